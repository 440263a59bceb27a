"""Bokeh figures of a scenario and a plan, shared by the HTML report and the widgets.

Each builder takes plain values (a scenario, a plan's options, an estimate, search curves) and
returns a bokeh model; none of them computes costs itself, so what a figure shows is exactly
what the estimator or the search reported.
"""

from __future__ import annotations

from typing import Mapping, Optional, Sequence

import networkx as nx
from bokeh.models import (ColumnDataSource, HoverTool, Label, LabelSet, Range1d, Span)
from bokeh.palettes import Category10_10
from bokeh.plotting import figure

from realbench.cost.simulate import PlanEstimate
from realbench.plan.mesh import Option
from realbench.plan.scenario import Scenario

GIB = 1024**3
KIND_COLORS = {"generate": "#1f77b4", "inference": "#2ca02c", "train": "#d62728", "function": "#9467bd"}
REALLOC_COLOR = "#ff7f0e"
TRANSFER_COLOR = "#bbbbbb"
TOOLS = "pan,wheel_zoom,box_zoom,reset,save"


def model_colors(scenario: Scenario) -> dict[str, str]:
    return {m: Category10_10[i % 10] for i, m in enumerate(scenario.models)}


def dataflow_figure(scenario: Scenario, width: int = 640, height: int = 320):
    """The calls as nodes in dependency layers; data edges solid (labelled with their keys),
    parameter-version edges dashed (grey: same iteration, orange: a later iteration: the next, or
    1 + max_staleness iterations later for a generation that runs ahead)."""
    flow = scenario.dataflow
    g = flow.graph
    dag = nx.DiGraph((u, v) for u, v, d in g.edges(data=True) if d["lag"] == 0)
    dag.add_nodes_from(flow.call_names)
    layer = {}
    for depth, names in enumerate(nx.topological_generations(dag)):
        for n in names:
            layer[n] = depth
    rows: dict[int, list[str]] = {}
    for n in flow.order:
        rows.setdefault(layer[n], []).append(n)
    pos = {n: (float(d), float(len(names) - 1) / 2 - i) for d, names in rows.items() for i, n in enumerate(names)}
    p = figure(width=width, height=height, title=f"dataflow: {scenario.name}", tools=TOOLS,
               x_range=Range1d(-0.6, max(layer.values()) + 0.6),
               y_range=Range1d(min(y for _, y in pos.values()) - 0.8, max(y for _, y in pos.values()) + 0.8))
    p.axis.visible = False
    p.grid.visible = False
    for style, dash, color in (("data", "solid", "#444444"), ("param0", "dashed", "#999999"),
                               ("param1", "dotted", REALLOC_COLOR)):
        xs, ys, keys, lags = [], [], [], []
        for u, v, d in g.edges(data=True):
            kind = "data" if d["kind"] == "data" else f"param{min(d['lag'], 1)}"
            if kind != style or u == v:
                continue
            xs.append([pos[u][0], pos[v][0]])
            ys.append([pos[u][1], pos[v][1]])
            keys.append(", ".join(d["keys"]) or {0: "weights", 1: "next iteration"}.get(
                d["lag"], f"{d['lag']} iterations later"))
            lags.append(d["lag"])
        if xs:
            src = ColumnDataSource(dict(xs=xs, ys=ys, keys=keys))
            p.multi_line("xs", "ys", source=src, line_dash=dash, line_color=color, line_width=2,
                         legend_label={"data": "data", "param0": "weights (same iteration)",
                                       "param1": "weights (next iteration)" if max(lags) == 1 else
                                       "weights (later iterations)"}[style])
    colors = model_colors(scenario)
    calls = [flow.call(n) for n in flow.call_names]
    src = ColumnDataSource(dict(
        x=[pos[c.name][0] for c in calls], y=[pos[c.name][1] for c in calls], name=[c.name for c in calls],
        model=[c.model for c in calls], kind=[c.kind.value for c in calls],
        color=[colors[c.model] for c in calls], line=[KIND_COLORS[c.kind.value] for c in calls],
        inputs=[", ".join(c.inputs) for c in calls], outputs=[", ".join(c.outputs) for c in calls]))
    nodes = p.scatter("x", "y", source=src, size=28, fill_color="color", line_color="line", line_width=3)
    p.add_layout(LabelSet(x="x", y="y", text="name", source=src, y_offset=16, text_align="center",
                          text_font_size="9pt"))
    p.add_tools(HoverTool(renderers=[nodes], tooltips=[("call", "@name"), ("model", "@model"), ("kind", "@kind"),
                                                        ("in", "@inputs"), ("out", "@outputs")]))
    p.legend.location = "bottom_right"
    p.legend.label_text_font_size = "8pt"
    return p


