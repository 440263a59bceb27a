"""Parameter reallocation: move a model's shards from one layout to another (REAL.md section 7).

Every rank computes the same transfer list from the two layouts alone:
for each parameter and each destination rank that holds it in the new layout (its pp stage),
the slice it needs (its tp range) is intersected with the tp ranges of the source layout; each
non-empty intersection comes from one source rank of the stage holding that parameter, chosen
among the source's dp replicas: the destination itself when it already holds the data, else the
replica with the same dp index modulo the source's dp (spreading the load over replicas).
Transfers between the same pair of ranks are packed into one flat buffer and sent point to point
(one message per pair, in the same order on both sides), so each destination receives only its
slices. Copies are exact, so A -> B -> A gives back bit-identical weights.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch
import torch.distributed as dist

from realbench.models import ModelSpec
from realbench.runtime.layout import Coord, Layout
from realbench.runtime.shards import ParamSpec, in_stage, param_specs, shard_shape, tp_range


@dataclass(frozen=True)
class Transfer:
    name: str
    src: int  # global rank sending
    dst: int  # global rank receiving
    split: Optional[int]  # dimension of the full tensor that the range refers to
    lo: int  # [lo, hi) along `split` in the full tensor (the whole tensor when split is None)
    hi: int
    src_lo: int  # where the range starts in the source shard
    dst_lo: int  # and in the destination shard


def _stage_of(spec: ParamSpec, n_layers: int, pp: int) -> int:
    return next(s for s in range(pp) if in_stage(spec, n_layers, pp, s))


def plan_transfers(model: ModelSpec, src: Layout, dst: Layout) -> list[Transfer]:
    L = model.n_layers
    out = []
    for p in param_specs(model):
        s_stage = _stage_of(p, L, src.dims.pp)
        for c in dst.coords():
            if not in_stage(p, L, dst.dims.pp, c.pp):
                continue
            r = dst.rank_of(c)
            if p.split is None:  # replicated: one copy from any source rank of the stage
                holders = [src.rank_of(Coord(d, t, s_stage)) for d in range(src.dims.dp) for t in range(src.dims.tp)]
                sender = r if r in holders else holders[(c.dp * dst.dims.tp + c.tp) % len(holders)]
                out.append(Transfer(p.name, sender, r, None, 0, p.shape[0], 0, 0))
                continue
            need_lo, need_hi = tp_range(p, dst.dims.tp, c.tp)
            for t in range(src.dims.tp):
                have_lo, have_hi = tp_range(p, src.dims.tp, t)
                lo, hi = max(need_lo, have_lo), min(need_hi, have_hi)
                if lo >= hi:
                    continue
                replicas = [src.rank_of(Coord(d, t, s_stage)) for d in range(src.dims.dp)]
                sender = r if r in replicas else replicas[c.dp % len(replicas)]
                out.append(Transfer(p.name, sender, r, p.split, lo, hi, lo - have_lo, lo - need_lo))
    return out


def _view(tensor: torch.Tensor, split: Optional[int], start: int, length: int) -> torch.Tensor:
    return tensor if split is None else tensor.narrow(split, start, length)


def reallocate(model: ModelSpec, src: Layout, dst: Layout, shards: dict[str, torch.Tensor], rank: int,
               dtype: torch.dtype = torch.float32, device: str | torch.device = "cpu",
               transfers: Optional[list[Transfer]] = None) -> dict[str, torch.Tensor]:
    """This rank's shards in layout `dst`, given its shards in layout `src` (empty if it holds
    none). Every rank of either layout must call it with the same layouts."""
    transfers = plan_transfers(model, src, dst) if transfers is None else transfers
    specs = {p.name: p for p in param_specs(model)}
    out: dict[str, torch.Tensor] = {}
    coord = dst.coord(rank)
    if coord is not None:
        for p in specs.values():
            if in_stage(p, model.n_layers, dst.dims.pp, coord.pp):
                out[p.name] = torch.empty(shard_shape(p, dst.dims.tp), dtype=dtype, device=device)
    outgoing: dict[int, list[Transfer]] = {}
    incoming: dict[int, list[Transfer]] = {}
    for t in transfers:
        n = t.hi - t.lo
        if t.src == rank and t.dst == rank:
            _view(out[t.name], t.split, t.dst_lo, n).copy_(_view(shards[t.name], t.split, t.src_lo, n))
        elif t.src == rank:
            outgoing.setdefault(t.dst, []).append(t)
        elif t.dst == rank:
            incoming.setdefault(t.src, []).append(t)
    requests, buffers = [], []
    for peer in sorted(set(outgoing) | set(incoming)):
        if peer in outgoing:  # one flat message per pair, slices in transfer-list order
            flat = torch.cat([_view(shards[t.name], t.split, t.src_lo, t.hi - t.lo).reshape(-1)
                              for t in outgoing[peer]])
            requests.append(dist.isend(flat, peer))
        if peer in incoming:
            size = sum(_view(out[t.name], t.split, t.dst_lo, t.hi - t.lo).numel() for t in incoming[peer])
            buf = torch.empty(size, dtype=dtype, device=device)
            requests.append(dist.irecv(buf, peer))
            buffers.append((buf, incoming[peer]))
    for req in requests:
        req.wait()
    for buf, items in buffers:
        offset = 0
        for t in items:
            view = _view(out[t.name], t.split, t.dst_lo, t.hi - t.lo)
            view.copy_(buf[offset:offset + view.numel()].view(view.shape))
            offset += view.numel()
    return out


def bytes_received(transfers: list[Transfer], model: ModelSpec, bytes_per_value: int = 4) -> dict[int, int]:
    """Bytes each rank receives from other ranks (local copies excluded)."""
    specs = {p.name: p for p in param_specs(model)}
    out: dict[int, int] = {}
    for t in transfers:
        if t.src == t.dst:
            continue
        shape = list(specs[t.name].shape)
        if t.split is not None:
            shape[t.split] = t.hi - t.lo
        n = 1
        for d in shape:
            n *= d
        out[t.dst] = out.get(t.dst, 0) + n * bytes_per_value
    return out
