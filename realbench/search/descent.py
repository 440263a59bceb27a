"""Greedy descent by one-call moves: how an Optuna trial turns a sampled plan into a good one.

A plan x picks one option per call. Its one-call neighbourhood N(x) changes exactly one call i to
another of its non-dominated options (SearchSpace.pruned):

    |N(x)| = sum_i |pruned_i|        (1,574 plans on ppo-7b-7b-16gpu, 22,000 on ppo-70b-7b-128gpu)

A descent visits the calls in turn; for call i it evaluates all |pruned_i| plans that differ from x
in call i as one batch of the vectorized estimator, and moves to the best of them when it is
better than x. It stops after a pass over every call without a move: x is then a local optimum,
no single call can be placed better. Plans that overflow device memory are ranked by `penalized`,
so a descent from an infeasible sample first walks into memory, then gets faster.

Why: the samplers' own proposals are single plans at about 60 per second (Optuna's overhead),
and on paper-like spaces of 10^14 to 10^20 plans none of 100,000 random plans beats the best
baseline. A descent costs a few thousand to a few hundred thousand evaluations at the
estimator's batch speed, and its end points are good: on ppo-7b-7b-16gpu, 20 s of descents from
uniformly random plans reach MCMC's 20-s result. The sampler then decides where descents start,
and learns from the value each start descends to.
"""

from __future__ import annotations

import numpy as np

from realbench.search.events import Tracker
from realbench.search.space import SearchSpace


def penalized(space: SearchSpace, times: np.ndarray, mems: np.ndarray, feasible: np.ndarray,
              penalty_base: float) -> np.ndarray:
    """The value a sampler sees: the time of a plan that fits; for one that does not,
    penalty_base * (1 + relative overflow) + time, above every plan that fits when penalty_base
    is at least the time of a plan that fits (callers pass twice the start plan's time)."""
    overflow = np.maximum(0.0, mems / space.est.capacity - 1.0)
    return np.where(feasible, times, penalty_base * (1.0 + overflow) + times)


def descend(space: SearchSpace, choice, tracker: Tracker, penalty_base: float) -> tuple[np.ndarray, float]:
    """Descent from `choice` (see the module docstring); every batch is reported to `tracker`,
    and the descent stops early when the tracker says stop. Returns the end plan and its value."""
    x = np.asarray(choice, dtype=np.int64).copy()
    t, mem, ok = space.objective(x[None])
    tracker.observe(x[None], t, mem, ok)
    value = float(penalized(space, t, mem, ok, penalty_base)[0])
    unchanged = 0  # calls visited since the last move
    i = 0
    while unchanged < space.n and not tracker.should_stop():
        options = space.pruned[i]
        batch = np.repeat(x[None], len(options), axis=0)
        batch[:, i] = options
        t, mem, ok = space.objective(batch)
        tracker.observe(batch, t, mem, ok)
        values = penalized(space, t, mem, ok, penalty_base)
        k = int(np.argmin(values))
        if values[k] < value * (1.0 - 1e-12):
            x, value, unchanged = batch[k].copy(), float(values[k]), 0
        unchanged += 1
        i = (i + 1) % space.n
    return x, value
