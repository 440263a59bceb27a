"""Weights on disk, as safetensors (never pickle).

* Hugging Face checkpoints (a folder with config.json and model.safetensors, or shards listed
  in model.safetensors.index.json) load into realbench's parameter names.
* realbench checkpoints: a folder `step<N>` per checkpoint, with one safetensors file per rank
  (its master shards and Adam state, written by runtime.worker) and `checkpoint.json`, the
  manifest: the step, the scenario, the plan's placements and the number of processes. Rank 0
  writes the manifest after every rank's file is on disk, so a folder without one is a save that
  did not finish, and is never resumed from. `load_resharded` reads one back under any plan of
  its scenario and any number of processes (as PyTorch's Distributed Checkpoint and Megatron's
  dist-checkpointing reshard on load); `convert_to_hf` writes one as Hugging Face folders.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from realbench.models.shards import adapter_specs, is_adapter

from realbench.errors import ConfigError
from realbench.models import ModelSpec

CHECKPOINT_SCHEMA = "realbench.checkpoint/1"
MANIFEST = "checkpoint.json"

def fresh_value_head(spec: ModelSpec, seed: int = 0) -> torch.Tensor:
    """A new scalar head on a decoder started from a language model: normal(0, 1/sqrt(h + 1))
    (OpenRLHF's and TRL's value heads start this way), the same on every rank for a seed."""
    g = torch.Generator().manual_seed(seed)
    return torch.randn(1, spec.hidden, generator=g) / (spec.hidden + 1) ** 0.5


def load_hf_checkpoint(folder: str | Path, name: str | None = None, value_head: bool | None = None,
                       seed: int = 0) -> tuple[ModelSpec, dict[str, torch.Tensor]]:
    """(spec, full fp32 weights by realbench name) of a Hugging Face checkpoint in a local folder,
    read whole (tests, small models). The config is read by `realbench.models.hf`, which refuses
    what the runtime would compute differently, and so is the list of tensors (each must map to
    a parameter, with its shape, and every parameter must be there)."""
    from realbench.models.hf import spec_from_checkpoint_entry

    entry = {"path": str(folder), **({"name": name} if name else {}),
             **({"value_head": value_head} if value_head is not None else {})}
    spec = spec_from_checkpoint_entry(entry, Path("."))
    from realbench.models.shards import param_specs

    full = {p.name: None for p in param_specs(spec)}
    return spec, load_hf_shards(spec, 1, 0, 1, 0, seed, names=list(full))


def load_hf_shards(spec: ModelSpec, tp: int, tp_rank: int, pp: int, stage: int, seed: int = 0, v: int = 1,
                   names: list[str] | None = None, dtype: torch.dtype = torch.float32, ep: int = 1,
                   ep_rank: int = 0) -> dict[str, torch.Tensor]:
    """The shards that tp rank `tp_rank` of pipeline stage `stage` holds, read from the
    checkpoint folder `spec.path` slice by slice (safetensors reads a slice without the rest of
    its tensor), so a process's memory stays near its shard. A tied head on the embedding's stage
    is the embedding (not listed); a fresh value head is made here. `names`: every parameter of
    one unsharded stage instead (the full model with tp = pp = 1). Of a mixture of experts' routed
    experts, those of expert-parallel rank `ep_rank` of `ep`."""
    from safetensors import safe_open

    from realbench.models.hf import checkpoint_tensors
    from realbench.models.shards import flat_offsets, is_adapter, param_specs, tied_aliases, tp_range

    folder = Path(spec.path)
    where = checkpoint_tensors(spec, folder)
    specs = {p.name: p for p in param_specs(spec)}
    wanted = names if names is not None else [n for n in flat_offsets(spec, tp, pp, stage, v, ep, ep_rank)[0]
                                              if n not in tied_aliases(spec, pp)]
    wanted = [n for n in wanted if not is_adapter(n)]  # a checkpoint holds the base; LoRA adapters start fresh
    out: dict[str, torch.Tensor] = {}
    by_file: dict[str, list[str]] = {}
    for name in wanted:
        if name in where:
            by_file.setdefault(where[name][0], []).append(name)
        elif name == "head.weight" and spec.tie_embeddings:
            by_file.setdefault(where["embed.weight"][0], []).append(name)
        else:
            out[name] = fresh_value_head(spec, seed)
    for f, members in by_file.items():
        with safe_open(str(folder / f), framework="pt") as st:
            for name in members:
                hf = where["embed.weight" if name not in where else name][1]
                p = specs[name]
                lo, hi = tp_range(p, tp, tp_rank)
                piece = st.get_slice(hf)
                if p.split is None:
                    t = piece[:]
                elif p.split == 0:
                    t = piece[lo:hi]
                else:
                    t = piece[:, lo:hi]
                out[name] = t.to(dtype)
    return out


def save_weights(path: str | Path, weights: dict[str, torch.Tensor], metadata: dict | None = None) -> None:
    save_file({k: v.detach().contiguous().cpu() for k, v in weights.items()}, str(path),
              metadata={k: str(v) for k, v in (metadata or {}).items()})


def load_weights(path: str | Path) -> dict[str, torch.Tensor]:
    return load_file(str(path))


def write_manifest(folder: str | Path, step: int, scenario: str, calls: dict, processes: int,
                   scenario_document: dict | None = None) -> None:
    """Mark a checkpoint complete (an atomic rename: a reader sees all of it or nothing). The
    scenario's document goes with it, so that `realbench checkpoint convert` needs nothing else."""
    from realbench.schema import write_text

    doc = {"schema": CHECKPOINT_SCHEMA, "step": step, "scenario": scenario, "processes": processes, "calls": calls,
           **({"scenario_document": scenario_document} if scenario_document else {})}
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


