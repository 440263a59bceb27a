"""Model specs from Hugging Face `config.json` files.

Everything in a config that changes the function the checkpoint computes is either carried into
the spec (shapes, `rope_theta`, `rms_norm_eps`, `tie_word_embeddings`) or refused by name: an
architecture, activation, bias, head size, rotary scaling or mixture of experts that the runtime
does not implement would otherwise load silently and compute something else.

Both config generations are read: transformers 5 writes the rotary settings as
`rope_parameters: {rope_type, rope_theta}`, transformers 4 as `rope_theta` and `rope_scaling`.
"""

from __future__ import annotations

import json
from pathlib import Path

from realbench.errors import ConfigError
from realbench.models import ModelSpec

CAUSAL_LM = ("LlamaForCausalLM",)
SEQUENCE_CLASSIFICATION = ("LlamaForSequenceClassification",)
SUPPORTED = CAUSAL_LM + SEQUENCE_CLASSIFICATION
# keys whose presence (with a true value) means a mixture of experts
_MOE_KEYS = ("num_experts", "num_local_experts", "n_routed_experts", "moe_intermediate_size")


def read_config(folder: str | Path) -> dict:
    folder = Path(folder)
    path = folder / "config.json"
    if not folder.is_dir():
        raise ConfigError("no such folder", source=str(folder))
    if not path.is_file():
        raise ConfigError("no config.json: not a Hugging Face checkpoint folder", source=str(folder))
    try:
        cfg = json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise ConfigError(f"unreadable: {e}", source=str(path)) from None
    if not isinstance(cfg, dict):
        raise ConfigError("is not a JSON object", source=str(path))
    return cfg


def rope_theta(cfg: dict, source: str = "") -> float:
    """The rotary base of a config, refusing any scaled or non-default rotary embedding."""
    params = cfg.get("rope_parameters") or {}
    scaling = cfg.get("rope_scaling") or {}
    for key, section in (("rope_parameters", params), ("rope_scaling", scaling)):
        if not isinstance(section, dict):
            raise ConfigError(f"expected a mapping, got {section!r}", key, source)
        kind = section.get("rope_type", section.get("type", "default"))
        if kind != "default":
            raise ConfigError(f"rope scaling type {kind!r} is not supported (only the default rotary embedding)",
                              key, source)
    theta = params.get("rope_theta", cfg.get("rope_theta", 10000.0))
    if not isinstance(theta, (int, float)) or not theta > 0:
        raise ConfigError(f"{theta!r} is not a positive number", "rope_theta", source)
    return float(theta)


def spec_from_config(cfg: dict, name: str, source: str = "") -> ModelSpec:
    """The spec of a checkpoint's config; a critic/reward head (`*ForSequenceClassification`
    with one label) becomes a value head."""
    archs = cfg.get("architectures") or []
    if len(archs) != 1 or archs[0] not in SUPPORTED:
        raise ConfigError(f"architecture {archs[0] if len(archs) == 1 else archs!r} is not supported "
                          f"(supported: {', '.join(SUPPORTED)})", "architectures", source)
    arch = archs[0]
    for key in _MOE_KEYS:
        if cfg.get(key):
            raise ConfigError("mixture of experts is not supported", key, source)
    act = cfg.get("hidden_act", "silu")
    if act != "silu":
        raise ConfigError(f"activation {act!r} is not supported (SwiGLU with silu only)", "hidden_act", source)
    for key in ("attention_bias", "mlp_bias"):
        if cfg.get(key):
            raise ConfigError("biases are not supported", key, source)
    try:
        hidden, heads = int(cfg["hidden_size"]), int(cfg["num_attention_heads"])
        shape = dict(n_layers=int(cfg["num_hidden_layers"]), hidden=hidden, n_heads=heads,
                     n_kv_heads=int(cfg.get("num_key_value_heads") or heads), ffn=int(cfg["intermediate_size"]),
                     vocab=int(cfg["vocab_size"]))
    except KeyError as e:
        raise ConfigError("missing", str(e.args[0]), source) from None
    except (TypeError, ValueError) as e:
        raise ConfigError(f"not a whole number: {e}", source=source) from None
    head_dim = cfg.get("head_dim")
    if head_dim is not None and heads and head_dim * heads != hidden:
        raise ConfigError(f"head_dim {head_dim} x {heads} heads != hidden_size {hidden} is not supported",
                          "head_dim", source)
    value_head = arch in SEQUENCE_CLASSIFICATION
    if value_head and cfg.get("num_labels", len(cfg.get("id2label") or {0: 0})) != 1:
        raise ConfigError("a reward or critic head needs exactly one label", "num_labels", source)
    from realbench.plan.schema import validate_model

    fields = dict(name=name, **shape, value_head=value_head, rope_theta=rope_theta(cfg, source),
                  norm_eps=cfg.get("rms_norm_eps", 1e-6),  # LlamaConfig's default
                  tie_embeddings=bool(cfg.get("tie_word_embeddings", False)) and not value_head)
    try:
        return validate_model(ModelSpec, fields)
    except ConfigError as e:
        raise e.in_file(source) from None


def spec_from_folder(folder: str | Path, name: str | None = None) -> ModelSpec:
    folder = Path(folder)
    cfg = read_config(folder)
    return spec_from_config(cfg, name or cfg.get("_name_or_path") or folder.name, str(folder / "config.json"))
