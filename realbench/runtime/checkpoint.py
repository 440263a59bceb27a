"""Weights on disk, as safetensors (never pickle).

* Hugging Face checkpoints (a folder with config.json and model.safetensors, or shards listed
  in model.safetensors.index.json) load into realbench's parameter names.
* realbench checkpoints: a folder `step<N>` per checkpoint, with one safetensors file per rank
  (its master shards and Adam state, written and read by runtime.worker) and `checkpoint.json`,
  the manifest: the step, the scenario, the plan's placements and the number of processes. Rank 0
  writes the manifest after every rank's file is on disk, so a folder without one is a save that
  did not finish, and is never resumed from.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from realbench.errors import ConfigError
from realbench.models import ModelSpec

CHECKPOINT_SCHEMA = "realbench.checkpoint/1"
MANIFEST = "checkpoint.json"

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


# buffers some exporters write that carry nothing the config does not say
_DERIVED = ("rotary_emb.inv_freq",)


def load_hf_checkpoint(folder: str | Path, name: str | None = None) -> tuple[ModelSpec, dict[str, torch.Tensor]]:
    """(spec, full fp32 weights by realbench name) of a Hugging Face checkpoint in a local folder.
    The config is read by `realbench.models.hf` (which refuses what the runtime would compute
    differently); every tensor of the files must map to a parameter of the spec, with its
    shape, and every parameter must be there."""
    from realbench.models.hf import spec_from_folder
    from realbench.runtime.shards import param_specs

    folder = Path(folder)
    spec = spec_from_folder(folder, name)
    index = folder / "model.safetensors.index.json"
    files = sorted(set(json.loads(index.read_text())["weight_map"].values())) if index.is_file() else ["model.safetensors"]
    for f in files:
        if not (folder / f).is_file():
            raise ConfigError(f"missing weights file {f}", source=str(folder))
    expected = {p.name: p.shape for p in param_specs(spec)}
    weights: dict[str, torch.Tensor] = {}
    for f in files:
        for k, v in load_file(str(folder / f)).items():
            ours = _hf_name(k)
            if ours is None:
                if k.endswith(_DERIVED):
                    continue
                raise ConfigError(f"tensor {k!r} has no counterpart in the model", source=str(folder / f))
            if ours == "head.weight" and spec.tie_embeddings:
                continue  # the tied head is the embedding (transformers ignores a stored copy too)
            if ours not in expected or tuple(v.shape) != expected[ours]:
                raise ConfigError(f"tensor {k!r} has shape {tuple(v.shape)}, the config gives "
                                  f"{expected.get(ours, 'no such parameter')}", source=str(folder / f))
            weights[ours] = v.float()
    if spec.tie_embeddings and "embed.weight" in weights:
        weights["head.weight"] = weights["embed.weight"]
    missing = sorted(set(expected) - set(weights))
    if missing:
        raise ConfigError(f"{len(missing)} parameter(s) missing, the first {missing[0]!r}", source=str(folder))
    return spec, weights


def save_weights(path: str | Path, weights: dict[str, torch.Tensor], metadata: dict | None = None) -> None:
    save_file({k: v.detach().contiguous().cpu() for k, v in weights.items()}, str(path),
              metadata={k: str(v) for k, v in (metadata or {}).items()})


def load_weights(path: str | Path) -> dict[str, torch.Tensor]:
    return load_file(str(path))


def write_manifest(folder: str | Path, step: int, scenario: str, calls: dict, processes: int) -> None:
    """Mark a checkpoint complete (an atomic rename: a reader sees all of it or nothing)."""
    from realbench.plan.schema import write_text

    doc = {"schema": CHECKPOINT_SCHEMA, "step": step, "scenario": scenario, "processes": processes, "calls": calls}
    write_text(json.dumps(doc, indent=2) + "\n", Path(folder) / MANIFEST, overwrite=True)


def read_manifest(folder: str | Path) -> dict:
    path = Path(folder) / MANIFEST
    try:
        doc = json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise ConfigError(f"unreadable checkpoint manifest: {e}", source=str(path)) from None
    if not isinstance(doc, dict) or doc.get("schema") != CHECKPOINT_SCHEMA:
        raise ConfigError(f"not a {CHECKPOINT_SCHEMA} manifest", source=str(path))
    return doc
