"""Train what the algorithm says, under every plan: DPO pairs stay whole, GRPO and RLOO groups have
at least two samples, NaNs stop the run, reward models with their own tokenizer score text,
reward functions written for TRL run unchanged, the first update's ratio is 1 in bf16, and
sampling follows the temperature and every end-of-sequence id of the checkpoint."""

import json
import math
import random

import pytest
import torch
import yaml

from realbench.cost import Estimator
from realbench.cost.baselines import symmetric_plan
from realbench.errors import ConfigError
from realbench.examples import arithmetic_prompts, save_model, tiny_grpo_job, train_tokenizer, write_jsonl
from realbench.models import get_model
from realbench.plan import get_builtin, load_scenario, plan_from_options
from realbench.plan.builtin import BUILTIN
from realbench.plan.scenario import Scenario
from realbench.plan.mesh import Mesh, Option, Strategy
from realbench.runtime.local import spawn
from realbench.models.shards import in_stage, param_specs, tp_range
from realbench.runtime.worker import NonFiniteError, Worker

DPO_SCENARIO = "dpo-tiny-cpu"


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    """A tiny LLaMA checkpoint saved by transformers, with the arithmetic tokenizer."""
    return save_model(tmp_path_factory.mktemp("llama") / "ckpt")


def grpo_job(folder, ckpt, algorithm="grpo", edit=None, **kwargs):
    """The README's three-file GRPO job (RLOO with `algorithm`) in `folder`, the scenario document
    changed by `edit(doc)`; returns the scenario's path."""
    if not (folder / "ckpt").exists():
        (folder / "ckpt").symlink_to(ckpt)
    path = tiny_grpo_job(folder, **kwargs)
    doc = yaml.safe_load(path.read_text())
    doc["algorithm"] = doc["dataflow"]["algorithm"] = algorithm
    if edit is not None:
        edit(doc)
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


# -- DPO pairs --------------------------------------------------------------------------------------
def _splits_of_the_old_rules(batch, devices=4, largest=16):
    """Every (dp, micro_batches) the rules before pairs were kept whole accepted: dp*m divides
    the batch, m a power of two up to 16."""
    return [(dp, m) for dp in (1, 2, 4) if dp <= devices for m in (1, 2, 4, 8, 16) if batch % (dp * m) == 0
            and m <= largest]


