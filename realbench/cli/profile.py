"""`realbench profile`: measure this machine's layer and collective costs into a profile file, or
(without --out) into the cached profile that local plans and runs are costed with by default
(realbench.runtime.profile_cache): that refreshes it."""

from __future__ import annotations

import sys

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
    from realbench.runtime.profiler import DEFAULT_BATCHES, DEFAULT_LENGTHS, ProfileRequest

    d = ProfileRequest()
    p = sub.add_parser("profile", help="measure this machine (layers of the runtime's model, collectives)")
    p.add_argument("--out", help="profile file to write (JSON); without it, this machine's cached profile for "
                                 "--nproc processes is measured again (what CPU scenarios are costed with)")
    p.add_argument("--device", default="cpu", choices=("cpu", "cuda"), help="measure on the CPU (gloo) or GPUs (NCCL)")
    p.add_argument("--dtype", default="auto", choices=("auto", "bf16", "fp32"),
                   help="what the layers compute in (auto: what a run on --device uses, bf16 on cuda, fp32 on cpu)")
    p.add_argument("--scenario", help="also measure this scenario's model shapes, on its number of devices "
                                      "unless --nproc is given")
    p.add_argument("--nproc", type=non_negative_int, default=None,
                   help=f"processes: tensor-parallel degrees and collective groups up to this (default {d.nproc})")
    p.add_argument("--model", action="append", dest="models", metavar="NAME",
                   help="model architecture to profile (repeatable; default llama-tiny)")
    p.add_argument("--batches", type=_sizes, default=DEFAULT_BATCHES, help="batch sizes, e.g. 1,2,4,8,16")
    p.add_argument("--lengths", type=_sizes, default=DEFAULT_LENGTHS, help="sequence lengths, e.g. 4,8,16,32")
    p.add_argument("--repeats", type=non_negative_int, default=d.repeats, help="timed repetitions of each measurement")
    p.add_argument("--warmup", type=non_negative_int, default=d.warmup, help="untimed repetitions before them")
    p.add_argument("--passes", type=non_negative_int, default=d.passes,
                   help=f"measure the grid this many times and keep the median (default {d.passes})")
    p.add_argument("--call-passes", type=non_negative_int, default=d.call_passes,
                   help=f"measure the runtime's whole calls this many times and keep the median (default {d.call_passes})")
    p.add_argument("--compile-decode", action="store_true",
                   help="measure generation's decode steps compiled, as `realbench run --compile-decode` runs "
                        "them (each shape compiles once; needs --out: the cached profile prices plain runs)")
    p.add_argument("--force", action="store_true", help="overwrite an existing file")
    p.set_defaults(handler=run)


def run(args) -> int:
    from pathlib import Path

    from realbench.cli import progress_bar
    from realbench.errors import ConfigError
    from realbench.runtime.profile_cache import cache_path, machine_identity, machine_profile, shape_named
    from realbench.runtime.profiler import ProfileRequest, check_request, profile_machine, profile_summary
    from realbench.plan import load_scenario

    models, nproc = list(args.models or ()), args.nproc
    if args.scenario:
        scenario = load_scenario(args.scenario)
        models += shape_named(scenario.models.values())
        nproc = nproc or scenario.cluster.n_devices
    req = ProfileRequest(models=tuple(models or ("llama-tiny",)), batches=args.batches, lengths=args.lengths,
                         repeats=args.repeats, warmup=args.warmup, passes=args.passes, call_passes=args.call_passes,
                         nproc=ProfileRequest().nproc if nproc is None else nproc, device=args.device,
                         dtype=args.dtype, compile_decode=args.compile_decode)
    check_request(req)
    if args.compile_decode and not args.out:
        raise ConfigError("needs --out: this machine's cached profile prices runs without compiled decode steps",
                          "--compile-decode")
    from realbench.runtime.local import WorkerError

    def failed(e: WorkerError) -> int:  # a measuring process failed: its first line, nothing written
        print(f"realbench: profile failed: {str(e).splitlines()[0]}", file=sys.stderr)
        return 1
    if not args.out:
        path = cache_path(*machine_identity(req.nproc, req.device))
        try:
            with progress_bar("profiling") as on_progress:
                profile = machine_profile(req.nproc, device=req.device, refresh=True, request=req,
                                          on_progress=on_progress)
        except WorkerError as e:
            return failed(e)
        for line in profile_summary(profile):
            log(line)
        log(f"refreshed this machine's cached profile for {req.nproc} processes: {path}")
        return 0
    out = Path(args.out)
    if out.exists() and not args.force:  # refuse before measuring, not after
        raise ConfigError("exists; pass --force to overwrite it", source=str(out))
    if not out.parent.exists():
        raise ConfigError("its folder does not exist", source=str(out))
    try:
        with progress_bar("profiling") as on_progress:
            profile = profile_machine(req, on_progress)
    except WorkerError as e:
        return failed(e)
    profile.save(out, overwrite=args.force)
    for line in profile_summary(profile):
        log(line)
    log(f"wrote {out}")
    return 0
