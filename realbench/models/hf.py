"""Model specs from Hugging Face `config.json` files, found where a user keeps them.

A model is named by a checkpoint folder, a config.json file, a hub id (`Qwen/Qwen3-8B`) found in
the local Hugging Face cache (`HF_HUB_CACHE`, else `HF_HOME/hub`, as huggingface_hub resolves it
offline: nothing is downloaded), or an entry of the built-in catalogue (realbench.models.catalogue,
by its name or the hub id it copies). Planning needs the config alone; the weights are read, and
checked tensor by tensor, only by what runs the model (`check_weights`: `realbench run`,
`realbench checkpoint`).

Each family's reader (realbench.models.families) carries into the spec everything in a config that
changes what the model costs or computes, and refuses by name what it does not price. Both config
generations are read: transformers 5 writes the rotary settings as `rope_parameters: {rope_type,
rope_theta}`, transformers 4 as `rope_theta` and `rope_scaling`.
"""

from __future__ import annotations

import json
import os
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from realbench.errors import ConfigError
from realbench.models import LoraSpec, ModelSpec
from realbench.models.families import Config, families, family_of
from realbench.schema import refuse_unknown_keys, validate_model


def read_config(folder: str | Path) -> dict:
    """The config.json of a checkpoint folder (or the file itself)."""
    folder = Path(folder)
    path = folder if folder.is_file() else folder / "config.json"
    if not folder.exists():
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


def hf_cache_dir() -> Path:
    """The Hugging Face hub cache as huggingface_hub finds it now: HF_HUB_CACHE (or its old name
    HUGGINGFACE_HUB_CACHE), else HF_HOME/hub, else XDG_CACHE_HOME/huggingface/hub, else
    ~/.cache/huggingface/hub."""
    for key in ("HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE"):
        if os.environ.get(key):
            return Path(os.environ[key]).expanduser()
    home = os.environ.get("HF_HOME") or os.path.join(os.environ.get("XDG_CACHE_HOME") or "~/.cache", "huggingface")
    return Path(home).expanduser() / "hub"


def looks_like_hub_id(text: str) -> bool:
    """`org/name` (or `name`): no path marks, one slash at most."""
    return (bool(text) and text.count("/") <= 1 and not text.startswith((".", "/", "~")) and "\\" not in text
            and not text.endswith((".json", "/")))


def cached_config(hub_id: str) -> Optional[Path]:
    """The config.json of `hub_id`'s main revision in the local hub cache, or None."""
    from huggingface_hub import try_to_load_from_cache

    try:
        found = try_to_load_from_cache(hub_id, "config.json", cache_dir=str(hf_cache_dir()))
    except ValueError:  # not a valid repository id
        return None
    return Path(found) if isinstance(found, str) else None


@dataclass(frozen=True)
class ConfigSource:
    """A model's config and where it was found: `folder` holds its weights (a checkpoint folder or
    the cache's snapshot of a hub id), None for a lone config.json and a catalogue entry;
    `origin` says which, for the user."""

    config: dict
    source: str  # what errors name: the config.json file, or the catalogue entry
    folder: Optional[Path]
    origin: str


def find_config(where: str, base: Path = Path(".")) -> ConfigSource:
    """The config a scenario's model names (module doc): a folder or a config.json file (relative to
    `base`, the scenario's folder), a hub id in the local cache, or a catalogue entry."""
    from realbench.models import catalogue

    if not isinstance(where, str) or not where.strip():
        raise ConfigError("must name a checkpoint folder, a config.json file, a hub id or a catalogue entry")
    path = (base / Path(where).expanduser()).resolve()
    if path.is_dir():
        return ConfigSource(read_config(path), str(path / "config.json"), path, f"folder {path}")
    if path.is_file():
        return ConfigSource(read_config(path), str(path), None, f"config file {path}")
    if looks_like_hub_id(where):
        cached = cached_config(where.strip())
        if cached is not None:
            return ConfigSource(read_config(cached), str(cached), cached.parent,
                                f"hub id {where.strip()} in the local Hugging Face cache")
        entry = catalogue.find(where)
        if entry is not None:
            return ConfigSource(catalogue.config(entry), f"catalogue:{entry}", None,
                                f"catalogue entry {entry} (a copy of {catalogue.hub_id(entry)}'s config.json)")
        raise ConfigError(f"no such folder or config.json file; no hub id {where.strip()!r} in the local Hugging Face "
                          f"cache ({hf_cache_dir()}: nothing is downloaded) and no catalogue entry of that name "
                          "(realbench models lists them)", source=str(path))
    raise ConfigError("no such folder or config.json file", source=str(path))


