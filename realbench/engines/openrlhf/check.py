"""Run OpenRLHF's own code on a command line, with OpenRLHF's Python (`make engines` builds
`.venv-openrlhf` with openrlhf 0.11.2 installed without its dependencies: Ray, DeepSpeed, vLLM and
flash-attn need GPUs). Standalone: the standard library and the openrlhf package only, never
realbench.

    .venv-openrlhf/bin/python realbench/engines/openrlhf/check.py defaults
        every flag of `python -m openrlhf.cli.train_ppo_ray` as its argument parser declares it
        (option strings, dest, type, nargs, choices, default, store_true/false):
        realbench/engines/openrlhf/openrlhf-0.11.2.json
    .venv-openrlhf/bin/python realbench/engines/openrlhf/check.py validate SCRIPT
        the flags of SCRIPT (a launch script or a file of flags: what follows
        `openrlhf.cli.train_ppo_ray`), through OpenRLHF's argument parser, the checks and rewrites
        after parsing, and its `train()` up to where it would start Ray actors (its assertions on
        colocated groups and the hybrid engine's GPUs), with Ray and the GPU workers stubbed;
        prints one JSON line: {"ok": true, ...} or {"ok": false, "error": "..."} (exit status 1)
    .venv-openrlhf/bin/python realbench/engines/openrlhf/check.py pack MAX_TOKENS_PER_GPU < LENGTHS.json
        the micro-batches OpenRLHF's dynamic batching counts for each list of sequence lengths (a
        JSON list of lists on stdin), by its get_minimum_num_micro_batch_size
        (utils/seqlen_balancing.py, ring attention and DeepSpeed's tp 1); prints a JSON list of counts
"""

from __future__ import annotations

import argparse
import io
import json
import shlex
import sys
import types
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path
from unittest import mock

# run as a script, this file's folder comes first on the path, and realbench's modules beside it
# (settings.py, reader.py, ...) would shadow any package of their names
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != Path(__file__).resolve().parent]

MODULE = "openrlhf.cli.train_ppo_ray"


def flags_of(text: str) -> list[str]:
    """The arguments of the train_ppo_ray call in a launch script (or all words of a file of
    flags), comments and line continuations as bash reads them."""
    words = shlex.split(text.replace("\\\n", " "), comments=True)
    if MODULE in words:
        words = words[words.index(MODULE) + 1:]
    words = [w for w in words if w != "$@"]  # (a launch script passes its own arguments on)
    for i, w in enumerate(words):  # the call ends where the shell's next command starts
        if w in ("&&", "||", ";", "|", "&"):
            return words[:i]
    return words


def _source() -> tuple[Path, str]:
    import openrlhf

    path = Path(openrlhf.__file__).parent / "cli" / "train_ppo_ray.py"
    return path, path.read_text()


def _stubs() -> dict:
    """Ray, the GPU workers and the strategy as mocks; openrlhf.utils.config (hierarchize) real."""
    import openrlhf

    utils = types.ModuleType("openrlhf.utils")
    utils.__path__ = [str(Path(openrlhf.__file__).parent / "utils")]
    utils.get_strategy = mock.MagicMock()
    mods = {name: mock.MagicMock() for name in (
        "ray", "ray.util", "ray.util.placement_group", "openrlhf.trainer", "openrlhf.trainer.ray",
        "openrlhf.trainer.ray.launcher", "openrlhf.trainer.ray.ppo_actor", "openrlhf.trainer.ray.ppo_critic",
        "openrlhf.trainer.ppo_trainer", "openrlhf.trainer.ppo_trainer_async")}
    mods["ray"].is_initialized.return_value = True
    mods["openrlhf.utils"] = utils
    return mods


class _Parsed(Exception):
    pass


def defaults() -> dict:
    from importlib.metadata import version

    path, src = _source()
    captured = {}

    def capture(self, args=None, namespace=None):
        captured["parser"] = self
        raise _Parsed

    with mock.patch.dict(sys.modules, _stubs()), mock.patch.object(argparse.ArgumentParser, "parse_args", capture):
        try:
            exec(compile(src, str(path), "exec"), {"__name__": "__main__"})
        except _Parsed:
            pass
    flags = []
    for a in captured["parser"]._actions:
        if not a.option_strings or isinstance(a, argparse._HelpAction):
            continue
        kind = {argparse._StoreTrueAction: "true", argparse._StoreFalseAction: "false"}.get(type(a), "value")
        # (the run name's default is the launch time, cli/train_ppo_ray.py: not a setting's default)
        default = None if a.dest == "logger.wandb.run_name" else a.default
        flags.append({"flags": a.option_strings, "dest": a.dest, "kind": kind, "default": default,
                      "type": getattr(a.type, "__name__", None), "nargs": a.nargs,
                      "choices": list(a.choices) if a.choices else None})
    return {"openrlhf": version("openrlhf"), "flags": flags}


