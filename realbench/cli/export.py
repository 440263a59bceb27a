"""`realbench export`: a plan as an Accelerate config + launch command, torchrun command lines,
a Slurm batch script, or a standalone HTML report."""

from __future__ import annotations

from realbench.cli import add_profile_args, log, named_folders, non_negative_int, profile_for
from realbench.export import DEFAULT_PORT, FORMATS, export_plan


def _port(text: str) -> int:
    import argparse

    v = non_negative_int(text)
    if not 1 <= v <= 65535:
        raise argparse.ArgumentTypeError(f"{text!r} is not a TCP port (1..65535)")
    return v


def add_parser(sub) -> None:
    p = sub.add_parser("export", help="export a plan for a cluster (accelerate, torchrun, slurm), as an HTML report, "
                                      "or as an engine's configuration (verl, OpenRLHF, AReaL)")
    p.add_argument("--plan", required=True, help="plan file")
    p.add_argument("--format", required=True, choices=FORMATS, help="the launch form, report or engine configuration to write")
    p.add_argument("--out", required=True, help="file to write (accelerate: the config; its launch script "
                                                "goes beside it as <stem>-launch.sh)")
    p.add_argument("--scenario", help="scenario (default: the one the plan names)")
    p.add_argument("--nodes", type=non_negative_int, help="refuse the plan unless its cluster has this many nodes")
    p.add_argument("--gpus-per-node", type=non_negative_int,
                   help="refuse the plan unless its cluster has this many devices per node")
    p.add_argument("--steps", type=non_negative_int, default=100, help="training steps the launch runs (default 100)")
    p.add_argument("--port", type=_port, default=DEFAULT_PORT, help=f"rendezvous port (default {DEFAULT_PORT})")
    p.add_argument("--master-addr", default="", help="accelerate: node 0's address to write into the config")
    p.add_argument("--force", action="store_true", help="overwrite existing files")
    p.add_argument("--dtype", default="auto", choices=("auto", "bf16", "fp32"), help="what the workers compute in")
    p.add_argument("--compile-decode", action="store_true",
                   help="the workers' decode steps through torch.compile (realbench run --compile-decode)")
    p.add_argument("--save-hf", default="", metavar="DIR", help="node 0 writes the trained models there at the end")
    p.add_argument("--eval-every", type=non_negative_int, default=0, metavar="N",
                   help="evaluate on the held-out rows every N steps")
    p.add_argument("--model-path", action="append", default=[], metavar="ROLE=DIR",
                   help="an engine's format: the checkpoint of a model role (actor, critic, reward, teacher): a "
                        "folder here, or a hub id the engine fetches (Qwen/Qwen3-8B), where the scenario names a "
                        "preset or catalogue entry; repeat for each")
    add_profile_args(p)  # the html report's times, as `estimate` computes them
    p.set_defaults(handler=run)


def run(args) -> int:
    written = export_plan(args.format, args.plan, args.out, args.scenario, args.nodes, args.gpus_per_node,
                          args.steps, args.port, args.master_addr, args.force, dtype=args.dtype,
                          compile_decode=args.compile_decode, save_hf=args.save_hf, eval_every=args.eval_every,
                          model_paths=named_folders(args.model_path, "ROLE", "--model-path"),
                          profile_for=lambda scenario: profile_for(args, scenario))
    for path in written:
        log(f"wrote {path}")
    return 0
