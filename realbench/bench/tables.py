"""The benchmarks' results as Markdown tables, for the manual (docs/hooks/generated.py renders each from
the benchmark's JSON: `fidelity` computed at build time, `engines` and `coverage` from the JSON files
their measured runs wrote, docs/measurements/data/). Nothing here is typed by hand: each cell is a
field of the result, formatted."""

from __future__ import annotations

import textwrap
from typing import Optional

from realbench.engines import ENGINES

# how the manual names each engine (a row of AReaL's is of the job with its workflow's reward function)
ENGINE_TITLES = {name: engine.title for name, engine in ENGINES.items()}


def _markdown(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines)


def _percent(x: Optional[float]) -> str:
    return "-" if x is None else f"{x * 100:.1f}%"


def fidelity_summary(result: dict) -> str:
    """`bench fidelity`'s summary: per kind of measurement and role of its rows (fit, held-out,
    reserved, excluded), the rows' count and their median and worst relative error."""
    rows = [[kind, role, str(s["rows"]), _percent(s["median_error"]), _percent(s["worst_error"])]
            for kind, roles in result["summary"].items() for role, s in roles.items()]
    return _markdown(["kind", "rows", "n", "median error", "worst error"], rows)


def _seconds(x: Optional[float]) -> str:
    return "out of memory" if x is None else f"{x:.2f}"


def engines_table(result: dict) -> str:
    """`bench engines`: per scenario and engine the example's, the default's and the searched plan's
    time per step, the gain of searching inside the engine, realbench's own best with and without the
    engines' sharding, and the reallocation gain (the engine's best over realbench's with zero)."""
    rows = []
    for r in result["rows"]:
        engine = ENGINE_TITLES[r["engine"]] + (" (reward function)" if r["reward"] == "function" else "")
        gain = "(fits)" if r["search_gain"] is None else f"{r['search_gain']:.2f}x"
        rows.append([r["scenario"], engine, _seconds(r["example_s"]), _seconds(r["default_s"]), f"{r['best_s']:.2f}",
                     gain, f"{r['realbench_s']:.2f}", f"{r['realbench_zero_s']:.2f}", f"{r['reallocation_gain']:.2f}x"])
    return _markdown(["scenario", "engine", "example s", "default s", "searched inside the engine s",
                      "gain by searching", "realbench's own search s", "realbench's own with zero s",
                      "reallocation gain"], rows)


def _share(x: Optional[float]) -> str:
    return "-" if x is None else f"{x:.0%}"


def coverage_table(result: dict, refusals: int = 5) -> str:
    """`bench coverage`: per engine the examples, RL jobs, stale ones (the pinned release refuses them
    too), priced ones, the share priced (of those not stale) and the `refusals` most frequent refusals
    (0: no such column)."""
    rows, total = [], {"examples": 0, "rl_jobs": 0, "stale": 0, "priced": 0}
    for engine, e in result["engines"].items():
        for key in total:
            total[key] += e[key]
        top = ", ".join(f"`{reason}` ({count})" for reason, count in list(e["refused"].items())[:refusals])
        rows.append([ENGINE_TITLES.get(engine, engine), str(e["examples"]), str(e["rl_jobs"]), str(e["stale"]),
                     str(e["priced"]), f"{_share(e['share_priced'])} ({_share(e['share_priced_of_running'])})", top])
    rows.append(["all", *(str(total[k]) for k in total),
                 f"{_share(result['share_priced'])} ({_share(result['share_priced_of_running'])})", ""])
    header = ["engine", "examples", "RL jobs", "stale", "priced", "share (of those not stale)",
              "most frequent refusals (count)"]
    if not refusals:
        header, rows = header[:-1], [row[:-1] for row in rows]
    return _markdown(header, rows)


def _refusals_by_feature(result: dict) -> list[tuple[str, dict[str, int], int]]:
    """`bench coverage`'s refusals by what they are for (coverage.NOT_PRICED: what realbench does not
    price, or the engine itself refuses): (feature, the examples each engine refuses for it, all of
    them), most first."""
    counts = {engine: e.get("refused_features", {}) for engine, e in result["engines"].items()}
    rows = [(f, {engine: c.get(f, 0) for engine, c in counts.items()}) for f in {f for c in counts.values() for f in c}]
    return sorted(((f, each, sum(each.values())) for f, each in rows), key=lambda row: (-row[2], row[0]))


