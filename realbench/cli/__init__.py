"""The `realbench` command. Each subcommand lives in its own module and registers itself with
`add_parser(subparsers)`; its handler returns an exit status. Bad input anywhere becomes one
line on stderr and exit status 2; `--json` prints one JSON document on stdout, logs go to stderr."""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
from typing import Any, Optional, Sequence

from realbench.errors import ConfigError

EXIT_BAD_INPUT = 2


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):  # one line, not the usage block
        self.exit(EXIT_BAD_INPUT, f"{self.prog}: error: {message}\n")


def emit_json(obj: Any) -> None:
    json.dump(obj, sys.stdout, indent=2)
    sys.stdout.write("\n")


def log(*parts: Any) -> None:
    print(*parts, file=sys.stderr)


def positive_float(text: str) -> float:
    try:
        v = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not v > 0 or v != v or v == float("inf"):
        raise argparse.ArgumentTypeError(f"{text!r} must be a positive number")
    return v


def non_negative_int(text: str) -> int:
    try:
        v = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if v < 0:
        raise argparse.ArgumentTypeError(f"{text!r} must not be negative")
    return v


def positive_int(text: str) -> int:
    v = non_negative_int(text)
    if v < 1:
        raise argparse.ArgumentTypeError(f"{text!r} must be 1 or more")
    return v


def named_folders(words: Sequence[str], name: str, flag: str, value: str = "DIR") -> dict[str, str]:
    """{name: folder} of `NAME=DIR` words (a flag's values: --model-path ROLE=DIR, --examples
    ENGINE=DIR; --check-with ENGINE=PYTHON, `value` PYTHON)."""
    out = {}
    for word in words:
        key, eq, folder = word.partition("=")
        if not eq or not key or not folder:
            raise ConfigError(f"{word!r} is not {name}={value}", flag)
        out[key] = folder
    return out


def add_profile_args(p) -> None:
    p.add_argument("--profile", help="a profile file (realbench profile): measured call times where it "
                                     "has them, the analytic model elsewhere; 'none': the analytic model only. "
                                     "Default: CPU scenarios use this machine's cached profile (measured once, "
                                     "under a minute), GPU scenarios the device presets")
    p.add_argument("--force-profile", action="store_true",
                   help="use a profile measured on another kind of device than the scenario's")


def add_device_file_arg(p) -> None:
    p.add_argument("--device", dest="device_file", metavar="NAME|FILE",
                   help="plan on this device instead of the scenario's: a preset (see `realbench scenarios`'s "
                        "devices) or a device file that `realbench calibrate --out` wrote; costs then come from it "
                        "(no profile unless --profile names one)")


def with_device_file(args, scenario):
    """The scenario on --device's device, when given."""
    from realbench.hardware import load_device

    name = getattr(args, "device_file", None)
    if not name:
        return scenario
    device, links = load_device(name)
    return scenario.with_device(device, links)


def add_device_args(p, cuda_help: str) -> None:
    p.add_argument("--device", default="auto", choices=("auto", "cpu", "cuda"),
                   help=f"cuda: {cuda_help} over NCCL; cpu: gloo; auto (default): cuda when every "
                        "process on this machine can have a GPU")
    p.add_argument("--dtype", default="auto", choices=("auto", "bf16", "fp32"),
                   help="what the models compute in (trained models keep fp32 master weights and Adam "
                        "state; losses and log-probabilities are fp32); auto: bf16 on CUDA, fp32 on the CPU")
    p.add_argument("--compile-decode", action="store_true",
                   help="generation's decode step through torch.compile (fuses each layer's element-wise "
                        "kernels; a CUDA graph of it on a GPU); the first step of a run pays the compilation")


def add_output_args(p) -> None:
    p.add_argument("--save-hf", default="", metavar="DIR",
                   help="write the trained models as Hugging Face folders DIR/actor (and DIR/critic) at the end "
                        "(and into each --save-every checkpoint); DIR must be new or empty")
    p.add_argument("--eval-every", type=non_negative_int, default=0, metavar="N",
                   help="every N steps, evaluate on the held-out rows (data.eval or data.eval_size)")


