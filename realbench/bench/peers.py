"""`realbench bench peers`: realbench against TRL's GRPOTrainer and RLOOTrainer on the same job.

One job, trained by both on one CPU process each, with GRPO, with RLOO and with GRPO on LoRA
adapters (`lora`): a LLaMA checkpoint saved by transformers (at least 20M parameters unless
`--quick`), arithmetic prompts with answers, the `digits` reward function of `realbench.examples`,
and the same settings for each algorithm (`ALGORITHMS`, TRL's names, which TRL's GRPOConfig and
RLOOConfig take as they are): learning rate (constant), beta, epsilon, group size, prompts per
step, max_new_tokens, temperature, and GRPO's loss type (RLOO has none: TRL's RLOO loss is its
own); neither checkpoints activations (TRL's configs do by default). `lora` trains the same GRPO
job at its own learning rate with the same adapters in both (`LORA`: r, lora_alpha and
target_modules, no dropout, no bias): TRL's GRPOTrainer with that `peft.LoraConfig` as its
peft_config, realbench's scenario with `models.actor.lora` and no reference model, so that both
take the reference from the actor with its adapters off. Each seed trains both with each
algorithm, alternating which system goes first; per run: seconds per step (the median over the
steps after the first), the reward of every step (the mean of the samples' rewards, before RLOO's
KL penalty) and the number of parameters the optimizer trains (`trained_params`: the adapters'
alone under LoRA). Each algorithm's summary compares the reward curves: each run's curve is
smoothed (the mean of its last `SMOOTH` steps at every step), and realbench's seed-mean curve is
inside TRL's band (the least and the greatest of TRL's smoothed seeds) at `curve_inside_trl_band`
of the steps; the final rewards (the mean of the last quarter of the steps) of every seed, with
TRL's spread; the mean first-step rewards (both sample from the same checkpoint there); and the
two median step times with their ratio (`step_ratio`: TRL's over realbench's). GRPO's summary is
at the top level of the JSON, beside the job (`model_params`, `steps`, `seeds`, `smooth_steps`);
RLOO's, the same keys, under `rloo`; LoRA's under `lora`, its settings with the adapters' r,
lora_alpha and target_modules. `bench_peers(algorithms=[...])` runs only some of `ALGORITHMS`
(e.g. `["lora"]`); the summaries of the others are absent.

TRL is an optional extra (`pip install 'realbench[peers]'`; LoRA also needs PEFT); without it the
benchmark says so in one line.
"""

from __future__ import annotations

import contextlib
import importlib.util
import statistics
import sys
import tempfile
import time
from pathlib import Path

from realbench.errors import ConfigError

# Each algorithm's training settings, TRL's names, given as they are to its TRL config (GRPOConfig,
# RLOOConfig) and to realbench's `training:`. RLOO has no loss_type (TRL's RLOOConfig neither) and
# its own beta, TRL's RLOO default.
SETTINGS = dict(learning_rate=1e-3, beta=0.04, epsilon=0.2, temperature=1.0, loss_type="dapo")
RLOO_SETTINGS = dict(learning_rate=1e-3, beta=0.05, epsilon=0.2, temperature=1.0)
# GRPO with LoRA adapters, PEFT's names (`peft.LoraConfig`, realbench's `models.actor.lora`): rank
# 16, alpha 32, every projection of the decoder layers, no dropout, no bias, no rsLoRA; the other
# GRPO settings as above but for a learning rate of 2e-3, the same in both systems (TRL's LoRA
# GRPO on the full job, seeds 0-2, mean final reward: 1.32 at 1e-3, 1.39 at 2e-3, 1.28 at 5e-3 and
# 1.36 at 1e-2, the last two with early dips of a step's reward to 0.44 and 0.41)
LORA = dict(r=16, lora_alpha=32, target_modules=["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj",
                                                 "down_proj"])
LORA_SETTINGS = dict(SETTINGS, learning_rate=2e-3)
ALGORITHMS = {"grpo": SETTINGS, "rloo": RLOO_SETTINGS, "lora": LORA_SETTINGS}
# the TRL trainer (and realbench's dataflow) of an algorithm not named after it, and its adapters
TRAINERS = {"lora": "grpo"}
ADAPTERS = {"lora": LORA}
FULL_JOB = dict(hidden=512, layers=8, ffn=1376, steps=30, seeds=(0, 1, 2, 3, 4, 5), prompts=4, group_size=4, max_new_tokens=8)
QUICK_JOB = dict(hidden=64, layers=2, ffn=176, steps=2, seeds=(0,), prompts=2, group_size=2, max_new_tokens=4)


