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
import struct
from pathlib import Path

from realbench.errors import ConfigError
from realbench.models import LoraSpec, ModelSpec
from realbench.schema import refuse_unknown_keys, validate_model

# The families the runtime computes exactly: LLaMA; Mistral (LLaMA's computation, when it has no
# sliding window); Qwen2 (LLaMA's with biases on q, k and v). Each as a language model or as a
# reward/critic model with a one-label score head.
FAMILIES = {"Llama": {}, "Mistral": {}, "Qwen2": {"qkv_bias": True}}
CAUSAL_LM = tuple(f"{f}ForCausalLM" for f in FAMILIES)
SEQUENCE_CLASSIFICATION = tuple(f"{f}ForSequenceClassification" for f in FAMILIES)
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


def _refuse_sliding_window(cfg: dict, source: str) -> None:
    """Sliding-window attention would differ from full attention on long sequences: refused.
    Mistral sets `sliding_window` (v0.1: 4096; null from v0.2 on); Qwen2 keeps a value there but
    uses it only with `use_sliding_window`; transformers 5 lists each layer's kind."""
    kinds = set(cfg.get("layer_types") or []) - {"full_attention"}
    if kinds:
        raise ConfigError(f"attention kind {sorted(kinds)[0]!r} is not supported (full attention only)",
                          "layer_types", source)
    if "use_sliding_window" in cfg and cfg.get("model_type") == "qwen2":
        if cfg["use_sliding_window"]:
            raise ConfigError("sliding-window attention is not supported", "use_sliding_window", source)
    elif cfg.get("sliding_window") is not None:
        raise ConfigError(f"sliding-window attention ({cfg['sliding_window']} tokens) is not supported",
                          "sliding_window", source)


