"""The model families realbench reads, one module each: how a Hugging Face config.json of the
family becomes a `ModelSpec`, and, for the families the runtime computes, which checkpoint
tensor is which of realbench's parameters.

A family is known by its config's `model_type`; its `architectures` entry must be one of the
family's (a causal LM, or a one-label sequence classifier, which becomes a value head). What a
config sets that the family's reader does not price is refused by name (an activation other than
SwiGLU's silu, a router kind, a bias); an unset key takes the default of transformers' config class
of the family (named in each module), as transformers would read the file.

Priced: every family here. Run by realbench's runtime (`RUNTIME_FAMILIES`): llama, mistral,
qwen2, qwen3, qwen3_moe, mixtral, where the config uses nothing the runtime lacks
(`runtime_problem`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Optional

from realbench.errors import ConfigError


class Config:
    """A config.json's mapping read as transformers reads it: a key left out takes the family's
    default; a wrong value is refused in one line naming the key and the file."""

    def __init__(self, raw: dict, defaults: dict, source: str = ""):
        self.raw, self.defaults, self.source = raw, defaults, source

    def __contains__(self, key: str) -> bool:
        return key in self.raw

    def get(self, key: str, default: Any = None) -> Any:
        """The config's value (a null written is None, as transformers reads it), else the family's
        default; `default` where both leave it None."""
        value = self.raw[key] if key in self.raw else self.defaults.get(key)
        return default if value is None else value

    def error(self, key: str, why: str) -> ConfigError:
        return ConfigError(why, key, self.source)

    def int(self, key: str, minimum: int = 1, default: Any = None) -> int:
        value = self.get(key, default)
        if value is None:
            raise self.error(key, "missing")
        if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
            raise self.error(key, f"{value!r} is not a whole number of at least {minimum}")
        return value

    def number(self, key: str, default: Any = None) -> float:
        value = self.get(key, default)
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
            raise self.error(key, f"{value!r} is not a positive number")
        return float(value)

    def flag(self, key: str, default: bool = False) -> bool:
        value = self.get(key, default)
        if not isinstance(value, bool):
            raise self.error(key, f"{value!r} is not true or false")
        return value

    def refuse_true(self, key: str, why: str) -> None:
        """Refuse `key` when it is set to something true (a feature the family's reader does not price)."""
        if self.raw.get(key):
            raise self.error(key, f"{self.raw[key]!r}: {why}")

    def only(self, key: str, allowed: tuple, what: str) -> Any:
        """The value of `key`, refused by name unless one of `allowed`."""
        value = self.get(key)
        if value not in allowed:
            raise self.error(key, f"{what} {value!r} is not priced (known: {', '.join(map(str, allowed))})")
        return value


@dataclass(frozen=True)
class Family:
    """One model_type's reading. `read(cfg)` gives the spec's fields beyond the common ones
    (common_fields). For the families the runtime computes, `layer_tensors` maps a layer's
    Hugging Face tensor names (under `model.layers.<i>.`) to realbench's (under `layers.<i>.`),
    `expert_prefix` and `expert_tensors` an expert's (under `<expert_prefix>.<j>.`)."""

    model_type: str
    architectures: tuple[str, ...]  # the causal LM first, then sequence classification (a value head)
    defaults: dict
    read: Callable[[Config], dict]
    runs: bool = False
    layer_tensors: dict = field(default_factory=dict)
    expert_prefix: str = ""
    expert_tensors: dict = field(default_factory=dict)
    # the config as the language model's reader takes it (a VL config's text_config over its top)
    view: Optional[Callable[[dict], dict]] = None

    @property
    def causal_lm(self) -> str:
        return self.architectures[0]

    def value_head(self, arch: str) -> bool:
        return arch.endswith("ForSequenceClassification")


# A LLaMA decoder layer's tensors (transformers' LlamaDecoderLayer), every runtime family's base.
DENSE_LAYER = {
    "input_layernorm.weight": "attn_norm.weight",
    "self_attn.q_proj.weight": "wq.weight",
    "self_attn.k_proj.weight": "wk.weight",
    "self_attn.v_proj.weight": "wv.weight",
    "self_attn.q_proj.bias": "wq.bias",
    "self_attn.k_proj.bias": "wk.bias",
    "self_attn.v_proj.bias": "wv.bias",
    "self_attn.o_proj.weight": "wo.weight",
    "post_attention_layernorm.weight": "ffn_norm.weight",
    "mlp.gate_proj.weight": "w_gate.weight",
    "mlp.up_proj.weight": "w_up.weight",
    "mlp.down_proj.weight": "w_down.weight",
}
QK_NORMS = {"self_attn.q_norm.weight": "q_norm.weight", "self_attn.k_norm.weight": "k_norm.weight"}


def common_fields(cfg: Config, value_head: bool) -> dict:
    """The fields every family shares: the shapes, the rotary embedding, the norms' epsilon, a
    tied head, the activation (SwiGLU with silu), the context."""
    act = cfg.get("hidden_act", "silu")
    if act != "silu":
        raise cfg.error("hidden_act", f"activation {act!r} is not priced (SwiGLU with silu only)")
    heads = cfg.int("num_attention_heads")
    head_dim = cfg.get("head_dim")
    if head_dim is not None and (isinstance(head_dim, bool) or not isinstance(head_dim, int) or head_dim < 1):
        raise cfg.error("head_dim", f"{head_dim!r} is not a whole number")
    hidden = cfg.int("hidden_size")
    if head_dim is None and hidden % heads:
        raise cfg.error("hidden_size", f"{hidden} is not a multiple of num_attention_heads {heads} and no head_dim is given")
    theta, scaling, partial = rope(cfg)
    positions = cfg.get("max_position_embeddings")
    return dict(n_layers=cfg.int("num_hidden_layers"), hidden=hidden, n_heads=heads,
                n_kv_heads=cfg.int("num_key_value_heads", default=heads), head_dim=head_dim or hidden // heads,
                ffn=cfg.int("intermediate_size"), vocab=cfg.int("vocab_size"), value_head=value_head,
                rope_theta=theta, rope_scaling=scaling, partial_rotary_factor=partial,
                norm_eps=cfg.number("rms_norm_eps"),
                max_positions=positions if isinstance(positions, int) and not isinstance(positions, bool) else None,
                tie_embeddings=cfg.flag("tie_word_embeddings") and not value_head)


def rope(cfg: Config) -> tuple[float, Optional[dict], float]:
    """(rope_theta, the scaling's settings or None, partial_rotary_factor) of a config in either
    generation: transformers 5's `rope_parameters: {rope_type, rope_theta, ...}`, transformers 4's
    `rope_theta` and `rope_scaling: {rope_type or type, factor, ...}`. A kind transformers does not
    know is refused by name."""
    from realbench.models.spec import ROPE_TYPES, RopeScaling

    params = cfg.raw.get("rope_parameters") or {}
    scaling = cfg.raw.get("rope_scaling") or {}
    for key, section in (("rope_parameters", params), ("rope_scaling", scaling)):
        if not isinstance(section, dict):
            raise cfg.error(key, f"expected a mapping, got {section!r}")
    kinds = {key: section.get("rope_type", section.get("type", "default"))
             for key, section in (("rope_parameters", params), ("rope_scaling", scaling))}
    scaled = {k: v for k, v in kinds.items() if v != "default"}
    if len(set(scaled.values())) > 1:
        raise cfg.error("rope_scaling", f"rope_parameters says {kinds['rope_parameters']!r}, rope_scaling "
                                        f"{kinds['rope_scaling']!r}: give one")
    # the scaled section's keys over the other's (a transformers 5 config keeps rope_theta in rope_parameters)
    merged = {**params, **scaling} if "rope_scaling" in scaled else {**scaling, **params}
    kind = next(iter(scaled.values()), "default")
    theta = merged.get("rope_theta", cfg.get("rope_theta", 10000.0))
    if isinstance(theta, bool) or not isinstance(theta, (int, float)) or not theta > 0:
        raise cfg.error("rope_theta", f"{theta!r} is not a positive number")
    partial = merged.get("partial_rotary_factor", cfg.get("partial_rotary_factor", 1.0))
    if kind == "default":
        return float(theta), None, float(partial)
    key = next(iter(scaled))
    if kind not in ROPE_TYPES:
        raise cfg.error(key, f"rope type {kind!r} is not known (known: default, {', '.join(ROPE_TYPES)})")
    fields = {k: v for k, v in merged.items() if k in RopeScaling.model_fields and v is not None}
    fields["rope_type"] = kind
    if kind == "yarn" and fields.get("factor") is None and isinstance(cfg.get("max_position_embeddings"), int):
        # (transformers: the ratio of the context to the original one, where the factor is left out)
        fields["factor"] = cfg.get("max_position_embeddings") / fields.get("original_max_position_embeddings", 1)
    if kind == "llama3" and "original_max_position_embeddings" not in fields:
        fields["original_max_position_embeddings"] = cfg.get("max_position_embeddings")
    for short in ("short_factor", "long_factor"):
        if short in fields:
            fields[short] = tuple(fields[short])
    from realbench.schema import validate_model

    try:
        validate_model(RopeScaling, fields)
    except ConfigError as e:
        raise cfg.error(key, f"{e.field + ': ' if e.field else ''}{e.message}") from None
    return float(theta), fields, float(partial)


def attention_layers(cfg: Config, default_kind: str = "full_attention") -> dict:
    """`layer_types` and `sliding_window` as transformers builds them: listed (transformers 5),
    or from the transformers 4 keys each family reads (Qwen2's use_sliding_window past
    max_window_layers, Mistral's sliding_window on every layer)."""
    n = cfg.int("num_hidden_layers")
    types = cfg.raw.get("layer_types")
    window = cfg.get("sliding_window")
    if types is not None:
        if not isinstance(types, list) or len(types) != n:
            raise cfg.error("layer_types", f"expected a list of {n} attention kinds")
        from realbench.models.spec import ATTENTION_KINDS

        unknown = sorted(set(types) - set(ATTENTION_KINDS))
        if unknown:
            raise cfg.error("layer_types", f"attention kind {unknown[0]!r} is not priced (known: "
                                           f"{', '.join(ATTENTION_KINDS)})")
        kinds = tuple(types)
    elif default_kind == "sliding_attention" and window is not None:
        kinds = ("sliding_attention",) * n
    else:
        kinds = ()
    if set(kinds) <= {"full_attention"}:
        return {}
    if "sliding_attention" in kinds and (not isinstance(window, int) or window < 1):
        raise cfg.error("sliding_window", f"{window!r}: sliding_attention layers need a window of whole tokens")
    return {"layer_types": kinds, **({"sliding_window": window} if "sliding_attention" in kinds else {})}


def qwen_window_layers(cfg: Config) -> dict:
    """Qwen2's and Qwen3's transformers-4 sliding windows: with use_sliding_window, the layers from
    max_window_layers on attend over the last sliding_window positions (transformers 5 lists them
    in layer_types, built the same way)."""
    if "layer_types" in cfg.raw or not cfg.flag("use_sliding_window"):
        return attention_layers(cfg)
    n, start = cfg.int("num_hidden_layers"), cfg.int("max_window_layers", minimum=0)
    window = cfg.get("sliding_window")
    kinds = tuple("sliding_attention" if i >= start else "full_attention" for i in range(n))
    return {"layer_types": kinds, "sliding_window": window} if "sliding_attention" in kinds else {}


MOE_KEYS = ("num_experts", "num_local_experts", "n_routed_experts", "moe_intermediate_size")


def refuse_foreign_keys(cfg: Config, family: str, window: bool = False) -> None:
    """A dense family's config that sets another architecture's keys (experts; a sliding window where
    the family attends to every position) is refused by name: transformers would ignore them, and a
    config that sets them is most likely another architecture's under this one's name."""
    for key in MOE_KEYS:
        cfg.refuse_true(key, f"a mixture-of-experts key in a config of {family}'s dense architecture (which ignores "
                             "it): another architecture's config?")
    if not window:
        if cfg.raw.get("sliding_window") is not None:
            raise cfg.error("sliding_window", f"{cfg.raw['sliding_window']}: {family} attends to every earlier position "
                                              "(its architecture ignores a window): another architecture's config?")
        kinds = set(cfg.raw.get("layer_types") or []) - {"full_attention"}
        if kinds:
            raise cfg.error("layer_types", f"attention kind {sorted(kinds)[0]!r}: {family} attends to every earlier "
                                           "position (its architecture ignores layer_types): another architecture's config?")


def _families() -> dict[str, Family]:
    from realbench.models.families import deepseek, gpt_oss, llama, mixtral, qwen2, qwen3, qwen3_next, qwen_vl

    out: dict[str, Family] = {}
    for module in (llama, qwen2, qwen3, mixtral, deepseek, qwen3_next, gpt_oss, qwen_vl):
        for family in module.FAMILIES:
            out[family.model_type] = family
    return out


FAMILIES: dict[str, Family] = {}


def families() -> dict[str, Family]:
    """Every family realbench reads, by model_type (built once)."""
    if not FAMILIES:
        FAMILIES.update(_families())
    return FAMILIES


def runtime_families() -> tuple[str, ...]:
    return tuple(t for t, f in families().items() if f.runs)


def family_of(cfg: dict, source: str = "") -> tuple[Family, str]:
    """(family, architecture) of a config, refused by name where realbench reads neither."""
    archs = cfg.get("architectures") or []
    arch = archs[0] if isinstance(archs, list) and len(archs) == 1 else None
    known = families()
    by_arch = {a: f for f in known.values() for a in f.architectures}
    if arch is None or arch not in by_arch:
        shown = arch if arch is not None else archs
        raise ConfigError(f"architecture {shown!r} is not supported (realbench reads {', '.join(sorted(by_arch))})",
                          "architectures", source)
    family = by_arch[arch]
    model_type = cfg.get("model_type")
    if model_type is not None and model_type not in known:
        raise ConfigError(f"{model_type!r} is not a model type realbench reads (known: {', '.join(sorted(known))})",
                          "model_type", source)
    if model_type is not None and known[model_type] is not family and arch not in known[model_type].architectures:
        raise ConfigError(f"{arch} is not a {model_type} architecture", "architectures", source)
    return (known[model_type] if model_type is not None else family), arch


def runtime_problem(spec) -> Optional[str]:
    """Why realbench's runtime does not compute `spec` (priced and exported all the same), named by
    what it lacks, or None."""
    family = families().get(spec.family)
    if family is None or not family.runs:
        return (f"realbench's runtime does not compute {spec.family} models (it runs "
                f"{', '.join(runtime_families())}); plan and export it for an engine")
    if spec.rope_scaling is not None and spec.rope_scaling.rope_type not in ("linear", "llama3", "yarn"):
        return f"the runtime computes rotary scaling linear, llama3 and yarn, not {spec.rope_scaling.rope_type!r}"
    if spec.partial_rotary_factor != 1.0:
        return "the runtime rotates whole heads (partial_rotary_factor 1)"
    if spec.layer_types:
        kinds = sorted(set(spec.layer_types) - {"full_attention"})
        return f"the runtime computes full attention only, not {kinds[0]} layers"
    for flag, what in (("vision", "a vision tower (vision-language models)"),
                       ("o_bias", "a bias on the attention output"), ("attn_output_gate", "a gated attention output"),
                       ("attention_sinks", "attention sinks"), ("mla", "multi-head latent attention"),
                       ("linear_attention", "linear attention")):
        if getattr(spec, flag):
            return f"the runtime does not compute {what}"
    moe = spec.moe
    if moe is not None and spec.lora is not None:
        return "the runtime trains LoRA adapters on dense models only, not on a mixture of experts"
    if moe is not None:
        for bad, what in ((moe.shared_ffn, "shared experts"), (moe.scoring != "softmax", f"{moe.scoring} routing"),
                          (moe.expert_bias or moe.router_bias, "biases in the experts or the router"),
                          (moe.routed_scaling_factor != 1.0, "a routed_scaling_factor"),
                          (moe.n_group > 1, "group-limited routing")):
            if bad:
                return f"the runtime's mixture of experts has no {what}"
    return None
