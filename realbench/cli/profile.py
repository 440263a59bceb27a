"""`realbench profile`: measure this machine's layer and collective costs into a profile file."""

from __future__ import annotations

from realbench.cli import log, non_negative_int


def _sizes(text: str) -> tuple[int, ...]:
    import argparse

    try:
        values = tuple(int(v) for v in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a comma-separated list of whole numbers") from None
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: every value must be at least 1")
    return tuple(sorted(set(values)))


def add_parser(sub) -> None:
    from realbench.hardware.profiler import DEFAULT_BATCHES, DEFAULT_LENGTHS, ProfileRequest

    d = ProfileRequest()
    p = sub.add_parser("profile", help="measure this machine (layers of the runtime's model, collectives)")
    p.add_argument("--out", required=True, help="profile file to write (JSON)")
    p.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    p.add_argument("--nproc", type=non_negative_int, default=d.nproc,
                   help=f"processes: tensor-parallel degrees and collective groups up to this (default {d.nproc})")
    p.add_argument("--model", action="append", dest="models", metavar="NAME",
                   help="model architecture to profile (repeatable; default llama-tiny)")
    p.add_argument("--batches", type=_sizes, default=DEFAULT_BATCHES, help="batch sizes, e.g. 1,2,4,8,16")
    p.add_argument("--lengths", type=_sizes, default=DEFAULT_LENGTHS, help="sequence lengths, e.g. 4,8,16,32")
    p.add_argument("--repeats", type=non_negative_int, default=d.repeats)
    p.add_argument("--warmup", type=non_negative_int, default=d.warmup)
    p.add_argument("--passes", type=non_negative_int, default=d.passes,
                   help=f"measure the grid this many times and keep the median (default {d.passes})")
    p.add_argument("--force", action="store_true", help="overwrite an existing file")
    p.set_defaults(handler=run)


def run(args) -> int:
    from pathlib import Path

    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from realbench.errors import ConfigError
    from realbench.hardware.profiler import ProfileRequest, check_request, profile_machine, profile_summary

    req = ProfileRequest(models=tuple(args.models or ("llama-tiny",)), batches=args.batches, lengths=args.lengths,
                         repeats=args.repeats, warmup=args.warmup, passes=args.passes, nproc=args.nproc, device=args.device)
    check_request(req)
    out = Path(args.out)
    if out.exists() and not args.force:  # refuse before measuring, not after
        raise ConfigError("exists; pass --force to overwrite it", source=str(out))
    if not out.parent.exists():
        raise ConfigError("its folder does not exist", source=str(out))
    with Progress(TextColumn("profiling"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  transient=True) as bar:
        task = bar.add_task("profile", total=None)
        profile = profile_machine(req, lambda done, total: bar.update(task, completed=done, total=total))
    profile.save(out, overwrite=args.force)
    for line in profile_summary(profile):
        log(line)
    log(f"wrote {out}")
    return 0
