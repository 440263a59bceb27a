"""verl's dynamic batching, as it forms a GPU's micro-batches from a step's real row lengths.

With `use_dynamic_bsz` (and always for the V1 critic) verl splits a GPU's rows of a call into
micro-batches of at most `max_token_len` tokens, each row counted by its attention mask's sum (the
prompt and the response as long as it ran), by `rearrange_micro_batches`
(verl/utils/seqlen_balancing.py:348-505, called by workers/engine/utils.py:92-128 with
`same_micro_num_in_dp=True`):

    n = min(rows, ceil(tokens / max_token_len)), the largest over the data-parallel ranks,
        rounded up to a multiple of `num_batches_divided_by` (Megatron with virtual stages:
        microbatch_group_size_per_vp_stage, the pipeline's size; workers/engine/megatron/
        transformer_impl.py:873-877; else none);
    then, until every rank's partition keeps each micro-batch within max_token_len:
        each rank partitions its rows into n by their workloads (calculate_workload:
        24576 s + s^2 for a row of s tokens) with the largest differencing method
        (karmarkar_karp, equal_size False), and n grows by that multiple (or 1).

`ceil(tokens / budget)` is only a lower bound: rows are indivisible, and the partition balances
workloads (which grow with a row's square), not tokens. So the count is at least one more than
the mean tokens suggest wherever the heaviest rank's rows do not fill its micro-batches evenly.
realbench counts it on the first `DRAWS` steps `StepRows` draws from the scenario's response
lengths (every row at its cap without them), the mean over the steps: `mean_count`; where a
step's rows are all alike, the partition is as even as rows allow (ceil(rows / n) a part: the
largest differencing method's, checked for every count up to 129 rows in the tests). The partition here is the
same algorithm as verl's, ties broken as verl breaks them; the tests check its counts against
verl's own function (`verl_check.py count`).
"""

from __future__ import annotations

import heapq
import math
from functools import lru_cache
from typing import Optional, Sequence

import numpy as np

from realbench.engines.areal_packer import StepRows

# the steps counted, of those StepRows draws (the partition runs in Python: a search asks for many counts)
DRAWS = 16
LINEAR, SQUARE = 24576, 1  # calculate_workload (verl/utils/seqlen_balancing.py:27-46): 24576 s + s^2


def workload(tokens: int) -> int:
    """verl's estimate of a row's compute: linear in its tokens (the dense layers of a 7B model,
    hidden 4096) plus their square (attention)."""
    return LINEAR * tokens + SQUARE * tokens * tokens


class _Set:
    """One part of a partition: its items (index, value) and their sum; ordered by sum, then size,
    then items (verl's Set)."""

    __slots__ = ("sum", "items")

    def __init__(self, items: list[tuple[int, int]], total: int) -> None:
        self.items, self.sum = items, total

    def key(self) -> tuple:
        return self.sum, len(self.items), self.items


class _State:
    """k parts, largest first; the heap pops the state with the largest spread first (ties: the
    one whose largest part is larger)."""

    __slots__ = ("sets",)

    def __init__(self, sets: list[_Set]) -> None:
        self.sets = sorted(sets, key=_Set.key, reverse=True)

    @property
    def spread(self) -> int:
        return self.sets[0].sum - self.sets[-1].sum

    def __lt__(self, other: "_State") -> bool:
        if self.spread != other.spread:
            return self.spread > other.spread
        return self.sets[0].key() > other.sets[0].key()

    def merged(self, other: "_State") -> "_State":
        """Each part joined with the other state's part of the opposite rank (largest with smallest)."""
        return _State([_Set(a.items + b.items, a.sum + b.sum) for a, b in zip(self.sets, reversed(other.sets))])


def partition(values: Sequence[int], k: int) -> list[list[int]]:
    """The largest differencing method's k-way partition of `values` (their indices, each part
    sorted), parts of any size: start from one state per value (the value alone in a part), take
    the two states of largest spread, join them part by part (the one's largest with the other's
    smallest), until one state is left."""
    if not 1 <= k <= len(values):
        raise ValueError(f"{len(values)} rows cannot make {k} non-empty micro-batches")
    heap: list[_State] = []
    for value, index in sorted((int(v), i) for i, v in enumerate(values)):
        heapq.heappush(heap, _State([_Set([(index, value)], value)] + [_Set([], 0) for _ in range(k - 1)]))
    while len(heap) > 1:
        first, second = heapq.heappop(heap), heapq.heappop(heap)
        heapq.heappush(heap, first.merged(second))
    return [sorted(i for i, _ in s.items) for s in heap[0].sets]


def count(tokens: np.ndarray, budget: int, divided_by: Optional[int] = None) -> Optional[int]:
    """The micro-batches verl forms of one step: `tokens` (ranks, rows), each rank's rows' tokens,
    within `budget` tokens a micro-batch (every row within it: verl asserts so); None where the
    multiple it must be (`divided_by`) outgrows the rows, which verl refuses."""
    ranks, rows = tokens.shape
    if int(tokens.max(initial=0)) > budget:
        raise ValueError(f"a row of {int(tokens.max())} tokens is longer than the budget of {budget}")
    n = max(min(rows, math.ceil(int(t.sum()) / budget)) for t in tokens)
    step = divided_by or 1
    n = math.ceil(n / step) * step
    loads = [[workload(int(s)) for s in t] for t in tokens]

    def within(t: np.ndarray, w: list[int]) -> bool:
        if t.min() == t.max():  # rows alike: the partition is as even as can be (ceil(rows / n) a part)
            return math.ceil(rows / n) * int(t[0]) <= budget
        return all(int(t[p].sum()) <= budget for p in partition(w, n))

    while n <= rows:
        if all(within(t, w) for t, w in zip(tokens, loads)):
            return n
        n += step
    return None


def mean_count(step: StepRows, rows: int, ranks: int, budget: int, divided_by: Optional[int] = None
               ) -> Optional[float]:
    """verl's micro-batches of `rows` a GPU on `ranks` data-parallel ranks within `budget` tokens,
    on average over the steps `step` draws (None: a step verl refuses)."""
    return _mean_count(step, rows, ranks, int(budget), divided_by)


# (a search's listing asks for the same few counts again and again: remembered)
@lru_cache(maxsize=4096)
def _mean_count(step: StepRows, rows: int, ranks: int, budget: int, divided_by: Optional[int]) -> Optional[float]:
    counts = [count(t, budget, divided_by) for t in step.tokens(rows, ranks)[:DRAWS]]
    return None if None in counts else float(np.mean(counts))