def mesh_map_figure(scenario: Scenario, options: Mapping[str, Option], width: int = 640):
    """Which devices each call uses, with its strategy; node boundaries as vertical lines."""
    G = scenario.cluster.gpus_per_node
    names = list(scenario.dataflow.call_names)
    colors = model_colors(scenario)
    rows = []
    for name in names:
        o, call = options[name], scenario.dataflow.call(name)
        s = o.strategy
        rows.append(dict(call=name, left=o.mesh.start(G), right=o.mesh.start(G) + o.mesh.size,
                         model=call.model, color=colors[call.model], mesh=o.mesh.label(G),
                         strategy=f"dp{s.dp} tp{s.tp} pp{s.pp} m{s.micro_batches}"
                         + (f" sp{s.sp}" if s.sp > 1 else "") + (f" ring ({s.ring})" if s.ring else "")
                         + (" checkpointed" if s.checkpointing else "")
                         + (f" v{s.virtual_stages} (interleaved)" if s.virtual_stages > 1 else "")))
    src = ColumnDataSource({k: [r[k] for r in rows] for k in rows[0]})
    n = scenario.cluster.n_devices
    p = figure(width=width, height=60 + 34 * len(names), title="mesh map: devices of each call",
               y_range=list(reversed(names)), x_range=Range1d(0, n), tools=TOOLS, x_axis_label="device (rank)")
    bars = p.hbar(y="call", left="left", right="right", height=0.7, source=src, fill_color="color",
                  line_color="black", fill_alpha=0.8)
    p.add_layout(LabelSet(x="left", y="call", text="strategy", source=src, x_offset=4, y_offset=-6,
                          text_font_size="8pt"))
    for node in range(1, scenario.cluster.nodes):
        p.add_layout(Span(location=node * G, dimension="height", line_color="#888888", line_dash="dashed"))
    p.add_tools(HoverTool(renderers=[bars], tooltips=[("call", "@call"), ("model", "@model"), ("mesh", "@mesh"),
                                                       ("strategy", "@strategy")]))
    return p


def timeline_figure(scenario: Scenario, estimate: PlanEstimate, width: int = 640, options: Optional[dict] = None):
    """The simulated Gantt chart of one steady-state iteration: a bar per call, reallocations
    (weights moving to the call's layout) in orange before it, the exchange of its inputs (where
    the profile measured the runtime's) in grey. With generation running ahead (max_staleness
    S), the last S + 1 iterations, overlapping, each bar labelled with its iteration (a
    generation's weights move to it after it, for its next batch). A generation call with a
    length distribution draws inside its bar the live batch shrinking (micro-batched decoding,
    on a pipeline or where `options`, the plan's, are not given) or, without a pipeline, its
    replica's decode slots busy, filling and draining (continuous batching)."""
    names = list(scenario.dataflow.call_names)
    steady = max(t.iteration for t in estimate.tasks)
    shown = range(steady - estimate.max_staleness, steady + 1)
    base = min(t.start_s for t in estimate.tasks if t.iteration == shown[0])
    def what(t):
        return {"realloc": ("reallocation", REALLOC_COLOR), "transfer": ("inputs moving", TRANSFER_COLOR)}.get(
            t.kind, (scenario.dataflow.call(t.call).kind.value, KIND_COLORS[scenario.dataflow.call(t.call).kind.value]))

    rows = [dict(call=t.call, start=t.start_s - base, end=t.end_s - base, seconds=t.end_s - t.start_s,
                 what=what(t)[0], color=what(t)[1], iteration=f"it {t.iteration - shown[0] + 1}")
            for t in estimate.tasks if t.iteration in shown]
    src = ColumnDataSource({k: [r[k] for r in rows] for k in rows[0]})
    title = f"simulated timeline of one iteration: {estimate.time_per_iter_s:.4g} s " \
            f"(reallocation {estimate.realloc_s:.3g} s)"
    if estimate.max_staleness:
        title = f"simulated timeline, generation up to {estimate.max_staleness} iteration(s) ahead: one iteration " \
                f"ends every {estimate.time_per_iter_s:.4g} s, each takes {estimate.iteration_s:.4g} s"
    p = figure(width=width, height=60 + 34 * len(names), y_range=list(reversed(names)), tools=TOOLS,
               title=title, x_axis_label="seconds")
    bars = p.hbar(y="call", left="start", right="end", height=0.6, source=src, fill_color="color",
                  line_color="black")
    if estimate.max_staleness:
        p.add_layout(LabelSet(x="start", y="call", text="iteration", source=src, x_offset=3, y_offset=-6,
                              text_font_size="8pt"))
    p.add_tools(HoverTool(renderers=[bars], tooltips=[("call", "@call"), ("what", "@what"), ("iteration", "@iteration"),
                                                       ("start s", "@start{0.000}"), ("seconds", "@seconds{0.000}")]))
    for r in rows:  # generation calls with a length distribution: the live batch shrinking
        call = scenario.dataflow.call(r["call"])
        if r["what"] == "generate" and call.lengths is not None and options and options[call.name].strategy.pp == 1:
            xs, share = slots_busy_curve(call, scenario.model_of(call), scenario.cluster, options[call.name],
                                         r["start"], r["end"])
            p.step(xs, [(r["call"], -0.3 + 0.6 * y) for y in share], mode="after", line_color="black",
                   line_width=1.5, name=f"slots busy {r['call']}")
        elif r["what"] == "generate" and call.lengths is not None:
            xs, share = live_batch_curve(call, r["start"], r["end"])
            # inside the bar (height 0.6 around the category): the bottom is no row alive
            p.step([(x) for x in xs], [(r["call"], -0.3 + 0.6 * y) for y in share], mode="after",
                   line_color="black", line_width=1.5, name=f"live batch {r['call']}")
    p.add_layout(Span(location=estimate.time_per_iter_s, dimension="height", line_color="black", line_dash="dotted"))
    return p


