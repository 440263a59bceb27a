"""AReaL's micro-batches, as its packer forms them from a step's real row lengths.

AReaL splits each GPU's rows of a call into micro-batches by their tokens (the attention mask's
sum: the prompt and the response as long as it ran), never by a fixed count
(split_padded_tensor_dict_into_mb_list, areal/utils/data.py:696-760), so how many a step runs
depends on that step's lengths. realbench counts them on `batches.DRAWS` steps drawn from the scenario's
response lengths (one seed: the same numbers on every run; `StepRows`) and writes budgets from the
same draws. The packer is first fit decreasing (`_ffd_allocate`, utils/seqpack.py:198-260):

    rows in decreasing order; a row opens a new group while there are fewer than `n_mbs`
    groups, or where even the smallest group cannot take it within `max_tokens_per_mb`;
    otherwise it joins, of the groups that can take it, the one holding the fewest rows
    (ties: the smallest sum, then the first opened).

A Megatron pipeline asks for at least 2 pp groups and a count that pp divides, raising
`n_mbs` by pp until it does (engine/megatron_engine.py:2054-2070, seqpack.py:244-260). The
data-parallel ranks then agree: where their counts differ each packs again with `n_mbs` the
largest (allocate_balanced_mbs_synced, data.py:475-490; FSDP over the trainer's whole group,
Megatron over its data-parallel group: either way the largest over the data-parallel ranks, the
tensor-parallel ones holding the same rows). So:

* the count is the largest over the ranks, of lengths that differ step by step: priced at its
  mean over the drawn steps;
* with a budget at least the largest group that `n_mbs` groups reach unbounded, the packer
  forms exactly `n_mbs` groups of equal row counts: a row joins the same group as it would
  unbounded, since that group holds it within the budget and no group left out was the one
  chosen. That is the budget realbench writes (`budget_for`): AReaL then runs the plan's
  micro-batches on every drawn step, as many rows each. A plan carries it on each packed call
  (`max_tokens`, on import too: the budget realbench would write for the count read), and memory
  is planned for a micro-batch that full, the largest AReaL forms on the drawn steps.

(verl forms its micro-batches otherwise, by a workload-balanced partition: realbench.engines.verl.packer,
which counts on the same drawn steps.) The packer here is checked against AReaL's
own (`check.py pack`) in the tests.
"""

from __future__ import annotations

import math
from functools import lru_cache
from typing import Optional

import numpy as np

from realbench.engines import batches


class StepRows(batches.StepRows):
    """A call's rows as AReaL's packer sees them (realbench.engines.batches.StepRows: a prompt at
    its cap and a response drawn from the scenario's lengths), with what the packer forms of them."""

    def micro_batches(self, rows: int, ranks: int, n_mbs: int, budget: Optional[int], pp: int = 1) -> float:
        """`micro_batches` of `rows` a GPU on `ranks` data-parallel ranks (no budget: None)."""
        return _micro_batches(self, rows, ranks, n_mbs, budget, pp)

    def budget(self, rows: int, ranks: int, n_mbs: int) -> int:
        """`budget_for` `rows` a GPU on `ranks` data-parallel ranks in `n_mbs` micro-batches."""
        return _budget(self, rows, ranks, n_mbs)


# (the listing of a search asks for the same few counts and budgets again and again: remembered)
@lru_cache(maxsize=4096)
def _micro_batches(step: StepRows, rows: int, ranks: int, n_mbs: int, budget: Optional[int], pp: int) -> float:
    return micro_batches(step.tokens(rows, ranks), math.inf if budget is None else budget, n_mbs, pp)


@lru_cache(maxsize=4096)
def _budget(step: StepRows, rows: int, ranks: int, n_mbs: int) -> int:
    return budget_for(step.tokens(rows, ranks), n_mbs, step.prompt_len + step.gen_len)


