"""Settings as flat dotted keys (`actor_rollout_ref.actor.ppo_epochs`), as realbench reads and
carries them, and as the nested documents engines read (`flatten`, `nest`)."""

from __future__ import annotations

from typing import Any, Callable


def flatten(node: Any, prefix: str = "", whole: Callable[[dict], bool] = lambda section: False) -> dict[str, Any]:
    """`node`'s leaves by dotted key; a nested section for which `whole` is true stays one value
    (AReaL's: a section holding only `_target_`)."""
    if isinstance(node, dict) and node and not (prefix and whole(node)):
        out: dict[str, Any] = {}
        for key, value in node.items():
            out.update(flatten(value, f"{prefix}{key}.", whole))
        return out
    return {prefix[:-1]: node}


def nest(flat: dict[str, Any]) -> dict:
    """The nested document of dotted keys, later keys over earlier ones as OmegaConf merges them: a
    key under an earlier leaf replaces it with a section (verl's reference block's
    override_transformer_config, an interpolation of the actor's, given a field: that field alone,
    as Hydra composes it)."""
    out: dict = {}
    for key, value in flat.items():
        *parents, leaf = key.split(".")
        node = out
        for p in parents:
            if not isinstance(node.get(p), dict):
                node[p] = {}
            node = node[p]
        node[leaf] = value
    return out