def live_batch_curve(call, start: float, end: float, points: int = 64) -> tuple[list[float], list[float]]:
    """A generation call's expected share of rows still alive over its bar: step t of its
    decode at the expected elapsed steps sum_{u < t} P_call(u) (the call runs while its longest
    row decodes), scaled to the bar; the share is 1 - cdf[t]. `points` steps at most, evenly
    spread."""
    import numpy as np

    from realbench.dataflow.lengths import still_decoding

    cdf = call.lengths.cdf()
    running = still_decoding(cdf, call.seqs)
    elapsed = np.concatenate([[0.0], np.cumsum(running)])[:-1] / running.sum()
    steps = np.unique(np.linspace(0, len(running) - 1, min(points, len(running))).astype(int))
    xs = [start + (end - start) * float(elapsed[t]) for t in steps] + [end]
    share = [float(1.0 - cdf[t]) for t in steps] + [float(1.0 - cdf[steps[-1] + 1])]
    return xs, share


def slots_busy_curve(call, model, cluster, option, start: float, end: float, points: int = 64
                     ) -> tuple[list[float], list[float]]:
    """A generation call's expected share of a replica's decode slots busy over its bar
    (continuous batching: realbench.dataflow.lengths.continuous_busy), scaled to the bar."""
    from realbench.cost.calls import serving_slots
    from realbench.dataflow.lengths import continuous_busy

    shares, busy = continuous_busy(call.lengths.cdf(), call.seqs / option.strategy.dp,
                                   serving_slots(call, model, cluster, option),
                                   call.sync_steps, points)
    return [start + (end - start) * x for x in shares], busy


def memory_figure(estimate: PlanEstimate, width: int = 640, height: int = 260):
    """Peak memory of every device against two lines: the device's capacity (black) and the
    usable part that plans are searched within (red; the rest is headroom for fragmentation)."""
    peaks = [b / GIB for b in estimate.device_peak_bytes]
    cap, usable = estimate.device_memory_bytes / GIB, estimate.usable_memory_bytes / GIB
    src = ColumnDataSource(dict(device=list(range(len(peaks))), gib=peaks,
                                color=["#d62728" if x > usable else "#1f77b4" for x in peaks]))
    p = figure(width=width, height=height, tools=TOOLS, x_axis_label="device (rank)", y_axis_label="GiB",
               title=f"peak memory per device (usable {usable:.3g} of {cap:.3g} GiB"
                     f"{', OUT OF MEMORY' if estimate.oom else ''})",
               y_range=Range1d(0, max(cap, max(peaks)) * 1.1))
    bars = p.vbar(x="device", top="gib", width=0.8, source=src, fill_color="color")
    for where, color, text in ((cap, "black", "capacity"), (usable, "#d62728", "usable")):
        p.add_layout(Span(location=where, dimension="width", line_color=color, line_dash="dashed", name=text))
        p.add_layout(Label(x=5, y=where, x_units="screen", text=f"{text} {where:.3g} GiB", text_font_size="8pt",
                           text_color=color, y_offset=2))
    p.add_tools(HoverTool(renderers=[bars], tooltips=[("device", "@device"), ("GiB", "@gib{0.00}")]))
    return p


