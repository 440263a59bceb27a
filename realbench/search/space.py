"""The search space: one option per call, from the options that fit in memory on their own.

Also the two views the samplers need:
  * `pruned` per call: the options not dominated by another option with the same mesh, tp and
    pp (those share reallocation, transfer and master-copy costs, so an option that is no faster
    and needs no less working memory can be dropped without losing the optimum). Every sampler
    draws from these: dominated micro-batch variants otherwise dilute the space (on
    ppo-tiny-2cpu, 0.2% of random plans beat the best baseline, 7% of random pruned plans do);
  * `features` per call: a numeric encoding for samplers that do not model categories
    (CMA-ES, GP): log2 mesh size, mesh position, log2 tp, log2 pp, log2 micro-batches, each
    scaled to [0, 1]; a point maps to the nearest feasible option.
"""

from __future__ import annotations

import math
from functools import cached_property

import numpy as np

from realbench.cost import Estimator

FEATURES = ("size", "position", "tp", "pp", "micro_batches")


class SearchSpace:
    def __init__(self, estimator: Estimator):
        self.est = estimator
        self.n = estimator.n
        self.candidates = [estimator.candidates(i) for i in range(self.n)]
        empty = [estimator.call_names[i] for i in range(self.n) if len(self.candidates[i]) == 0]
        if empty:
            raise ValueError(f"no option of call {empty[0]!r} fits in device memory")

    @property
    def size(self) -> int:
        return math.prod(len(c) for c in self.candidates)

    def objective(self, choices: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(time per iteration, peak memory, feasible) for a batch of plans."""
        t, mem = self.est.evaluate_batch(choices)
        return t, mem, mem <= self.est.capacity

    # -- exhaustive search's view ------------------------------------------------------------------
    @cached_property
    def pruned(self) -> list[np.ndarray]:
        """Per call, the options left after dominance within each (mesh, tp, pp) layout.

        Options of one layout differ only in time and working memory. An option is dropped when
        another is no slower and needs no more working memory, or when it is no faster than an
        option that is memory-safe: its working set plus every master copy at its largest fits
        on a device, so it can replace the slower one in any plan without running out of memory.
        Start times are monotone in task durations under the fixed-order list schedule; the
        tests check the pruned optimum against the unpruned one."""
        est = self.est
        resident = sum(float(est.master_bytes[m][self.candidates[m]].max()) for m in est.masters)
        out = []
        for i, cands in enumerate(self.candidates):
            groups: dict[int, list[int]] = {}
            for k in cands:
                groups.setdefault(int(est.layout_id[i][k]), []).append(int(k))
            keep = []
            for members in groups.values():
                members.sort(key=lambda k: (est.dur[i][k], est.working[i][k], k))
                best_working = math.inf
                for k in members:  # by time: keep each new low of working memory ...
                    if est.working[i][k] < best_working:
                        keep.append(k)
                        best_working = est.working[i][k]
                    if est.working[i][k] + est.weights[i][k] + resident <= est.capacity:
                        break  # ... up to the first memory-safe option
            out.append(np.array(sorted(keep), dtype=np.int64))
        return out

    def dominating(self, call: int, k: int) -> int:
        """A pruned option at least as good as option k in any plan (k itself if kept): same
        layout, no slower, and either no more working memory or memory-safe."""
        est = self.est
        kept = self.pruned[call]
        if k in set(kept.tolist()):
            return int(k)
        same = [int(j) for j in kept if est.layout_id[call][j] == est.layout_id[call][k]
                and est.dur[call][j] <= est.dur[call][k]]
        leaner = [j for j in same if est.working[call][j] <= est.working[call][k]]
        return min(leaner or same, key=lambda j: (est.dur[call][j], j))

    def start_plan(self, choice) -> np.ndarray:
        return np.array([self.dominating(i, int(k)) for i, k in enumerate(choice)], dtype=np.int64)

    # -- numeric samplers' view --------------------------------------------------------------------------
    @cached_property
    def features(self) -> list[np.ndarray]:
        est, c = self.est, self.est.cluster
        out = []
        for i, cands in enumerate(self.pruned):
            layers = getattr(est.scenario.models[est.calls[i].model], "n_layers", 1)  # a function has none
            rows = []
            for k in cands:
                o = est.options[i][k]
                s = o.strategy
                rows.append((
                    math.log2(o.mesh.size) / max(1.0, math.log2(c.n_devices)),
                    o.mesh.start(c.gpus_per_node) / max(1, c.n_devices - o.mesh.size) if o.mesh.size < c.n_devices else 0.0,
                    math.log2(s.tp) / max(1.0, math.log2(c.gpus_per_node)),
                    math.log2(s.pp) / max(1.0, math.log2(layers)),
                    math.log2(s.micro_batches) / 4.0,
                ))
            out.append(np.array(rows))
        return out

    def nearest(self, call: int, point: np.ndarray) -> int:
        f = self.features[call]
        return int(self.pruned[call][int(np.argmin(((f - point) ** 2).sum(axis=1)))])