def coverage_features_table(result: dict) -> str:
    """The refusals by feature (_refusals_by_feature), a column per engine and one of all."""
    rows = [[f, *(str(n) for n in each.values()), str(total)] for f, each, total in _refusals_by_feature(result)]
    return _markdown(["refused for", *(ENGINE_TITLES.get(e, e) for e in result["engines"]), "all"], rows)


def coverage_features_list(result: dict, width: int = 104) -> str:
    """The same counts as one paragraph (the README's): each feature with its examples over every
    engine, most first, wrapped at `width`."""
    items = "; ".join(f"{f}: {total}" for f, _, total in _refusals_by_feature(result))
    return textwrap.fill(items + ".", width=width, break_on_hyphens=False)


def engine_steps_table(result: dict) -> str:
    """`bench fidelity`'s published engine steps: per row, the whole step published and estimated (or,
    where only calls are published, their median error), and whether the plan fits in memory."""
    rows = []
    for r in result["engine_steps"]:
        job = r["label"] or r["source"]
        if r["published_step_s"] is not None:
            rows.append([r["source"], job, f"{r['published_step_s']:.1f}", f"{r['predicted_step_s']:.1f}",
                         f"{r['step_error'] * 100:+.1f}%", "yes" if r["fits"] else "no"])
        else:
            calls = ", ".join(f"{c['call']} {c['error'] * 100:+.1f}%" for c in r["calls"])
            rows.append([r["source"], job, "-", f"{r['predicted_step_s']:.1f}", f"calls: {calls}",
                         "yes" if r["fits"] else "no"])
    return _markdown(["source", "job", "published step s", "estimated s", "error", "fits"], rows)


def engine_predictions_table(result: dict) -> str:
    """`bench fidelity`'s predictions: per group and row fitted on, the factor k and the errors of the
    group's other rows predicted with it."""
    rows = []
    for group, g in result["engine_step_predictions"].items():
        for r in g["rows"]:
            errors = ", ".join(f"{p['error'] * 100:+.0f}%" for p in r["predicted"])
            rows.append([group, r["fit_on"], "-" if r["k"] is None else f"{r['k']:.3f}", errors or "-"])
        rows.append([group, "all", "", f"median {_percent(g['median_error'])}, worst {_percent(g['worst_error'])}"])
    return _markdown(["group", "fitted on", "k", "the other rows predicted (in the table's order)"], rows)


def engine_fit_table(result: dict) -> str:
    """`bench fidelity`'s engine factors: the calls they are fitted to, then the whole steps they are
    checked on, each published and estimated with the factors."""
    f = result["engine_fit"]
    rows = [[r["source"], r["row"], f"fitted: {r['call']}", f"{r['published_s']:.1f}", f"{r['estimated_s']:.1f}",
             f"{r['error'] * 100:+.1f}%"] for r in f["fitted_calls"]]
    rows += [[r["source"], r["row"], "checked: whole step", f"{r['published_s']:.1f}", f"{r['estimated_s']:.1f}",
              f"{r['error'] * 100:+.1f}%"] for r in f["checked_steps"]]
    rows.append(["", f"k_matmul {f['k_matmul']:.3f}, k_decode {f['k_decode']:.3f}", "checked steps", "", "",
                 f"median {_percent(f['checked_median_error'])}, worst {_percent(f['checked_worst_error'])}"])
    return _markdown(["source", "job", "role", "published s", "estimated s", "error"], rows)


TABLES = {"fidelity": fidelity_summary, "engine_fit": engine_fit_table, "engine_steps": engine_steps_table, "engine_predictions": engine_predictions_table, "engines": engines_table, "coverage": coverage_table,
          "coverage_features": coverage_features_table}
# the benchmark whose stored JSON a table is made from, where its name is not the benchmark's
TABLE_SOURCES = {"coverage_features": "coverage"}
