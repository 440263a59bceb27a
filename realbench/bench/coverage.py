"""How much of what the engines' own users run realbench reads (`realbench bench coverage --json`):
every example configuration of verl, OpenRLHF and AReaL (their `examples/` folders, given as
folders: the pinned releases' packages do not ship them, their repositories at the release tags
do), imported and priced as `realbench import` and `realbench estimate` would, with config-only
stand-ins for the models they name (the catalogue entry of the same architecture: a hub id's
base, instruct and dated variants share one config). Per engine: how many examples are
configurations of an RL job, how many import, how many price, and the reasons of the rest,
grouped (each a refusal by name of what realbench does not price).

An example written for another release than the pinned one may set what the pinned release does
not have (a key it dropped or has not yet). Given each engine's Python with its pinned release
(`--check-with verl=.venv-verl/bin/python ...`, the environments `make engines` builds), a
refusal of a setting the engine does not have is put to the engine's own checks (its
realbench/engines/*/check.py validate): where the release refuses the example too, naming that
setting, the example is counted as one the pinned release does not run (`stale`), apart from the
RL jobs realbench could price.

An example shell script is run by bash with the commands it calls replaced by recorders (python,
torchrun, ray, nvidia-smi, ...): what it would launch is captured with its variables expanded as
bash expands them, and nothing runs. verl's launch is `-m verl.trainer.main_ppo` (or its
one-step-off entry) with Hydra overrides over ppo_trainer or ppo_megatron_trainer; OpenRLHF's
`-m openrlhf.cli.train_ppo_ray` with its flags; AReaL's examples are experiment YAML files.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import tempfile
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Optional

from realbench.errors import ConfigError

# the entry points of each engine's RL training (what import reads), and of its other trainers
RL_ENTRIES = {"verl": ("verl.trainer.main_ppo", "verl.experimental.one_step_off_policy.main_ppo"),
              "openrlhf": ("openrlhf.cli.train_ppo_ray",)}
# RL entry points import does not read: RL jobs, refused by name (or stale, where the pinned release
# has no such module: verl 0.9.1 has no trainer/main_ppo_sync.py)
OTHER_RL_ENTRIES = {"verl": ("verl.trainer.main_ppo_sync", "verl.experimental.fully_async_policy.fully_async_main",
                             "verl.trainer.main_ppo_v0")}
EXAMPLE_FILES = {"verl": "*.sh", "openrlhf": "*.sh", "areal": "*.yaml"}
# the commands an example script may call, answered by the recorder (nvidia-smi as a node of 8 GPUs)
RECORDED = ("python", "python3", "torchrun", "accelerate", "deepspeed")
STUBS = {"nvidia-smi": "for i in 0 1 2 3 4 5 6 7; do echo \"GPU $i: NVIDIA H100 80GB HBM3 (UUID: GPU-$i)\"; done",
         "npu-smi": "exit 1", "ray": 'while [ $# -gt 0 ] && [ "$1" != "--" ]; do shift; done; shift; exec "$@"',
         "hf": "exit 0", "huggingface-cli": "exit 0", "wandb": "exit 0", "pip": "exit 0", "pip3": "exit 0",
         "git": "exit 0", "wget": "exit 0", "sleep": "exit 0", "hostname": "echo node0",
         # (nothing the script would write reaches a file: its logs pass through, its folders, copies
         # and package installs are not made; what bash itself redirects lands in the sandbox it runs in,
         # `sandboxed`)
         "tee": "exec cat", "mkdir": "exit 0", "touch": "exit 0", "rm": "exit 0", "cp": "exit 0", "mv": "exit 0",
         "ln": "exit 0", "chmod": "exit 0", "sudo": "exit 0", "apt": "exit 0", "apt-get": "exit 0", "curl": "exit 0"}
RECORDER = r'''#!/usr/bin/env python3
import json, os, sys
args = sys.argv[1:]
if "-c" in args[:1] or "--version" in args:
    sys.exit(1)  # (probes such as `python3 -c 'import torch_npu'`: absent)
with open(os.environ["REALBENCH_CAPTURE"], "a") as f:
    f.write(json.dumps({"command": os.path.basename(sys.argv[0]), "args": args}) + "\n")
'''


# a refusal of a setting the pinned engine does not have (the readers' words), which its own checks
# confirm or not; AReaL's top-level keys are set apart: its agent examples' own config classes
# (subclasses of PPOConfig, in their scripts) hold them, which AReaL's PPOConfig refuses as well
UNKNOWN_SETTING = ("has no such setting", "has no such flag", "+ adds a key verl's config does not hold")


# What an example is refused for, as the README's table of refusals names it: a feature realbench does
# not price, or a setting the engine itself refuses when it runs; each refused example's by the first
# match of its refusal ("key: message") in order. A refusal none matches is "other", which the stored
# measurement has none of (tests/test_readme.py)
NOT_PRICED = (
    ("vision-language models beyond Qwen2.5-VL, Qwen3-VL and Qwen3.5 (GLM-4.1V, MiniCPM-o, a frozen vision encoder)",
     r"freeze_visual_encoder|max_images_per_prompt|image_patch_size|GLM-4\.1V|MiniCPM-o"),
    ("verl's multi-stage wake-up of the rollout", r"multi_stage_wake_up: "),
    ("a data set class of the example's own (verl's data.custom_cls)", r"^data\.custom_cls\."),
    ("Megatron's fused forward kernels", r"use_fused_kernels: True with model_engine megatron"),
    ("a model with no config here", r"model[._]path: .*no such folder or config\.json|models\.actor: .*no config\.json"),
    ("verl's VeOmni and MindSpeed engines", r"^model_engine: model_engine '(veomni|mindspeed)'"),
    ("another package's configs (verl_mlite)", r"^hydra\.searchpath: "),
    ("on-policy distillation from several teachers", r"several teachers"),
    ("a served reward model's tp beyond its KV heads",
     r"^calls\.reward_inf\.tp: .*does not divide the \d+ attention heads and \d+ KV heads"),
    ("ReMax, the optimal-token baseline, GDPO",
     r"^algorithm\.adv_estimator: '(remax|optimal_token_baseline|gdpo)'|calculate_sum_pi_squared|gdpo_reward_keys"),
    ("FSDP2's offload policy on a trained model", r"fsdp_config\.offload_policy: "),
    ("pure bf16 training (FSDP's model_dtype)", r"fsdp_config\.model_dtype: "),
    ("Megatron's unfused kernels", r"gradient_accumulation_fusion: False"),
    ("decoding without CUDA graphs, or beyond the captured batches",
     r"enforce_eager: True|cudagraph_mode: '(NONE|PIECEWISE)'|cudagraph_capture_sizes: "),
    ("Ascend NPUs", r"^trainer\.device: 'npu'"),
    ("verl's prefix grouper", r"use_prefix_grouper: "),
    ("a generative reward model's own lengths", r"^reward\.reward_model\.rollout\."),
    ("verl's fully-async entry point", r"fully_async_main: an RL entry point"),
    ("tensor parallelism across nodes", r"tp \d+ does not divide the \d+ devices of a node"),
    ("an adapter folder without lora_rank", r"^actor_rollout_ref\.model\.lora_adapter_path: .* with lora_rank 0"),
    ("responses without a token budget", r"^--rollout\.max_new_tokens: is not set"),
    ("an AReaL example's own config class (agent workflows)", r"AReaL [\d.]+'s PPOConfig has no such setting"),
    ("AReaL's v2 inference gateway", r"^rollout\._version: 'v2'"),
    ("AReaL's one-string allocation_mode", r"^allocation_mode: "),
    ("dynamic batch sizes (DAPO's filtering)", r"^dynamic_bs: "),
    ("training on CPU workers", r"scheduling_spec's first entry gpu"),
    ("a group of one the engine's GRPO scores otherwise", r"compares? a prompt's samples|group of one: AReaL centres"),
    ("prompts without a length cap (AReaL's train_dataset.max_length)", r"^train_dataset\.max_length: is not set"),
    ("a group of GPUs other than a power-of-two block of a node", r"places a group on a power-of-two block"),
    ("settings the engine itself refuses when it runs", r"does not divide a GPU's \d+ rows|tokens hold no whole row of"),
)


def feature_of(reason: str) -> str:
    """What a refusal ("key: message") is for (NOT_PRICED), or "other"."""
    return next((feature for feature, pattern in NOT_PRICED if re.search(pattern, reason)), "other")


@dataclass
class Example:
    engine: str
    file: str  # relative to the examples folder
    status: str = "priced"  # priced | not_rl | refused | stale (the pinned release refuses it too)
    reason: str = ""  # what refused it (a ConfigError's key and message), or what it runs instead
    feature: str = ""  # what realbench does not price that refused it (NOT_PRICED), where refused
    models: list[str] = field(default_factory=list)
    time_per_iter_s: Optional[float] = None


def captured_launches(script: Path, timeout_s: float = 30.0) -> list[dict]:
    """The commands `script` would run through python (and torchrun, ray, ...), in order, each
    {command, args}: the script run by bash with those commands recorded instead of run."""
    with tempfile.TemporaryDirectory() as tmp:
        bin_dir, home = Path(tmp) / "bin", Path(tmp) / "home"
        bin_dir.mkdir()
        home.mkdir()
        for name in RECORDED:
            (bin_dir / name).write_text(RECORDER.replace("#!/usr/bin/env python3", f"#!{_host_python()}"))
        for name, body in STUBS.items():
            (bin_dir / name).write_text(f"#!/bin/bash\n{body}\n")
        for f in bin_dir.iterdir():
            f.chmod(0o755)
        capture = Path(tmp) / "capture.jsonl"
        env = {"PATH": f"{bin_dir}:/usr/bin:/bin", "HOME": str(home), "REALBENCH_CAPTURE": str(capture),
               "USER": "user", "LANG": "C.UTF-8",
               # (a variable the script requires, ${NAME:?...}, as a user gives it: a path of its name)
               **{name: str(Path(tmp) / name.lower()) for name in re.findall(r"\$\{(\w+):\?", script.read_text())}}
        try:
            # (ulimit: a builtin, answered by a function; positional arguments as a usage line asks them:
            # a process count and a folder)
            # (set -u off: a variable the user would export reads as empty, as its default does)
            prelude = ('ulimit() { :; }; set() { local a=(); for x in "$@"; do case "$x" in -*u*) x="${x//u/}";; '
                       'esac; [ "$x" = "-" ] || a+=("$x"); done; builtin set "${a[@]}"; }; ')
            # (a script that reads $1 or $2 gets them; one that passes "$@" on as overrides gets none)
            # (not a `$1` of a quoted program inside it: awk's fields)
            text = re.sub(r"'[^']*'", "", script.read_text())
            positional = ["8", str(Path(tmp) / "out")] if re.search(r"\$\{?[12]\b", text) else []
            subprocess.run(["bash", "-c", prelude + 'source "$0" "$@"', str(script.resolve()), *positional],
                           env=env, timeout=timeout_s,
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, stdin=subprocess.DEVNULL)
        except subprocess.TimeoutExpired:
            pass
        if not capture.is_file():
            return []
        return [json.loads(line) for line in capture.read_text().splitlines() if line.strip()]


def sandboxed(repository: Path, mirror: Path) -> Path:
    """`mirror`, a folder holding the repository's folders (linked) and copies of its files: a script
    run there reads the repository's files by the paths it gives them, and a file it writes where it
    runs (a log, a helper script, one of the repository's own files) lands in the mirror. (A link to
    a file would lead the write back to the user's.)"""
    mirror.mkdir()
    for entry in repository.iterdir():
        if entry.is_dir():
            (mirror / entry.name).symlink_to(entry, target_is_directory=True)
        elif entry.is_file():
            shutil.copyfile(entry, mirror / entry.name)
    return mirror


def _host_python() -> str:
    import sys

    return sys.executable


def _module_of(launch: dict) -> tuple[Optional[str], list[str]]:
    """(the python module a launch runs, the arguments after it)."""
    args = launch["args"]
    flag = next((f for f in ("-m", "--module") if f in args), None)  # (python -m, deepspeed --module)
    if flag:
        i = args.index(flag)
        return args[i + 1] if i + 1 < len(args) else None, args[i + 2:]
    scripts = [a for a in args if a.endswith(".py")]
    return (scripts[0] if scripts else None), args[args.index(scripts[0]) + 1:] if scripts else []


def rl_launch(engine: str, launches: list[dict]) -> tuple[Optional[str], list[str], list[str]]:
    """(the RL entry point launched, its arguments, the other modules launched) of an example."""
    others = []
    for launch in launches:
        module, args = _module_of(launch)
        if module in RL_ENTRIES[engine] or module in OTHER_RL_ENTRIES.get(engine, ()):
            return module, args, others
        if module:
            others.append(module)
    return None, [], others


def verl_job(args: list[str], folder: Path, work: Path) -> tuple[Path, list[str]]:
    """(a Hydra primary config, the overrides) of verl's main_ppo arguments: --config-name names
    ppo_trainer, ppo_megatron_trainer or the one-step-off entry's config (a config of the example's
    own `folder` is read as it is; realbench's own primary is written in `work`, not beside the
    example), the rest are overrides."""
    name, path, overrides = "ppo_trainer", None, []
    it = iter(args)
    for a in it:
        key, eq, value = a.partition("=")
        if key in ("--config-name", "--config-path", "-cn", "-cp"):
            value = value if eq else next(it, "")
            if key in ("--config-name", "-cn"):
                name = value.strip("'\"").removesuffix(".yaml")
            else:
                path = value.strip("'\"")
        elif a.startswith("-"):
            continue  # Hydra's own flags
        else:
            overrides.append(a)
    own = (folder / path / f"{name}.yaml") if path else None
    if own is not None and own.is_file():
        return own, overrides
    primary = work / f".realbench-{name}.yaml"
    # (the searchpath: verl's own composition finds ppo_trainer there, as main_ppo's config path does)
    primary.write_text(f"hydra:\n  searchpath: [pkg://verl.trainer.config]\ndefaults:\n  - {name}\n  - _self_\n")
    return primary, overrides


def stand_in(name: str) -> Optional[str]:
    """The catalogue entry of a model a configuration names (a hub id or a folder whose name is
    one), its base, instruct and dated variants taken as one architecture, or None."""
    from realbench.models import catalogue

    def key(text: str) -> str:
        text = text.rstrip("/").rsplit("/", 1)[-1].lower()
        return re.sub(r"-(instruct|base|chat|thinking)(-\d{4})?$", "", re.sub(r"-(instruct|thinking)-\d{4}$", "", text))

    wanted = key(str(name))
    for entry, info in catalogue.index().items():
        if key(str(info["hub"])) == wanted or key(entry) == wanted:
            return entry
    return None


def with_stand_ins(engine: str, path: Path, overrides: list[str], folder: Path) -> tuple[list[str], list[str]]:
    """(the overrides with every model path pointed at a stand-in folder holding its catalogue
    entry's config.json, the models named) of a configuration."""
    from realbench.engines import engine_module
    from realbench.models import catalogue

    spec = engine_module(engine)
    _, settings, given = spec.read_config(str(path), overrides)
    named, extra = [], []
    for key in dict.fromkeys(spec.model_paths.values()):
        flat = key.lstrip("-")
        value = settings.get(flat, settings.get(key))
        if not isinstance(value, str) or not value:
            continue
        if flat in given or key in given:  # (an engine's default path, a critic the job may not run, is no model named)
            named.append(value)
        entry = stand_in(value)
        if entry is None:
            continue
        target = folder / "stand-ins" / entry
        target.mkdir(parents=True, exist_ok=True)
        (target / "config.json").write_text(json.dumps(catalogue.config(entry)))
        extra.append(f"{flat}={target}")
    return overrides + extra, named


# The image tokens a prompt holds that a vision-language example is priced with: a stand-in, as its
# model's config is (the examples' data sets are not read here), 256 tokens: a 448 x 448 image in
# Qwen2.5-VL's 28-pixel merged patches, 512 x 512 in Qwen3-VL's 32-pixel ones
IMAGE_TOKENS_STAND_IN = 256
# The prompt cap an AReaL example that sets none (train_dataset.max_length: AReaL then keeps every
# prompt, and realbench would price prompts at gconfig.max_tokens less max_new_tokens) is priced with:
# a stand-in, as the data sets are not read here, 1,024 tokens, the cap AReaL's own math examples set
PROMPT_CAP_STAND_IN = 1024


def prompt_cap_stand_in(file: Path) -> list[str]:
    """The override that gives an AReaL example without a prompt cap PROMPT_CAP_STAND_IN, or none."""
    from realbench.schema import read_document

    data = read_document(file, schema=False).get("train_dataset") or {}
    return [] if data.get("max_length") is not None else [f"train_dataset.max_length={PROMPT_CAP_STAND_IN}"]


def price(engine: str, path: Path, overrides: list[str], out: Path) -> float:
    """Import a configuration (realbench import; a vision-language model's prompts with
    IMAGE_TOKENS_STAND_IN image tokens) and estimate the plan its engine would run."""
    from realbench.cost import Estimator
    from realbench.engines import import_config, job_models
    from realbench.plan.plan import load_plan

    vlm = any(getattr(m, "vision", None) for m in job_models(engine, str(path), overrides))
    scenario_file, plan_file = import_config(engine, str(path), overrides, str(out), name="job", overwrite=True,
                                             image_tokens=IMAGE_TOKENS_STAND_IN if vlm else None)
    plan, scenario, options = load_plan(str(plan_file))
    est = Estimator(scenario)
    return float(est.estimate(est.choice_of(options)).time_per_iter_s)


def engine_refusal(engine: str, python: str, path: Path, overrides: list[str], key: str) -> Optional[str]:
    """The pinned engine's own refusal of a configuration (its check's `validate`, run with
    `python`, the engine's environment) where it names `key`'s setting, or None: it accepts the
    configuration, or refuses it for something else."""
    from realbench.engines import engine_module

    script = engine_module(engine).check
    done = _in_engine_python(python, [str(script), "validate", str(path), *overrides], timeout_s=600)
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    if not lines:
        raise ConfigError(f"the engine's check printed no result: {done.stderr.strip()[-300:]}", "--check-with", python)
    result = json.loads(lines[-1])
    error = "" if result.get("ok") else str(result.get("error", ""))
    return error if key.lstrip("-+").split("=", 1)[0].rsplit(".", 1)[-1] in error else None


def areal_kind(file: Path) -> Optional[str]:
    """What an AReaL example YAML is where it is not an RL experiment's configuration, or None: a
    file without experiment_name is none of AReaL's (a SkyPilot task, environment variables); an
    experiment without rollout and gconfig, PPOConfig's own sections, is an SFT, reward-model or
    DPO one (AReaL's SFTConfig, RWConfig, DPOConfig)."""
    import yaml

    try:
        doc = yaml.safe_load(file.read_text())
    except (OSError, yaml.YAMLError):
        return None  # (import says what is wrong with it)
    if not isinstance(doc, dict) or "experiment_name" not in doc:
        return "not an AReaL experiment configuration (no experiment_name)"
    if "rollout" not in doc and "gconfig" not in doc:
        return "an SFT, reward-model or DPO experiment (no rollout or gconfig)"
    return None


def module_exists(python: str, module: str) -> bool:
    """Whether the engine's environment (`python`) has `module` (importlib's find_spec: its parent
    packages are imported, the module is not run)."""
    code = "import importlib.util, sys; sys.exit(0 if importlib.util.find_spec(sys.argv[1]) else 1)"
    return _in_engine_python(python, ["-c", code, module], timeout_s=300).returncode == 0


def _in_engine_python(python: str, args: list[str], timeout_s: float) -> subprocess.CompletedProcess:
    """`python args` (the engine's environment), its output captured; one that does not run or
    does not end in time is a ConfigError naming --check-with."""
    try:
        return subprocess.run([python, *args], capture_output=True, text=True, timeout=timeout_s,
                              stdin=subprocess.DEVNULL)
    except (OSError, subprocess.TimeoutExpired) as e:
        raise ConfigError(f"the engine's Python did not run: {e}", "--check-with", python) from None


def _in_ppo_config(key: str) -> bool:
    """Whether an AReaL key is under one of PPOConfig's own sections (actor, rollout, ...), not a
    field an example's own config class adds (UNKNOWN_SETTING)."""
    from realbench.engines import areal

    return "." in key and key.split(".", 1)[0] in {k.split(".", 1)[0] for k in areal.defaults() if "." in k}


def examine(engine: str, file: Path, root: Path, work: Path, check_with: Optional[str] = None) -> Example:
    example = Example(engine, str(file.relative_to(root)))
    path, overrides = None, []
    try:
        if engine == "areal":
            what = areal_kind(file)
            if what:
                example.status, example.reason = "not_rl", what
                return example
            path, overrides = file, ["train_dataset.path=data", *prompt_cap_stand_in(file)]
        else:
            module, args, others = rl_launch(engine, captured_launches(file))
            if module is None:
                example.status = "not_rl"
                example.reason = f"launches {', '.join(dict.fromkeys(others)) or 'nothing realbench reads'}"
                return example
            if module in OTHER_RL_ENTRIES.get(engine, ()):
                example.status, example.reason = "refused", (
                    f"{module}: an RL entry point realbench does not read (import reads {', '.join(RL_ENTRIES[engine])})")
                if check_with and not module_exists(check_with, module):
                    example.status, example.reason = "stale", f"{module}: the pinned release has no such module"
                return example
            if engine == "verl":
                path, overrides = verl_job(args, file.parent, work)
            else:
                path = work / "flags.txt"
                path.write_text(shlex.join(args))
                overrides = []
        overrides, models = with_stand_ins(engine, path, overrides, work)
        # (a model under the script's sandboxed home, `$HOME/models/...`, as its user reads it: `~/models/...`)
        example.models = [as_user_reads(m) for m in models]
        example.time_per_iter_s = price(engine, path, overrides, work / "imported")
    except ConfigError as e:
        example.status, example.reason = "refused", as_user_reads(f"{e.field + ': ' if e.field else ''}{e.message}")
        unknown = e.field and any(words in e.message for words in UNKNOWN_SETTING)
        if unknown and check_with and path is not None and not (engine == "areal" and not _in_ppo_config(e.field)):
            theirs = engine_refusal(engine, check_with, path, overrides, e.field)
            if theirs:
                example.status, example.reason = "stale", f"{e.field}: the pinned release refuses it too: {theirs}"
    return example


def as_user_reads(text: str) -> str:
    """`text` with the sandbox a script ran in as its user reads it: its home `~`, and a variable the
    script requires (`${NAME:?...}`, given a path of its name: captured_launches) `$NAME`."""
    sandbox = rf"{re.escape(tempfile.gettempdir())}/[^/\s']+"
    text = re.sub(rf"{sandbox}/home(?=/)", "~", text)
    # (and this machine's home, where a refusal names the Hugging Face cache looked in)
    text = re.sub(rf"{re.escape(os.path.expanduser('~'))}(?=/)", "~", text)
    return re.sub(rf"{sandbox}/([a-z0-9_]+)(?![\w/-])", lambda m: "$" + m.group(1).upper(), text)


def reason_group(reason: str) -> str:
    """A refusal's group: its key (with numbers and paths out), or the start of its message."""
    head = reason.split(": ", 1)[0] if ": " in reason else reason
    head = re.sub(r"\d+", "N", head)
    return head if len(head) < 90 else head[:90]


def run(examples: Optional[dict[str, str]] = None, check_with: Optional[dict[str, str]] = None,
        on_progress: Optional[Callable[[int, int], None]] = None) -> dict:
    """Per engine, every example under its folder (`examples`: {engine: folder}) imported and
    priced; the counts and the refusals' reasons grouped. `check_with`: {engine: its Python with
    the pinned release}, whose own checks tell stale examples apart."""
    from realbench.engines import ENGINES

    check_with = dict(check_with or {})
    given = dict(check_with)  # (as the user named them, for the result)
    for engine, python in check_with.items():
        if engine not in ENGINES:
            raise ConfigError(f"unknown engine {engine!r} ({', '.join(ENGINES)})", "--check-with")
        if not Path(python).is_file():
            raise ConfigError("no such file (the engine's Python: `make engines` builds .venv-verl, "
                              ".venv-openrlhf and .venv-areal)", "--check-with", python)
        check_with[engine] = str(Path(python).absolute())  # (before each example's folder is the working one)
    if not examples:
        raise ConfigError("give each engine's examples folder (--examples verl=DIR openrlhf=DIR areal=DIR): the "
                          "releases' packages do not ship them; their repositories at the release tags do")
    rows: list[Example] = []
    files = []
    for engine, folder in examples.items():
        if engine not in EXAMPLE_FILES:
            raise ConfigError(f"unknown engine {engine!r} (verl, openrlhf, areal)", "--examples")
        root = Path(folder).expanduser().resolve()
        if not root.is_dir():
            raise ConfigError("no such folder", "--examples", str(root))
        files += [(engine, root, f) for f in sorted(root.rglob(EXAMPLE_FILES[engine])) if f.is_file()]
    for k, (engine, root, f) in enumerate(files):
        with tempfile.TemporaryDirectory() as work:
            cwd = os.getcwd()
            try:
                # (run, and its paths taken, from the repository, the folder above examples/, as the
                # engines' docs launch them: bash examples/grpo_trainer/run_qwen3-8b.sh; from a mirror
                # of it, so that what a script writes where it runs stays out of the user's clone)
                os.chdir(sandboxed(root.parent, Path(work) / "repository"))
                rows.append(examine(engine, f, root, Path(work), check_with.get(engine)))
            finally:
                os.chdir(cwd)
        if on_progress is not None:
            on_progress(k + 1, len(files))
    for r in rows:
        r.feature = feature_of(r.reason) if r.status == "refused" else ""
    out = {"benchmark": "coverage", "engines": {}}
    for engine in examples:
        mine = [r for r in rows if r.engine == engine]
        rl = [r for r in mine if r.status != "not_rl"]
        stale = [r for r in rl if r.status == "stale"]
        priced = [r for r in rl if r.status == "priced"]
        runs = len(rl) - len(stale)
        out["engines"][engine] = {
            "examples": len(mine), "rl_jobs": len(rl), "stale": len(stale), "priced": len(priced),
            "share_priced": len(priced) / len(rl) if rl else None,
            "share_priced_of_running": len(priced) / runs if runs else None,
            "checked_with": given.get(engine),
            "refused": dict(Counter(reason_group(r.reason) for r in rl if r.status == "refused").most_common()),
            "refused_features": dict(Counter(r.feature for r in rl if r.status == "refused").most_common()),
            "stale_settings": dict(Counter(reason_group(r.reason) for r in stale).most_common()),
            "not_rl": dict(Counter(r.reason for r in mine if r.status == "not_rl").most_common())}
    total_rl = sum(e["rl_jobs"] for e in out["engines"].values())
    total_runs = total_rl - sum(e["stale"] for e in out["engines"].values())
    total = sum(e["priced"] for e in out["engines"].values())
    out["share_priced"] = total / total_rl if total_rl else None
    out["share_priced_of_running"] = total / total_runs if total_runs else None
    out["rows"] = [r.__dict__ for r in rows]
    return out



def table(result: dict) -> str:
    """The counts per engine as lines of text (`realbench bench coverage` without --json): examples,
    RL jobs, stale, priced, the share priced (of those not stale), and the most frequent refusals."""
    lines = []
    for engine, e in result["engines"].items():
        share = "-" if e["share_priced"] is None else f"{e['share_priced']:.0%}"
        running = "-" if e["share_priced_of_running"] is None else f"{e['share_priced_of_running']:.0%}"
        lines.append(f"{engine}: {e['examples']} examples, {e['rl_jobs']} RL jobs, {e['stale']} stale, "
                     f"{e['priced']} priced ({share}; {running} of those not stale)")
        lines += [f"  refused {count}x: {reason}" for reason, count in list(e["refused"].items())[:5]]
    if result["share_priced"] is not None:
        lines.append(f"all: {result['share_priced']:.0%} priced ({result['share_priced_of_running']:.0%} of those "
                     "not stale); --json lists every example with its reason")
    return "\n".join(lines)