def written_options(scenario, manifest: dict) -> dict:
    """The options of the plan a checkpoint was written under (its manifest's placements)."""
    from realbench.plan.plan import plan_from_document, resolve_plan

    doc = {"schema": "realbench.plan/1", "scenario": scenario.name, "calls": manifest["calls"]}
    if scenario.dataflow.max_staleness:  # the weights' layouts do not depend on it: a checkpoint resumes either way
        doc["max_staleness"] = scenario.dataflow.max_staleness
    return resolve_plan(plan_from_document(doc, "the checkpoint's manifest"), scenario)


# where each kind of state a worker holds (Worker.master_state) lies in a rank's file
_FILE_KEYS = {"master": "model/{role}/{name}", "weights": "model/{role}/{name}",
              "exp_avg": "adam/{role}/{name}/exp_avg", "exp_avg_sq": "adam/{role}/{name}/exp_avg_sq"}


class _RankFiles:
    """The rank files of one checkpoint, opened when first read (a process opens only the files
    its slices come from)."""

    def __init__(self, folder: Path):
        self.folder, self.open = folder, {}

    def __call__(self, rank: int):
        if rank not in self.open:
            from safetensors import safe_open

            path = self.folder / f"rank{rank}.safetensors"
            if not path.is_file():
                raise ConfigError(f"missing {path.name}: the checkpoint is incomplete", "--resume", str(self.folder))
            handle = safe_open(str(path), framework="pt")
            self.open[rank] = (handle, set(handle.keys()))
        return self.open[rank]


@torch.no_grad()
def _read_slices(files: _RankFiles, spec: ModelSpec, role: str, src, dst, rank: int,
                 state: dict[str, dict[str, torch.Tensor]]) -> int:
    """Fill `state` (kind -> name -> this rank's tensors in layout `dst`) with the slices the
    reallocation from `src` (the layout the files were written under) would send to `rank`,
    read from the senders' files; returns the model's Adam step count (0 when not trained)."""
    from realbench.runtime.realloc import plan_transfers
    from realbench.models.shards import tied_aliases

    stored_as = tied_aliases(spec, src.dims.pp)  # a head kept in the embedding is stored as the embedding
    steps = None
    for t in plan_transfers(spec, src, dst):
        if t.dst != rank:
            continue
        f, keys = files(t.src)
        name, n = stored_as.get(t.name, t.name), t.hi - t.lo
        for kind, views in state.items():
            if t.name not in views:  # under LoRA: the base's weights, the adapters' optimizer state
                continue
            key = _FILE_KEYS[kind].format(role=role, name=name)
            if key not in keys:
                if kind.startswith("exp_avg"):  # saved before the first step: zeros, as Adam starts
                    continue
                raise ConfigError(f"has no tensor {key!r}", "--resume", str(files.folder / f"rank{t.src}.safetensors"))
            piece = f.get_slice(key)
            if t.split is None:
                value = piece[:]
            elif t.split == 0:
                value = piece[t.src_lo:t.src_lo + n]
            else:
                value = piece[:, t.src_lo:t.src_lo + n]
            view = views[t.name]
            (view if t.split is None else view.narrow(t.split, t.dst_lo, n)).copy_(value)
        if steps is None:
            steps = int(f.metadata().get(f"adam_step/{role}", 0))
    return steps or 0


