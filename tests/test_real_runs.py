"""Training what a user brings: checkpoint folders saved by transformers (LLaMA, Qwen2), a
tokenizer trained with `tokenizers`, data files, a reward function or a reward-model folder. The
tests make all of it themselves."""

import json

import pytest
import torch
import yaml
from safetensors.torch import load_file

from realbench.cost import Estimator
from realbench.cost.baselines import symmetric_plan
from realbench.plan import load_scenario, plan_from_options
from realbench.runtime.worker import Worker
from realbench.examples import (arithmetic_prompts, save_model, tiny_grpo_job, write_jsonl, write_scenario)

transformers = pytest.importorskip("transformers")


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    """One tiny LLaMA checkpoint with its tokenizer, shared by the tests of this file."""
    return save_model(tmp_path_factory.mktemp("llama") / "ckpt")


def job(tmp_path, ckpt, **kwargs):
    (tmp_path / "ckpt").symlink_to(ckpt)
    return tiny_grpo_job(tmp_path, **kwargs)


def symmetric_plan_file(scenario_path, folder):
    est = Estimator(load_scenario(str(scenario_path)))
    path = folder / "plan.yaml"
    plan_from_options(est.scenario, est.options_of(symmetric_plan(est))).save(path)
    return path


def one_device(scenario):
    est = Estimator(scenario)
    return {n: next(o for o in est.options[i] if o.mesh.size == 1 and o.mesh.gpu == 0
                    and o.strategy.micro_batches == 1) for i, n in enumerate(est.call_names)}


def test_grpo_with_a_reward_function_raises_the_reward(cli, tmp_path, ckpt):
    """40 steps of GRPO on 2 processes: the checkpoint folder, a JSONL of arithmetic prompts with
    answers, and a rule-based reward function (TRL's convention, the answer column as keyword)."""
    scenario = job(tmp_path, ckpt)
    code, out, err = cli("validate", scenario)
    assert code == 0 and "40 training rows, prompts padded to 6 tokens" in out, err
    plan = symmetric_plan_file(scenario, tmp_path)
    code, out, err = cli("run", "--scenario", scenario, "--plan", plan, "--nproc", 2, "--steps", 40, "--json",
                         "--save-hf", tmp_path / "hf", "--eval-every", 20, "--out", tmp_path / "run")
    assert code == 0, err
    r = json.loads(out)
    # progress: a line per step on stderr, with a decoded sample; the same steps in metrics.jsonl
    assert [line.split(":")[0] for line in err.splitlines() if line.startswith("step")] == \
        [f"step {k}/40" for k in range(1, 41)]
    lines = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [x["step"] for x in lines] == list(range(40)) and all(x["seconds"] > 0 for x in lines)
    assert {"reward", "loss", "actor_train/kl", "actor_train/entropy", "actor_train/k3_kl", "actor_train/clipfrac",
            "actor_gen/response_len", "actor_gen/tokens_per_s", "reward_inf/reward_std"} <= set(lines[5])
    assert "eval/reward" in lines[19] and "eval/reward" in lines[39] and "eval/reward" not in lines[20]
    assert len((tmp_path / "run" / "samples.jsonl").read_text().splitlines()) == 40
    assert json.loads((tmp_path / "run" / "summary.json").read_text())["steps"] == 40
    # the trained actor as a Hugging Face folder: transformers loads it, with its tokenizer, and
    # computes what realbench computes with it; and it is not the checkpoint it started from
    hf_logits_equal(tmp_path / "hf" / "actor", "AutoModelForCausalLM")
    start = load_file(ckpt / "model.safetensors")
    trained = load_file(tmp_path / "hf" / "actor" / "model.safetensors")
    assert set(trained) == set(start) and not torch.equal(trained["model.layers.0.mlp.up_proj.weight"],
                                                          start["model.layers.0.mlp.up_proj.weight"])
    rewards = [m["reward"] for m in r["metrics"]]
    first, last = sum(rewards[:10]) / 10, sum(rewards[-10:]) / 10
    assert last > first + 0.15, (first, last)
    assert r["calls"]["reward_inf"]["measured_s"] > 0 and r["calls"]["actor_gen"]["tokens_per_s"] > 0
    lengths = [m["actor_gen/response_len"] for m in r["metrics"]]
    assert all(0 < x <= 6 for x in lengths) and min(lengths) < 6  # rows stop at the end-of-sequence token
    # every response's length, per step, in lengths.jsonl: what the metrics summarize
    per_step = [json.loads(x) for x in (tmp_path / "run" / "lengths.jsonl").read_text().splitlines()]
    assert [x["step"] for x in per_step] == list(range(40))
    for x, m in zip(per_step, r["metrics"]):
        assert len(x["actor_gen"]) == 16 and all(1 <= n <= 6 for n in x["actor_gen"])
        assert sum(x["actor_gen"]) == m["actor_gen/tokens"]
        assert sum(x["actor_gen"]) / 16 == pytest.approx(m["actor_gen/response_len"])
    assert all(m["actor_train/kl"] == pytest.approx(m["actor_train/kl"]) for m in r["metrics"])  # finite


