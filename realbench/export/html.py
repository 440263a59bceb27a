"""A standalone HTML report of one plan (bokeh with inline resources: no server, no network).

Sections: the scenario, the dataflow graph, the mesh map, the simulated Gantt timeline with
reallocations, memory per device against capacity, the search curve when the plan came from a
search, and this plan's time beside the baselines'. Every number is the estimator's or the
search's, computed when the report is made.
"""

from __future__ import annotations

import datetime
import html
import math
from typing import Mapping, Optional

from bokeh.embed import file_html
from bokeh.layouts import column
from bokeh.models import Div
from bokeh.resources import INLINE

from realbench.cost import Estimator
from realbench.plan.mesh import Option
from realbench.plan.plan import Plan
from realbench.plan.scenario import Scenario
from realbench.report import figures

WIDTH = 900
# how a call's sp group splits its sequences (Strategy.ring)
SEQUENCE_SPLITS = {"": "Ulysses", "allgather": "ring attention", "p2p": "context parallel p2p ring"}


def _table(header: list[str], rows: list[list[str]]) -> str:
    head = "".join(f"<th style='text-align:left;padding:2px 10px'>{html.escape(h)}</th>" for h in header)
    body = "".join("<tr>" + "".join(f"<td style='padding:2px 10px'>{html.escape(str(c))}</td>" for c in r) + "</tr>"
                   for r in rows)
    return f"<table style='border-collapse:collapse;font-size:13px'><tr>{head}</tr>{body}</table>"


def report_layout(scenario: Scenario, options: Mapping[str, Option], plan: Optional[Plan] = None,
                  plan_name: str = "this plan", profile=None):
    """The report as one bokeh layout (also shown by the plan viewer widget); times from
    `profile` where it has them."""
    from realbench.search import baseline_plans

    est = Estimator(scenario, profile=profile)
    choice = est.choice_of(dict(options))
    estimate = est.estimate(choice)
    G = scenario.cluster.gpus_per_node
    c = scenario.cluster
    gib = 1024**3
    summary = scenario.summary()
    intro = Div(width=WIDTH, text=(
        f"<h1>realbench plan report: {html.escape(scenario.name)}</h1>"
        f"<p>{html.escape(scenario.description)}</p>"
        f"<p>Cluster: {c.nodes} node(s) x {c.gpus_per_node} {html.escape(c.device.name)} "
        f"({c.device.memory_bytes / gib:.0f} GiB each, {c.memory_fraction:.0%} of it usable by plans). Algorithm: {html.escape(scenario.algorithm)}. "
        f"Plan space: 10^{summary['plan_space_log10']} plans. "
        f"Made {datetime.datetime.now().isoformat(timespec='seconds')}.</p>"
        f"<p><b>Simulated time per iteration: {estimate.time_per_iter_s:.4g} s</b>; reallocation "
        f"{estimate.realloc_s:.3g} s; peak memory {estimate.peak_mem_bytes / gib:.2f} GiB per device "
        f"of {estimate.usable_memory_bytes / gib:.3g} GiB usable "
        f"({'OUT OF MEMORY' if estimate.oom else 'fits'}).</p>"
        + _table(["call", "model", "kind", "sequences", "tokens each", "mesh", "dp", "tp", "pp", "micro-batches",
                  "start s", "end s", "alone s", "realloc s"],
                 [[n, call.model, call.kind.value, call.seqs, call.seq_len, options[n].mesh.label(G),
                   options[n].strategy.dp if options[n].strategy.sp == 1 else
                   f"{options[n].strategy.dp} ({SEQUENCE_SPLITS[options[n].strategy.ring]} "
                   f"sp {options[n].strategy.sp})",
                   options[n].strategy.tp, options[n].strategy.pp,
                   options[n].strategy.micro_batches, f"{t.start_s:.4g}", f"{t.end_s:.4g}", f"{t.time_s:.4g}",
                   f"{t.realloc_s:.3g}"]
                  for n, t in estimate.calls.items() for call in [scenario.dataflow.call(n)]])))
    parts = [intro,
             figures.dataflow_figure(scenario, width=WIDTH),
             figures.mesh_map_figure(scenario, options, width=WIDTH),
             figures.timeline_figure(scenario, estimate, width=WIDTH, options=options),
             figures.memory_figure(estimate, width=WIDTH)]
    baselines = {name: t for name, (_, t) in baseline_plans(est).items()}
    origin = plan.origin if plan is not None else None
    if origin is not None and origin.curve:
        parts.append(figures.curves_figure({origin.method: origin.curve},
                                           {k: v for k, v in baselines.items() if math.isfinite(v)}, width=WIDTH))
    times = {plan_name: estimate.time_per_iter_s}
    times.update({f"{k} baseline": v for k, v in baselines.items() if math.isfinite(v)})
    parts.append(figures.comparison_figure(times, width=WIDTH))
    lost = [k for k, v in baselines.items() if not math.isfinite(v)]
    if lost:
        parts.append(Div(text=f"<p>Baselines that do not fit in memory: {html.escape(', '.join(lost))}.</p>"))
    return column(*parts)


def plan_report_html(scenario: Scenario, options: Mapping[str, Option], plan: Optional[Plan] = None,
                     plan_name: str = "this plan", profile=None) -> str:
    return file_html(report_layout(scenario, options, plan, plan_name, profile), resources=INLINE,
                     title=f"realbench: {scenario.name}")