def test_a_plan_that_would_split_dpo_pairs_is_refused_naming_micro_batches(cli, tmp_path):
    est = Estimator(get_builtin(DPO_SCENARIO))
    i = est.call_names.index("actor_train")
    rows = est.scenario.dataflow.call("actor_train").seqs  # 8 pairs: 16 rows
    offered = {(o.strategy.dp, o.strategy.micro_batches) for o in est.options[i]}
    splitting = [(dp, m) for dp, m in _splits_of_the_old_rules(rows) if (rows // (dp * m)) % 2]
    assert (4, 4) in splitting and (2, 8) in splitting  # one row per micro-batch: pairs cut in two
    assert not offered & set(splitting)  # the search never proposes them
    assert offered == set(_splits_of_the_old_rules(rows)) - set(splitting)
    # a plan file that asks for one is refused with one line naming the field
    base = est.options_of(symmetric_plan(est))
    doc = plan_from_options(est.scenario, base).to_document()
    doc["calls"]["actor_train"] = {"mesh": "n0", "dp": 4, "tp": 1, "pp": 1, "micro_batches": 4}
    (tmp_path / "split.yaml").write_text(yaml.safe_dump(doc))
    code, out, err = cli("validate", tmp_path / "split.yaml")
    assert code == 2 and err.count("\n") == 1, err
    assert "calls.actor_train.micro_batches" in err and "whole 2-row examples" in err, err
    # and the runtime refuses it too, whatever let it through
    with pytest.raises(ConfigError, match="micro_batches"):
        Worker(0, est.scenario, {**base, "actor_train": Option(Mesh(0, 1, 0, 4), Strategy(4, 1, 1, 4))})


def _alone(scenario, device):
    """Every call on one device, as one process would run it."""
    return {c.name: Option(Mesh(0, 1, device, 1), Strategy(1, 1, 1, 1)) for c in scenario.dataflow.calls}


def _dpo_step(worker):
    """Step 0 of a worker: (the policy's loss as this rank reports it, the gradients of this rank's
    shard of the actor, from the train call's optimizer step)."""
    ti = next(i for i, c in enumerate(worker.calls) if c.name == "actor_train")
    grads = {}
    if ti in worker.optimizers:
        opt = worker.optimizers[ti]
        step = opt.step

        def record(*args):
            grads.update({k: p.grad.clone() for k, p in opt.model.stage.named_parameters()})
            step(*args)
        opt.step = record
    rec = worker.step(0)
    return rec.loss, grads, worker.layouts[ti].coord(worker.rank), worker.layouts[ti].dims


def _dpo_parity(rank, world, plans):
    scenario = get_builtin(DPO_SCENARIO)
    loss, full, _, _ = _dpo_step(Worker(rank, scenario, _alone(scenario, rank)))  # no communication
    out = [(loss, None)]
    spec = scenario.models["actor"]
    specs = {p.name: p for p in param_specs(spec)}
    for options in plans:
        loss, grads, coord, dims = _dpo_step(Worker(rank, scenario, options))
        err = 0.0
        for name, g in grads.items():
            s = specs[name]
            want = full[name]
            if s.split is not None:
                lo, hi = tp_range(s, dims.tp, coord.tp)
                want = want.narrow(s.split, lo, hi - lo)
            assert in_stage(s, spec.n_layers, dims.pp, coord.pp, dims.v)
            err = max(err, float((g - want).abs().max()))
        out.append((loss, err if grads else None))
    return out


def test_dpo_loss_and_gradient_equal_the_single_process_ones_under_random_splits():
    """Random plans of the DPO train call over dp, tp, pp and micro-batches on 4 processes: the
    loss and every gradient equal one process's (to 1e-6). Under the old rules the plan dp 4 x 4
    micro-batches put one row in each micro-batch: loss and gradient exactly 0."""
    est = Estimator(get_builtin(DPO_SCENARIO))
    i = est.call_names.index("actor_train")
    rng = random.Random(0)
    base = est.options_of(symmetric_plan(est))
    candidates = [o for o in est.options[i] if o.mesh.start(4) == 0 and not o.strategy.checkpointing]
    picked = rng.sample(candidates, 6)
    for dp in (1, 2, 4):  # the finest split each dp is offered (2 rows a micro-batch)
        finest = max(o.strategy.micro_batches for o in candidates if o.strategy.dp == dp)
        picked.append(rng.choice([o for o in candidates if (o.strategy.dp, o.strategy.micro_batches) == (dp, finest)]))
    assert {o.strategy.dp for o in picked} >= {1, 2, 4} and len({o.strategy.micro_batches for o in picked}) >= 3
    plans = [{**base, "actor_train": o} for o in picked]
    per_rank = spawn(_dpo_parity, 4, plans, timeout_s=300)
    reference = [r[0][0] for r in per_rank]
    assert len(set(reference)) == 1 and reference[0] > 0  # every rank alone computes the same loss
    for k, option in enumerate(picked, start=1):
        losses = [r[k][0] for r in per_rank if r[k][0] is not None]
        dims = option.strategy
        assert len(losses) == dims.dp * dims.tp  # the last stage's ranks report their shares
        assert sum(losses) / dims.tp / dims.dp == pytest.approx(reference[0], abs=1e-6), (option, losses)
        errors = [r[k][1] for r in per_rank if r[k][1] is not None]
        assert len(errors) == option.mesh.size and max(errors) < 1e-6, (option, errors)


# -- groups of one, and NaNs ------------------------------------------------------------------------
@pytest.mark.parametrize("algorithm", ["grpo", "rloo"])
def test_a_group_of_one_sample_takes_its_reward_as_its_advantage(cli, tmp_path, algorithm):
    """A prompt of one sample has no others to compare with: its reward is its advantage (verl's rule:
    mean 0, std 1), a NaN reward 0; no samples at all is refused by name."""
    from realbench.runtime import losses

    doc = {"schema": "realbench.scenario/1", "name": "solo", "algorithm": algorithm,
           "cluster": {"nodes": 1, "gpus_per_node": 2, "device": "cpu"},
           "models": {"actor": "llama-tiny", "ref": "llama-tiny", "reward": {"arch": "llama-tiny", "value_head": True}},
           "dataflow": {"algorithm": algorithm, "prompts": 4, "group_size": 1, "prompt_len": 8, "gen_len": 8}}
    (tmp_path / "my job.yaml").write_text(yaml.safe_dump(doc))
    code, out, err = cli("validate", tmp_path / "my job.yaml")
    assert code == 0, err
    doc["dataflow"]["group_size"] = 0
    (tmp_path / "my job.yaml").write_text(yaml.safe_dump(doc))
    code, out, err = cli("validate", tmp_path / "my job.yaml")
    assert code == 2 and err.count("\n") == 1 and "dataflow.group_size" in err and "1 or more" in err, err
    rewards = torch.tensor([0.5, float("nan"), -2.0, 1.0])
    advantages = losses.grpo_advantages(rewards, 1) if algorithm == "grpo" else losses.rloo_advantages(rewards, 1)
    assert advantages.tolist() == [0.5, 0.0, -2.0, 1.0]
    if algorithm == "rloo":  # (normalized as the others: mean -1/6 and std 1.2583 of the three scored)
        normalized = losses.rloo_advantages(rewards, 1, normalize=True)
        mean, std = (0.5 - 2.0 + 1.0) / 3, math.sqrt(((0.5 + 1 / 6) ** 2 + (-2 + 1 / 6) ** 2 + (1 + 1 / 6) ** 2) / 2)
        assert normalized.tolist() == pytest.approx([(0.5 - mean) / (std + 1e-4), 0.0, (-2 - mean) / (std + 1e-4),
                                                     (1 - mean) / (std + 1e-4)], abs=1e-6)


def _one_device(scenario, **kwargs):
    return Worker(0, scenario, _alone(scenario, 0), **kwargs)


def test_non_finite_advantages_stop_the_step_before_the_weights_change(monkeypatch):
    from realbench.runtime import losses

    w = _one_device(get_builtin("grpo-tiny-cpu"))
    ti = next(i for i, c in enumerate(w.calls) if c.name == "actor_train")
    before = w.masters[ti].stage.flat.clone()
    monkeypatch.setattr(losses, "grpo_advantages", lambda score, *args: score * math.nan)
    with pytest.raises(NonFiniteError, match=r"^actor_train at step 0: the advantages hold nan \(128 of 128 values\)"):
        w.step(0)
    assert torch.equal(w.masters[ti].stage.flat, before)


EXPLODING_REWARD = '''
CALLS = []


def explodes(prompts, completions, **columns):
    """Fine for two steps, then one reward out of float32's range."""
    CALLS.append(1)
    return [3e38 if len(CALLS) > 2 and i == 0 else 0.5 for i in range(len(completions))]
'''


def test_an_infinite_loss_stops_the_run_naming_the_call_and_step_and_the_checkpoint_stays(cli, tmp_path, ckpt):
    """RLOO's advantage of a 3e38 reward is finite, its loss summed over a response's tokens (the
    token-level loss_type dapo) is not: the run stops with one line naming the call and the step;
    the checkpoints before stay complete and resume."""
    scenario = grpo_job(tmp_path, ckpt, reward="rewards.py:explodes", algorithm="rloo",
                        edit=lambda d: d["training"].update(loss_type="dapo"))
    with open(tmp_path / "rewards.py", "a") as f:
        f.write(EXPLODING_REWARD)
    plan = tmp_path / "plan.yaml"
    assert cli("estimate", "--scenario", scenario, "--baseline", "symmetric", "--out", plan)[0] == 0
    code, out, err = cli("run", "--scenario", scenario, "--plan", plan, "--nproc", 2, "--steps", 4,
                         "--save-every", 1, "--checkpoint-dir", tmp_path / "ck")
    last = err.splitlines()[-1]  # after the progress lines of steps 0 and 1
    assert code == 1 and last.startswith("realbench: run failed: rank") and "step 3/4" not in err, err
    assert last.endswith("NonFiniteError: actor_train at step 2: the loss is -inf; nothing was applied to the weights")
    assert sorted(p.name for p in (tmp_path / "ck").iterdir()) == ["step1", "step2"]
    assert all((tmp_path / "ck" / s / "checkpoint.json").is_file() for s in ("step1", "step2"))


# -- a reward model with a tokenizer of its own ------------------------------------------------------
def _reward_model(folder, char_level: bool):
    """A one-label LLaMA reward model; with `char_level`, its own tokenizer, which splits the
    arithmetic text into characters where the policy's takes whole words."""
    save_model(folder, cls="LlamaForSequenceClassification", num_labels=1, seed=5, tokenizer=False)
    train_tokenizer(folder, vocab_size=24 if char_level else 60)
    return folder


def _rm_job(tmp_path, ckpt, char_level=True):
    _reward_model(tmp_path / "rm", char_level)
    return grpo_job(tmp_path, ckpt, eval_size=0,
                    edit=lambda d: d["models"].update(reward={"path": "rm"}))


def test_a_reward_model_with_its_own_tokenizer_scores_the_text_re_tokenized(tmp_path, ckpt):
    transformers = pytest.importorskip("transformers")
    s = load_scenario(str(_rm_job(tmp_path, ckpt)))
    policy_tok = transformers.AutoTokenizer.from_pretrained(str(ckpt))
    rm_tok = transformers.AutoTokenizer.from_pretrained(str(tmp_path / "rm"))
    prompt = "what is 3 + 4 ?"
    assert len(policy_tok(prompt)["input_ids"]) == 6 and len(rm_tok(prompt)["input_ids"]) == 16  # words, characters
    assert s.data.tokenizers == {"reward": str((tmp_path / "rm").resolve())}
    # costed at the width it scores: every prompt is 16 characters (6 policy tokens), and the 6
    # new tokens become 6 x 16/6 characters
    assert s.dataflow.call("reward_inf").seq_len == 16 + math.ceil(6 * 16 / 6)
    assert s.dataflow.call("actor_gen").seq_len == 6 + 6
    w = _one_device(s)
    w.step(0)
    gi, ri = (next(i for i, c in enumerate(w.calls) if c.name == n) for n in ("actor_gen", "reward_inf"))
    seqs, rewards = w.outputs[gi]["seqs"], w.outputs[ri]["rewards"]
    prompts = [r["question"] for r in arithmetic_prompts()]
    rows = w.dataset.indices(0, 4)
    hf = transformers.AutoModelForSequenceClassification.from_pretrained(str(tmp_path / "rm")).eval()
    for k in range(len(seqs)):  # TRL's recipe: prompt text + decoded completion, its tokenizer's ids
        completion = policy_tok.decode([t for t in seqs[k, -6:].tolist() if t >= 0], skip_special_tokens=True)
        ids = rm_tok(prompts[rows[k // 4]] + completion, add_special_tokens=False)["input_ids"]
        with torch.no_grad():
            want = float(hf(torch.tensor([ids])).logits[0, 0])
        assert float(rewards[k]) == pytest.approx(want, abs=1e-5), k
    # the same tokenizer beside the reward model: the policy's ids, as before
    (tmp_path / "same").mkdir()
    same = load_scenario(str(_rm_job(tmp_path / "same", ckpt, char_level=False)))
    assert same.data.tokenizers == {} and same.dataflow.call("reward_inf").seq_len == 12
    est, est_same = Estimator(s, profile=None), Estimator(same, profile=None)
    sym = symmetric_plan(est)
    assert est.estimate(sym).calls["reward_inf"].time_s > est_same.estimate(sym).calls["reward_inf"].time_s


def test_a_reference_with_another_tokenizer_is_refused(cli, tmp_path, ckpt):
    save_model(tmp_path / "ref", tokenizer=False)
    train_tokenizer(tmp_path / "ref", vocab_size=24)
    path = grpo_job(tmp_path, ckpt, edit=lambda d: d["models"].update(ref={"path": "ref"}))
    code, out, err = cli("validate", path)
    assert code == 2 and err.count("\n") == 1, err
    assert "models.ref: its tokenizer" in err and "call 'ref_inf' needs the policy's own tokens" in err, err


# -- reward functions written for TRL --------------------------------------------------------------
TRL_STYLE_REWARDS = '''
import re


def format_reward(completions, **kwargs):
    """A format check on chat completions, in the style of TRL's documentation."""
    pattern = r"^\\s*\\d+\\s*$"
    completion_contents = [completion[0]["content"] for completion in completions]
    return [1.0 if re.match(pattern, content) else 0.0 for content in completion_contents]


def length_penalty(completion_ids, **kwargs):
    """Shorter is better, counted in tokens."""
    return [-float(len(ids)) for ids in completion_ids]


def correct(prompts, completions, answer, **kwargs):
    return [1.0 if a in c[0]["content"] and p[-1]["role"] == "user" else 0.0
            for p, c, a in zip(prompts, completions, answer)]


def by_step(completions, trainer_state, **kwargs):
    return [float(trainer_state.global_step)] * len(completions)


def every_other(completions, **kwargs):
    """None: no reward from this function for that sample."""
    return [None if i % 2 else 1.0 for i in range(len(completions))]


def named_only(completions, answer):
    """No **kwargs: it is given what it names."""
    return [float(len(a)) for a in answer]


def wants_difficulty(completions, difficulty, **kwargs):
    return [0.0] * len(completions)
'''


def _chat_job(tmp_path, ckpt, function):
    rows = [{"prompt": [{"role": "user", "content": r["question"]}], "answer": r["answer"]}
            for r in arithmetic_prompts()]
    write_jsonl(tmp_path / "chat.jsonl", rows)

    def edit(doc):
        doc["data"].update(train="chat.jsonl", fields={})
        doc["models"]["reward"] = {"function": f"trl_rewards.py:{function}"}
    (tmp_path / "trl_rewards.py").write_text(TRL_STYLE_REWARDS)
    return grpo_job(tmp_path, ckpt, edit=edit)


def _scored(worker, step):
    """Rewards of step `step` and the generated responses (decoded, and their ids with the
    end-of-sequence token), on one device."""
    worker.step(step)
    gi, ri = (next(i for i, c in enumerate(worker.calls) if c.name == n) for n in ("actor_gen", "reward_inf"))
    seqs = worker.outputs[gi]["seqs"]
    ids = [[t for t in row[-6:] if t >= 0] for row in seqs.tolist()]
    texts = [worker.dataset.tokenizer.decode(x, skip_special_tokens=True) for x in ids]
    return worker.outputs[ri]["rewards"].tolist(), texts, ids


def test_reward_functions_written_for_trl_run_unchanged(cli, tmp_path, ckpt):
    import re

    w = _one_device(load_scenario(str(_chat_job(tmp_path, ckpt, "format_reward"))))
    rewards, texts, _ = _scored(w, 0)
    assert rewards == [1.0 if re.match(r"^\s*\d+\s*$", t) else 0.0 for t in texts]
    w = _one_device(load_scenario(str(_chat_job(tmp_path, ckpt, "length_penalty"))))
    rewards, _, ids = _scored(w, 0)
    assert rewards == [-float(len(x)) for x in ids] and any(x[-1] == w.dataset.tokenizer.eos_token_id for x in ids)
    w = _one_device(load_scenario(str(_chat_job(tmp_path, ckpt, "correct"))))
    rewards, texts, _ = _scored(w, 0)
    answers = [w.dataset.rows[i]["answer"] for i in w.dataset.indices(0, 4) for _ in range(4)]
    assert rewards == [1.0 if a in t else 0.0 for a, t in zip(answers, texts)]
    w = _one_device(load_scenario(str(_chat_job(tmp_path, ckpt, "by_step"))))
    assert _scored(w, 0)[0] == [0.0] * 16 and _scored(w, 1)[0] == [1.0] * 16
    w = _one_device(load_scenario(str(_chat_job(tmp_path, ckpt, "named_only"))))
    answers = [w.dataset.rows[i]["answer"] for i in w.dataset.indices(0, 4) for _ in range(4)]
    assert _scored(w, 0)[0] == [float(len(a)) for a in answers]
    # None: no reward from the function for that sample; a sample no scorer rewarded is NaN, left
    # out of the step's reward and of its group's statistics, with advantage 0 (TRL's)
    w = _one_device(load_scenario(str(_chat_job(tmp_path, ckpt, "every_other"))))
    rec = w.step(0)
    rewards = w.outputs[next(i for i, c in enumerate(w.calls) if c.name == "reward_inf")]["rewards"]
    assert rewards[0::2].tolist() == [1.0] * 8 and bool(rewards[1::2].isnan().all())
    assert rec.metrics["reward_inf/no_reward"] == 0.5 and rec.reward == 1.0
    ti = next(i for i, c in enumerate(w.calls) if c.name == "actor_train")
    assert w.algorithm.targets(w.data[ti], False, 4)["adv"].abs().sum() == 0  # 1 or unknown: no spread
    # a function that takes what no call gives is refused when the scenario is read
    code, out, err = cli("validate", _chat_job(tmp_path, ckpt, "wants_difficulty"))
    assert code == 2 and err.count("\n") == 1 and "takes 'difficulty', which no call gives" in err, err


# -- the first update's ratio, in bf16 ---------------------------------------------------------------
def test_in_bf16_the_first_update_has_ratio_one_and_the_step_0_kl_is_0():
    """The policy and the reference are the same weights at step 0 and share a layout here: the
    KL to the reference, the k3 penalty and the clipped fraction are exactly 0 and the policy loss
    is -mean(advantage), the ratio being exactly 1. The generation's own log-probabilities may
    differ from the training forward's in bf16 (a KV-cached decode can round otherwise: the
    causal forward over whole sequences and one-token steps may take other kernels; the micro-
    batched loop's did, by up to 0.01 here, the rollout engine's masked attention over its
    preallocated cache rounds as the training forward does on this CPU), which is why the update
    takes the training forward's."""
    doc = dict(BUILTIN["grpo-tiny-cpu"])
    doc["dataflow"] = {**doc["dataflow"], "minibatches": 1}
    s = Scenario.model_validate(doc)
    w = _one_device(s, dtype=torch.bfloat16)
    rec = w.step(0)
    assert rec.metrics["actor_train/kl"] == 0.0 and rec.metrics["actor_train/k3_kl"] == 0.0
    assert rec.metrics["actor_train/clipfrac"] == 0.0
    ti = next(i for i, c in enumerate(w.calls) if c.name == "actor_train")
    t = w.algorithm.targets(w.data[ti], False, 4)
    assert rec.loss == pytest.approx(float(-t["adv"].mean()), abs=1e-6)
    fresh = _one_device(s, dtype=torch.bfloat16)  # the weights the batch was generated with
    with torch.no_grad():
        y = fresh.masters[ti].forward([w.data[ti]["seqs"]])[0]
    gap = w.algorithm.token_logprobs(y, w.data[ti]["seqs"], 8) - w.data[ti]["logprobs"]
    assert float(gap.abs().max()) < 1e-2  # the same tokens' probabilities, to bf16's rounding


def test_later_optimizer_steps_take_the_behaviour_log_probabilities_of_the_weights_before_the_update(tmp_path, ckpt):
    """With two minibatches the second step's ratio compares the updated policy with the policy
    that generated the batch, recomputed by the training forward before the first update: a
    forward of the initial weights on those rows gives the same numbers."""
    s = load_scenario(str(grpo_job(tmp_path, ckpt, edit=lambda d: d["dataflow"].update(minibatches=2))))
    w = _one_device(s)
    ti = next(i for i, c in enumerate(w.calls) if c.name == "actor_train")
    seen = []
    behaviour = w._behaviour_logprobs
    w._behaviour_logprobs = lambda *a: seen.append(behaviour(*a)) or seen[-1]
    w.step(0)
    rows = w.data[ti]["seqs"][8:]
    fresh = _one_device(s)
    with torch.no_grad():
        y = fresh.masters[ti].forward([rows])[0]
    want = w.algorithm.token_logprobs(y, rows, 6)
    assert seen[0][0] is None and torch.allclose(seen[0][1][0], want, atol=1e-6)
    from realbench.cost.calls import behaviour_forwards

    calls = {c.name: c for c in s.dataflow.calls}
    assert behaviour_forwards(calls["actor_train"], s.models["actor"]) == 1  # and the cost model charges it


def test_old_log_probabilities_come_from_where_training_old_logprobs_says(tmp_path, ckpt, monkeypatch):
    """Two minibatches, three ways. whole_batch (verl, OpenRLHF, AReaL recomputing): the forward
    before the first update covers both steps' rows, and the first update takes it (the numbers the
    first update's own forward gives: the same run as later_steps). rollout (AReaL's default, verl's
    bypass_mode): no forward; every update's ratio takes generation's own log-probabilities. The
    cost model charges 2, 1 and 0 such forwards."""
    from realbench.cost.calls import behaviour_forwards
    from realbench.runtime import losses

    runs = {}
    for mode in ("later_steps", "whole_batch", "rollout"):
        folder = tmp_path / mode
        folder.mkdir()
        path = grpo_job(folder, ckpt, edit=lambda d: (d["dataflow"].update(minibatches=2),
                                                      d["training"].update(old_logprobs=mode)))
        s = load_scenario(str(path))
        train = s.dataflow.call("actor_train")
        assert train.old_logprobs == mode
        w = _one_device(s)
        seen, olds = [], []
        behaviour = w._behaviour_logprobs
        w._behaviour_logprobs = lambda *a: seen.append(behaviour(*a)) or seen[-1]
        policy_loss = losses.policy_loss
        monkeypatch.setattr(losses, "policy_loss", lambda logp, old, *a: olds.append(old) or policy_loss(logp, old, *a))
        rec = w.step(0)
        monkeypatch.setattr(losses, "policy_loss", policy_loss)
        ti = next(i for i, c in enumerate(w.calls) if c.name == "actor_train")
        runs[mode] = (rec, seen, olds, w.data[ti], behaviour_forwards(train, s.models["actor"]), path)
    (later, l_seen, l_olds, data, l_n, path), (whole, w_seen, w_olds, _, w_n, _), \
        (rollout, r_seen, r_olds, r_data, r_n, _) = runs.values()
    assert (l_n, w_n, r_n) == (1, 2, 0)
    # later_steps: the second step's rows only; whole_batch: both steps' (rows 0-7, then 8-15)
    assert l_seen[0][0] is None and w_seen[0][0] is not None
    fresh = _one_device(load_scenario(str(path)))  # the weights the batch was generated with
    ti = next(i for i, c in enumerate(fresh.calls) if c.name == "actor_train")
    with torch.no_grad():
        y = fresh.masters[ti].forward([data["seqs"][:8]])[0]
    assert torch.allclose(w_seen[0][0][0], fresh.algorithm.token_logprobs(y, data["seqs"][:8], 6), atol=1e-6)
    assert torch.equal(w_olds[0], w_seen[0][0][0]) and torch.allclose(w_olds[1], l_olds[1], atol=1e-6)
    assert whole.loss == pytest.approx(later.loss, abs=1e-6)
    assert whole.metrics["actor_train/clipfrac"] == later.metrics["actor_train/clipfrac"]
    # rollout: no forward at all, and each update's old log-probabilities are generation's rows
    assert r_seen == [] and len(r_olds) == 2
    assert torch.equal(r_olds[0], r_data["logprobs"][:8]) and torch.equal(r_olds[1], r_data["logprobs"][8:])


# -- sampling: temperature and stop ids --------------------------------------------------------------
def test_temperature_reaches_the_sampler(tmp_path, ckpt):
    """Lower temperature, lower entropy: the tempered log-probabilities of the sampled tokens
    are higher (and the training forward's entropy, at the same temperature, lower)."""
    out = {}
    for temperature in (0.05, 1.0):
        folder = tmp_path / str(temperature)
        folder.mkdir()
        s = load_scenario(str(grpo_job(folder, ckpt, edit=lambda d: d["training"].update(temperature=temperature))))
        assert s.training.temperature == temperature
        w = _one_device(s)
        rec = w.step(0)
        gi = next(i for i, c in enumerate(w.calls) if c.name == "actor_gen")
        lp, seqs = w.outputs[gi]["logprobs"], w.outputs[gi]["seqs"]
        mask = seqs[:, -6:] >= 0
        out[temperature] = (float((lp * mask).sum() / mask.sum()), rec.metrics["actor_train/entropy"])
    assert out[0.05][0] > out[1.0][0] + 1.0 and out[0.05][1] < out[1.0][1] - 1.0, out


def test_every_end_of_sequence_id_of_the_generation_config_stops_a_response(tmp_path, ckpt):
    """The checkpoint's generation_config.json names a second end-of-sequence id: the first token
    row 0 samples. With it, row 0's response is that token alone (the draws are the same)."""
    s = load_scenario(str(grpo_job(tmp_path, ckpt)))
    w = _one_device(s)
    w.step(0)
    gi = next(i for i, c in enumerate(w.calls) if c.name == "actor_gen")
    first = int(w.outputs[gi]["seqs"][0, -6])
    assert first != w.dataset.tokenizer.eos_token_id and int(w.outputs[gi]["seqs"][0, -5]) >= 0
    (tmp_path / "own").mkdir()
    for f in ckpt.iterdir():
        (tmp_path / "own" / f.name).symlink_to(f)
    (tmp_path / "own" / "generation_config.json").write_text(
        json.dumps({"eos_token_id": [w.dataset.tokenizer.eos_token_id, first]}))
    s = load_scenario(str(grpo_job(tmp_path, ckpt, edit=lambda d: d["models"].update(
        actor={"path": "own"}, ref={"path": "own"}))))
    w = _one_device(s)
    w.step(0)
    assert w.outputs[gi]["seqs"][0, -6:].tolist() == [first, -1, -1, -1, -1, -1]