def load_resharded(worker, folder: str | Path) -> int:
    """Fill `worker`'s models (weights, and trained models' fp32 masters and Adam moments) from
    a checkpoint written under any plan and any number of processes; returns the step it was
    written after. The slice arithmetic is the reallocation engine's (realloc.plan_transfers,
    from the layouts the checkpoint was written under to the worker's): each transfer to this
    rank becomes a read of that slice from the sending rank's file, and safetensors reads a
    slice without the rest of its tensor, so a process reads its own shards only."""
    from realbench.runtime.worker import layout_of

    folder = Path(folder)
    manifest = read_manifest(folder)
    scenario, G = worker.scenario, worker.scenario.cluster.gpus_per_node
    written = written_options(scenario, manifest)
    files = _RankFiles(folder)
    for m in sorted(set(worker.master_of) - set(worker.functions)):
        call = worker.calls[m]
        steps = _read_slices(files, scenario.models[call.model], call.model, layout_of(written[call.name], G),
                             worker.layouts[m], worker.rank, worker.master_state(m))
        if m in worker.optimizers:
            worker.optimizers[m].moved_in(steps)
    return int(manifest["step"])


def convert_to_hf(folder: str | Path, out: str | Path, scenario=None, merge_lora: bool = False) -> list[Path]:
    """Write the trained models of a realbench checkpoint (its fp32 master weights) as Hugging
    Face folders `out/<role>`, as `realbench run --save-hf` does; returns the folders. The
    scenario is the one stored with the checkpoint unless given."""
    from realbench.dataflow import CallKind
    from realbench.runtime.layout import Layout
    from realbench.runtime.realloc import empty_shards
    from realbench.models.shards import tied_aliases
    from realbench.runtime.worker import layout_of

    folder = Path(folder)
    manifest = read_manifest(folder)
    if scenario is None:
        scenario = scenario_of(manifest, folder)
    else:
        check_scenario(manifest, scenario, "--scenario", folder)
    written, G = written_options(scenario, manifest), scenario.cluster.gpus_per_node
    files, whole, made = _RankFiles(folder), Layout.on([0], 1, 1, 1), []
    tokenizer = scenario.data.tokenizer if scenario.data is not None else None
    for call in (scenario.dataflow.call(n) for n in scenario.dataflow.order):
        if call.kind != CallKind.TRAIN:
            continue
        spec = scenario.models[call.model]
        full = empty_shards(spec, whole, 0)
        _read_slices(files, spec, call.model, layout_of(written[call.name], G), whole, 0, {"weights": full})
        made.append(save_hf(Path(out) / call.model, spec,
                            {k: v for k, v in full.items() if k not in tied_aliases(spec, 1)}, tokenizer,
                            merge_lora=merge_lora))
    return made


def check_scenario(manifest: dict, scenario, flag: str, folder) -> None:
    if manifest.get("scenario") != scenario.name:
        raise ConfigError(f"the checkpoint is of scenario {manifest.get('scenario')!r}, not {scenario.name!r}",
                          flag, str(folder))


def scenario_of(manifest: dict, folder: Path):
    """The scenario a checkpoint was written for: the document stored in its manifest, or the
    built-in scenario of its name."""
    from realbench.plan import get_builtin
    from realbench.plan.scenario import scenario_from_document

    if "scenario_document" in manifest:
        return scenario_from_document(manifest["scenario_document"])
    try:
        return get_builtin(manifest.get("scenario", ""))
    except (KeyError, ValueError, ConfigError):
        raise ConfigError(f"names scenario {manifest.get('scenario')!r}, which is not built in; pass --scenario",
                          source=str(folder / MANIFEST)) from None


def hf_config(spec: ModelSpec, dtype: str) -> dict:
    """The config.json of a model: its source checkpoint's (its rotary settings and the rest as they
    were: training changes no shape), with the head it has now (a critic or reward model started
    from a language model becomes `<family>ForSequenceClassification` with one label) and the dtype
    it is saved in; for a model without a source, its family's config of its spec
    (realbench.models.hf.config_of)."""
    from realbench.models.families import families
    from realbench.models.hf import config_of, read_config

    cfg = read_config(spec.path) if spec.path else config_of(spec)
    family = families()[cfg["model_type"]] if cfg.get("model_type") in families() else families()[spec.family]
    cfg = {**cfg, "tie_word_embeddings": spec.tie_embeddings, "torch_dtype": dtype, "dtype": dtype}
    if spec.value_head:
        cfg.update(architectures=[family.architectures[1]], num_labels=1, id2label={"0": "LABEL_0"},
                   label2id={"LABEL_0": 0})
    else:
        cfg["architectures"] = [family.causal_lm]
    return cfg