def hf_logits_equal(folder, auto_class):
    """transformers' logits for a folder realbench wrote equal realbench's own for it."""
    from realbench.runtime.checkpoint import load_hf_checkpoint
    from realbench.runtime.model import LlamaStage

    hf = getattr(transformers, auto_class).from_pretrained(str(folder), local_files_only=True).eval()
    tok = transformers.AutoTokenizer.from_pretrained(str(folder), local_files_only=True)
    ids = torch.tensor([tok("what is 2 + 3 ?")["input_ids"]])
    spec, weights = load_hf_checkpoint(folder)
    ours = LlamaStage(spec)
    ours.load_full(weights)
    with torch.no_grad():
        got, want = ours(ids), hf(ids).logits
    if spec.value_head:  # sequence classification scores the last token
        got = got[:, -1:]
    assert torch.allclose(got.reshape(want.shape), want, atol=1e-5), float((got.reshape(want.shape) - want).abs().max())


def test_a_failing_reward_function_stops_the_run_with_one_line_and_keeps_checkpoints(cli, tmp_path, ckpt):
    scenario = job(tmp_path, ckpt, reward="rewards.py:short")
    plan = symmetric_plan_file(scenario, tmp_path)
    code, out, err = cli("run", "--scenario", scenario, "--plan", plan, "--nproc", 2, "--steps", 2)
    assert code == 1 and err.count("\n") == 1, err
    assert "reward function rewards.py:short at step 0 returned 1 values for 8 completions" in err
    # raising: at step 2, after two checkpoints; they stay whole and resumable
    (tmp_path / "rewards.py").write_text((tmp_path / "rewards.py").read_text() + '''
CALLS = []


def late(prompts, completions, **columns):
    CALLS.append(1)
    if len(CALLS) > 2:
        raise ZeroDivisionError("division by zero")
    return [0.5] * len(completions)
''')
    doc = yaml.safe_load(scenario.read_text())
    doc["models"]["reward"]["function"] = "rewards.py:late"
    scenario.write_text(yaml.safe_dump(doc))
    ck = tmp_path / "ck"
    code, out, err = cli("run", "--scenario", scenario, "--plan", plan, "--nproc", 2, "--steps", 4,
                         "--save-every", 1, "--checkpoint-dir", ck)
    # stderr: the two finished steps' progress lines (and a sample each), then the one failure line
    lines = err.splitlines()
    assert code == 1 and [x.split(":")[0] for x in lines if x.startswith("step")] == ["step 1/4", "step 2/4"]
    assert all(x.startswith(("step ", "  ")) for x in lines[:-1]) and len(lines) == 5, err
    assert lines[-1].startswith("realbench: run failed: rank ") and lines[-1].endswith(
        "failed in call reward_inf: RuntimeError: reward function rewards.py:late at step 2 raised "
        "ZeroDivisionError: division by zero"), lines[-1]
    assert sorted(p.name for p in ck.iterdir()) == ["step1", "step2"]
    assert all((ck / s / "checkpoint.json").is_file() for s in ("step1", "step2"))