def spec_from_config(cfg: dict, name: str, source: str = "", **fields) -> ModelSpec:
    """The spec of a config (its family's reading); a one-label `*ForSequenceClassification`
    becomes a value head. `fields`: more of the spec's (path, config_source)."""
    family, arch = family_of(cfg, source)
    value_head = family.value_head(arch)
    if value_head and (cfg.get("num_labels") or len(cfg.get("id2label") or {"0": 0})) != 1:
        raise ConfigError("a reward or critic head needs exactly one label", "num_labels", source)
    from realbench.models.families import common_fields

    try:
        view = family.view(cfg) if family.view else cfg
    except ConfigError as e:
        raise e.in_file(source) from None
    reader = Config(view, family.defaults, source)
    spec = {**common_fields(reader, value_head), **family.read(reader)}
    try:
        return validate_model(ModelSpec, {"name": name, "family": family.model_type, **spec, **fields})
    except ConfigError as e:
        raise e.in_file(source) from None


def config_of(spec: ModelSpec) -> dict:
    """The Hugging Face config.json of a spec of a family the runtime computes (transformers 5's
    names; `spec_from_config` reads it back to the same spec): what a model without a source
    checkpoint is saved with."""
    name = spec.family
    if name == "llama" and spec.qkv_bias and not spec.o_bias:  # (q, k, v biases alone: Qwen2's computation)
        name = "qwen2"
    family = families().get(name)
    if family is None or not family.runs:
        raise ConfigError(f"realbench writes configs of the families its runtime computes, not {spec.family}")
    spec = spec.model_copy(update={"family": name})
    rope = {"rope_type": "default", "rope_theta": spec.rope_theta}
    if spec.rope_scaling is not None:
        rope = {**spec.rope_scaling.model_dump(exclude_defaults=True), "rope_type": spec.rope_scaling.rope_type,
                "rope_theta": spec.rope_theta}
    head = {"architectures": [family.architectures[1]], "num_labels": 1} if spec.value_head else \
        {"architectures": [family.causal_lm]}
    cfg = {**head, "model_type": spec.family, "hidden_act": "silu",
           "hidden_size": spec.hidden, "intermediate_size": spec.ffn, "num_hidden_layers": spec.n_layers,
           "num_attention_heads": spec.n_heads, "num_key_value_heads": spec.n_kv_heads, "head_dim": spec.head_dim,
           "vocab_size": spec.vocab, "rms_norm_eps": spec.norm_eps, "rope_parameters": rope,
           "max_position_embeddings": spec.max_positions or 4096, "tie_word_embeddings": spec.tie_embeddings,
           "initializer_range": 0.02}
    if spec.family in ("llama", "qwen3", "qwen3_moe"):
        cfg["attention_bias"] = spec.qkv_bias
    if spec.family == "llama":
        cfg["mlp_bias"] = False
    if spec.family in ("mistral", "mixtral"):
        cfg["sliding_window"] = None
    if spec.family in ("qwen2", "qwen3", "qwen3_moe"):
        cfg.update(use_sliding_window=False, sliding_window=None)
    moe = spec.moe
    if moe is not None:
        aux = {"output_router_logits": moe.aux_loss_coef > 0, "router_aux_loss_coef": moe.aux_loss_coef or 0.001,
               "num_experts_per_tok": moe.top_k}
        if spec.family == "mixtral":
            cfg.update(num_local_experts=moe.experts, intermediate_size=moe.expert_ffn, **aux)
        else:
            cfg.update(num_experts=moe.experts, moe_intermediate_size=moe.expert_ffn, norm_topk_prob=moe.norm_topk_prob,
                       decoder_sparse_step=1, mlp_only_layers=list(moe.dense_layers), **aux)
    return cfg


def spec_from_folder(folder: str | Path, name: str | None = None) -> ModelSpec:
    folder = Path(folder)
    cfg = read_config(folder)
    return spec_from_config(cfg, name or cfg.get("_name_or_path") or folder.name, str(folder / "config.json"),
                            path=str(folder))


def spec_from_source(where: str, base: Path = Path("."), name: Optional[str] = None) -> ModelSpec:
    """The spec of the model `where` names (find_config), with the folder its weights would be in,
    or where its config came from when it has no folder."""
    found = find_config(where, base)
    default = found.folder.name if found.folder is not None else where.strip().rsplit("/", 1)[-1]
    if found.folder is not None and found.folder.parent.name == "snapshots":  # a hub cache snapshot
        default = where.strip().rsplit("/", 1)[-1]
    fields = {"path": str(found.folder)} if found.folder is not None else {"config_source": found.origin}
    return spec_from_config(found.config, name or default, found.source, **fields)


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
        ours = ours_of_adapter(hf, spec.family)
        if ours not in expected or expected[ours] != shape:
            raise ConfigError(f"tensor {hf!r} {list(shape)} is not an adapter of {spec.name} (r {lora.r}, "
                              f"hidden {spec.hidden}, ffn {spec.ffn}): an adapter folder for another base?",
                              source=str(folder / f))
    missing = sorted(set(expected) - {ours_of_adapter(hf, spec.family) for hf in found})
    if missing:
        raise ConfigError(f"{len(missing)} adapter(s) of its target_modules missing for {spec.name} "
                          f"({spec.n_layers} layers), the first {missing[0]!r}: an adapter folder for another base?",
                          source=str(folder))
    return lora


