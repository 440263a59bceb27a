"""Would this run deadlock on NCCL? Record every torch.distributed call of a run on gloo, then
replay the records under NCCL's rules.

gloo buffers a send, so two ranks that send to each other before receiving pass on the CPU and
hang on GPUs. NCCL's rules, as the replay applies them:
  * each communicator has one stream per rank: its operations start in the order issued
    (a process group's collectives and batched point-to-point operations share its full
    communicator; a lone send or receive uses a communicator of the two ranks);
  * a point-to-point operation completes only when the peer's matching one (the k-th send from
    a to b on that communicator matches b's k-th receive from a, with the same size and dtype)
    has started: a rendezvous, the strictest protocol NCCL may use;
  * a collective completes when every member has started it; a batch (`batch_isend_irecv`, one
    NCCL group) starts as one and completes when all its operations have;
  * a `wait` on an operation makes everything issued after it on that rank wait for it (taken
    as blocking the host, which is stricter than NCCL's stream wait);
  * the first lone send or receive between two ranks on a process group creates their
    communicator, which blocks both hosts until the other one gets there too.
Sizes must match exactly (NCCL does not check them: a mismatch corrupts or hangs). `replay`
says how the rules are combined.
"""

from __future__ import annotations

from collections import defaultdict, deque
from dataclasses import dataclass

import torch.distributed as dist
import torch.distributed.distributed_c10d as c10d


@dataclass(frozen=True)
class Op:
    kind: str  # send | recv | the collective's name
    peer: int  # global rank for send/recv; -1 for collectives
    numel: int
    dtype: str


@dataclass(frozen=True)
class Entry:
    index: int
    comm: tuple  # (group name, "all") or (group name, "pair", low rank, high rank)
    members: tuple[int, ...]  # the communicator's global ranks
    ops: tuple[Op, ...]
    waited: tuple[int, ...]  # entries waited on before this one was issued


class _Waited:
    def __init__(self, work, recorder, index):
        self._work, self._recorder, self._index = work, recorder, index

    def wait(self, *args, **kwargs):
        self._recorder.waits.add(self._index)
        return self._work.wait(*args, **kwargs)

    def __getattr__(self, name):
        return getattr(self._work, name)


class Recorder:
    """Patches torch.distributed in this process; `entries` is what it issued, in order."""

    def __init__(self):
        self.entries: list[Entry] = []
        self.waits: set[int] = set()
        self._batch: list | None = None
        self._saved: list = []

    def _group(self, group):
        g = group if group is not None else c10d._get_default_group()
        return g.group_name, tuple(dist.get_process_group_ranks(g))

    def _add(self, comm, members, ops) -> int:
        self.entries.append(Entry(len(self.entries), comm, members, tuple(ops), tuple(sorted(self.waits))))
        return len(self.entries) - 1

    def _p2p(self, original, kind):
        def op(tensor, peer=None, group=None, tag=0, **kwargs):
            name, members = self._group(group)
            peer = kwargs.get("dst", kwargs.get("src")) if peer is None else peer  # global rank
            if peer is None:  # a rank of the group
                peer = members[kwargs.get("group_dst", kwargs.get("group_src"))]
            record = Op(kind, peer, tensor.numel(), str(tensor.dtype))
            work = original(tensor, None, group, tag, **({"group_dst": members.index(peer)} if kind == "send"
                                                          else {"group_src": members.index(peer)}))
            if self._batch is not None:
                self._batch.append(record)
                return _Waited(work, self, len(self.entries))  # the batch's entry, added when it ends
            me = dist.get_rank()
            index = self._add((name, "pair", min(me, peer), max(me, peer)), (min(me, peer), max(me, peer)), [record])
            return _Waited(work, self, index)
        return op

    def _batched(self, original):
        def batch(ops):
            self._batch = []
            try:
                works = original(ops)
            finally:
                recorded, self._batch = self._batch, None
            name, members = self._group(ops[0].group)
            index = self._add((name, "all"), members, recorded)
            return [_Waited(w, self, index) for w in works]
        return batch

    def _collective(self, original, kind):
        def collective(*args, group=None, async_op=False, **kwargs):
            tensor = args[1] if kind == "all_gather" else (args[0] if args else None)
            name, members = self._group(group)
            op = Op(kind, -1, tensor.numel() if tensor is not None else 0, str(tensor.dtype) if tensor is not None else "")
            index = self._add((name, "all"), members, [op])
            work = original(*args, group=group, async_op=async_op, **kwargs)
            if not async_op:
                self.waits.add(index)
                return work
            return _Waited(work, self, index)
        return collective

    def install(self) -> "Recorder":
        patches = {"isend": self._p2p(c10d.isend, "send"), "irecv": self._p2p(c10d.irecv, "recv"),
                   "batch_isend_irecv": self._batched(c10d.batch_isend_irecv)}
        for kind in ("all_reduce", "all_gather", "broadcast", "barrier"):
            patches[kind] = self._collective(getattr(c10d, kind), kind)
        for name, fn in patches.items():
            for module in (dist, c10d):
                self._saved.append((module, name, getattr(module, name)))
                setattr(module, name, fn)
        return self

    def uninstall(self) -> None:
        for module, name, fn in reversed(self._saved):
            setattr(module, name, fn)
        self._saved.clear()


def recorded_steps(rank: int, world: int, runs: list, steps: int, seed: int = 0) -> list[tuple[list, list]]:
    """Run each (scenario, options) of `runs` for `steps` steps on this rank, one after the
    other in the same processes (for `local.spawn`); per run, the step records (as dicts) and
    the entries it issued."""
    import dataclasses

    from realbench.runtime.worker import run_steps

    out = []
    for scenario, options in runs:
        recorder = Recorder().install()
        try:
            records = [dataclasses.asdict(r) for r in run_steps(rank, scenario, options, steps, seed)]
        finally:
            recorder.uninstall()
        out.append((records, recorder.entries))
    return out