def _job(folder: Path, size: dict, algorithms=tuple(ALGORITHMS)) -> dict[str, Path]:
    """The checkpoint, the data and the reward function, and the scenario realbench trains for
    each of `algorithms`."""
    from realbench.examples import save_model, tiny_grpo_job

    save_model(folder / "ckpt", hidden=size["hidden"], layers=size["layers"], ffn=size["ffn"], heads=8,
               kv_heads=4)
    out = {}
    for a in algorithms:
        path = tiny_grpo_job(folder, devices=1, prompts=size["prompts"], group_size=size["group_size"],
                             max_new_tokens=size["max_new_tokens"], eval_size=0, shuffle=False,
                             algorithm=TRAINERS.get(a, a))
        out[a] = with_adapters(path, ADAPTERS[a], a) if a in ADAPTERS else path
    return out


def with_adapters(path: Path, lora: dict, name: str) -> Path:
    """The scenario at `path` with its actor trained with LoRA adapters (`lora`: r, lora_alpha,
    target_modules) and no reference model: the reference is the actor with its adapters off,
    as TRL's with a peft_config and beta > 0. Written beside it as `<algorithm>-<name>-...yaml`."""
    import yaml

    doc = yaml.safe_load(Path(path).read_text())
    algorithm = doc["algorithm"]
    doc["models"]["actor"]["lora"] = {**lora, "target_modules": list(lora["target_modules"]), "lora_dropout": 0.0,
                                      "bias": "none", "use_rslora": False}
    del doc["models"]["ref"]
    doc["name"] = doc["name"].replace(algorithm, f"{algorithm}-{name}", 1)
    out = Path(path).with_name(f"{doc['name']}.yaml")
    out.write_text(yaml.safe_dump(doc, sort_keys=False))
    return out


def _realbench(scenario_path: Path, settings: dict, steps: int, seed: int) -> dict:
    import torch

    from realbench.plan import load_scenario
    from realbench.plan.mesh import Mesh, Option, Strategy
    from realbench.runtime.worker import Worker

    torch.set_num_threads(1)
    s = load_scenario(str(scenario_path))
    s = s.model_copy(update={"training": s.training.model_copy(update=dict(settings))})
    worker = Worker(0, s, {c.name: Option(Mesh(0, 1, 0, 1), Strategy(1, 1, 1, 1)) for c in s.dataflow.calls},
                    seed=seed, total_steps=steps)
    rewards, seconds = [], []
    for k in range(steps):
        start = time.perf_counter()
        rec = worker.step(k)
        seconds.append(time.perf_counter() - start)
        rewards.append(rec.reward)
    # the parameters the optimizer updates (LoRA: the adapters alone)
    trained = sum(o.master.numel() for o in worker.optimizers.values())
    return {"rewards": rewards, "seconds": seconds, "trained_params": trained}


def trl_arguments(folder: Path, algorithm: str, settings: dict, size: dict, steps: int, seed: int) -> dict:
    """The trainer class (`trainer`) and the arguments (`args`, `peft_config`) that TRL trains
    `algorithm` with: its `<ALGORITHM>Config` (GRPOConfig, RLOOConfig) of `settings`, and for an
    algorithm with adapters a `peft.LoraConfig` of them (None otherwise)."""
    import trl

    trainer = TRAINERS.get(algorithm, algorithm).upper()
    per_step = size["prompts"] * size["group_size"]
    args = getattr(trl, f"{trainer}Config")(
        output_dir=str(folder / f"trl-{algorithm}-{seed}"), use_cpu=True, bf16=False, report_to="none", seed=seed,
        max_steps=steps, per_device_train_batch_size=per_step, gradient_accumulation_steps=1,
        num_generations=size["group_size"], max_completion_length=size["max_new_tokens"],
        lr_scheduler_type="constant", **settings,
        # TRL's configs checkpoint activations by default (with a peft_config it then also makes
        # the embeddings' output require gradients); realbench's plan here does not checkpoint
        gradient_checkpointing=False,
        logging_steps=1, save_strategy="no", shuffle_dataset=False, dataloader_num_workers=0, disable_tqdm=True)
    peft_config = None
    if algorithm in ADAPTERS:
        import peft

        lora = ADAPTERS[algorithm]
        peft_config = peft.LoraConfig(r=lora["r"], lora_alpha=lora["lora_alpha"],
                                      target_modules=list(lora["target_modules"]), lora_dropout=0.0, bias="none",
                                      use_rslora=False, task_type="CAUSAL_LM")
    return {"trainer": getattr(trl, f"{trainer}Trainer"), "args": args, "peft_config": peft_config}


