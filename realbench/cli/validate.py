"""`realbench validate FILE`: check a scenario, plan or profile file (exit 0 valid, 2 invalid)."""

from __future__ import annotations

from realbench.cli import emit_json
from realbench.dataflow import CallKind
from realbench.plan import load_plan, load_scenario
from realbench.schema import PLAN_SCHEMA, PROFILE_SCHEMA, read_document
from realbench.plan.scenario import scenario_from_document


def add_parser(sub) -> None:
    p = sub.add_parser("validate", help="check a scenario, plan or profile file")
    p.add_argument("file", help="a scenario, plan or profile file")
    p.add_argument("--scenario", help="for a plan: check it against this scenario (name or file) "
                                      "instead of the one it names")
    p.add_argument("--json", action="store_true", help="print the verdict as JSON")
    p.set_defaults(handler=run)


def run(args) -> int:
    from realbench.engines import refuse_uncarried

    doc = read_document(args.file)
    if doc["schema"] == PLAN_SCHEMA:
        scenario = load_scenario(args.scenario) if args.scenario else None
        plan, scenario, _ = load_plan(args.file, scenario)
        refuse_uncarried(scenario)
        result = {"file": args.file, "valid": True, "kind": "plan", "scenario": scenario.name,
                  "calls": len(plan.calls)}
        text = f"{args.file}: valid plan for scenario {scenario.name} ({len(plan.calls)} calls)"
    elif doc["schema"] == PROFILE_SCHEMA:
        from realbench.hardware.profile import profile_from_document

        prof = profile_from_document(doc, args.file)
        result = {"file": args.file, "valid": True, "kind": "profile", "device": prof.device.name,
                  "models": list(prof.models)}
        text = f"{args.file}: valid profile of {prof.device.name} ({', '.join(prof.models)}), made {prof.date}"
    else:
        s = scenario_from_document(doc, args.file)
        refuse_uncarried(s)
        result = {"file": args.file, "valid": True, "kind": "scenario", "scenario": s.name,
                  "calls": len(s.dataflow.calls), "plan_space": s.plan_space_size}
        text = (f"{args.file}: valid scenario {s.name} ({len(s.dataflow.calls)} calls, "
                f"plan space {s.plan_space_size:.3g})")
        if s.data is not None:
            d = s.data
            result["data"] = {"rows": d.rows, "prompt_len": d.prompt_len, "completion_len": d.completion_len,
                              "truncated": d.truncated, "tokenizer_size": d.vocab}
            widths = f"prompts padded to {d.prompt_len} tokens" + (
                f", completions to {d.completion_len}" if d.completion_len else "")
            text += (f"\n  data: {d.rows} training rows, {widths} ({d.prompt_percentile:g}th percentile; "
                     f"{d.truncated} row(s) cut to fit)")
            for role, width in d.rescored_len.items():  # reward models with a tokenizer of their own
                result["data"].setdefault("rescored_len", {})[role] = width
                text += (f"\n  {role}: its own tokenizer scores the texts re-tokenized "
                         f"(costed at {width} tokens a sequence)")
        for c in s.dataflow.calls:  # generation calls whose response lengths are a distribution
            if c.lengths is not None and c.kind == CallKind.GENERATE:
                from realbench.dataflow.lengths import expected_max

                rows = c.group_size if c.group_size > 1 else c.seqs
                longest = expected_max(c.lengths.cdf(), rows)
                result.setdefault("lengths", {})[c.name] = {"mean": c.lengths.expected, "max": c.lengths.max,
                                                            "expected_longest": longest, "of_rows": rows}
                text += (f"\n  {c.name}: responses {c.lengths.short()}, mean {c.lengths.expected:.0f} tokens; the "
                         f"longest of {rows} {'samples of a prompt' if c.group_size > 1 else 'responses'} "
                         f"{longest:.0f} on average")
    if args.json:
        emit_json(result)
    else:
        print(text)
    return 0
