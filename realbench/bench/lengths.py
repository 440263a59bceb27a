"""`realbench bench lengths`: generation estimated for the measured lengths, against the run.

A tiny GRPO job whose responses come out skewed: its checkpoint's `generation_config.json`
names `END_TOKENS` tokens of the vocabulary as end-of-sequence tokens, so that with the random
model's nearly uniform next-token distribution (temperature 1) a response ends at each step
with a chance of about END_TOKENS / vocabulary: geometric lengths, most short, some long, the
cap `max_new_tokens`. The job's best symmetric plan runs for `steps` steps on local processes;
then its generation call is estimated with this machine's profile twice, for the same plan:

    at the cap           `gen_len` the number max_new_tokens (every response priced at the cap)
    with the lengths     `gen_len: {from: lengths.jsonl}`, the run's own measured lengths

and each estimate is compared with the measured generation seconds (the slowest rank, median
over the steps after the first): rel_err = |estimated - measured| / measured. Target: the
estimate with the lengths within 25%.
"""

from __future__ import annotations

import json
import statistics
import tempfile
from pathlib import Path

TARGET_REL_ERR = 0.25
END_TOKENS = 12
FULL = {"steps": 12, "prompts": 8, "group_size": 4, "max_new_tokens": 32}
QUICK = {"steps": 2, "prompts": 2, "group_size": 2, "max_new_tokens": 8, "quick": True}


def skewed_checkpoint(folder: Path, end_tokens: int = END_TOKENS) -> list[int]:
    """A tiny checkpoint whose generation config ends a response at any of `end_tokens` ids
    (the tokenizer's own end-of-sequence token among them); returns them."""
    from realbench.examples import save_model

    save_model(folder)
    config_path = folder / "generation_config.json"
    config = json.loads(config_path.read_text())
    vocab = json.loads((folder / "config.json").read_text())["vocab_size"]
    eos = config["eos_token_id"]
    eos = [eos] if isinstance(eos, int) else list(eos)
    pad = config.get("pad_token_id")
    others = [t for t in range(vocab - 1, 0, -1) if t not in eos and t != pad][:end_tokens - len(eos)]
    config["eos_token_id"] = eos + others
    config_path.write_text(json.dumps(config, indent=2) + "\n")
    return config["eos_token_id"]


def run(steps: int = FULL["steps"], prompts: int = FULL["prompts"], group_size: int = FULL["group_size"],
        max_new_tokens: int = FULL["max_new_tokens"], quick: bool = False, nproc: int = 2) -> dict:
    import yaml

    from realbench.cost import Estimator
    from realbench.cost.baselines import symmetric_plan
    from realbench.examples import tiny_grpo_job
    from realbench.runtime.profile_cache import scenario_profile
    from realbench.plan import load_scenario
    from realbench.plan.plan import plan_from_options
    from realbench.runtime.launch import run_plan

    with tempfile.TemporaryDirectory(prefix="realbench-lengths-") as tmp:
        folder = Path(tmp)
        end_ids = skewed_checkpoint(folder / "ckpt")
        path = tiny_grpo_job(folder, devices=nproc, prompts=prompts, group_size=group_size,
                             max_new_tokens=max_new_tokens, eval_size=0)
        scenario = load_scenario(str(path))
        profile = scenario_profile(scenario, nproc)
        est = Estimator(scenario, profile=profile)
        options = est.options_of(symmetric_plan(est))
        summary = run_plan(scenario, options, nproc, steps, seed=0, profile=profile, device="cpu")
        gen = next(c.name for c in scenario.dataflow.calls if c.kind.value == "generate")
        measured = summary["calls"][gen]["measured_s"]
        (folder / "lengths.jsonl").write_text("".join(json.dumps(x) + "\n" for x in summary["lengths"]))
        doc = yaml.safe_load(path.read_text())
        doc["dataflow"]["gen_len"] = {"from": "lengths.jsonl"}
        measured_path = folder / "measured-lengths.yaml"
        measured_path.write_text(yaml.safe_dump(doc))
        with_lengths = load_scenario(str(measured_path))
        est_lengths = Estimator(with_lengths, profile=profile)
        at_cap = est.estimate(est.choice_of(options)).calls[gen].time_s
        for_lengths = est_lengths.estimate(est_lengths.choice_of(options)).calls[gen].time_s
    lengths = [n for step in summary["lengths"] for n in step[gen]]
    err = {"at_cap": abs(at_cap - measured) / measured, "with_lengths": abs(for_lengths - measured) / measured}
    return {
        "benchmark": "lengths", "steps": steps, "processes": nproc, "call": gen,
        "plan": plan_from_options(scenario, options).to_document()["calls"],
        "end_token_ids": end_ids, "max_new_tokens": max_new_tokens,
        "lengths": {"responses": len(lengths), "mean": statistics.fmean(lengths), "max": max(lengths),
                    "at_cap": sum(n == max_new_tokens for n in lengths),
                    "median": statistics.median(lengths)},
        "measured_s": measured, "estimated_at_cap_s": at_cap, "estimated_with_lengths_s": for_lengths,
        "rel_err": err, "target_rel_err": TARGET_REL_ERR,
        "meets_target": err["with_lengths"] <= TARGET_REL_ERR,
    }
