"""`realbench scenarios`: list the built-in scenarios (or print one as a scenario file)."""

from __future__ import annotations

import yaml

from realbench.cli import emit_json
from realbench.plan import BUILTIN, get_builtin
from realbench.schema import write_document


def add_parser(sub) -> None:
    p = sub.add_parser("scenarios", help="list the built-in scenarios")
    p.add_argument("--json", action="store_true", help="print a JSON list")
    p.add_argument("--dump", metavar="NAME", help="print the scenario file of one built-in scenario")
    p.add_argument("--out", metavar="FILE", help="with --dump: write it to FILE (.yaml or .json)")
    p.add_argument("--force", action="store_true", help="with --out: overwrite an existing file")
    p.set_defaults(handler=run)


def run(args) -> int:
    if args.dump:
        doc = get_builtin(args.dump).to_document()
        if args.out:
            write_document(doc, args.out, overwrite=args.force)
        else:
            print(yaml.safe_dump(doc, sort_keys=False, width=100), end="")
        return 0
    rows = [get_builtin(name).summary() for name in BUILTIN]
    if args.json:
        emit_json(rows)
        return 0
    from rich.console import Console
    from rich.table import Table

    table = Table(title="built-in scenarios")
    for col in ("name", "algorithm", "models", "gpus", "plan space"):
        table.add_column(col)
    for r in rows:
        models = ", ".join(f"{k}={v}" for k, v in r["models"].items())
        table.add_row(r["name"], r["algorithm"], models, f"{r['nodes']}x{r['gpus'] // r['nodes']} {r['device']}",
                      f"10^{r['plan_space_log10']:.1f}")
    Console(width=160).print(table)
    return 0