class NcclOrderError(AssertionError):
    pass


def _match(traces: list[list[Entry]]) -> list[tuple]:
    """The groups of entries whose operations complete together: the k-th send from a to b on a
    communicator with b's k-th receive from a there; the k-th collective on a communicator
    across its members. Raises NcclOrderError on a missing or mismatched counterpart."""
    sends, recvs, collectives = defaultdict(list), defaultdict(list), defaultdict(list)
    for r, entries in enumerate(traces):
        count: dict[tuple, int] = defaultdict(int)
        for e in entries:
            for op in e.ops:
                if op.kind == "send":
                    sends[(e.comm, r, op.peer)].append(((r, e.index), op))
                elif op.kind == "recv":
                    recvs[(e.comm, op.peer, r)].append(((r, e.index), op))
                else:
                    collectives[(e.comm, e.members, count[e.comm])].append(((r, e.index), op))
                    count[e.comm] += 1
    matches = []
    for key in set(sends) | set(recvs):
        s, v = sends.get(key, []), recvs.get(key, [])
        comm, a, b = key
        if len(s) != len(v):
            raise NcclOrderError(f"{len(s)} sends from rank {a} to {b} on {comm} but {len(v)} receives")
        for k, ((se, so), (re, ro)) in enumerate(zip(s, v)):
            if (so.numel, so.dtype) != (ro.numel, ro.dtype):
                raise NcclOrderError(f"message {k} from rank {a} to {b} on {comm}: sends {so.numel} x {so.dtype}, "
                                     f"receives {ro.numel} x {ro.dtype}")
            matches.append((se, re))
    for (comm, members, k), parts in collectives.items():
        if len(parts) != len(members) or len({(op.kind, op.numel) for _, op in parts}) != 1:
            raise NcclOrderError(f"collective {k} on {comm}: members issue "
                                 f"{sorted((e[0], op.kind, op.numel) for e, op in parts)}")
        matches.append(tuple(e for e, _ in parts))
    return matches


def replay(traces: list[list[Entry]]) -> int:
    """Replay every rank's entries under NCCL's rules (module docstring). Raises NcclOrderError
    naming where each rank is stuck if the run would hang, or the first mismatched pair; returns
    the number of entries replayed.

    The replay is a graph of conditions, each holding once all its prerequisites hold:
      reached(e)   the host got to e: e's predecessor was issued, and every operation waited on
                   before e completed (a wait is taken to block the host: stricter than NCCL,
                   where it blocks the compute stream, and the runtime synchronises after each
                   event anyway)
      issued(e)    reached(e), and for the first lone send/receive between two ranks on a process
                   group, the peer reached its first one too: the pair's communicator is created
                   then, by both ranks at once
      started(e)   issued(e) and the previous entry on e's communicator completed (one stream each)
      matched(m)   every entry of match m started
      completed(e) every match with an operation of e fired
    With only "and" conditions, whatever holds under these rules holds under looser ones: a run
    that completes here completes on NCCL."""
    prereqs: dict[tuple, list] = defaultdict(list)
    for r, entries in enumerate(traces):
        last_on: dict[tuple, int] = {}
        first_pair: dict[tuple, int] = {}
        for e in entries:
            if e.index > 0:
                prereqs[("reached", r, e.index)].append(("issued", r, e.index - 1))
            prereqs[("reached", r, e.index)] += [("completed", r, w) for w in e.waited]
            prereqs[("issued", r, e.index)].append(("reached", r, e.index))
            if e.comm[1] == "pair" and e.comm not in first_pair:
                first_pair[e.comm] = e.index
            prereqs[("started", r, e.index)].append(("issued", r, e.index))
            if e.comm in last_on:
                prereqs[("started", r, e.index)].append(("completed", r, last_on[e.comm]))
            last_on[e.comm] = e.index
        for comm, index in first_pair.items():
            peer = comm[2] if comm[3] == r else comm[3]
            other = next((f.index for f in traces[peer] if f.comm == comm), None)
            if other is not None:  # else _match reports the missing counterpart
                prereqs[("issued", r, index)].append(("reached", peer, other))
    for m, entries in enumerate(_match(traces)):
        prereqs[("matched", m)] = [("started", r, i) for r, i in set(entries)]
        for r, i in entries:
            prereqs[("completed", r, i)].append(("matched", m))
    waiting = {node: len(set(p)) for node, p in prereqs.items()}
    unlocks: dict[tuple, list] = defaultdict(list)
    for node, p in prereqs.items():
        for q in set(p):
            unlocks[q].append(node)
    nodes = set(prereqs) | set(unlocks)
    ready = deque(n for n in nodes if waiting.get(n, 0) == 0)
    holds = set()
    while ready:
        node = ready.popleft()
        holds.add(node)
        for n in unlocks[node]:
            waiting[n] -= 1
            if waiting[n] == 0:
                ready.append(n)
    entries = [(r, e.index) for r, t in enumerate(traces) for e in t]
    stuck = [(r, i) for r, i in entries if ("completed", r, i) not in holds]
    if stuck:
        lines, seen = [], set()
        for r, i in stuck:
            if r in seen:
                continue
            seen.add(r)
            e = traces[r][i]
            where = next(s for s in ("reached", "issued", "started", "completed") if (s, r, i) not in holds)
            lines.append(f"rank {r}: entry {i} on {e.comm} never {where}: {[(o.kind, o.peer, o.numel) for o in e.ops]}")
        raise NcclOrderError("would hang on NCCL; first stuck operation per rank:\n" + "\n".join(lines))
    return len(entries)