def fraction(text: str) -> float:
    try:
        v = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not 0 <= v < 1:
        raise argparse.ArgumentTypeError(f"{text!r} must be a fraction in [0, 1)")
    return v


def add_staleness_arg(p) -> None:
    p.add_argument("--max-staleness", type=non_negative_int, default=None, metavar="S",
                   help="asynchronous RL: generation runs up to S iterations ahead of training (overrides the "
                        "scenario's dataflow.max_staleness; 0: synchronous)")


def with_staleness(args, scenario):
    """The scenario with --max-staleness applied, when given."""
    from realbench.errors import ConfigError

    given = getattr(args, "max_staleness", None)
    try:
        return scenario if given is None else scenario.with_staleness(given)
    except ConfigError as e:
        raise ConfigError(e.message, "--max-staleness") from None


def add_replan_args(p) -> None:
    p.add_argument("--replan-every", type=positive_int, default=0, metavar="K",
                   help="every K steps under one plan, recalibrate the estimator from the measured call times, "
                        "search a plan beside the training, and switch to it between two steps if it is faster")
    p.add_argument("--replan-budget", type=positive_float, default=5.0, metavar="SEC",
                   help="seconds each re-planning search takes (default 5)")
    p.add_argument("--replan-min-gain", type=fraction, default=0.05, metavar="G",
                   help="switch only to a plan predicted at least this fraction faster (default 0.05)")


def replan_settings(args, profile_file: str = ""):
    from realbench.runtime.launch import ReplanSettings

    return ReplanSettings(args.replan_every, args.replan_budget, args.replan_min_gain, profile_file)


@contextlib.contextmanager
def progress_bar(label: str):
    """A bar on stderr; yields the callback on_progress(done, total) that moves it. The bar
    appears with the first call: work that turns out to have nothing to do prints nothing; and
    only on a terminal (rich cannot draw a live bar into a file or pipe, it would leave a blank line)."""
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    shown: dict = {}

    def update(done: int, total: int) -> None:
        if not sys.stderr.isatty():
            return
        if not shown:
            shown["bar"] = Progress(TextColumn(label), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                                    transient=True, console=Console(file=sys.stderr))
            shown["bar"].start()
            shown["task"] = shown["bar"].add_task(label, total=None)
        shown["bar"].update(shown["task"], completed=done, total=total)
    try:
        yield update
    finally:
        if shown:
            shown["bar"].stop()


def profile_for(args, scenario, processes: Optional[int] = None, device_type: str = "cpu"):
    """The profile the arguments name, checked against the scenario's devices; by default this
    machine's cached profile for a CPU scenario planned or run on the CPU (realbench.runtime.profile_cache);
    None: the analytic model."""
    name = getattr(args, "profile", None)
    if name == "none" or (not name and getattr(args, "device_file", None)):
        return None
    if not name:
        from realbench.runtime.profile_cache import scenario_profile

        with progress_bar("profiling this machine") as on_progress:
            return scenario_profile(scenario, processes, note=log, on_progress=on_progress, device_type=device_type)
    from realbench.hardware.profile import check_profile_device, load_profile

    profile = load_profile(name)
    check_profile_device(profile, scenario.cluster, name, args.force_profile)
    return profile


def build_parser() -> argparse.ArgumentParser:
    from realbench.cli import (bench, calibrate, checkpoint, estimate, export, importer, lab, models, profile, run, scenarios,
                               search, validate, worker)

    parser = _Parser(prog="realbench", description="Plan and run RLHF training with parameter reallocation.")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    for module in (scenarios, models, validate, estimate, search, profile, run, worker, checkpoint, export, importer,
                   calibrate, bench, lab):
        module.add_parser(sub)
    return parser


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return args.handler(args) or 0
    except ConfigError as e:
        print(f"realbench: error: {e}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except KeyboardInterrupt:
        print("realbench: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        return 0