def _trl(folder: Path, algorithm: str, settings: dict, size: dict, steps: int, seed: int) -> dict:
    """TRL's `<ALGORITHM>Trainer` (GRPOTrainer, RLOOTrainer; GRPOTrainer with a peft_config for
    `lora`) on the job; both log the step's mean reward (before RLOO's KL penalty) as `reward`."""
    import datasets
    import torch
    import transformers

    from realbench.examples import arithmetic_prompts
    from realbench.models.rewards import load_function

    torch.set_num_threads(1)
    given = trl_arguments(folder, algorithm, settings, size, steps, seed)
    digits = load_function(str(folder / "rewards.py"), "digits")
    rows = [{"prompt": r["question"], "answer": r["answer"]} for r in arithmetic_prompts()]

    class Clock(transformers.TrainerCallback):
        def __init__(self):
            self.seconds, self.start = [], None

        def on_step_begin(self, *a, **k):
            self.start = time.perf_counter()

        def on_step_end(self, *a, **k):
            self.seconds.append(time.perf_counter() - self.start)

    clock = Clock()
    level = transformers.logging.get_verbosity()
    transformers.logging.set_verbosity_error()
    try:
        trainer = given["trainer"](model=str(folder / "ckpt"), reward_funcs=[digits], args=given["args"],
                                   train_dataset=datasets.Dataset.from_list(rows), callbacks=[clock],
                                   peft_config=given["peft_config"])
        trainer.remove_callback(transformers.PrinterCallback)  # its log lines are not ours to print
        trainer.train()
    finally:
        transformers.logging.set_verbosity(level)
    rewards = [h["reward"] for h in trainer.state.log_history if "reward" in h]
    trained = sum(p.numel() for p in trainer.model.parameters() if p.requires_grad)
    return {"rewards": rewards[:steps], "seconds": clock.seconds, "trained_params": trained}


SMOOTH = 5


def smoothed(values: list[float], window: int = SMOOTH) -> list[float]:
    """The mean of the last `window` values (fewer at the start) at every position."""
    return [statistics.fmean(values[max(0, i - window + 1):i + 1]) for i in range(len(values))]


def curve_inside_band(curves: list[list[float]], band: list[list[float]]) -> float:
    """The share of the steps at which the mean of `curves` lies between the least and the
    greatest of the `band` curves (all smoothed)."""
    mean = [statistics.fmean(c) for c in zip(*map(smoothed, curves))]
    sides = [(min(c), max(c)) for c in zip(*map(smoothed, band))]
    return sum(lo <= m <= hi for m, (lo, hi) in zip(mean, sides)) / len(mean)


def _median_step(seconds: list[float]) -> float:
    return statistics.median(seconds[1:] if len(seconds) > 1 else seconds)


QUICK = {"quick": True}


def run(quick: bool = False) -> dict:
    from realbench.cli import log

    return bench_peers(quick, log)


