"""The benchmarks' results as Markdown tables, for the manual (docs/hooks/generated.py renders each from
the benchmark's JSON: `fidelity` computed at build time, `engines` and `coverage` from the JSON files
their measured runs wrote, docs/measurements/data/). Nothing here is typed by hand: each cell is a
field of the result, formatted."""

from __future__ import annotations

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


TABLES = {"fidelity": fidelity_summary, "engines": engines_table, "coverage": coverage_table}
