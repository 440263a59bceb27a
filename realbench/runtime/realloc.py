"""Parameter reallocation: move a model's shards from one layout to another (REAL.md section 7).

Every rank computes the same transfer list from the two layouts alone:
for each parameter and each destination rank that holds it in the new layout (its pp stage),
the slice it needs (its tp range) is intersected with the tp ranges of the source layout; each
non-empty intersection comes from one source rank of the stage holding that parameter, chosen
among the source's dp replicas: the destination itself when it already holds the data, else the
replica with the same dp index modulo the source's dp (spreading the load over replicas).
Each destination receives only its slices, point to point, and every rank turns the list into
its own messages once (`rank_plan`), so a reallocation repeated every step only walks that plan.
Each pair of ranks exchanges one message per direction, whatever the number of tensors (a
message's fixed cost is what makes many small ones slow). A stage keeps its shards in one flat
buffer (`shards.flat_offsets`), so a message whose slices lie there in order, as whole shards
and row ranges do, is sent straight from that buffer or received straight into it; only a side
where they do not (column ranges, slices interleaved with others) goes through one copy. Both
sides derive the same messages from the transfer list alone.
Copies are exact, so A -> B -> A gives back bit-identical weights. A tied head (see
`shards.tied_aliases`) is sent only to a layout that keeps it apart from the embedding; a
source that keeps it in its embedding serves it from there.

Destinations may pass their tensors of layout B (`out`), which are then filled in place: a worker
keeps a call's placed model from step to step, so reallocation allocates nothing and the pages
it writes are already mapped.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Optional

import torch
import torch.distributed as dist

from realbench.models import ModelSpec
from realbench.runtime.layout import Coord, Layout
from realbench.models.shards import (ParamSpec, expert_rank, flat_offsets, flat_views, in_stage, param_specs,
                                      shard_shape, tied_aliases, tp_range)


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


def _stage_of(spec: ParamSpec, n_layers: int, pp: int, v: int) -> int:
    return next(s for s in range(pp) if in_stage(spec, n_layers, pp, s, v))


def plan_transfers(model: ModelSpec, src: Layout, dst: Layout, names: Optional[Callable[[str], bool]] = None
                   ) -> list[Transfer]:
    """`names`: move only the parameters it accepts (the adapters alone, say); None: all. A routed
    expert's weights come from the source replicas that hold that expert and go to the destination
    ranks that hold it (expert parallelism: realbench.runtime.layout)."""
    L = model.n_layers
    out = []
    stored_once = tied_aliases(model, dst.dims.pp)  # a tied head the destination keeps in its embedding
    for p in param_specs(model):
        if p.name in stored_once or (names is not None and not names(p.name)):
            continue
        s_stage = _stage_of(p, L, src.dims.pp, src.dims.v)
        # the source replicas that hold it (all of them, unless it is an expert's)
        s_holds = [d for d in range(src.dims.dp) if expert_rank(p, model, src.dims.ep) in (-1, d % src.dims.ep)]
        d_owner = expert_rank(p, model, dst.dims.ep)
        for c in dst.coords():
            if not in_stage(p, L, dst.dims.pp, c.pp, dst.dims.v) or d_owner not in (-1, dst.ep_rank(c)):
                continue
            r = dst.rank_of(c)
            if p.split is None:  # replicated: one copy from any source rank of the stage
                holders = [src.rank_of(Coord(d, t, s_stage)) for d in s_holds for t in range(src.dims.tp)]
                sender = r if r in holders else holders[(c.dp * dst.dims.tp + c.tp) % len(holders)]
                out.append(Transfer(p.name, sender, r, None, 0, p.shape[0], 0, 0))
                continue
            need_lo, need_hi = tp_range(p, dst.dims.tp, c.tp)
            for t in range(src.dims.tp):
                have_lo, have_hi = tp_range(p, src.dims.tp, t)
                lo, hi = max(need_lo, have_lo), min(need_hi, have_hi)
                if lo >= hi:
                    continue
                replicas = [src.rank_of(Coord(d, t, s_stage)) for d in s_holds]
                sender = r if r in replicas else replicas[c.dp % len(replicas)]
                out.append(Transfer(p.name, sender, r, p.split, lo, hi, lo - have_lo, lo - need_lo))
    return out


# A sender reads a message straight from its flat buffer when the message's slices lie there in
# order with gaps (shards the receiver does not need, such as a norm it gets from another
# replica) of at most this fraction of the span: sending a few unneeded values costs less than
# packing the rest.
MAX_GAP_FRACTION = 1 / 8


@dataclass(frozen=True)
class Slice:
    name: str
    split: Optional[int]  # None: the whole tensor
    start: int  # in this rank's tensor, along split
    length: int


@dataclass(frozen=True)
class Message:
    """The one message between this rank and `peer` in one direction: this rank's slices, where
    each starts in the message (values), the message's length, and where the message lies in
    this rank's flat stage buffer when it is sent from or received into that buffer in place
    (`in_place_at`; None: through a staging buffer, one copy)."""
    peer: int
    slices: tuple[Slice, ...]
    offsets: tuple[int, ...]
    length: int
    in_place_at: Optional[int]


@dataclass(frozen=True)
class RankPlan:
    rank: int
    local: tuple[tuple[Slice, Slice], ...]  # (from the source shards, into the destination shards)
    sends: tuple[Message, ...]
    recvs: tuple[Message, ...]


def _view(tensor: torch.Tensor, s: Slice) -> torch.Tensor:
    return tensor if s.split is None else tensor.narrow(s.split, s.start, s.length)


def _numel(shape: tuple[int, ...], split: Optional[int], length: int) -> int:
    """Values in narrow(split, ., length) of a tensor of `shape` (the whole tensor if split is None)."""
    n = length if split is not None else 1
    for d, size in enumerate(shape):
        if d != split:
            n *= size
    return n


def _flat_position(s: Slice, shape: tuple[int, ...], start: int) -> Optional[int]:
    """Where slice `s` of a shard of `shape`, stored from `start` in a flat buffer, begins there;
    None when the slice is not contiguous (a column range of a matrix, say)."""
    if s.split is None or s.length == shape[s.split]:
        return start
    if any(d != 1 for d in shape[:s.split]):
        return None
    return start + s.start * math.prod(shape[s.split + 1:])


def _pair_messages(model: ModelSpec, specs: dict[str, ParamSpec], src: Layout, dst: Layout, sender: int,
                   receiver: int, transfers: list[Transfer]) -> tuple[Message, Message]:
    """The message from `sender` (layout src) to `receiver` (layout dst) with the given transfers,
    as each of the two sees it. Both ranks compute it from the layouts alone. Order: the sender's
    memory order when it can send in place, else the receiver's (which may then receive in place)."""
    src_at = stage_offsets(model, src, sender)
    dst_at = stage_offsets(model, dst, receiver)
    items = []  # (slice in the sender's shard, in the receiver's, values, flat positions on each side)
    for t in transfers:
        n = t.hi - t.lo
        a, b = Slice(t.name, t.split, t.src_lo, n), Slice(t.name, t.split, t.dst_lo, n)
        spec = specs[t.name]
        src_shape, dst_shape = shard_shape(spec, src.dims.tp), shard_shape(spec, dst.dims.tp)
        items.append((a, b, _numel(src_shape, t.split, n), _flat_position(a, src_shape, src_at[t.name]),
                      _flat_position(b, dst_shape, dst_at[t.name])))
    values = sum(it[2] for it in items)
    send_at = None
    if all(it[3] is not None for it in items):
        items.sort(key=lambda it: it[3])
        lo, hi = items[0][3], max(it[3] + it[2] for it in items)
        if (hi - lo) - values <= MAX_GAP_FRACTION * (hi - lo):
            send_at, offsets, length = lo, [it[3] - lo for it in items], hi - lo
    if send_at is None:
        items.sort(key=lambda it: (it[4] is None, it[4] or 0))
        offsets = [sum(it[2] for it in items[:i]) for i in range(len(items))]
        length = values
    recv_at = None
    shifts = {(it[4] - o) if it[4] is not None else None for it, o in zip(items, offsets)}
    if length == values and len(shifts) == 1 and None not in shifts:
        recv_at = shifts.pop()
    return (Message(receiver, tuple(it[0] for it in items), tuple(offsets), length, send_at),
            Message(sender, tuple(it[1] for it in items), tuple(offsets), length, recv_at))