def summary(runs: dict[str, list[dict]], settings: dict, size: dict, adapters: dict | None = None) -> dict:
    """One algorithm's comparison: its settings (with its adapters' r, lora_alpha and
    target_modules), the runs of each system, the final rewards (the
    mean of the last quarter of the steps) with TRL's spread, the mean first-step rewards, the share
    of the steps at which realbench's smoothed seed-mean curve is inside TRL's band, and the median
    step times with their ratio (TRL's over realbench's)."""
    tail = max(1, size["steps"] // 4)

    def final(run):
        return statistics.fmean(run["rewards"][-tail:])

    trl_final = [final(r) for r in runs["trl"]]
    ours_final = [final(r) for r in runs["realbench"]]
    step = {s: statistics.median(r["step_s"] for r in runs[s]) for s in runs}
    return {
        "settings": {**settings, "group_size": size["group_size"], "prompts_per_step": size["prompts"],
                     "max_new_tokens": size["max_new_tokens"], "lr_scheduler_type": "constant", **(adapters or {})},
        "runs": runs, "final_reward": {"realbench": ours_final, "trl": trl_final},
        "trl_spread": [min(trl_final), max(trl_final)],
        "realbench_mean_within_trl_spread": min(trl_final) <= statistics.fmean(ours_final) <= max(trl_final),
        "first_step_reward": {s: statistics.fmean(r["rewards"][0] for r in runs[s]) for s in runs},
        "curve_inside_trl_band": curve_inside_band([r["rewards"] for r in runs["realbench"]],
                                                   [r["rewards"] for r in runs["trl"]]),
        "step_s": step, "step_ratio": step["trl"] / step["realbench"],
    }


def bench_peers(quick: bool = False, log=lambda msg: None, algorithms=None) -> dict:
    """GRPO's summary at the top level (as before RLOO joined), RLOO's under `rloo`, GRPO with
    LoRA's under `lora`; `algorithms`: only these of `ALGORITHMS` (all when None), the others'
    summaries absent."""
    if importlib.util.find_spec("trl") is None:
        raise ConfigError("TRL is not installed: pip install 'realbench[peers]' (or trl)", "bench peers")
    chosen = list(ALGORITHMS) if algorithms is None else [algorithms] if isinstance(algorithms, str) \
        else list(algorithms)
    unknown = [a for a in chosen if a not in ALGORITHMS]
    if unknown or not chosen:
        raise ConfigError(f"{unknown[0]!r} is not one of the algorithms ({', '.join(ALGORITHMS)})" if unknown
                          else f"no algorithm to run (of {', '.join(ALGORITHMS)})", "bench peers: algorithms")
    chosen = [a for a in ALGORITHMS if a in chosen]  # ALGORITHMS' order, once each
    lora_parts = [a for a in chosen if a in ADAPTERS]
    if lora_parts and importlib.util.find_spec("peft") is None:  # TRL trains LoRA with PEFT
        if algorithms is not None:
            raise ConfigError("PEFT is not installed (TRL trains LoRA with it): pip install peft", "bench peers")
        log(f"PEFT is not installed: no {', '.join(lora_parts)} (pip install peft)")
        chosen = [a for a in chosen if a not in ADAPTERS]
    size = QUICK_JOB if quick else FULL_JOB
    runs = {a: {"realbench": [], "trl": []} for a in chosen}
    # the libraries' own output (progress bars, blank lines) goes to stderr: stdout is the JSON
    with tempfile.TemporaryDirectory(prefix="realbench-peers-") as tmp, contextlib.redirect_stdout(sys.stderr):
        folder = Path(tmp)
        scenarios = _job(folder, size, chosen)
        from realbench.plan import load_scenario

        params = load_scenario(str(scenarios[chosen[0]])).models["actor"].n_params  # (the base's: adapters not counted)
        for k, seed in enumerate(size["seeds"]):
            order = ("realbench", "trl") if k % 2 == 0 else ("trl", "realbench")
            for algorithm in chosen:
                settings = ALGORITHMS[algorithm]
                for system in order:
                    log(f"{algorithm}, {system}, seed {seed}: {size['steps']} steps")
                    run = _realbench(scenarios[algorithm], settings, size["steps"], seed) if system == "realbench" \
                        else _trl(folder, algorithm, settings, size, size["steps"], seed)
                    runs[algorithm][system].append({"seed": seed, "step_s": _median_step(run["seconds"]), **run})
    out = {"model_params": params, "steps": size["steps"], "seeds": list(size["seeds"]), "smooth_steps": SMOOTH}
    for algorithm in chosen:
        result = summary(runs[algorithm], ALGORITHMS[algorithm], size, ADAPTERS.get(algorithm))
        if algorithm == "grpo":
            out.update(result)
        else:
            out[algorithm] = result
    return out
