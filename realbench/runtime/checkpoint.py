"""Weights on disk, as safetensors (never pickle).

* Hugging Face LLaMA checkpoints (a folder with config.json and model.safetensors, or shards
  listed in model.safetensors.index.json) load into realbench's parameter names.
* realbench checkpoints: one safetensors file per model with its full (unsharded) tensors.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from realbench.errors import ConfigError
from realbench.models import ModelSpec

_HF_LAYER = {
    "input_layernorm.weight": "attn_norm.weight",
    "self_attn.q_proj.weight": "wq.weight",
    "self_attn.k_proj.weight": "wk.weight",
    "self_attn.v_proj.weight": "wv.weight",
    "self_attn.o_proj.weight": "wo.weight",
    "post_attention_layernorm.weight": "ffn_norm.weight",
    "mlp.gate_proj.weight": "w_gate.weight",
    "mlp.up_proj.weight": "w_up.weight",
    "mlp.down_proj.weight": "w_down.weight",
}


def _hf_name(name: str) -> str | None:
    if name == "model.embed_tokens.weight":
        return "embed.weight"
    if name == "model.norm.weight":
        return "norm.weight"
    if name in ("lm_head.weight", "score.weight"):
        return "head.weight"
    if name.startswith("model.layers."):
        _, _, idx, rest = name.split(".", 3)
        if rest in _HF_LAYER:
            return f"layers.{idx}.{_HF_LAYER[rest]}"
    return None


def load_hf_llama(folder: str | Path, name: str | None = None) -> tuple[ModelSpec, dict[str, torch.Tensor]]:
    """(spec, full weights) of a Hugging Face LLaMA checkpoint in a local folder."""
    folder = Path(folder)
    cfg_path = folder / "config.json"
    if not cfg_path.is_file():
        raise ConfigError("no config.json: not a Hugging Face checkpoint folder", source=str(folder))
    cfg = json.loads(cfg_path.read_text())
    if cfg.get("rope_scaling") or cfg.get("rope_parameters", {}).get("rope_type", "default") != "default":
        raise ConfigError("rope scaling is not supported", "rope_scaling", str(cfg_path))
    spec = ModelSpec(name=name or cfg.get("_name_or_path") or folder.name, n_layers=cfg["num_hidden_layers"],
                     hidden=cfg["hidden_size"], n_heads=cfg["num_attention_heads"],
                     n_kv_heads=cfg.get("num_key_value_heads", cfg["num_attention_heads"]),
                     ffn=cfg["intermediate_size"], vocab=cfg["vocab_size"])
    index = folder / "model.safetensors.index.json"
    files = sorted(set(json.loads(index.read_text())["weight_map"].values())) if index.is_file() else ["model.safetensors"]
    weights: dict[str, torch.Tensor] = {}
    for f in files:
        for k, v in load_file(str(folder / f)).items():
            ours = _hf_name(k)
            if ours is not None:
                weights[ours] = v.float()
    if "head.weight" not in weights and cfg.get("tie_word_embeddings"):
        weights["head.weight"] = weights["embed.weight"]
    if weights.get("head.weight") is not None and weights["head.weight"].shape[0] == 1:
        spec = spec.with_value_head()
    return spec, weights


def save_weights(path: str | Path, weights: dict[str, torch.Tensor], metadata: dict | None = None) -> None:
    save_file({k: v.detach().contiguous().cpu() for k, v in weights.items()}, str(path),
              metadata={k: str(v) for k, v in (metadata or {}).items()})


def load_weights(path: str | Path) -> dict[str, torch.Tensor]:
    return load_file(str(path))
