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
verl's own function (`check.py count`).
"""

from __future__ import annotations

import heapq
import math
from functools import lru_cache, partial
from typing import Callable, Optional, Sequence

import numpy as np

from realbench.engines.batches import StepRows

# the steps counted, of those StepRows draws (the partition runs in Python: a search asks for many counts)
DRAWS = 16
LINEAR, SQUARE = 24576, 1  # calculate_workload (verl/utils/seqlen_balancing.py:27-46): 24576 s + s^2


def workload(tokens: int) -> int:
    """verl's estimate of a row's compute: linear in its tokens (the dense layers of a 7B model,
    hidden 4096) plus their square (attention)."""
    return LINEAR * tokens + SQUARE * tokens * tokens


def _state(parts: list[tuple[int, int, int, tuple]], k: int) -> tuple:
    """A state of k parts, of which `parts` are those holding rows, each (sum, size, first index,
    rows); the rest are empty. Its parts largest first, keyed for the heap: the largest spread
    first, ties to the state whose largest part is larger (verl's State.__lt__).
    verl orders parts (its Sets) by sum, then size, then their (index, value) lists. Two parts
    compared never share a row, so their lists differ at the first pair: comparing the first
    indices is the same, and the rows (nested pairs, listed at the end) are never compared."""
    parts.sort(reverse=True)
    top = parts[0]
    return ((parts[-1][0] if len(parts) == k else 0) - top[0], -top[0], -top[1], -top[2], parts)


def _merged(first: list, second: list, k: int) -> list:
    """Each of the k parts of `first` joined with the part of the opposite rank of `second`
    (largest with smallest): part i with second's part k - 1 - i, of which only the first
    len(second) hold rows. A joined part's rows are the first's, then the second's."""
    p, q = len(first), len(second)
    out = [first[i] if i < k - q else
           (first[i][0] + second[k - 1 - i][0], first[i][1] + second[k - 1 - i][1], first[i][2],
            (first[i][3], second[k - 1 - i][3]))
           for i in range(p)]
    out += [second[k - 1 - i] for i in range(max(p, k - q), k)]
    return out


def _indices(rows) -> list[int]:
    """The row indices of a part's nested pairs."""
    out, stack = [], [rows]
    while stack:
        node = stack.pop()
        if isinstance(node, tuple):
            stack.extend(node)
        else:
            out.append(node)
    return sorted(out)


def partition(values: Sequence[int], k: int) -> list[list[int]]:
    """The largest differencing method's k-way partition of `values` (their indices, each part
    sorted), parts of any size: start from one state per value (the value alone in a part), take
    the two states of largest spread, join them part by part (the one's largest with the other's
    smallest), until one state is left. (A state keeps only its parts that hold rows: a merge of
    states with few costs as little, whatever k.)"""
    if not 1 <= k <= len(values):
        raise ValueError(f"{len(values)} rows cannot make {k} non-empty micro-batches")
    heap = [_state([(value, 1, index, index)], k) for value, index in sorted((int(v), i) for i, v in enumerate(values))]
    heapq.heapify(heap)
    while len(heap) > 1:
        first, second = heapq.heappop(heap)[-1], heapq.heappop(heap)[-1]
        heapq.heappush(heap, _state(_merged(first, second, k), k))
    parts = [_indices(part[3]) for part in heap[0][-1]]
    return parts + [[] for _ in range(k - len(parts))]


def heaviest(tokens: np.ndarray, n: int) -> int:
    """The most tokens of any of the `n` micro-batches one rank's rows (`tokens`) are partitioned
    into by their workloads."""
    if tokens.min() == tokens.max():  # rows alike: the partition is as even as can be (ceil(rows / n) a part)
        return math.ceil(len(tokens) / n) * int(tokens[0])
    return max(int(tokens[p].sum()) for p in partition([workload(int(s)) for s in tokens], n))


def count(tokens: np.ndarray, budget: int, divided_by: Optional[int] = None,
          heaviest_of: Optional[Callable[[int], int]] = None) -> Optional[int]:
    """The micro-batches verl forms of one step: `tokens` (ranks, rows), each rank's rows' tokens,
    within `budget` tokens a micro-batch (every row within it: verl asserts so); None where the
    multiple it must be (`divided_by`) outgrows the rows, which verl refuses. `heaviest_of(n)`:
    the most tokens of a micro-batch of any rank in n (a partition does not depend on the
    budget, so a caller pricing many budgets remembers them)."""
    ranks, rows = tokens.shape
    if int(tokens.max(initial=0)) > budget:
        raise ValueError(f"a row of {int(tokens.max())} tokens is longer than the budget of {budget}")
    n = max(min(rows, math.ceil(int(t.sum()) / budget)) for t in tokens)
    step = divided_by or 1
    n = math.ceil(n / step) * step
    heaviest_of = heaviest_of or (lambda n: max(heaviest(t, n) for t in tokens))
    while n <= rows:
        if heaviest_of(n) <= budget:
            return n
        n += step
    return None


def mean_count(step: StepRows, rows: int, ranks: int, budget: int, divided_by: Optional[int] = None
               ) -> Optional[float]:
    """verl's micro-batches of `rows` a GPU on `ranks` data-parallel ranks within `budget` tokens,
    on average over the steps `step` draws (None: a step verl refuses)."""
    return _mean_count(step, rows, ranks, int(budget), divided_by)


# (a search's listing asks for the same few counts again and again, and for each the same
# partitions under many budgets: both remembered)
@lru_cache(maxsize=4096)
def _mean_count(step: StepRows, rows: int, ranks: int, budget: int, divided_by: Optional[int]) -> Optional[float]:
    draws = _draws(step, rows, ranks)
    counts = [count(t, budget, divided_by, partial(_heaviest_of_draw, step, rows, ranks, d))
              for d, t in enumerate(draws)]
    return None if None in counts else float(np.mean(counts))


@lru_cache(maxsize=65536)
def _heaviest_of_draw(step: StepRows, rows: int, ranks: int, draw: int, n: int) -> int:
    return max(heaviest(t, n) for t in _draws(step, rows, ranks)[draw])


@lru_cache(maxsize=64)
def _draws(step: StepRows, rows: int, ranks: int) -> np.ndarray:
    return step.tokens(rows, ranks)[:DRAWS]