def test_bad_inputs_are_one_line_and_exit_2(cli, tmp_path, ckpt):
    scenario = job(tmp_path, ckpt)
    base = yaml.safe_load(scenario.read_text())

    def check(change, needle):
        doc = json.loads(json.dumps(base))
        change(doc)
        path = tmp_path / "bad.yaml"
        path.write_text(yaml.safe_dump(doc))
        code, _, err = cli("validate", path)
        assert code == 2 and err.count("\n") == 1 and needle in err, err

    check(lambda d: d["models"]["actor"].update(path="nope"), "nope: no such folder")
    check(lambda d: d["data"].update(train="missing.jsonl"), "missing.jsonl: no such file")
    check(lambda d: d["data"]["fields"].update(prompt="query"), "no column 'query' for the prompt")
    check(lambda d: d["models"]["reward"].update(function="rewards.py:nothing"), "defines no function 'nothing'")
    check(lambda d: d["models"]["reward"].update(function="gone.py:digits"), "gone.py: models.reward.function: no such file")
    check(lambda d: d["dataflow"].update(prompt_len=8), "dataflow.prompt_len: comes from the data")
    check(lambda d: d["data"].pop("max_new_tokens"), "data.max_new_tokens: must be given")
    (tmp_path / "gpt2").mkdir()
    (tmp_path / "gpt2" / "config.json").write_text(json.dumps({"architectures": ["GPT2LMHeadModel"]}))
    check(lambda d: d["models"]["ref"].update(path="gpt2"), "architecture 'GPT2LMHeadModel' is not supported")
    save_model(tmp_path / "small-vocab", vocab=32, tokenizer=False)
    size = len(transformers.AutoTokenizer.from_pretrained(str(ckpt), local_files_only=True))
    assert size > 32
    check(lambda d: d["models"].update(ref={"path": "small-vocab"}),
          f"models.ref: the tokenizer has {size} tokens, the model's vocabulary 32")
    (tmp_path / "bad.jsonl").write_text('{"question": "what is 1 + 1 ?"}\n[1, 2]\n')
    check(lambda d: d["data"].update(train="bad.jsonl"), "bad.jsonl: line 2 is not a JSON object")
    assert (tmp_path / "train.jsonl").read_text() == "".join(json.dumps(r) + "\n" for r in arithmetic_prompts())


def pairs(n=24):
    """Preference pairs: the right sum chosen over a wrong one."""
    return [{"prompt": r["question"], "chosen": r["answer"], "rejected": str(int(r["answer"]) + 3)}
            for r in arithmetic_prompts(n, seed=1)]


def test_dpo_on_a_jsonl_of_pairs(tmp_path, ckpt):
    write_jsonl(tmp_path / "pairs.jsonl", pairs())
    path = write_scenario(tmp_path, "dpo-pairs", "dpo", {"actor": {"path": str(ckpt)}, "ref": {"path": str(ckpt)}},
                          {"train": "pairs.jsonl"}, {"pairs": 8})
    s = load_scenario(str(path))
    assert s.data.prompt_len == 6 and s.dataflow.calls[0].seq_len == 6 + s.data.completion_len
    w = Worker(0, s, one_device(s))
    records = [w.step(k) for k in range(12)]
    losses = [r.loss for r in records]
    margins = [r.metrics["actor_train/margin"] for r in records]
    assert sum(losses[-3:]) / 3 < sum(losses[:3]) / 3 - 0.05, losses
    assert margins[-1] > margins[0] + 0.15, margins


@pytest.mark.parametrize("fmt", ["text", "prompt-completion"])
def test_sft_on_text_and_on_prompt_completion_pairs(tmp_path, ckpt, fmt):
    rows = arithmetic_prompts(24, seed=2)
    if fmt == "text":
        write_jsonl(tmp_path / "sft.jsonl", [{"text": f"{r['question']} {r['answer']}"} for r in rows])
    else:
        write_jsonl(tmp_path / "sft.jsonl", [{"prompt": r["question"], "completion": r["answer"]} for r in rows])
    path = write_scenario(tmp_path, "sft", "sft", {"actor": {"path": str(ckpt)}}, {"train": "sft.jsonl"},
                          {"seqs": 8})
    s = load_scenario(str(path))
    assert s.data.prompt_len == (0 if fmt == "text" else 6)
    w = Worker(0, s, one_device(s))
    losses = [w.step(k).loss for k in range(10)]
    assert sum(losses[-3:]) / 3 < sum(losses[:3]) / 3 - 0.2, losses


