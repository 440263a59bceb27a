"""Run AReaL's own configuration code on an experiment YAML, with AReaL's Python (`make engines`
builds `.venv-areal`: areal 1.0.4 installed without its dependencies, beside the few its
configuration modules import: torch (ours, 2.13.0: AReaL pins an older one, which its config code
does not need), transformers, omegaconf, hydra-core, lark, uvloop, colorlog, numba). Standalone:
the standard library and the areal package only, never realbench.

    .venv-areal/bin/python realbench/engines/areal/check.py defaults
        every setting of AReaL's PPOConfig (areal/api/cli_args.py), flat: dotted key -> default
        (interpolations unresolved, MISSING as "???"), and the sections that are None unless a
        YAML names them (ref, critic, actor.reward_norm, ...): realbench/engines/areal/areal-1.0.4.json
    .venv-areal/bin/python realbench/engines/areal/check.py validate CONFIG.yaml [...] [key=value ...]
        CONFIG and the overrides through AReaL's loader (Hydra compose, the merge into the
        structured PPOConfig, every __post_init__: cli_args.load_expr_config's steps without the
        name-resolve and logging side effects), then each engine's `backend` through
        ModelAllocation.from_str (areal/api/alloc_mode.py), as PPOTrainer parses them
        (areal/trainer/rl_trainer.py:132-194); prints a JSON line a file: {"ok": true, "allocations":
        {role: {backend, dp, tp, pp, cp, ep, etp, edp, world}}, ...} or {"ok": false, "error": "..."} (exit 1
        if any is refused); the overrides apply to every file
    .venv-areal/bin/python realbench/engines/areal/check.py pack MAX_TOKENS_PER_MB N_MBS [DIVISOR] < LENGTHS.json
        each list of sequence lengths (a JSON list of lists on stdin: one GPU's rows of a step) packed
        into micro-batches by AReaL's own allocator (areal/utils/seqpack.py ffd_allocate, what
        split_padded_tensor_dict_into_mb_list calls with the mb_spec; DIVISOR its n_mbs_divisor, a
        Megatron pipeline's pp); prints a JSON list, per list the tokens of each micro-batch

The package `areal` and `areal.engine` import the whole GPU stack in their __init__; they are
replaced by bare packages over the same folders, so that `areal.api.cli_args` and
`areal.api.alloc_mode` import as they are. `areal.utils.name_resolve` (Ray, etcd) is stubbed.
"""

from __future__ import annotations

import io
import json
import sys
import types
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path
from unittest import mock

# run as a script, this file's folder comes first on the path, and realbench's modules beside it
# (settings.py, reader.py, ...) would shadow any package of their names
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != Path(__file__).resolve().parent]

ROLES = ("actor", "critic", "ref", "rollout")


def _stubs() -> dict:
    import importlib.util

    root = Path(importlib.util.find_spec("areal").submodule_search_locations[0])

    def package(name: str, path: Path) -> types.ModuleType:
        m = types.ModuleType(name)
        m.__path__ = [str(path)]
        return m

    return {"areal": package("areal", root), "areal.engine": package("areal.engine", root / "engine"),
            "areal.engine.fsdp_utils": package("areal.engine.fsdp_utils", root / "engine" / "fsdp_utils"),
            "areal.utils.name_resolve": mock.MagicMock()}


def _flat(node, prefix: str = "") -> dict:
    if isinstance(node, dict) and (node or not prefix):
        out = {}
        for k, v in node.items():
            out.update(_flat(v, f"{prefix}{k}."))
        return out
    return {prefix[:-1]: node}


def _allocation(backend: str, role: str) -> dict:
    from areal.api.alloc_mode import ModelAllocation

    a = ModelAllocation.from_str(backend, name=role)
    p = a.parallel
    return {"backend": a.backend, "dp": p.data_parallel_size, "tp": p.tensor_parallel_size,
            "pp": p.pipeline_parallel_size, "cp": p.context_parallel_size, "ep": p.expert_parallel_size,
            # (the experts' tensor parallelism: the FFN's t, 1 in the flat form; str() leaves it out)
            "etp": p.expert_tensor_parallel_size, "edp": p.expert_data_parallel_size,
            "world": p.world_size, "string": str(a)}


def _optional_sections(cls, prefix: str = "") -> dict[str, type]:
    """Settings that are a dataclass or None, None by default (`ref`, `critic`,
    `actor.reward_norm`, ...): dotted key -> the dataclass a YAML that names them fills in."""
    import dataclasses
    import typing

    out: dict[str, type] = {}
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        inner = [a for a in typing.get_args(hints[f.name]) or (hints[f.name],) if dataclasses.is_dataclass(a)]
        if not inner:
            continue
        if f.default is None:
            out[prefix + f.name] = inner[0]
        out.update(_optional_sections(inner[0], f"{prefix}{f.name}."))
    return out