def rank_plan(model: ModelSpec, src: Layout, dst: Layout, rank: int,
              transfers: Optional[list[Transfer]] = None, names: Optional[Callable[[str], bool]] = None) -> RankPlan:
    """This rank's part of moving `model` from `src` to `dst` (the parameters `names` accepts):
    local copies, and one message to and from each peer it exchanges data with."""
    transfers = plan_transfers(model, src, dst, names) if transfers is None else transfers
    specs = {p.name: p for p in param_specs(model)}
    local = []
    pairs: dict[tuple[int, int], list[Transfer]] = {}
    for t in transfers:
        if rank not in (t.src, t.dst):
            continue
        if t.src == t.dst:
            n = t.hi - t.lo
            local.append((Slice(t.name, t.split, t.src_lo, n), Slice(t.name, t.split, t.dst_lo, n)))
        else:
            pairs.setdefault((t.src, t.dst), []).append(t)
    sends, recvs = [], []
    for (a, b), pair in sorted(pairs.items()):
        send, recv = _pair_messages(model, specs, src, dst, a, b, pair)
        (sends if a == rank else recvs).append(send if a == rank else recv)
    return RankPlan(rank, tuple(local), tuple(sends), tuple(recvs))


def _in_place(views: list[torch.Tensor], m: Message) -> Optional[torch.Tensor]:
    """The message as one view of the flat buffer that holds `views`, if they lie where the
    message says (a worker's models do; tensors made one by one do not)."""
    if not views or any(not v.is_contiguous() for v in views):
        return None
    storage = views[0].untyped_storage().data_ptr()
    base = views[0].storage_offset() - m.offsets[0]
    if any(v.untyped_storage().data_ptr() != storage or v.storage_offset() - o != base
           for v, o in zip(views, m.offsets)):
        return None
    return torch.as_strided(views[0], (m.length,), (1,), base)