def ours_of_adapter(hf: str, family: str = "llama") -> str | None:
    """realbench's name of a PEFT adapter tensor (base_model.model.<module>.lora_A.weight)."""
    if not hf.startswith("base_model.model.") or not hf.endswith((".lora_A.weight", ".lora_B.weight")):
        return None
    module, part, _ = hf.removeprefix("base_model.model.").rsplit(".", 2)
    ours = ours_of(module + ".weight", family)
    return None if ours is None else f"{ours.removesuffix('.weight')}.{part}"


def spec_from_checkpoint_entry(entry: dict, base: Path) -> ModelSpec:
    """A scenario's `{path: WHERE[, value_head: true][, name: N]}` model: the spec of the config
    WHERE names (a folder or config.json file relative to `base`, the scenario file's folder; a hub
    id in the local cache; a catalogue entry: find_config), with a fresh value head when asked (a
    critic or reward model started from a language model). The weights are not read here
    (check_weights, before a run)."""
    refuse_unknown_keys(CHECKPOINT_KEYS, entry)
    if not isinstance(entry["path"], str) or not entry["path"]:
        raise ConfigError("must be a folder, a config.json file, a hub id or a catalogue entry", "path")
    spec = spec_from_source(entry["path"], base, entry.get("name"))
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
    return spec.with_value_head(value_head).model_copy(update={"lora": lora})


def check_weights(spec: ModelSpec, role: str = "") -> None:
    """Refuse, in one line, a model whose weights cannot be run: one read from its config alone
    (no folder), a folder without its safetensors files, a tensor that is not the config's. Run
    before any process starts, by what runs the model."""
    where = f"models.{role}" if role else spec.name
    if spec.path is None:
        if spec.config_source is not None:
            raise ConfigError(f"{spec.name} is read from its config alone ({spec.config_source}): no weights to run. "
                              "Give the checkpoint folder with its model.safetensors (models.<role>.path)", where)
        return  # random weights (a preset, or a spec written by hand)
    checkpoint_tensors(spec, Path(spec.path))


# -- tensors ---------------------------------------------------------------------------------------
# buffers some exporters write that carry nothing the config does not say
_DERIVED = ("rotary_emb.inv_freq",)


def _family_tensors(spec_family: str):
    family = families().get(spec_family)
    if family is None or not family.runs:
        raise ConfigError(f"realbench does not map the tensors of {spec_family} checkpoints (its runtime does not "
                          "compute them)")
    return family


def ours_of(hf: str, family: str = "llama") -> str | None:
    """realbench's parameter name for a Hugging Face tensor name of a checkpoint of `family`
    (None: no counterpart)."""
    if hf == "model.embed_tokens.weight":
        return "embed.weight"
    if hf == "model.norm.weight":
        return "norm.weight"
    if hf in ("lm_head.weight", "score.weight"):
        return "head.weight"
    if hf.startswith("model.layers."):
        _, _, idx, rest = hf.split(".", 3)
        if not idx.isdigit():
            return None
        fam = _family_tensors(family)
        if rest in fam.layer_tensors:
            return f"layers.{idx}.{fam.layer_tensors[rest]}"
        if fam.expert_prefix and rest.startswith(fam.expert_prefix + "."):
            j, _, name = rest[len(fam.expert_prefix) + 1:].partition(".")
            if j.isdigit() and name in fam.expert_tensors:
                return f"layers.{idx}.moe.experts.{j}.{fam.expert_tensors[name]}"
    return None


def hf_of(ours: str, spec: ModelSpec) -> str:
    """The Hugging Face tensor name of a realbench parameter (the score head for value models)."""
    if ours == "embed.weight":
        return "model.embed_tokens.weight"
    if ours == "norm.weight":
        return "model.norm.weight"
    if ours == "head.weight":
        return "score.weight" if spec.value_head else "lm_head.weight"
    fam = _family_tensors(spec.family)
    _, idx, rest = ours.split(".", 2)
    if rest.startswith("moe.experts."):
        _, _, j, name = rest.split(".", 3)
        theirs = {v: k for k, v in fam.expert_tensors.items()}[name]
        return f"model.layers.{idx}.{fam.expert_prefix}.{j}.{theirs}"
    theirs = {v: k for k, v in fam.layer_tensors.items()}[rest]
    return f"model.layers.{idx}.{theirs}"


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
    problem = spec.runtime_problem()
    if problem:
        raise ConfigError(problem, source=str(folder / "config.json"))
    for hf, (f, shape) in tensor_files(folder).items():
        ours = ours_of(hf, spec.family)
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
