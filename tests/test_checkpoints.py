"""Hugging Face checkpoint folders in scenarios: each process reads only its own slices, the
cost model sees the real shapes, and what cannot be run faithfully is refused by `validate`."""

import pytest
import torch

from realbench.runtime.layout import Layout
from realbench.runtime.local import spawn

transformers = pytest.importorskip("transformers")


def save_llama(path, hidden=512, layers=8, ffn=1536, vocab=8000, **kwargs):
    cfg = transformers.LlamaConfig(vocab_size=vocab, hidden_size=hidden, intermediate_size=ffn,
                                   num_hidden_layers=layers, num_attention_heads=8, num_key_value_heads=4,
                                   max_position_embeddings=512, **kwargs)
    torch.manual_seed(0)
    transformers.LlamaForCausalLM(cfg).save_pretrained(path, safe_serialization=True)
    return path


def _status_bytes(field):
    for line in open("/proc/self/status"):
        if line.startswith(field + ":"):
            return int(line.split()[1]) * 1024  # kB
    raise KeyError(field)


def reset_peak_rss():
    """Start a new peak: Linux resets VmHWM to the current resident size on "5" in clear_refs."""
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")
    return _status_bytes("VmRSS")


def peak_rss_bytes():
    return _status_bytes("VmHWM")


def _load_shards(rank, world, folder, layout, full_load):
    from realbench.models.hf import spec_from_checkpoint_entry
    from realbench.runtime.checkpoint import load_hf_checkpoint, load_hf_shards
    from realbench.runtime.model import LlamaStage
    from realbench.models.shards import param_specs, tp_range

    spec = spec_from_checkpoint_entry({"path": folder}, __import__("pathlib").Path("."))
    c = layout.coord(rank)
    stage = LlamaStage(spec, layout.dims.tp, c.tp, layout.dims.pp, c.pp)  # its own buffer is allocated here
    before = reset_peak_rss()
    if full_load:  # what every process did before: the whole model, then its slices
        stage.load_full(load_hf_checkpoint(folder)[1])
    else:
        shards = load_hf_shards(spec, layout.dims.tp, c.tp, layout.dims.pp, c.pp)
        with torch.no_grad():
            for name, v in stage.state_dict().items():
                if name in shards:
                    v.copy_(shards[name])
        del shards
    grown = peak_rss_bytes() - before
    # then, and only then, the whole model to compare with
    full = load_hf_checkpoint(folder)[1]
    specs = {p.name: p for p in param_specs(spec)}
    same = True
    for name, v in stage.state_dict().items():
        p = specs[name]
        want = full[name]
        if p.split is not None:
            lo, hi = tp_range(p, layout.dims.tp, c.tp)
            want = want.narrow(p.split, lo, hi - lo)
        same = same and torch.equal(v, want)
    return grown, same, stage.flat.numel() * 4


@pytest.mark.parametrize("dims", [(1, 1, 4), (1, 2, 2)])
def test_each_process_reads_only_its_slices(tmp_path, dims):
    """4 processes load a 133 MB checkpoint (33.4M fp32 parameters) as 4 pipeline stages, or 2
    stages of 2 tensor-parallel shards: each one's peak memory grows by about its shard (measured:
    1.0x for whole stages; 1.6x with tensor parallelism, whose column slices of row-parallel
    weights read whole pages of those tensors), far less than the 134 MB a process that reads
    the whole model grows by; and the shards equal the full model's slices."""
    folder = str(save_llama(tmp_path / "ckpt"))
    layout = Layout.on(range(4), *dims)
    sharded = spawn(_load_shards, 4, folder, layout, False, timeout_s=240)
    full = spawn(_load_shards, 1, folder, Layout.on([0], 1, 1, 1), True, timeout_s=240)[0]
    model_bytes = full[2]
    assert model_bytes > 130e6 and full[0] > 0.9 * model_bytes  # reading everything costs the model
    for grown, same, shard_bytes in sharded:
        assert same
        assert grown < 1.6 * shard_bytes + 8e6, (grown, shard_bytes)  # its shard, plus a little
        assert grown < 0.5 * full[0], (grown, full[0])