def pack(tokens: np.ndarray, capacity: float, n_mbs: np.ndarray | int) -> tuple[np.ndarray, np.ndarray]:
    """AReaL's first fit decreasing over the last axis of `tokens` (any leading axes: one packing
    each), at least `n_mbs` groups (broadcast over the leading axes): (the groups formed, the
    largest group's tokens), each of the leading shape."""
    lead, n = tokens.shape[:-1], tokens.shape[-1]
    values = -np.sort(-tokens.reshape(-1, n), axis=1)
    k = values.shape[0]
    floor = np.broadcast_to(np.asarray(n_mbs), lead).reshape(-1)
    # a group not yet opened holds "more than any budget": it neither takes a row nor is the smallest
    closed = np.int64(1) << 50
    capacity = min(capacity, float(closed >> 1))
    sums = np.full((k, n), closed, dtype=np.int64)
    groups = np.zeros(k, dtype=np.int64)
    every = np.arange(k)
    # each group's place in the order a row picks from: the fewest rows, the smallest sum, the first opened
    scale = n * int(values[:, :1].max(initial=0)) + 1  # above any group's sum
    order = np.tile(np.arange(n, dtype=np.int64), (k, 1))
    for i in range(n):
        v = values[:, i]
        w = int(groups.max()) + 1  # (the groups opened so far, and one to open)
        held = sums[:, :w]
        new = (groups < floor) | (held.min(axis=1) + v > capacity)
        join = np.where(held + v[:, None] <= capacity, order[:, :w], np.iinfo(np.int64).max).argmin(axis=1)
        at = np.where(new, groups, join)
        sums[every, at] = np.where(new, v, sums[every, at] + v)
        order[every, at] += (scale + v) * n
        groups += new
    sums[sums == closed] = 0
    return groups.reshape(lead), sums.max(axis=1).reshape(lead)


def micro_batches(tokens: np.ndarray, capacity: float, n_mbs: int, pp: int = 1) -> float:
    """The micro-batches AReaL forms on a call's GPUs, on average over the drawn steps: `tokens`
    (draws, ranks, rows) packed within `capacity` tokens, at least `n_mbs` (a pipeline of pp
    stages: at least 2 pp and a multiple of pp), the ranks agreeing on the largest count."""
    draws, ranks, rows = tokens.shape
    flat = tokens.reshape(draws * ranks, rows)
    floor = np.full(draws * ranks, max(n_mbs, 2 * pp if pp > 1 else 1), dtype=np.int64)

    def packed(which: np.ndarray) -> np.ndarray:  # (each packing is its own: only those asked again)
        groups, _ = pack(flat[which], capacity, floor[which])
        while pp > 1 and (groups % pp).any():  # (seqpack.py:244-260: n_mbs raised by pp until pp divides)
            odd = groups % pp != 0
            floor[which[odd]] += pp - floor[which[odd]] % pp
            groups[odd], _ = pack(flat[which[odd]], capacity, floor[which[odd]])
        return groups

    groups = packed(np.arange(draws * ranks))
    while True:
        agreed = groups.reshape(draws, ranks).max(axis=1)
        split = (groups.reshape(draws, ranks) != agreed[:, None]).any(axis=1)
        if not split.any():
            return float(agreed.mean())
        # a step whose ranks disagree: each packs again with n_mbs the largest (data.py:475-490)
        again = np.flatnonzero(np.repeat(split, ranks))
        floor[again] = np.repeat(agreed[split], ranks)
        groups[again] = packed(again)


def budget_for(tokens: np.ndarray, n_mbs: int, row: int) -> int:
    """The max_tokens_per_mb under which AReaL forms exactly `n_mbs` groups (of equal row counts)
    on every drawn step of `tokens`: the largest group they reach unbounded, and at least a whole
    row of `row` tokens (AReaL's packer refuses a longer one, seqpack.py:240-241)."""
    _, largest = pack(tokens, math.inf, n_mbs)
    return max(int(largest.max()), row)
