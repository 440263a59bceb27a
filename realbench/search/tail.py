"""Plans for the length distribution against plans for the mean length.

A planner that knows only the mean response length plans the *mean twin* of a scenario: every
generation call's lengths replaced by their mean, rounded (a number: every response, and every
sequence of the calls that process them, priced at the mean). Both plans are then judged on the same
seeded sampled lengths: each step draws every generation call's `seqs` lengths from its
distribution (inverse-CDF sampling) and estimates the plan with that step's lengths (their
empirical distribution: the call waits for its longest row; its memory is what those lengths
need, no quantile); a plan that does not fit in a step's memory takes infinitely long. The
searches plan memory at the distribution's `memory_at` (0.99 unless set), so that the
plans fit the steps whose responses run longer than the average step's. `sampled_time` is the mean over the steps.
"""

from __future__ import annotations

import math

import numpy as np

from realbench.cost import Estimator
from realbench.dataflow import CallKind
from realbench.dataflow.lengths import LengthDistribution


def mean_twin(scenario, shorten_later: bool = True):
    """The scenario with every generation call's lengths replaced by their mean, rounded, and
    (`shorten_later`) the sequences of the model calls of the same width (the prompt and a
    response) shortened alike; without it, the later calls keep the padded width (the prompt
    and the cap), as a planner that knows neither the lengths nor the trimming prices them."""
    widths = {}  # a generation call's full width -> its prompt and mean response
    for c in scenario.dataflow.calls:
        if c.kind == CallKind.GENERATE and c.lengths is not None:
            widths[c.seq_len] = c.prompt_len + max(1, round(c.lengths.expected))
    calls = []
    for c in scenario.dataflow.calls:
        if c.kind == CallKind.GENERATE and c.lengths is not None:
            mean = widths[c.seq_len] - c.prompt_len
            c = c.model_copy(update={"lengths": None, "gen_len": mean, "seq_len": c.prompt_len + mean})
        elif c.seq_len in widths:
            c = c.model_copy(update={"lengths": None, **({"seq_len": widths[c.seq_len]} if shorten_later else {})})
        calls.append(c)
    return scenario.model_copy(update={"dataflow": scenario.dataflow.with_calls(calls)})


def sampled_lengths(scenario, steps: int, seed: int) -> list[dict[str, LengthDistribution]]:
    """Per step, every generation call's `seqs` lengths drawn from its distribution (seeded;
    a uniform u becomes the least t with cdf[t] >= u), as that step's empirical distribution."""
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(steps):
        drawn = {}
        for c in scenario.dataflow.calls:
            if c.kind == CallKind.GENERATE and c.lengths is not None:
                lengths = np.searchsorted(c.lengths.cdf(), rng.random(c.seqs), side="left")
                # memory for the step's own lengths (no quantile: they are what it has)
                drawn[c.name] = LengthDistribution.of(lengths, c.lengths.max, memory_at="mean")
        out.append(drawn)
    return out


def sampled_time(scenario, options: dict, samples: list[dict[str, LengthDistribution]]) -> float:
    """The mean time per iteration of the plan `options` over the sampled steps (inf if it does
    not fit in some step)."""
    times = []
    for drawn in samples:
        est = Estimator(scenario.with_lengths(drawn), only={n: [o] for n, o in options.items()})
        e = est.estimate((0,) * est.n)
        times.append(math.inf if e.oom else e.time_per_iter_s)
    return float(np.mean(times))


def compare(scenario, method: str = "mcmc", budget_s: float = 20.0, seed: int = 0, steps: int = 8) -> dict:
    """Search the scenario and its two mean twins (later calls at the mean width, and at the
    padded width) with the same method, budget and seed, and judge the plans on the same sampled
    lengths."""
    from realbench.plan.plan import plan_from_options
    from realbench.search import run_search

    out = {"scenario": scenario.name, "method": method, "budget_s": budget_s, "seed": seed, "steps": steps}
    samples = sampled_lengths(scenario, steps, seed)
    for name, s in (("distribution", scenario), ("mean", mean_twin(scenario)),
                    ("mean_padded", mean_twin(scenario, shorten_later=False))):
        est = Estimator(s)
        r = run_search(est, method, budget_s, seed=seed)
        options = est.options_of(r.best_choice)
        out[name] = {"searched_time_s": r.best_time_s, "sampled_time_s": sampled_time(scenario, options, samples),
                     "plan": plan_from_options(scenario, options).to_document()["calls"]}
    ours = out["distribution"]["sampled_time_s"]
    for twin in ("mean", "mean_padded"):
        theirs = out[twin]["sampled_time_s"]
        out[twin]["plan_differs"] = out[twin]["plan"] != out["distribution"]["plan"]
        out[twin]["fits"] = math.isfinite(theirs)
        # how much faster the distribution's plan is on the sampled lengths (None: the twin's
        # plan does not fit them)
        out[twin]["distribution_gain"] = 1.0 - ours / theirs if math.isfinite(theirs) else None
    return out
