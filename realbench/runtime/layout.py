"""Layouts: where a model lives and how it is split, as explicit values.

A worker takes part in several layouts at once (the actor's generation layout and its training
layout, say), so nothing here is global: a `Layout` names the global ranks of its mesh and its
`ParallelDims`, and the process groups it needs are looked up in a `Groups` registry that is
passed to whoever communicates.

Rank placement inside a layout (REAL.md section 4): mesh index r = pp * (dp * tp) + dp * tp + tp,
i.e. tp innermost (consecutive devices), then dp, then pp.

Expert parallelism (a mixture of experts' `ep`, dividing dp): the dp replicas of a (tp rank, stage)
form groups of ep consecutive ones, each holding every expert once (replica d holds expert-parallel
rank d % ep's experts: realbench.runtime.experts); replicas with the same expert-parallel rank, one
per group, hold the same experts and average their gradients (`expert_dp_group`), as all dp
replicas do the rest's.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterator, NamedTuple, Optional


@dataclass(frozen=True)
class ParallelDims:
    dp: int
    tp: int
    pp: int
    v: int = 1  # virtual stages per rank (interleaved schedule; realbench.models.shards)
    ep: int = 1  # expert-parallel ranks, over the dp replicas (a mixture of experts)

    def __post_init__(self):
        for name in ("dp", "tp", "pp", "v", "ep"):
            if not isinstance(getattr(self, name), int) or getattr(self, name) < 1:
                raise ValueError(f"{name} must be a positive integer, got {getattr(self, name)!r}")
        if self.dp % self.ep:
            raise ValueError(f"ep {self.ep} does not divide dp {self.dp}")

    @property
    def size(self) -> int:
        return self.dp * self.tp * self.pp


class Coord(NamedTuple):
    dp: int
    tp: int
    pp: int


@dataclass(frozen=True)
class Layout:
    ranks: tuple[int, ...]  # global ranks of the mesh, in mesh order
    dims: ParallelDims

    def __post_init__(self):
        if len(self.ranks) != self.dims.size:
            raise ValueError(f"{len(self.ranks)} ranks for dp*tp*pp = {self.dims.size}")
        if len(set(self.ranks)) != len(self.ranks):
            raise ValueError("a rank appears twice in the layout")

    @classmethod
    def on(cls, ranks, dp: int, tp: int, pp: int, v: int = 1, ep: int = 1) -> "Layout":
        return cls(tuple(ranks), ParallelDims(dp, tp, pp, v, ep))

    def ep_rank(self, c: Coord) -> int:
        """Whose experts the rank at `c` holds: its replica's place in its group of ep."""
        return c.dp % self.dims.ep

    def rank_of(self, c: Coord) -> int:
        d = self.dims
        return self.ranks[c.pp * d.dp * d.tp + c.dp * d.tp + c.tp]

    def coord(self, rank: int) -> Optional[Coord]:
        """This rank's (dp, tp, pp) coordinates, or None if it is not in the layout."""
        try:
            r = self.ranks.index(rank)
        except ValueError:
            return None
        d = self.dims
        return Coord(dp=(r // d.tp) % d.dp, tp=r % d.tp, pp=r // (d.tp * d.dp))

    def coords(self) -> Iterator[Coord]:
        d = self.dims
        for pp in range(d.pp):
            for dp in range(d.dp):
                for tp in range(d.tp):
                    yield Coord(dp, tp, pp)

    def tp_group(self, c: Coord) -> tuple[int, ...]:
        return tuple(self.rank_of(Coord(c.dp, t, c.pp)) for t in range(self.dims.tp))

    def dp_group(self, c: Coord) -> tuple[int, ...]:
        return tuple(self.rank_of(Coord(d, c.tp, c.pp)) for d in range(self.dims.dp))

    def pp_group(self, c: Coord) -> tuple[int, ...]:
        return tuple(self.rank_of(Coord(c.dp, c.tp, p)) for p in range(self.dims.pp))

    def ep_group(self, c: Coord) -> tuple[int, ...]:
        """The ep replicas that hold every expert once between them (the all-to-alls' group)."""
        first = c.dp - c.dp % self.dims.ep
        return tuple(self.rank_of(Coord(first + e, c.tp, c.pp)) for e in range(self.dims.ep))

    def expert_dp_group(self, c: Coord) -> tuple[int, ...]:
        """The replicas that hold this rank's experts (one of each ep group): their gradients' average."""
        d = self.dims
        return tuple(self.rank_of(Coord(g * d.ep + c.dp % d.ep, c.tp, c.pp)) for g in range(d.dp // d.ep))

    def all_groups(self) -> list[tuple[int, ...]]:
        """Every tp, dp, pp (and with experts, ep and expert dp) group of the layout, in a fixed order
        (for group creation)."""
        out: list[tuple[int, ...]] = []
        for c in self.coords():
            experts = (self.ep_group(c), self.expert_dp_group(c)) if self.dims.ep > 1 else ()
            for g in (self.tp_group(c), self.dp_group(c), self.pp_group(c), *experts):
                if len(g) > 1 and g not in out:
                    out.append(g)
        return out


class Groups:
    """Process groups by member ranks. torch.distributed.new_group must be called by every
    process in the same order, so `prepare` is called with the same layouts on every rank
    before any communication; `get` then only looks groups up."""

    def __init__(self, timeout=None):
        self._groups: dict[tuple, object] = {}
        self._timeout = timeout

    def prepare(self, layouts) -> None:
        import torch.distributed as dist

        kwargs = {"timeout": self._timeout} if self._timeout is not None else {}
        for layout in layouts:
            keys = [(ranks, list(ranks)) for ranks in layout.all_groups()]
            if layout.dims.pp > 1:  # each pipeline's generation loop, see `loop`
                pipelines = {layout.pp_group(c) for c in layout.coords()}
                keys += [(("loop", p[-1], p[0]), sorted((p[-1], p[0]))) for p in sorted(pipelines)]
            for key, members in keys:
                if key not in self._groups:
                    self._groups[key] = dist.new_group(members, **kwargs)

    def get(self, ranks: tuple[int, ...]):
        if len(ranks) == 1:
            return None
        return self._groups[tuple(ranks)]

    def loop(self, pipeline: tuple[int, ...]):
        """The group of a pipeline's first and last stages. Generation sends its tokens back on
        it; it is not the group that carries the hidden states forward, so on NCCL (one ordered
        queue per communicator) the two directions cannot wait on each other. Training sums a
        tied embedding's gradients on it."""
        return self._groups[("loop", pipeline[-1], pipeline[0])]