def test_ppo_with_a_reward_model_folder_and_a_critic_from_the_checkpoint(tmp_path, ckpt):
    save_model(tmp_path / "rm", cls="LlamaForSequenceClassification", num_labels=1, seed=5)
    write_jsonl(tmp_path / "train.jsonl", arithmetic_prompts())
    path = write_scenario(tmp_path, "ppo-rm", "ppo",
                          {"actor": {"path": str(ckpt)}, "ref": {"path": str(ckpt)},
                           "critic": {"path": str(ckpt), "value_head": True}, "reward": {"path": "rm"}},
                          {"train": "train.jsonl", "fields": {"prompt": "question"}, "max_new_tokens": 5},
                          {"prompts": 4, "minibatches": 2})
    s = load_scenario(str(path))
    assert s.models["reward"].value_head and s.models["critic"].value_head and not s.models["actor"].value_head
    w = Worker(0, s, one_device(s))
    records = [w.step(k) for k in range(3)]
    for r in records:
        assert r.reward is not None and r.loss is not None and r.metrics["critic_train/value_error"] >= 0
    assert len({r.reward for r in records}) == 3  # the reward model scores what was generated
    # the actor and the critic (a sequence-classification model now) as Hugging Face folders
    from realbench.runtime.launch import export_hf

    export_hf(w, str(tmp_path / "hf"))
    assert sorted(p.name for p in (tmp_path / "hf").iterdir()) == ["actor", "critic"]
    hf_logits_equal(tmp_path / "hf" / "actor", "AutoModelForCausalLM")
    hf_logits_equal(tmp_path / "hf" / "critic", "AutoModelForSequenceClassification")


def test_a_qwen2_checkpoint_trains_with_grpo(tmp_path):
    save_model(tmp_path / "ckpt", family="Qwen2", tie_word_embeddings=True)
    s = load_scenario(str(tiny_grpo_job(tmp_path)))
    assert s.models["actor"].qkv_bias and s.models["actor"].tie_embeddings
    w = Worker(0, s, one_device(s))
    records = [w.step(k) for k in range(3)]
    assert all(r.reward is not None and r.loss == r.loss for r in records)
    from realbench.runtime.launch import export_hf

    export_hf(w, str(tmp_path / "hf"))  # the tied head is the embedding, stored once
    assert "lm_head.weight" not in load_file(tmp_path / "hf" / "actor" / "model.safetensors")
    hf_logits_equal(tmp_path / "hf" / "actor", "AutoModelForCausalLM")


def test_a_bf16_run_resumes_exactly_from_its_checkpoint(cli, tmp_path, ckpt):
    """bf16 compute, fp32 master weights and Adam state in the checkpoint: resuming reproduces
    the uninterrupted run's rewards and losses exactly."""
    scenario = job(tmp_path, ckpt)
    plan = symmetric_plan_file(scenario, tmp_path)
    ck = tmp_path / "ck"
    base = ("run", "--scenario", scenario, "--plan", plan, "--nproc", 2, "--dtype", "bf16", "--json",
            "--checkpoint-dir", ck)
    code, out, err = cli(*base, "--steps", 4, "--save-every", 2, "--save-hf", tmp_path / "hf")
    assert code == 0, err
    whole = json.loads(out)
    assert whole["dtype"] == "bf16"
    # each checkpoint holds the Hugging Face folders too, saved in the dtype the run computed in
    config = json.loads((ck / "step2" / "hf" / "actor" / "config.json").read_text())
    assert config["torch_dtype"] == "bfloat16" and (tmp_path / "hf" / "actor" / "model.safetensors").is_file()
    (ck / "step4" / "checkpoint.json").unlink()  # as if the run had stopped while saving step 4
    code, out, err = cli(*base, "--steps", 4, "--resume")
    assert code == 0, err
    resumed = json.loads(out)["metrics"]
    assert [m["step"] for m in resumed] == [2, 3] and resumed == whole["metrics"][2:]


