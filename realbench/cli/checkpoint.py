"""`realbench checkpoint convert CHECKPOINT --to-hf DIR [--merge-lora]`: a realbench checkpoint,
written under any plan and any number of processes, as Hugging Face folders (DIR/actor,
DIR/critic; a model trained with LoRA as PEFT's adapter folder, or merged into one model)."""

from __future__ import annotations

from pathlib import Path

from realbench.cli import log
from realbench.errors import ConfigError


def add_parser(sub) -> None:
    p = sub.add_parser("checkpoint", help="work with realbench checkpoints")
    actions = p.add_subparsers(dest="action", required=True)
    c = actions.add_parser("convert", help="write a checkpoint's trained models as Hugging Face folders")
    c.add_argument("checkpoint", help="a checkpoint (a step<N> folder), or a --checkpoint-dir (its latest)")
    c.add_argument("--to-hf", required=True, metavar="DIR", help="new or empty folder for DIR/<role>")
    c.add_argument("--scenario", help="the scenario (default: the one stored with the checkpoint)")
    c.add_argument("--merge-lora", action="store_true",
                   help="a model trained with LoRA as one full model (W + alpha/r B A), not PEFT's adapter folder")
    c.set_defaults(handler=run)


def run(args) -> int:
    from realbench.runtime.checkpoint import MANIFEST, convert_to_hf
    from realbench.runtime.launch import latest_checkpoint

    folder = Path(args.checkpoint)
    if not folder.is_dir():
        raise ConfigError("is not a folder", source=args.checkpoint)
    if not (folder / MANIFEST).is_file():  # a checkpoint directory: its latest complete checkpoint
        try:
            folder = folder / f"step{latest_checkpoint(str(folder))}"
        except ConfigError:
            raise ConfigError("is neither a checkpoint (step<N> with checkpoint.json) nor a folder of complete ones",
                              source=args.checkpoint) from None
    out = Path(args.to_hf)
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise ConfigError("exists and is not empty: name a new folder", "--to-hf", args.to_hf)
    scenario = None
    if args.scenario:
        from realbench.plan import load_scenario

        scenario = load_scenario(args.scenario)
    for made in convert_to_hf(folder, out, scenario, merge_lora=args.merge_lora):
        log(f"wrote {made}")
    return 0