def defaults() -> dict:
    """{"keys": every setting, flat, with its default; "sections": the dotted keys of the
    settings that are None unless given (their own keys are listed under them)}."""
    from importlib.metadata import version

    with mock.patch.dict(sys.modules, _stubs()):
        from omegaconf import OmegaConf

        from areal.api import cli_args

        keys = _flat(OmegaConf.to_container(OmegaConf.structured(cli_args.PPOConfig), resolve=False))
        sections = _optional_sections(cli_args.PPOConfig)
        for key, cls in sections.items():
            keys.pop(key, None)
            keys.update(_flat(OmegaConf.to_container(OmegaConf.structured(cls), resolve=False), f"{key}."))
        for key in sections:  # (a section inside another: its keys stay, the key itself is not a leaf)
            keys.pop(key, None)
    return {"areal": version("areal"), "keys": dict(sorted(keys.items())), "sections": sorted(sections)}


def validate(config: str, overrides: list[str]) -> dict:
    """(Inside `_stubs()`: AReaL's modules import once a process.)"""
    with redirect_stdout(io.StringIO()), redirect_stderr(io.StringIO()):
        from omegaconf import OmegaConf

        from areal.api import cli_args

        cfg, _ = cli_args.parse_cli_args(["--config", config, *overrides])
        cfg = OmegaConf.to_object(cli_args.to_structured_cfg(cfg, cli_args.PPOConfig))
        allocations = {role: _allocation(getattr(cfg, role).backend, role)
                       for role in ROLES if getattr(cfg, role, None) is not None}
    return {"ok": True, "allocations": allocations,
            "kl_ctl": cfg.actor.kl_ctl, "batch_size": cfg.train_dataset.batch_size,
            "n_samples": cfg.gconfig.n_samples, "max_head_offpolicyness": cfg.rollout.max_head_offpolicyness,
            "ppo_n_minibatches": cfg.actor.ppo_n_minibatches, "n_gpus_per_node": cfg.cluster.n_gpus_per_node,
            "n_nodes": cfg.cluster.n_nodes,
            # AReaL's own decision: whether the trainer runs a forward for the old (proximal) log-probabilities
            "logprob_forward": cfg.actor.should_compute_prox_logp(), "use_decoupled_loss": cfg.actor.use_decoupled_loss,
            "prox_logp_method": cfg.actor.prox_logp_method,
            "lora": {"use_lora": cfg.actor.use_lora, "rank": cfg.actor.lora_rank, "alpha": cfg.actor.lora_alpha,
                     "target_modules": list(cfg.actor.target_modules), "rollout": cfg.rollout.use_lora},
            # a user's own settings, carried through realbench (engine_settings)
            "actor_lr": cfg.actor.optimizer.lr, "train_dataset": cfg.train_dataset.path,
            "experiment_name": cfg.experiment_name,
            # the servers' share of each GPU's memory (realbench's memory_fraction)
            "mem_fraction_static": cfg.sglang.mem_fraction_static, "gpu_memory_utilization": cfg.vllm.gpu_memory_utilization,
            # the context a request to the servers may take (realbench's max_model_len, vLLM's)
            "context_length": cfg.sglang.context_length, "max_model_len": cfg.vllm.max_model_len}


def pack(capacity: int, min_groups: int, batches: list[list[int]], divisor: int = 1) -> list[list[int]]:
    """(Inside `_stubs()`.) AReaL's first fit decreasing over each batch of lengths."""
    from areal.utils import seqpack

    return [[int(sum(lengths[i] for i in group))
             for group in seqpack.ffd_allocate(lengths, capacity, min_groups, n_groups_divisor=divisor)]
            for lengths in batches]


def main(argv: list[str]) -> int:
    if argv[:1] == ["pack"] and len(argv) in (3, 4):
        stubs = {**_stubs(), "areal.utils": types.ModuleType("areal.utils")}
        stubs["areal.utils"].__path__ = [str(Path(stubs["areal"].__path__[0]) / "utils")]
        with mock.patch.dict(sys.modules, stubs):
            print(json.dumps(pack(int(argv[1]), int(argv[2]), json.load(sys.stdin), *map(int, argv[3:]))))
        return 0
    if argv[:1] == ["defaults"]:
        print(json.dumps(defaults(), sort_keys=True, default=str))
        return 0
    if argv[:1] == ["validate"] and len(argv) >= 2:
        # several files share one import of AReaL (seconds): each its own line, overrides for all
        configs = [a for a in argv[1:] if "=" not in a]
        overrides = [a for a in argv[1:] if "=" in a]
        status = 0
        with mock.patch.dict(sys.modules, _stubs()):
            for config in configs:
                try:
                    print(json.dumps(validate(config, overrides)))
                except Exception as e:  # AReaL's own refusal, whatever its type: reported as one line
                    text = f"{type(e).__name__}: {e}".strip().splitlines()
                    print(json.dumps({"ok": False, "error": text[0] if text else type(e).__name__}))
                    status = 1
        return status
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