class BoundReallocation:
    """A rank plan bound to the tensors it reads (`shards`, layout A) and writes (`out`, layout
    B). The views, and the staging buffers, are made once: a worker reallocates between the same
    tensors every step (its master and placed models, updated in place), so a repeated
    reallocation only copies and communicates. Calling it runs one reallocation.
    `staged_values` counts the values that go through a staging buffer (a copy) per call."""

    def __init__(self, plan: RankPlan, shards: dict[str, torch.Tensor], out: dict[str, torch.Tensor],
                 dtype: torch.dtype = torch.float32, device: str | torch.device = "cpu"):
        self.dtype, self.device = dtype, device
        self.local = [(_view(out[b.name], b), _view(shards[a.name], a)) for a, b in plan.local]
        self.pack: list[tuple[torch.Tensor, list]] = []  # filled before sending
        self.unpack: list[tuple[torch.Tensor, list]] = []  # per received message, emptied after it arrives
        self.ops, self.staged_values = [], 0
        for m in plan.sends:
            self.ops.append(dist.P2POp(dist.isend, self._buffer(m, shards, self.pack), m.peer))
        for m in plan.recvs:
            self.ops.append(dist.P2POp(dist.irecv, self._buffer(m, out, self.unpack), m.peer))

    def _buffer(self, m: Message, tensors: dict[str, torch.Tensor], staged: list) -> torch.Tensor:
        """The tensor that message `m` is sent from or received into: a view of the flat buffer,
        or a staging buffer (its copies listed in `staged`; an empty list when in place)."""
        views = [_view(tensors[s.name], s) for s in m.slices]
        buffer = _in_place(views, m) if m.in_place_at is not None else None
        if buffer is None:
            # zeros: the gaps of a message that the sender reads in place travel as they are
            buffer = torch.zeros(m.length, dtype=self.dtype, device=self.device)
            self.staged_values += m.length
            staged.append((buffer, list(zip(m.offsets, views))))
        else:
            staged.append((buffer, []))
        return buffer

    def __call__(self) -> None:
        for buffer, parts in self.pack:
            for offset, v in parts:
                buffer[offset:offset + v.numel()].view(v.shape).copy_(v)
        # all messages are posted at once (one NCCL group on CUDA), so no pair waits on another
        requests = dist.batch_isend_irecv(self.ops) if self.ops else []
        for dst, src in self.local:  # while the messages travel
            dst.copy_(src)
        sent = len(self.pack)
        for req, (buffer, parts) in zip(requests[sent:], self.unpack):
            req.wait()  # copying out one message while the later ones still arrive
            for offset, v in parts:
                v.copy_(buffer[offset:offset + v.numel()].view(v.shape))
        for req in requests[:sent]:
            req.wait()


def empty_shards(model: ModelSpec, layout: Layout, rank: int, dtype: torch.dtype = torch.float32,
                 device: str | torch.device = "cpu") -> dict[str, torch.Tensor]:
    """Uninitialised shards of `rank` in `layout`, as views of one flat buffer (as a LlamaStage
    holds them); empty if the rank is not in the layout."""
    coord = layout.coord(rank)
    if coord is None:
        return {}
    where = (model, layout.dims.tp, layout.dims.pp, coord.pp, layout.dims.v, layout.dims.ep, layout.ep_rank(coord))
    flat = torch.empty(flat_offsets(*where)[1], dtype=dtype, device=device)
    return flat_views(flat, *where)


def stage_offsets(model: ModelSpec, layout: Layout, rank: int) -> dict[str, int]:
    """Where each of `rank`'s shards starts in its stage's flat buffer (shards.flat_offsets)."""
    c, d = layout.coord(rank), layout.dims
    return flat_offsets(model, d.tp, d.pp, c.pp, d.v, d.ep, layout.ep_rank(c))[0]


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
        out = empty_shards(model, dst, rank, dtype, device)
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