def validate(script: str) -> dict:
    path, src = _source()
    argv = flags_of(Path(script).read_text())
    captured: dict = {}
    g: dict = {"__name__": "__main__"}
    # OpenRLHF's own train() (defined by the module before its __main__ block calls it), the
    # parsed arguments kept
    g["_checked_train"] = lambda args: (captured.setdefault("args", args), g["train"](args))
    code = compile(src.replace("\n    train(args)", "\n    _checked_train(args)"), str(path), "exec")
    err, old_argv = io.StringIO(), sys.argv
    sys.argv = [MODULE] + argv
    try:
        with mock.patch.dict(sys.modules, _stubs()), redirect_stdout(io.StringIO()), redirect_stderr(err):
            exec(code, g)
    except SystemExit as e:  # argparse's refusal: its message is on stderr
        lines = [line for line in err.getvalue().splitlines() if line.strip()]
        raise ValueError(lines[-1] if lines else f"exit {e.code}") from None
    finally:
        sys.argv = old_argv
    a = captured["args"]
    return {"ok": True, "actor_gpus": a.actor.num_nodes * a.actor.num_gpus_per_node,
            "vllm_engines": a.vllm.num_engines, "vllm_tp": a.vllm.tensor_parallel_size, "zero_stage": a.ds.zero_stage,
            "colocate_all": a.train.colocate_all, "critic": bool(a.critic.model_name_or_path),
            "lora": {"rank": a.ds.lora.rank, "alpha": a.ds.lora.alpha, "target_modules": a.ds.lora.target_modules},
            # a user's own settings, carried through realbench (engine_settings)
            "actor_lr": a.actor.adam.lr,
            "prompt_dataset": a.data.prompt_dataset, "packing_samples": a.ds.packing_samples,
            # ring attention's group size (realbench's sp with ring) and head stride
            "ring_attn_size": a.ds.ring_attn_size, "ring_attn_head_stride": a.ds.ring_attn_head_stride,
            # vLLM's share of each GPU's memory (realbench's memory_fraction)
            "gpu_memory_utilization": a.vllm.gpu_memory_utilization,
            # the DeepSpeed states offloaded between updates (realbench's offload_optimizer)
            "ds_enable_sleep": a.ds.enable_sleep, "vllm_enable_sleep": a.vllm.enable_sleep,
            # CPU Adam (realbench's host_adam): the flag, and where OpenRLHF's own DeepSpeed config
            # puts the optimizer for it
            "ds_adam_offload": a.ds.adam_offload, "offload_optimizer_device": _ds_config(a)["offload_optimizer"]["device"]}


def _ds_config(a) -> dict:
    """The zero_optimization block of OpenRLHF's own DeepSpeed training config for the parsed
    arguments (utils/deepspeed/deepspeed_utils.py get_train_ds_config, as deepspeed.py:437-439 calls
    it), its module loaded with DeepSpeed and torch as mocks (the function builds a dict)."""
    import importlib.util

    import openrlhf

    path = Path(openrlhf.__file__).parent / "utils" / "deepspeed" / "deepspeed_utils.py"
    mocks = {n: mock.MagicMock() for n in ("deepspeed", "deepspeed.runtime", "deepspeed.runtime.zero",
                                           "deepspeed.runtime.zero.partition_parameters", "torch", "packaging")}
    with mock.patch.dict(sys.modules, mocks):
        spec = importlib.util.spec_from_file_location("openrlhf_deepspeed_utils", path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return module.get_train_ds_config(offload=False, adam_offload=a.ds.adam_offload,
                                          stage=a.ds.zero_stage)["zero_optimization"]


def pack(max_tokens: int, batches: list[list[int]]) -> list[int]:
    """OpenRLHF's count of dynamic micro-batches for each batch of lengths (its module loaded alone:
    the package's __init__ imports the GPU stack)."""
    import importlib.util

    import openrlhf

    path = Path(openrlhf.__path__[0]) / "utils" / "seqlen_balancing.py"
    spec = importlib.util.spec_from_file_location("openrlhf_seqlen_balancing", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return [module.get_minimum_num_micro_batch_size(lengths, max_tokens, 1, 1) for lengths in batches]


def main(argv: list[str]) -> int:
    if argv[:1] == ["pack"] and len(argv) == 2:
        print(json.dumps(pack(int(argv[1]), json.load(sys.stdin))))
        return 0
    if argv[:1] == ["defaults"]:
        print(json.dumps(defaults(), sort_keys=True, default=list))
        return 0
    if argv[:1] == ["validate"] and len(argv) == 2:
        try:
            print(json.dumps(validate(argv[1])))
            return 0
        except Exception as e:  # OpenRLHF's own refusal, whatever its type: reported as one line
            print(json.dumps({"ok": False, "error": f"{type(e).__name__}: {e}".splitlines()[0]}))
            return 1
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
