"""`realbench models`: the models a scenario can name without files (presets and the catalogue of
hub configs), or the spec of one (a name, a folder, a config.json file or a hub id in the local
cache): its family, parameters, active parameters, and whether realbench's runtime computes it."""

from __future__ import annotations

from realbench.cli import emit_json


def add_parser(sub) -> None:
    p = sub.add_parser("models", help="list the models a scenario can name (presets, the catalogue of hub configs), "
                                      "or show one")
    p.add_argument("name", nargs="?", help="a preset, a catalogue entry, a checkpoint folder, a config.json file or "
                                           "a hub id in the local Hugging Face cache")
    p.add_argument("--json", action="store_true", help="print JSON")
    p.set_defaults(handler=run)


def model_row(name: str, spec, hub: str = "") -> dict:
    """What `realbench models` shows of one model."""
    problem = spec.runtime_problem()
    moe = spec.moe
    return {"name": name, "family": spec.family, "params": spec.n_params, "active_params": spec.active_params,
            "layers": spec.n_layers, "hidden": spec.hidden,
            "experts": None if moe is None else {"experts": moe.experts, "top_k": moe.top_k,
                                                 "expert_ffn": moe.expert_ffn, "shared_ffn": moe.shared_ffn},
            "hub": hub or None, "source": spec.path or spec.config_source, "priced": True, "runs": problem is None,
            "not_run_because": problem}


def rows() -> list[dict]:
    from realbench.models import PRESETS, catalogue, get_model

    out = [model_row(name, spec) for name, spec in PRESETS.items()]
    out += [model_row(name, get_model(name), catalogue.hub_id(name)) for name in catalogue.names()]
    return out


def run(args) -> int:
    if args.name:
        from pathlib import Path

        from realbench.plan.scenario import named_model

        row = model_row(args.name, named_model(args.name, Path(".")))
        if args.json:
            emit_json(row)
        else:
            for key, value in row.items():
                print(f"{key}: {value}")
        return 0
    table = rows()
    if args.json:
        emit_json(table)
        return 0
    from rich.console import Console
    from rich.table import Table

    t = Table(title="models a scenario can name (models: {actor: NAME}); any Hugging Face folder, config.json "
                    "or cached hub id too")
    for col in ("name", "family", "params", "active", "hub config", "runtime"):
        t.add_column(col)
    for r in table:
        t.add_row(r["name"], r["family"], f"{r['params'] / 1e9:.2f}B", f"{r['active_params'] / 1e9:.2f}B",
                  r["hub"] or "(preset)", "runs" if r["runs"] else "priced only")
    Console(width=140).print(t)
    return 0
