"""Re-planning while training: switch plans between iterations from measured times.

Every `every` steps under one plan, rank 0 takes the response lengths that the last `every`
steps generated as every generation call's length distribution (empirical, capped at the call's
`max_new_tokens`; `Dataflow.with_lengths`, so the calls that process the sequences follow too),
recalibrates the estimator of that workload call by call,

    scale_c = median over the last `every` steps of call c's measured seconds (slowest rank)
              / the estimate of call c under the plan that ran, at the measured lengths,

and searches (MCMC, `budget_s` seconds) with every call's time under every option multiplied by
its scale, in a thread beside its training. When the search is done and its plan is predicted at
least `min_gain` faster than the running plan under the same recalibrated estimator,

    gain = 1 - t_new / t_running        (1 when the running plan no longer fits in memory),

so a run whose responses grow (as reasoning runs' do) re-plans for the lengths it now
generates, and a change of length is not mistaken for a slower or faster device.

every process switches before its next step (`switch_plan`): never inside one, so a call in
flight finishes under the plan it started with. The switch moves each model's state from its old
master layout to its new one through the reallocation engine (fp32 master weights and both Adam
moments of trained models, the weights of frozen ones), keeps Adam's step count, and rebuilds the
process groups the new plan needs. Sampling draws per global row (engine.row_uniforms) and the
loss is normalized per step whatever the layout, so a run that switches computes what the run
without switching computes, up to floating-point summation order.
"""

from __future__ import annotations

import statistics
import threading
import time
from dataclasses import dataclass, field
from typing import Optional

import numpy as np
import torch
import torch.distributed as dist

from realbench.dataflow import CallKind
from realbench.models.shards import is_adapter
from realbench.runtime.realloc import BoundReallocation, rank_plan

# the kinds of state a switch moves, and the dtype each travels in (None: the models' compute dtype)
STATE_KINDS = {"master": torch.float32, "exp_avg": torch.float32, "exp_avg_sq": torch.float32, "weights": None}


@torch.no_grad()
def switch_plan(old, options: dict):
    """The worker of `options`, with every model's state moved from `old`'s layouts. Every rank
    calls it at the same iteration boundary."""
    from realbench.runtime.worker import Worker

    new = Worker(old.rank, old.scenario, options, old.seed, total_steps=old.total_steps, device=old.device, dtype=old.dtype,
                 compile_decode=old.compile_decode, groups=old.groups, dataset=old.dataset, weights=False)
    masters = sorted(set(old.master_of) - set(old.functions))
    # Adam's step count, known on the ranks of each trained model's old layout
    trained = [m for m in masters if old.calls[m].kind == CallKind.TRAIN]
    steps = torch.tensor([old.optimizers[m].steps_taken if m in old.optimizers else 0 for m in trained],
                         dtype=torch.long, device=old.device)
    if trained:
        dist.all_reduce(steps, op=dist.ReduceOp.MAX)
    for m in masters:
        spec = old.scenario.models[old.calls[m].model]
        src, dst = old.master_state(m), new.master_state(m)
        kinds = ("master", "exp_avg", "exp_avg_sq") if m in trained else ("weights",)
        if m in trained and spec.lora is not None:  # the adapters' state, and the frozen base
            plans = {kind: rank_plan(spec, old.layouts[m], new.layouts[m], old.rank, names=is_adapter) for kind in kinds}
            plans["weights"] = rank_plan(spec, old.layouts[m], new.layouts[m], old.rank,
                                         names=lambda name: not is_adapter(name))
        else:
            plan = rank_plan(spec, old.layouts[m], new.layouts[m], old.rank)
            plans = {kind: plan for kind in kinds}
        for kind, plan in plans.items():
            BoundReallocation(plan, src.get(kind, {}), dst.get(kind, {}), dtype=STATE_KINDS[kind] or old.dtype,
                              device=old.device)()
        if m in new.optimizers:
            new.optimizers[m].moved_in(int(steps[trained.index(m)]))
    return new


@dataclass
class Switch:
    """One plan change, as the run's JSON reports it."""
    step: int  # the first step under the new plan
    requested_in_step: int  # the step rank 0 was running when the search finished
    old_plan: dict
    new_plan: dict
    predicted_gain: float
    predicted_old_s: float
    predicted_new_s: float
    search_s: float
    calibration: dict
    lengths: dict = field(default_factory=dict)  # generation call -> the measured lengths planned for
    old_fits: bool = True  # whether the running plan fits the measured lengths in memory
    measured_gain: Optional[float] = None  # 1 - median step after / median step before

    def to_json(self) -> dict:
        return dict(self.__dict__)