def spec_from_config(cfg: dict, name: str, source: str = "") -> ModelSpec:
    """The spec of a checkpoint's config; a critic/reward head (`*ForSequenceClassification`
    with one label) becomes a value head."""
    archs = cfg.get("architectures") or []
    if len(archs) != 1 or archs[0] not in SUPPORTED:
        raise ConfigError(f"architecture {archs[0] if len(archs) == 1 else archs!r} is not supported "
                          f"(supported: {', '.join(SUPPORTED)})", "architectures", source)
    arch = archs[0]
    family = arch.split("For")[0]
    _refuse_sliding_window(cfg, source)
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
    if value_head and (cfg.get("num_labels") or len(cfg.get("id2label") or {"0": 0})) != 1:
        raise ConfigError("a reward or critic head needs exactly one label", "num_labels", source)
    fields = dict(name=name, **shape, **FAMILIES[family], value_head=value_head, rope_theta=rope_theta(cfg, source),
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


CHECKPOINT_KEYS = ("path", "value_head", "name", "lora", "adapter")  # of a scenario's checkpoint entry
# adapter_config.json fields realbench reads (LoraSpec's), and those it accepts at their
# defaults only (anything else would change what the adapters compute, and is refused by name)
_ADAPTER_READ = ("r", "lora_alpha", "lora_dropout", "target_modules", "bias", "use_rslora")
_ADAPTER_DEFAULTS = {"peft_type": "LORA", "fan_in_fan_out": False, "modules_to_save": None, "layers_to_transform": None,
                     "layers_pattern": None, "rank_pattern": {}, "alpha_pattern": {}, "use_dora": False,
                     "megatron_config": None, "layer_replication": None,
                     "exclude_modules": None, "trainable_token_indices": None, "lora_bias": False}


def read_adapter(folder: Path, spec: ModelSpec) -> LoraSpec:
    """The LoRA settings of a PEFT adapter folder, checked against the base they are for: every
    tensor of adapter_model.safetensors must be an adapter of `spec` with its shape."""
    path = folder / "adapter_config.json"
    try:
        cfg = json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise ConfigError(f"not a PEFT adapter folder ({type(e).__name__}: {e})", source=str(path)) from None
    for key, default in _ADAPTER_DEFAULTS.items():
        if cfg.get(key) not in (None, default, {}, []):
            raise ConfigError(f"{key}: {cfg[key]!r}: realbench computes LoRA adapters only with {default!r}",
                              source=str(path))
    try:
        lora = validate_model(LoraSpec, {**{k: cfg[k] for k in _ADAPTER_READ if cfg.get(k) is not None},
                                         "path": str(folder)})
    except ConfigError as e:
        raise e.in_file(str(path)) from None
    from realbench.models.shards import adapter_specs

    expected = {p.name: p.shape for p in adapter_specs(spec.model_copy(update={"lora": lora}))}
    found = tensor_files(folder, "adapter_model.safetensors")
    for hf, (f, shape) in found.items():
        ours = ours_of_adapter(hf)
        if ours not in expected or expected[ours] != shape:
            raise ConfigError(f"tensor {hf!r} {list(shape)} is not an adapter of {spec.name} (r {lora.r}, "
                              f"hidden {spec.hidden}, ffn {spec.ffn}): an adapter folder for another base?",
                              source=str(folder / f))
    missing = sorted(set(expected) - {ours_of_adapter(hf) for hf in found})
    if missing:
        raise ConfigError(f"{len(missing)} adapter(s) of its target_modules missing for {spec.name} "
                          f"({spec.n_layers} layers), the first {missing[0]!r}: an adapter folder for another base?",
                          source=str(folder))
    return lora


def ours_of_adapter(hf: str) -> str | None:
    """realbench's name of a PEFT adapter tensor (base_model.model.<module>.lora_A.weight)."""
    if not hf.startswith("base_model.model.") or not hf.endswith((".lora_A.weight", ".lora_B.weight")):
        return None
    module, part, _ = hf.removeprefix("base_model.model.").rsplit(".", 2)
    ours = ours_of(module + ".weight")
    return None if ours is None else f"{ours.removesuffix('.weight')}.{part}"


def spec_from_checkpoint_entry(entry: dict, base: Path) -> ModelSpec:
    """A scenario's `{path: DIR[, value_head: true][, name: N]}` model: the spec of the folder's
    config (`path` relative to `base`, the scenario file's folder), with a fresh value head when
    asked (a critic or reward model started from a language model)."""
    refuse_unknown_keys(CHECKPOINT_KEYS, entry)
    if not isinstance(entry["path"], str) or not entry["path"]:
        raise ConfigError("must be a folder name", "path")
    folder = (base / Path(entry["path"]).expanduser()).resolve()
    spec = spec_from_folder(folder, entry.get("name") or folder.name)
    value_head = entry.get("value_head", spec.value_head)
    if not isinstance(value_head, bool):
        raise ConfigError("must be true or false", "value_head")
    if spec.value_head and not value_head:
        raise ConfigError("a sequence-classification checkpoint has no language-model head", "value_head")
    if entry.get("lora") is not None and entry.get("adapter") is not None:
        raise ConfigError("give lora (fresh adapters) or adapter (a PEFT folder, whose config says the rest), not both",
                          "adapter")
    try:
        lora = validate_model(LoraSpec, entry["lora"]) if entry.get("lora") is not None else None
    except ConfigError as e:
        raise e.within("lora") from None
    if entry.get("adapter") is not None:
        if not isinstance(entry["adapter"], str) or not (base / Path(entry["adapter"]).expanduser()).is_dir():
            raise ConfigError("must be a PEFT adapter folder", "adapter")
        lora = read_adapter((base / Path(entry["adapter"]).expanduser()).resolve(), spec)
    spec = spec.with_value_head(value_head).model_copy(update={"path": str(folder), "lora": lora})
    checkpoint_tensors(spec, folder)  # every tensor accounted for, before any process starts
    return spec


# -- tensors ---------------------------------------------------------------------------------------
_HF_LAYER = {
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
_FROM_OURS = {v: k for k, v in _HF_LAYER.items()}
# buffers some exporters write that carry nothing the config does not say
_DERIVED = ("rotary_emb.inv_freq",)


def ours_of(hf: str) -> str | None:
    """realbench's parameter name for a Hugging Face tensor name (None: no counterpart)."""
    if hf == "model.embed_tokens.weight":
        return "embed.weight"
    if hf == "model.norm.weight":
        return "norm.weight"
    if hf in ("lm_head.weight", "score.weight"):
        return "head.weight"
    if hf.startswith("model.layers."):
        _, _, idx, rest = hf.split(".", 3)
        if rest in _HF_LAYER and idx.isdigit():
            return f"layers.{idx}.{_HF_LAYER[rest]}"
    return None


def hf_of(ours: str, spec: ModelSpec) -> str:
    """The Hugging Face tensor name of a realbench parameter (the score head for value models)."""
    if ours == "embed.weight":
        return "model.embed_tokens.weight"
    if ours == "norm.weight":
        return "model.norm.weight"
    if ours == "head.weight":
        return "score.weight" if spec.value_head else "lm_head.weight"
    _, idx, rest = ours.split(".", 2)
    return f"model.layers.{idx}.{_FROM_OURS[rest]}"


def safetensors_header(path: Path) -> dict:
    """{tensor name: {"dtype", "shape", ...}} of a safetensors file, from its header alone."""
    with open(path, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(n))
    header.pop("__metadata__", None)
    return header


def tensor_files(folder: Path, single: str = "model.safetensors") -> dict[str, tuple[str, tuple[int, ...]]]:
    """Every tensor of a checkpoint folder: its file and shape."""
    index = folder / f"{single}.index.json"
    try:
        files = sorted(set(json.loads(index.read_text())["weight_map"].values())) if index.is_file() \
            else [single]
    except (OSError, ValueError, KeyError) as e:
        raise ConfigError(f"unreadable index: {e}", source=str(index)) from None
    out = {}
    for f in files:
        if not (folder / f).is_file():
            raise ConfigError(f"missing weights file {f}", source=str(folder))
        try:
            header = safetensors_header(folder / f)
        except (OSError, ValueError, struct.error) as e:
            raise ConfigError(f"not a safetensors file: {e}", source=str(folder / f)) from None
        for name, info in header.items():
            out[name] = (f, tuple(info["shape"]))
    return out


def checkpoint_tensors(spec: ModelSpec, folder: Path) -> dict[str, tuple[str, str]]:
    """{realbench parameter: (file, Hugging Face name)} for the parameters the folder holds,
    after checking that every tensor maps to a parameter with its shape and that every
    parameter is there (a fresh value head, or a tied head, need none)."""
    from realbench.models.shards import param_specs

    expected = {p.name: p.shape for p in param_specs(spec, adapters=False)}
    fresh = set()
    if spec.tie_embeddings:
        fresh.add("head.weight")  # the embedding serves as the head
    out = {}
    for hf, (f, shape) in tensor_files(folder).items():
        ours = ours_of(hf)
        if ours is None:
            if hf.endswith(_DERIVED):
                continue
            raise ConfigError(f"tensor {hf!r} has no counterpart in the model", source=str(folder / f))
        if ours == "head.weight" and (spec.tie_embeddings or (spec.value_head and hf == "lm_head.weight")):
            continue  # a tied head is the embedding; a fresh value head replaces the LM head
        if ours not in expected or shape != expected[ours]:
            raise ConfigError(f"tensor {hf!r} has shape {shape}, the config gives "
                              f"{expected.get(ours, 'no such parameter')}", source=str(folder / f))
        out[ours] = (f, hf)
    if spec.value_head and "head.weight" not in out:
        fresh.add("head.weight")  # a critic or reward model started from a language model
    missing = sorted(set(expected) - set(out) - fresh)
    if missing:
        raise ConfigError(f"{len(missing)} parameter(s) missing, the first {missing[0]!r}", source=str(folder))
    return out
