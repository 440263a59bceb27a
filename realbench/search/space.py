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
from realbench.plan.options import OptionSet

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
        """Per call, the options left after dominance within each (mesh, tp, pp, zero and its shard
        group, merged or kept LoRA base) layout.

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
            opts = est.options[i]
            if isinstance(opts, OptionSet):  # decided per block and spread over its positions
                out.append(self._pruned_blocks(i, opts, resident))
                continue
            groups: dict[tuple[int, int, int], list[int]] = {}
            for k in cands:
                groups.setdefault((int(est.mesh_id[i][k]), int(est.layout_id[i][k]), int(est.expert_layout[i][k])),
                                  []).append(int(k))
            keep = []
            for members in groups.values():
                keep += self._undominated([(float(est.dur[i][k]), float(est.working[i][k]),
                                            float(est.weights[i][k]), k) for k in members], resident)
            out.append(np.array(sorted(keep), dtype=np.int64))
        return out

    def _undominated(self, members: list[tuple[float, float, float, int]], resident: float) -> list[int]:
        """Of one layout's (time, working bytes, weight bytes, index): by time, each new low of
        working memory, up to the first memory-safe one."""
        keep, best_working = [], math.inf
        for dur, working, weights, k in sorted(members):
            if working < best_working:
                keep.append(k)
                best_working = working
            if working + weights + resident <= self.est.capacity:
                break
        return keep

    def _pruned_blocks(self, i: int, opts: OptionSet, resident: float) -> np.ndarray:
        """Pruning of an OptionSet: every position of a block costs the same, so the strategies a
        block keeps (within each layout) are kept at every position."""
        est, kept = self.est, []
        for j, b in enumerate(opts.blocks):
            costs, _ = est._block(i, j)
            own = costs["master_bytes"] if est.master_of[i] == i else costs["weights"]
            alone = own + costs["working"] <= est.capacity
            groups: dict[tuple[int, int], list] = {}
            for s, st in enumerate(b.strategies):
                if alone[s]:
                    groups.setdefault((st.tp, st.pp, st.zero, st.state_shards, st.merge_lora, st.ep, st.etp), []).append(
                        (float(costs["dur"][s]), float(costs["working"][s]), float(costs["weights"][s]), s))
            chosen = sorted(s for members in groups.values() for s in self._undominated(members, resident))
            if chosen:
                rows = b.base + np.arange(b.positions, dtype=np.int64)[:, None] * len(b.strategies)
                kept.append((rows + np.array(chosen, dtype=np.int64)[None, :]).ravel())
        out = np.concatenate(kept) if kept else np.zeros(0, dtype=np.int64)
        return out

    def dominating(self, call: int, k: int) -> int:
        """A pruned option at least as good as option k in any plan (k itself if kept): same
        layout, no slower, and either no more working memory or memory-safe."""
        est = self.est
        kept = self.pruned[call]
        pos = np.searchsorted(kept, k)
        if pos < len(kept) and kept[pos] == k:
            return int(k)
        layout = ((est.mesh_id[call][kept] == est.mesh_id[call][k]) & (est.layout_id[call][kept] == est.layout_id[call][k])
                  & (est.expert_layout[call][kept] == est.expert_layout[call][k]))
        same = kept[layout & (est.dur[call][kept] <= est.dur[call][k])]
        leaner = same[est.working[call][same] <= est.working[call][k]]
        pool = leaner if len(leaner) else same
        return int(min(pool.tolist(), key=lambda j: (float(est.dur[call][j]), j)))

    def start_plan(self, choice) -> np.ndarray:
        return np.array([self.dominating(i, int(k)) for i, k in enumerate(choice)], dtype=np.int64)

    def plain_starts(self) -> list[np.ndarray]:
        """Where a search of a space without baseline plans (an engine's) starts: every call's first
        candidate or, where that plan does not fit in memory, every call's leanest (least working
        memory): a chain started from a plan that does not fit may find none that does in a group's
        short share of the budget."""
        est = self.est
        first = self.start_plan([int(c[0]) for c in self.candidates])
        if est.evaluate(first)[1] <= est.capacity:
            return [first]
        leanest = [int(c[np.argmin(est.working[i][c])]) for i, c in enumerate(self.candidates)]
        return [self.start_plan(leanest), first]

    # -- numeric samplers' view --------------------------------------------------------------------------
    def mesh_ids(self, call: int, k: np.ndarray) -> np.ndarray:
        """Per option index: a number options share exactly when they run on the same mesh."""
        return self.est.mesh_id[call][k]

    def strategy_ids(self, call: int, k: np.ndarray) -> np.ndarray:
        """Per option index: a number two options of the call share exactly when their
        strategies are equal."""
        opts = self.est.options[call]
        if isinstance(opts, OptionSet):
            return opts.strategy_ids(k)
        ids: dict = {}
        return np.array([ids.setdefault(opts[int(x)].strategy, len(ids)) for x in k], dtype=np.int64)

    @cached_property
    def features(self) -> list[np.ndarray]:
        est, c = self.est, self.est.cluster
        D, G = c.n_devices, c.gpus_per_node
        out = []
        for i, cands in enumerate(self.pruned):
            layers = getattr(est.scenario.models[est.calls[i].model], "n_layers", 1)  # a function has none
            lo, size = est.lo[i][cands], est.hi[i][cands] - est.lo[i][cands]
            micro_batches = est.micro_batches[i][cands]
            whole = size >= D
            out.append(np.stack([
                np.log2(size) / max(1.0, math.log2(D)),
                np.where(whole, 0.0, lo / np.maximum(1, D - size)),
                np.log2(est.tp[i][cands]) / max(1.0, math.log2(G)),
                np.log2(est.pp[i][cands]) / max(1.0, math.log2(layers)),
                np.log2(micro_batches) / max(1.0, math.log2(micro_batches.max())),
            ], axis=1))
        return out

    def nearest(self, call: int, point: np.ndarray) -> int:
        f = self.features[call]
        return int(self.pruned[call][int(np.argmin(((f - point) ** 2).sum(axis=1)))])