def test_bench_runtime_quick(cli):
    code, out, err = cli("bench", "runtime", "--quick", "--json")
    assert code == 0, err
    r = json.loads(out)
    assert r["generate_ratio"] > 0 and r["train_ratio"] > 0 and r["targets"] == {"generate_ratio": 1.0, "train_ratio": 0.9}
    for part in ("generate", "train"):
        assert r[part]["realbench_tokens_per_s"] > 0 and r[part]["transformers_tokens_per_s"] > 0
    # generation that stops: both stopped each row at the same end-of-sequence token, most rows
    # early and one at least at the cap; tokens/s count the responses' own tokens
    stop = r["generate_stopping"]
    cap = stop["max_new_tokens"]
    assert stop["lengths"] == stop["transformers_lengths"] and stop["own_tokens"] == sum(stop["lengths"])
    assert cap in stop["lengths"] and stop["ended_early"] == sum(n <= cap / 4 for n in stop["lengths"]) > 0
    assert stop["realbench_tokens_per_s"] / stop["transformers_tokens_per_s"] > 0
    # continuous batching on a long-tailed batch (log-normal, cv at least 1, capped at 8 x the
    # mean): the micro-batched loop's tokens, the estimate beside the measured seconds
    tail = r["continuous"]
    lengths = tail["lengths"]
    assert tail["same_tokens"] and tail["rows"] == 64 and tail["slots"] == 8 and tail["micro_batches"] == 8
    assert lengths["cv"] >= 1.0 and lengths["max"] <= tail["max_new_tokens"] == 8 * 8 and lengths["max"] > 4 * lengths["mean"]
    seconds, rates = tail["seconds"], tail["tokens_per_s"]
    assert rates == {k: pytest.approx(lengths["tokens"] / v) for k, v in seconds.items()}
    assert tail["gain"] == pytest.approx(seconds["micro_batched"] / seconds["continuous"])
    assert tail["rel_err"] == pytest.approx(abs(tail["estimated_s"] - seconds["continuous"]) / seconds["continuous"])
    assert tail["meets_target"] == (tail["gain"] >= 1.5 and tail["rel_err"] <= 0.2)
    assert r["meets_target"] == (r["generate_ratio"] >= 1.0 and r["train_ratio"] >= 0.9 and tail["meets_target"])


def test_the_early_ending_workload_takes_end_tokens_that_end_most_rows_early_and_keep_a_tail():
    from realbench.bench.runtime import early_ending_eos

    full = torch.tensor([[5, 1, 2, 3], [1, 5, 2, 3], [2, 2, 2, 2], [3, 1, 5, 5]])
    # each round adds the token that ends the most rows within a quarter of the cap (1 token)
    # among those that leave a row at the cap (ties: the lowest id): 1; then 3 ({1, 2} would end
    # every row); then 5, after which three rows of four end early
    assert early_ending_eos(full) == ([1, 3, 5], [1, 1, 4, 1])
    assert early_ending_eos(full, at_most=1) == ([1], [2, 1, 4, 2])


def test_the_reward_function_is_in_the_report_and_its_timeline(tmp_path, ckpt):
    """Its call is costed (seconds_per_sample per response, over its processes) and drawn in the
    dataflow graph and the Gantt chart of the HTML report, as a function call."""
    from realbench.export.html import plan_report_html
    from realbench.report.figures import KIND_COLORS, timeline_figure

    s = load_scenario(str(job(tmp_path, ckpt)))
    est = Estimator(s)
    choice = symmetric_plan(est)
    estimate = est.estimate(choice)
    fn = est.options_of(choice)["reward_inf"]
    assert estimate.calls["reward_inf"].time_s == pytest.approx(16 / fn.strategy.dp * s.models["reward"].seconds_per_sample)
    bars = timeline_figure(s, estimate).renderers[0].data_source.data
    row = bars["call"].index("reward_inf")
    assert bars["what"][row] == "function" and bars["color"][row] == KIND_COLORS["function"]
    assert "reward_inf" in plan_report_html(s, est.options_of(choice))
