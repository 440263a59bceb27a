"""`realbench bench NAME`: run a benchmark and print its JSON (or a short summary)."""

from __future__ import annotations

import contextlib
import importlib
import inspect

from realbench.cli import emit_json, named_folders, progress_bar

BENCHMARKS = {"estimator": "realbench.bench.estimator", "search": "realbench.bench.search",
              "realloc": "realbench.bench.realloc", "calibration": "realbench.bench.calibration",
              "runtime": "realbench.bench.runtime", "fidelity": "realbench.bench.fidelity",
              "peers": "realbench.bench.peers", "lengths": "realbench.bench.lengths",
              "async": "realbench.bench.asynchronous", "engines": "realbench.bench.engines",
              "rollout": "realbench.bench.rollout", "host-adam": "realbench.bench.host_adam",
              "coverage": "realbench.bench.coverage", "prediction": "realbench.bench.prediction"}


def add_parser(sub) -> None:
    p = sub.add_parser("bench", help="run a benchmark")
    p.add_argument("name", choices=sorted(BENCHMARKS), help="the benchmark to run")
    p.add_argument("--quick", action="store_true", help="a smaller, faster run (for smoke tests)")
    p.add_argument("--profile", help="calibration: use this profile file instead of profiling first")
    p.add_argument("--examples", nargs="+", metavar="ENGINE=DIR",
                   help="coverage: each engine's examples folder (verl=DIR openrlhf=DIR areal=DIR)")
    p.add_argument("--check-with", nargs="+", metavar="ENGINE=PYTHON",
                   help="coverage: each engine's Python with its pinned release (verl=.venv-verl/bin/python ...), "
                        "whose own checks tell the examples it refuses too apart")
    p.add_argument("--json", action="store_true", help="print the results as one JSON document")
    p.set_defaults(handler=run)


def run(args) -> int:
    module = importlib.import_module(BENCHMARKS[args.name])
    kwargs = dict(module.QUICK) if args.quick and hasattr(module, "QUICK") else {}
    if args.profile:
        if args.name != "calibration":
            from realbench.errors import ConfigError

            raise ConfigError("only the calibration benchmark takes a profile", "--profile")
        from realbench.hardware.profile import load_profile

        load_profile(args.profile)  # a bad file is a one-line error before any work starts
        kwargs["profile_path"] = args.profile
    if args.examples:
        if args.name != "coverage":
            from realbench.errors import ConfigError

            raise ConfigError("only the coverage benchmark takes examples", "--examples")
        kwargs["examples"] = named_folders(args.examples, "ENGINE", "--examples")
    if args.check_with:
        if args.name != "coverage":
            from realbench.errors import ConfigError

            raise ConfigError("only the coverage benchmark takes engines' checks", "--check-with")
        kwargs["check_with"] = named_folders(args.check_with, "ENGINE", "--check-with", "PYTHON")
    # (a benchmark that reports its progress gets a bar on the terminal)
    with progress_bar(f"bench {args.name}") if "on_progress" in inspect.signature(module.run).parameters \
            else contextlib.nullcontext() as on_progress:
        if on_progress:
            kwargs["on_progress"] = on_progress
        result = module.run(**kwargs)
    if args.json:
        emit_json(result)
    elif hasattr(module, "table"):  # (a benchmark whose rows are too many to print as they are)
        print(module.table(result))
    else:
        for k, v in result.items():
            print(f"{k}: {v}")
    return 0
