"""Exhaustive search: every plan of the pruned space, evaluated in batches.

Pruning that cannot lose the optimum:
  * options that do not fit in memory on their own are never part of a valid plan;
  * within one (mesh, tp, pp) layout of a call, options that are no faster and need no less
    working memory than another are dropped (SearchSpace.pruned);
  * combinations of the master copies (train calls and frozen models) whose resident memory
    alone overflows a device are dropped before the other calls are expanded (peak memory only
    grows as calls are added).
The result is the true optimum of the simulated objective when the search completes.
"""

from __future__ import annotations

import math

import numpy as np

from realbench.search.events import Tracker
from realbench.search.space import SearchSpace

MAX_PLANS = 20_000_000
CHUNK = 8192


def space_size(space: SearchSpace) -> int:
    return math.prod(len(p) for p in space.pruned)


def exhaustive(space: SearchSpace, tracker: Tracker) -> bool:
    """Returns True when every plan was evaluated (False when stopped early)."""
    est = space.est
    size = space_size(space)
    if size > MAX_PLANS:
        raise ValueError(f"{size:.3g} plans remain after pruning, more than the {MAX_PLANS:.0e} that "
                         "exhaustive search enumerates; use mcmc or an Optuna method")
    pruned = space.pruned
    masters = est.masters
    others = [i for i in range(est.n) if i not in masters]
    # master combinations that fit, as rows with the other calls unchosen (-1)
    grids = np.meshgrid(*[pruned[m] for m in masters], indexing="ij")
    heads = np.full((grids[0].size, est.n), -1, dtype=np.int64)
    for m, g in zip(masters, grids):
        heads[:, m] = g.ravel()
    fits = np.concatenate([est.peak_memory_batch(heads[s:s + CHUNK]) <= est.capacity
                           for s in range(0, len(heads), CHUNK)]) if len(heads) else np.zeros(0, bool)
    heads = heads[fits]
    tail_shape = [len(pruned[i]) for i in others]
    tail_count = math.prod(tail_shape)
    for head in heads:
        for start in range(0, tail_count, CHUNK):
            idx = np.unravel_index(np.arange(start, min(tail_count, start + CHUNK)), tail_shape) if others else ()
            rows = np.tile(head, (len(idx[0]) if others else 1, 1))
            for col, i in enumerate(others):
                rows[:, i] = pruned[i][idx[col]]
            t, mem, ok = space.objective(rows)
            tracker.observe(rows, t, mem, ok)
            if tracker.should_stop():
                return False
    return True