def save_hf(folder: str | Path, spec: ModelSpec, full: dict[str, torch.Tensor], tokenizer_dir: str | None = None,
            merge_lora: bool = False) -> Path:
    """Write a model's full weights as a Hugging Face folder: config.json, model.safetensors (its
    tensors under transformers' names; a tied head is the embedding, not stored twice) and the
    tokenizer, which transformers loads as it loads the checkpoints it wrote itself.

    A model trained with LoRA is written as PEFT writes it (`save_adapters`): the adapters in
    `folder`, for the base checkpoint they were trained on (written beside them, in
    `folder/base`, when the base has no checkpoint folder: random weights); with `merge_lora`,
    one full model whose projections are W + (alpha / r) B A instead."""
    if spec.lora is not None:
        base = {k: v for k, v in full.items() if not is_adapter(k)}
        adapters = {k: v for k, v in full.items() if is_adapter(k)}
        plain = spec.model_copy(update={"lora": None})
        if merge_lora:
            return save_hf(folder, plain, merged_weights(spec, full), tokenizer_dir)
        source = spec.path or str(save_hf(Path(folder) / "base", plain, base, tokenizer_dir).resolve())
        return save_adapters(folder, spec, adapters, source, tokenizer_dir)
    from realbench.models.hf import hf_of

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    dtype = {torch.bfloat16: "bfloat16", torch.float16: "float16"}.get(next(iter(full.values())).dtype, "float32")
    tensors = {hf_of(k, spec): v.detach().contiguous().cpu() for k, v in full.items()
               if not (spec.tie_embeddings and k == "head.weight")}
    save_file(tensors, str(folder / "model.safetensors"), metadata={"format": "pt"})
    (folder / "config.json").write_text(json.dumps(hf_config(spec, dtype), indent=2) + "\n")
    if tokenizer_dir:
        from realbench.plan.datafiles import load_tokenizer

        tok = load_tokenizer(tokenizer_dir)
        if spec.value_head and tok.pad_token_id is not None:  # sequence classification finds the last token
            cfg = json.loads((folder / "config.json").read_text())
            cfg["pad_token_id"] = tok.pad_token_id
            (folder / "config.json").write_text(json.dumps(cfg, indent=2) + "\n")
        tok.save_pretrained(str(folder))
    return folder


def peft_name(name: str, spec: ModelSpec) -> str:
    """PEFT's name of an adapter tensor in adapter_model.safetensors, from realbench's
    (`layers.3.wq.lora_A` -> `base_model.model.model.layers.3.self_attn.q_proj.lora_A.weight`)."""
    from realbench.models.hf import hf_of

    module, part = name.rsplit(".", 1)
    return f"base_model.model.{hf_of(module + '.weight', spec).removesuffix('.weight')}.{part}.weight"


def merged_weights(spec: ModelSpec, full: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The base's weights with every adapter folded in: W + (alpha / r) B A (PEFT's merge)."""
    out = {k: v for k, v in full.items() if not is_adapter(k)}
    for module in spec.lora.modules:
        for i in range(spec.n_layers):
            p = f"layers.{i}.{module}"
            delta = spec.lora.scaling * full[f"{p}.lora_B"].float() @ full[f"{p}.lora_A"].float()
            out[f"{p}.weight"] = (out[f"{p}.weight"].float() + delta).to(out[f"{p}.weight"].dtype)
    return out


def save_adapters(folder: str | Path, spec: ModelSpec, adapters: dict[str, torch.Tensor], base: str,
                  tokenizer_dir: str | None = None) -> Path:
    """A PEFT adapter folder (`adapter_config.json`, `adapter_model.safetensors`) that
    `peft.PeftModel.from_pretrained(<base model>, folder)` loads: the LoraConfig's fields in
    PEFT's names, the tensors under PEFT's names, `base_model_name_or_path` the base checkpoint."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    lora = spec.lora
    save_file({peft_name(k, spec): v.detach().contiguous().cpu() for k, v in adapters.items()},
              str(folder / "adapter_model.safetensors"), metadata={"format": "pt"})
    config = {"peft_type": "LORA", "task_type": "CAUSAL_LM", "base_model_name_or_path": base, "r": lora.r,
              "lora_alpha": lora.lora_alpha, "lora_dropout": lora.lora_dropout, "bias": lora.bias,
              "target_modules": list(lora.target_modules), "use_rslora": lora.use_rslora, "fan_in_fan_out": False,
              "inference_mode": True, "modules_to_save": None}
    (folder / "adapter_config.json").write_text(json.dumps(config, indent=2) + "\n")
    if tokenizer_dir:
        from realbench.plan.datafiles import load_tokenizer

        load_tokenizer(tokenizer_dir).save_pretrained(str(folder))
    return folder


def load_adapters(spec: ModelSpec) -> dict[str, torch.Tensor]:
    """The full adapters of a PEFT adapter folder (`spec.lora.path`), by realbench's names."""
    from realbench.models.hf import ours_of_adapter

    tensors = load_file(str(Path(spec.lora.path) / "adapter_model.safetensors"))
    out = {ours_of_adapter(k): v.float() for k, v in tensors.items()}
    missing = sorted({p.name for p in adapter_specs(spec)} - set(out))
    if missing:
        raise ConfigError(f"{len(missing)} adapter(s) missing, the first {missing[0]!r}", source=spec.lora.path)
    return out
