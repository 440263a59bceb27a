"""Parameter reallocation: move a model's shards from one layout to another (REAL.md section 7).

Every rank computes the same transfer list from the two layouts alone:
for each parameter and each destination rank that holds it in the new layout (its pp stage),
the slice it needs (its tp range) is intersected with the tp ranges of the source layout; each
non-empty intersection comes from one source rank of the stage holding that parameter, chosen
among the source's dp replicas: the destination itself when it already holds the data, else the
replica with the same dp index modulo the source's dp (spreading the load over replicas).
Each destination receives only its slices, point to point, and every rank turns the list into
its own messages once (`rank_plan`), so a reallocation repeated every step only walks that plan.
A large slice travels as its own message, read in place where it is contiguous in the source
tensor (a dim-0 range, a whole shard) and written in place where it is contiguous in the
destination tensor; only a strided side goes through one copy. Small slices, where a message's
fixed cost exceeds a copy's, are packed into one flat message per pair. Both sides derive the
same messages from the transfer list alone.
Copies are exact, so A -> B -> A gives back bit-identical weights.

Destinations may pass their tensors of layout B (`out`), which are then filled in place: a worker
keeps a call's placed model from step to step, so reallocation allocates nothing and the pages
it writes are already mapped.
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


# Below this many values a slice is packed with the others of its pair: on gloo over loopback a
# message costs about as much as copying some thousands of values (measured: 4096 moved the
# bench realloc pairs fastest among 4096, 16384, 65536, 262144 and packing everything).
DIRECT_MIN_VALUES = 4096


@dataclass(frozen=True)
class Slice:
    name: str
    split: Optional[int]  # None: the whole tensor
    start: int  # in this rank's tensor, along split
    length: int


@dataclass(frozen=True)
class PeerMessages:
    """What one rank sends to and receives from one peer, in message order: a message per
    direct slice, then one packed message with the others (when there are any)."""
    peer: int
    direct_send: tuple[Slice, ...]
    packed_send: tuple[Slice, ...]
    direct_recv: tuple[Slice, ...]
    packed_recv: tuple[Slice, ...]


@dataclass(frozen=True)
class RankPlan:
    rank: int
    local: tuple[tuple[Slice, Slice], ...]  # (from the source shards, into the destination shards)
    peers: tuple[PeerMessages, ...]


def _view(tensor: torch.Tensor, s: Slice) -> torch.Tensor:
    return tensor if s.split is None else tensor.narrow(s.split, s.start, s.length)


def _contiguous_slice(shape: tuple[int, ...], split: Optional[int], length: int) -> bool:
    """Whether narrow(split, ., length) of a contiguous tensor of `shape` is contiguous."""
    if split is None or length == shape[split]:
        return True
    return all(d == 1 for d in shape[:split])


def _numel(shape: tuple[int, ...], split: Optional[int], length: int) -> int:
    """Values in narrow(split, ., length) of a tensor of `shape` (the whole tensor if split is None)."""
    n = length if split is not None else 1
    for d, size in enumerate(shape):
        if d != split:
            n *= size
    return n


def is_direct(t: Transfer, spec: ParamSpec, src_tp: int, dst_tp: int) -> bool:
    """A transfer that travels as its own message: large, and contiguous on at least one side
    (so it costs at most one copy, never two)."""
    n = t.hi - t.lo
    src_shape, dst_shape = shard_shape(spec, src_tp), shard_shape(spec, dst_tp)
    return (_numel(src_shape, t.split, n) >= DIRECT_MIN_VALUES
            and (_contiguous_slice(src_shape, t.split, n) or _contiguous_slice(dst_shape, t.split, n)))


def rank_plan(model: ModelSpec, src: Layout, dst: Layout, rank: int,
              transfers: Optional[list[Transfer]] = None) -> RankPlan:
    """This rank's part of moving `model` from `src` to `dst`: local copies and messages per peer."""
    transfers = plan_transfers(model, src, dst) if transfers is None else transfers
    specs = {p.name: p for p in param_specs(model)}
    local = []
    sends: dict[int, tuple[list, list]] = {}
    recvs: dict[int, tuple[list, list]] = {}
    for t in transfers:
        if rank not in (t.src, t.dst):
            continue
        n = t.hi - t.lo
        from_src, into_dst = Slice(t.name, t.split, t.src_lo, n), Slice(t.name, t.split, t.dst_lo, n)
        if t.src == t.dst:
            local.append((from_src, into_dst))
            continue
        direct = is_direct(t, specs[t.name], src.dims.tp, dst.dims.tp)
        if t.src == rank:
            sends.setdefault(t.dst, ([], []))[0 if direct else 1].append(from_src)
        else:
            recvs.setdefault(t.src, ([], []))[0 if direct else 1].append(into_dst)
    peers = []
    for peer in sorted(set(sends) | set(recvs)):
        ds, ps = sends.get(peer, ([], []))
        dr, pr = recvs.get(peer, ([], []))
        peers.append(PeerMessages(peer, tuple(ds), tuple(ps), tuple(dr), tuple(pr)))
    return RankPlan(rank, tuple(local), tuple(peers))