def curve_source(curve: Sequence[Sequence[float]] = ()) -> ColumnDataSource:
    return ColumnDataSource(dict(seconds=[float(s) for s, _ in curve], best=[float(b) for _, b in curve]))


def curves_figure(curves: Mapping[str, ColumnDataSource | Sequence[Sequence[float]]],
                  baselines: Optional[Mapping[str, float]] = None, width: int = 640, height: int = 300):
    """Best time per iteration against search seconds, one stepped line per method, the
    baselines as horizontal reference lines. Sources may be updated live (widgets stream into
    them); plain curves are wrapped."""
    p = figure(width=width, height=height, tools=TOOLS, title="search: best time per iteration",
               x_axis_label="search seconds", y_axis_label="s / iteration")
    for i, (method, data) in enumerate(curves.items()):
        src = data if isinstance(data, ColumnDataSource) else curve_source(data)
        color = Category10_10[i % 10]
        p.step("seconds", "best", source=src, mode="after", line_width=2, color=color, legend_label=method)
        p.scatter("seconds", "best", source=src, size=4, color=color, legend_label=method)
    for j, (name, t) in enumerate((baselines or {}).items()):
        p.add_layout(Span(location=t, dimension="width", line_dash="dashed", line_color="#666666"))
        p.add_layout(Label(x=5, y=t, x_units="screen", text=f"{name} {t:.4g} s", text_font_size="8pt",
                           y_offset=2 + 10 * j))
    if curves:
        p.legend.location = "top_right"
        p.legend.label_text_font_size = "8pt"
    return p


def comparison_figure(times: Mapping[str, float], width: int = 640, height: int = 240):
    """Time per iteration of several plans side by side (this plan, the baselines, ...)."""
    names = list(times)
    src = ColumnDataSource(dict(plan=names, seconds=[times[n] for n in names],
                                text=[f"{times[n]:.4g} s" for n in names],
                                color=[Category10_10[i % 10] for i in range(len(names))]))
    p = figure(width=width, height=height, y_range=list(reversed(names)), tools=TOOLS,
               title="time per iteration", x_axis_label="seconds (simulated)",
               x_range=Range1d(0, max(times.values()) * 1.25))
    p.hbar(y="plan", right="seconds", height=0.6, source=src, fill_color="color")
    p.add_layout(LabelSet(x="seconds", y="plan", text="text", source=src, x_offset=4, y_offset=-6,
                          text_font_size="9pt"))
    return p


def calibration_figure(phases: Sequence[Mapping], width: int = 640, height: int = 260):
    """Per phase of a logged step (`realbench calibrate`): the measured seconds beside the
    estimate before and after calibration, as grouped bars."""
    from bokeh.transform import dodge

    names = [r["phase"] for r in phases]
    src = ColumnDataSource(dict(phase=names, measured=[r["measured_s"] for r in phases],
                                before=[r["before_s"] for r in phases], after=[r["after_s"] for r in phases]))
    top = max([max(r["measured_s"], r["before_s"], r["after_s"]) for r in phases] or [1.0])
    p = figure(width=width, height=height, x_range=names, y_range=Range1d(0, top * 1.15), tools=TOOLS,
               title="measured and estimated per phase", y_axis_label="seconds")
    for i, (key, label) in enumerate((("measured", "measured"), ("before", "estimated before"),
                                      ("after", "estimated after"))):
        p.vbar(x=dodge("phase", (i - 1) * 0.27, range=p.x_range), top=key, width=0.25, source=src,
               fill_color=Category10_10[i], line_color=None, legend_label=label)
    p.legend.location = "top_right"
    p.legend.label_text_font_size = "8pt"
    p.xaxis.major_label_orientation = 0.6
    return p
