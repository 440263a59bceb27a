"""`realbench bench peers`: realbench against TRL's GRPOTrainer and RLOOTrainer on the same job.

One job, trained by both on one CPU process each, with GRPO and with RLOO: a LLaMA checkpoint
saved by transformers (at least 20M parameters unless `--quick`), arithmetic prompts with answers,
the `digits` reward function of `realbench.examples`, and the same settings for each algorithm
(`ALGORITHMS`, TRL's names, which TRL's GRPOConfig and RLOOConfig take as they are): learning rate
(constant), beta, epsilon, group size, prompts per step, max_new_tokens, temperature, and GRPO's
loss type (RLOO has none: TRL's RLOO loss is its own); neither checkpoints activations (TRL's
configs do by default). Each seed trains both with each algorithm,
alternating which system goes first; per run: seconds per step (the median over the steps after
the first) and the reward of every step (the mean of the samples' rewards, before RLOO's KL
penalty). Each algorithm's summary compares the reward curves: each run's curve is smoothed (the
mean of its last `SMOOTH` steps at every step), and realbench's seed-mean curve is inside TRL's
band (the least and the greatest of TRL's smoothed seeds) at `curve_inside_trl_band` of the steps;
the final rewards (the mean of the last quarter of the steps) of every seed, with TRL's spread; the
mean first-step rewards (both sample from the same checkpoint there); and the two median step
times with their ratio (`step_ratio`: TRL's over realbench's). GRPO's summary is at the top level
of the JSON, beside the job (`model_params`, `steps`, `seeds`, `smooth_steps`); RLOO's, the same
keys, under `rloo`.

TRL is an optional extra (`pip install 'realbench[peers]'`); without it the benchmark says so in
one line.
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
ALGORITHMS = {"grpo": SETTINGS, "rloo": RLOO_SETTINGS}
FULL_JOB = dict(hidden=512, layers=8, ffn=1376, steps=30, seeds=(0, 1, 2, 3, 4, 5), prompts=4, group_size=4, max_new_tokens=8)
QUICK_JOB = dict(hidden=64, layers=2, ffn=176, steps=2, seeds=(0,), prompts=2, group_size=2, max_new_tokens=4)


def _job(folder: Path, size: dict) -> dict[str, Path]:
    """The checkpoint, the data and the reward function, and the scenario realbench trains for
    each algorithm."""
    from realbench.examples import save_model, tiny_grpo_job

    save_model(folder / "ckpt", hidden=size["hidden"], layers=size["layers"], ffn=size["ffn"], heads=8,
               kv_heads=4)
    return {a: tiny_grpo_job(folder, devices=1, prompts=size["prompts"], group_size=size["group_size"],
                             max_new_tokens=size["max_new_tokens"], eval_size=0, shuffle=False, algorithm=a)
            for a in ALGORITHMS}


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
    return {"rewards": rewards, "seconds": seconds}


def _trl(folder: Path, algorithm: str, settings: dict, size: dict, steps: int, seed: int) -> dict:
    """TRL's `<ALGORITHM>Trainer` (GRPOTrainer, RLOOTrainer) on the job; both log the step's mean
    reward (before RLOO's KL penalty) as `reward`."""
    import datasets
    import torch
    import transformers
    import trl

    from realbench.examples import arithmetic_prompts
    from realbench.models.rewards import load_function

    torch.set_num_threads(1)
    config, trainer_class = getattr(trl, f"{algorithm.upper()}Config"), getattr(trl, f"{algorithm.upper()}Trainer")
    digits = load_function(str(folder / "rewards.py"), "digits")
    rows = [{"prompt": r["question"], "answer": r["answer"]} for r in arithmetic_prompts()]
    per_step = size["prompts"] * size["group_size"]
    args = config(
        output_dir=str(folder / f"trl-{algorithm}-{seed}"), use_cpu=True, bf16=False, report_to="none", seed=seed,
        max_steps=steps, per_device_train_batch_size=per_step, gradient_accumulation_steps=1,
        num_generations=size["group_size"], max_completion_length=size["max_new_tokens"],
        lr_scheduler_type="constant", **settings,
        # TRL's configs checkpoint activations by default; realbench's plan here does not
        gradient_checkpointing=False,
        logging_steps=1, save_strategy="no", shuffle_dataset=False, dataloader_num_workers=0, disable_tqdm=True)

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
        trainer = trainer_class(model=str(folder / "ckpt"), reward_funcs=[digits], args=args,
                                train_dataset=datasets.Dataset.from_list(rows), callbacks=[clock])
        trainer.remove_callback(transformers.PrinterCallback)  # its log lines are not ours to print
        trainer.train()
    finally:
        transformers.logging.set_verbosity(level)
    rewards = [h["reward"] for h in trainer.state.log_history if "reward" in h]
    return {"rewards": rewards[:steps], "seconds": clock.seconds}


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


def summary(runs: dict[str, list[dict]], settings: dict, size: dict) -> dict:
    """One algorithm's comparison: its settings, the runs of each system, the final rewards (the
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
                     "max_new_tokens": size["max_new_tokens"], "lr_scheduler_type": "constant"},
        "runs": runs, "final_reward": {"realbench": ours_final, "trl": trl_final},
        "trl_spread": [min(trl_final), max(trl_final)],
        "realbench_mean_within_trl_spread": min(trl_final) <= statistics.fmean(ours_final) <= max(trl_final),
        "first_step_reward": {s: statistics.fmean(r["rewards"][0] for r in runs[s]) for s in runs},
        "curve_inside_trl_band": curve_inside_band([r["rewards"] for r in runs["realbench"]],
                                                   [r["rewards"] for r in runs["trl"]]),
        "step_s": step, "step_ratio": step["trl"] / step["realbench"],
    }


def bench_peers(quick: bool = False, log=lambda msg: None) -> dict:
    """GRPO's summary at the top level (as before RLOO joined) and RLOO's under `rloo`."""
    if importlib.util.find_spec("trl") is None:
        raise ConfigError("TRL is not installed: pip install 'realbench[peers]' (or trl)", "bench peers")
    size = QUICK_JOB if quick else FULL_JOB
    runs = {a: {"realbench": [], "trl": []} for a in ALGORITHMS}
    # the libraries' own output (progress bars, blank lines) goes to stderr: stdout is the JSON
    with tempfile.TemporaryDirectory(prefix="realbench-peers-") as tmp, contextlib.redirect_stdout(sys.stderr):
        folder = Path(tmp)
        scenarios = _job(folder, size)
        from realbench.plan import load_scenario

        params = load_scenario(str(scenarios["grpo"])).models["actor"].n_params
        for k, seed in enumerate(size["seeds"]):
            order = ("realbench", "trl") if k % 2 == 0 else ("trl", "realbench")
            for algorithm, settings in ALGORITHMS.items():
                for system in order:
                    log(f"{algorithm}, {system}, seed {seed}: {size['steps']} steps")
                    run = _realbench(scenarios[algorithm], settings, size["steps"], seed) if system == "realbench" \
                        else _trl(folder, algorithm, settings, size, size["steps"], seed)
                    runs[algorithm][system].append({"seed": seed, "step_s": _median_step(run["seconds"]), **run})
    return {"model_params": params, "steps": size["steps"], "seeds": list(size["seeds"]), "smooth_steps": SMOOTH,
            **summary(runs["grpo"], SETTINGS, size), "rloo": summary(runs["rloo"], RLOO_SETTINGS, size)}