class BoundReallocation:
    """A rank plan bound to the tensors it reads (`shards`, layout A) and writes (`out`, layout
    B). The views, and the packing and staging buffers, are made once: a worker reallocates
    between the same tensors every step (its master and placed models, updated in place), so a
    repeated reallocation only copies and communicates. Calling it runs one reallocation."""

    def __init__(self, plan: RankPlan, shards: dict[str, torch.Tensor], out: dict[str, torch.Tensor],
                 dtype: torch.dtype = torch.float32, device: str | torch.device = "cpu"):
        self.dtype, self.device = dtype, device
        self.local = [(_view(out[b.name], b), _view(shards[a.name], a)) for a, b in plan.local]
        self.pack: list[tuple[torch.Tensor, list[torch.Tensor]]] = []  # filled before sending
        self.unpack: list[tuple[torch.Tensor, list[torch.Tensor]]] = []  # emptied after receiving
        self.ops = []
        for m in plan.peers:
            self._post(dist.isend, m.peer, shards, m.direct_send, m.packed_send, self.pack)
            self._post(dist.irecv, m.peer, out, m.direct_recv, m.packed_recv, self.unpack)

    def _post(self, op, peer: int, tensors: dict, direct: tuple[Slice, ...], packed: tuple[Slice, ...],
              staged: list) -> None:
        """One message per direct slice, then one for the packed ones; a message whose data is
        not one contiguous view goes through a buffer of its own."""
        groups = [[_view(tensors[s.name], s)] for s in direct]
        if packed:
            groups.append([_view(tensors[s.name], s) for s in packed])
        for views in groups:
            if len(views) == 1 and views[0].is_contiguous():
                self.ops.append(dist.P2POp(op, views[0], peer))
            else:
                flat = torch.empty(sum(v.numel() for v in views), dtype=self.dtype, device=self.device)
                staged.append((flat, views))
                self.ops.append(dist.P2POp(op, flat, peer))

    def __call__(self) -> None:
        for flat, views in self.pack:
            _scatter(flat, views, into_views=False)
        # all messages are posted at once (one NCCL group on CUDA), so no pair waits on another
        requests = dist.batch_isend_irecv(self.ops) if self.ops else []
        for dst, src in self.local:  # while the messages travel
            dst.copy_(src)
        for req in requests:
            req.wait()
        for flat, views in self.unpack:
            _scatter(flat, views, into_views=True)


def _scatter(flat: torch.Tensor, views: list[torch.Tensor], into_views: bool) -> None:
    """Copy the consecutive parts of `flat` into the views, or the views into `flat`."""
    offset = 0
    for v in views:
        part = flat[offset:offset + v.numel()].view(v.shape)
        if into_views:
            v.copy_(part)
        else:
            part.copy_(v)
        offset += v.numel()


def reallocate(model: ModelSpec, src: Layout, dst: Layout, shards: dict[str, torch.Tensor], rank: int,
               dtype: torch.dtype = torch.float32, device: str | torch.device = "cpu",
               transfers: Optional[list[Transfer]] = None, out: Optional[dict[str, torch.Tensor]] = None,
               plan: Optional[RankPlan] = None) -> dict[str, torch.Tensor]:
    """This rank's shards in layout `dst`, given its shards in layout `src` (empty if it holds
    none): a one-off `BoundReallocation`. Every rank of either layout must call it with the
    same layouts. With `out`, the destination tensors are filled in place (and returned);
    `plan` is this rank's `rank_plan` (computed here when not given)."""
    plan = rank_plan(model, src, dst, rank, transfers) if plan is None else plan
    if out is None:
        out = {}
        coord = dst.coord(rank)
        if coord is not None:
            for p in param_specs(model):
                if in_stage(p, model.n_layers, dst.dims.pp, coord.pp):
                    out[p.name] = torch.empty(shard_shape(p, dst.dims.tp), dtype=dtype, device=device)
    BoundReallocation(plan, shards, out, dtype, device)()
    return out


def bytes_received(transfers: list[Transfer], model: ModelSpec, bytes_per_value: int = 4) -> dict[int, int]:
    """Bytes each rank receives from other ranks (local copies excluded)."""
    specs = {p.name: p for p in param_specs(model)}
    out: dict[int, int] = {}
    for t in transfers:
        if t.src == t.dst:
            continue
        n = _numel(specs[t.name].shape, t.split, t.hi - t.lo)
        out[t.dst] = out.get(t.dst, 0) + n * bytes_per_value
    return out