@dataclass
class Replanner:
    """Rank 0's side of re-planning: fed each finished step's per-call seconds (slowest rank)
    and step seconds, it starts searches and says when to switch (`poll`)."""

    scenario: object
    options: dict
    every: int
    budget_s: float
    min_gain: float = 0.05
    profile: object = None
    seed: int = 0
    history: list = field(default_factory=list)  # (step, {call: s}, step_s, {call: lengths}) under the running plan
    switches: list = field(default_factory=list)
    before: list = field(default_factory=list)  # step times of the last window before the latest switch
    running_step: int = -1  # the step the driver is running now (set before each step)
    _thread: Optional[threading.Thread] = None
    _result: Optional[dict] = None
    _closing: threading.Event = field(default_factory=threading.Event)
    _observed: int = -1

    def observe(self, step: int, call_s: dict, step_s: float, lengths: Optional[dict] = None) -> None:
        """A finished step: each call's seconds (slowest rank), the step's, and each generation
        call's response lengths (every row's)."""
        self._observed = step
        self.history.append((step, call_s, step_s, lengths or {}))
        last = self.switches[-1] if self.switches else None
        # the first step under a new plan binds its reallocations (one-off work): left out
        after = [h[2] for h in self.history[1:]]
        if last is not None and after:
            last.measured_gain = 1.0 - statistics.median(after) / statistics.median(self.before)
        if self._thread is None and len(self.history) % self.every == 0:
            self._start_search()

    def measured_scenario(self):
        """The scenario with every generation call's lengths those of the last `every` steps."""
        from realbench.dataflow.lengths import LengthDistribution

        window = self.history[-self.every:]
        measured = {}
        for c in self.scenario.dataflow.calls:
            rows = [n for h in window for n in h[3].get(c.name, [])]
            if c.kind == CallKind.GENERATE and rows:
                measured[c.name] = LengthDistribution.of(np.maximum(rows, 1), c.gen_len)
        return self.scenario.with_lengths(measured), measured

    def _start_search(self) -> None:
        from realbench.cost import Estimator

        window = self.history[-self.every:]
        scenario, measured = self.measured_scenario()
        base = Estimator(scenario, profile=self.profile)
        running = base.estimate(base.choice_of(self.options))
        scale = {}
        for name, call in running.calls.items():
            seconds = [h[1][name] for h in window if name in h[1]]
            if seconds and call.time_s > 0:
                scale[name] = statistics.median(seconds) / call.time_s
        lengths = {n: {"mean": d.expected, "max": max(d.lengths), "responses": sum(d.counts)} for n, d in measured.items()}
        self._thread = threading.Thread(target=self._search, args=(scenario, scale, lengths, self._observed),
                                        daemon=True, name="realbench-replan")
        self._thread.start()

    def _search(self, scenario, scale: dict, lengths: dict, requested: int) -> None:
        from realbench.cost import Estimator
        from realbench.search import run_search

        t0 = time.perf_counter()
        try:
            est = Estimator(scenario, profile=self.profile, call_scale=scale)
            result = run_search(est, "mcmc", self.budget_s, seed=self.seed + requested, stop=self._closing.is_set)
            current, memory = est.evaluate(est.choice_of(self.options))
            new = est.options_of(result.best_choice) if result.best_choice is not None else None
            self._result = {"options": new, "new_s": result.best_time_s, "old_s": current,
                            "old_fits": memory <= est.capacity, "scale": scale}
        except Exception as e:  # a failed search keeps the running plan; the run goes on
            self._result = {"options": None, "error": f"{type(e).__name__}: {e}", "scale": scale}
        self._result.update(search_s=time.perf_counter() - t0, finished_in_step=self.running_step, lengths=lengths)

    def close(self) -> None:
        """End a search still running (the run is over) and wait for its thread: a thread left
        computing while the interpreter exits aborts the process (SIGABRT, "terminate called
        without an active exception"), which fails a run that finished every step."""
        self._closing.set()
        if self._thread is not None:
            self._thread.join()

    def poll(self) -> Optional[dict]:
        """At an iteration boundary: the options to switch to, or None (no search finished, or
        its plan is not `min_gain` faster)."""
        if self._thread is None or self._thread.is_alive():
            return None
        self._thread.join()
        r, self._thread, self._result = self._result, None, None
        if r["options"] is None:
            return None
        gain = 1.0 - r["new_s"] / r["old_s"] if r["old_fits"] else 1.0
        G = self.scenario.cluster.gpus_per_node
        if gain < self.min_gain or r["options"] == self.options:
            return None
        switch = Switch(step=self._observed + 1, requested_in_step=r["finished_in_step"],
                        old_plan={n: o.label(G) for n, o in self.options.items()},
                        new_plan={n: o.label(G) for n, o in r["options"].items()}, predicted_gain=gain,
                        predicted_old_s=r["old_s"], predicted_new_s=r["new_s"], search_s=r["search_s"],
                        calibration=r["scale"], lengths=r["lengths"], old_fits=r["old_fits"])
        self.switches.append(switch)
        self.before = [h[2] for h in self.history[-self.every:]]
        self.history, self.options = [], r["options"]
        return r["options"]
