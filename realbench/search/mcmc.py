"""MCMC plan search (REAL.md section 6), done right.

Each of `chains` Markov chains holds a plan. A step proposes, for every chain at once, changing
one call's option (uniformly among its non-dominated options (SearchSpace.pruned), or to a neighbour: the same mesh with
another strategy, or the same strategy on another mesh). A chain at inverse temperature beta
accepts a proposal that is faster always, and a slower one with probability
    exp(-beta * (t_new - t_cur) / t_cur)
computed in floating point (the reference code's integer division accepted every move).
Plans that do not fit in memory are rejected. A chain whose plan does not fit (the baselines of
a job whose memory is tight) accepts a proposal that fits, or one that needs less memory than its
own: a descent on the peak memory, since a fitting plan may lie two or more calls' changes away
(generation's share of the GPU and training's micro-batches together), which single changes that
must fit at once would never reach. The chains form a temperature ladder (beta from
`beta_min` to `beta_max`, geometric) and neighbours swap states with the replica-exchange rule
min(1, exp((beta_i - beta_j)(e_i - e_j))) on relative times, so hot chains explore and cold
chains refine. All chains start from the best baseline plan. The proposals of all chains are
evaluated as one batch, which is where the speed comes from.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from realbench.search.events import Tracker
from realbench.search.space import SearchSpace


@dataclass(frozen=True)
class _Groups:
    """Candidates grouped by a key, for drawing a uniform member of a candidate's group:
    positions sorted by key, and per candidate position where its group starts and its size."""

    order: np.ndarray
    first: np.ndarray
    count: np.ndarray

    @classmethod
    def by(cls, key: np.ndarray) -> "_Groups":
        order = np.argsort(key, kind="stable")
        values, first, count = np.unique(key[order], return_index=True, return_counts=True)
        group = np.searchsorted(values, key)
        return cls(order, first[group], count[group])

    def draw(self, rng: np.random.Generator, position: int) -> int:
        return int(self.order[self.first[position] + rng.integers(self.count[position])])


def _neighbours(space: SearchSpace) -> list[tuple[np.ndarray, _Groups, _Groups]]:
    """Per call: candidate array, and the candidates grouped by mesh and by strategy (dp, tp,
    pp, micro-batches, recomputation)."""
    return [(cands, _Groups.by(space.mesh_ids(i, cands)), _Groups.by(space.strategy_ids(i, cands)))
            for i, cands in enumerate(space.pruned)]


@dataclass
class MCMCStats:
    """What the chains did. Per chain: feasible proposals slower than the chain's plan, and how
    many were accepted (the rule: a fraction exp(-beta * relative slowdown)). Over all neighbour
    pairs (a hotter than b): swaps that would give the colder chain the slower plan, exponent
    (beta_a - beta_b)(e_a - e_b) < 0, and how many were accepted (a fraction exp(exponent))."""
    betas: np.ndarray
    uphill_proposed: np.ndarray
    uphill_accepted: np.ndarray
    uphill_swaps_proposed: int = 0
    uphill_swaps_accepted: int = 0


def mcmc(space: SearchSpace, start: np.ndarray, tracker: Tracker, seed: int = 0, chains: int = 16,
         beta_min: float = 5.0, beta_max: float = 400.0, swap_every: int = 10) -> MCMCStats:
    rng = np.random.default_rng(seed)
    n = space.n
    neigh = _neighbours(space)
    betas = np.geomspace(beta_min, beta_max, chains)
    stats = MCMCStats(betas, np.zeros(chains, dtype=np.int64), np.zeros(chains, dtype=np.int64))
    state = np.tile(np.asarray(start, dtype=np.int64), (chains, 1))
    cur_t, cur_m, feasible = space.objective(state)
    tracker.observe(state, cur_t, cur_m, feasible)
    cur_t = np.where(feasible, cur_t, np.inf)  # an infeasible start accepts its first feasible move
    cur_m = np.asarray(cur_m, dtype=np.float64).copy()
    step = 0
    while not tracker.should_stop():
        proposal = state.copy()
        calls = rng.integers(0, n, size=chains)
        kinds = rng.integers(0, 3, size=chains)
        for c in range(chains):
            i = calls[c]
            cands, by_mesh, by_strategy = neigh[i]
            if kinds[c] == 0:
                proposal[c, i] = cands[rng.integers(len(cands))]
            else:
                groups = by_mesh if kinds[c] == 1 else by_strategy
                proposal[c, i] = cands[groups.draw(rng, int(np.searchsorted(cands, state[c, i])))]
        t, mem, ok = space.objective(proposal)
        tracker.observe(proposal, t, mem, ok)
        # relative slowdown in floating point (the reference code's integer division made it 0)
        rel = np.where(np.isfinite(cur_t), (t - cur_t) / np.where(np.isfinite(cur_t), cur_t, 1.0), -np.inf)
        accept = ok & ((rel <= 0) | (rng.random(chains) < np.exp(-betas * np.maximum(rel, 0.0))))
        uphill = ok & (rel > 0)
        stats.uphill_proposed += uphill
        stats.uphill_accepted += uphill & accept
        # (a chain that does not fit yet: toward less memory, above)
        accept |= ~np.isfinite(cur_t) & ~ok & np.isfinite(t) & (mem < cur_m)
        state[accept] = proposal[accept]
        cur_t = np.where(accept, np.where(ok, t, np.inf), cur_t)
        cur_m = np.where(accept, mem, cur_m)
        step += 1
        if step % swap_every == 0 and chains > 1:
            ref = np.min(cur_t[np.isfinite(cur_t)]) if np.isfinite(cur_t).any() else 1.0
            energy = np.where(np.isfinite(cur_t), cur_t / ref, 1e9)
            for a in range(step // swap_every % 2, chains - 1, 2):
                b = a + 1
                exponent = (betas[a] - betas[b]) * (energy[a] - energy[b])
                swap = rng.random() < np.exp(min(0.0, exponent))
                if exponent < 0:
                    stats.uphill_swaps_proposed += 1
                    stats.uphill_swaps_accepted += int(swap)
                if swap:
                    state[[a, b]] = state[[b, a]]
                    cur_t[[a, b]] = cur_t[[b, a]]
                    cur_m[[a, b]] = cur_m[[b, a]]
                    energy[[a, b]] = energy[[b, a]]
    return stats
