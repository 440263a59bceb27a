"""The settings practitioners set (`training:`), checked like a file's, reaching the runtime and the
cost model: schedules, decay, clipping on the global norm of every layout, sampling, several
reward scorers with weights, trackers, data folders of Hugging Face datasets, and the README's
recipe whatever its files are called."""

import json
import math
import random

import pytest
import torch
import yaml

from realbench.cost import Estimator
from realbench.cost.baselines import symmetric_plan
from realbench.errors import ConfigError
from realbench.examples import arithmetic_prompts, save_model, tiny_grpo_job, write_jsonl
from realbench.plan import load_scenario
from realbench.plan.builtin import BUILTIN
from realbench.plan.mesh import Mesh, Option, Strategy
from realbench.plan.scenario import Scenario, scenario_from_document
from realbench.plan.training import OptimizerSettings, TrainingSpec
from realbench.runtime.algorithms import PPO, make_algorithm
from realbench.runtime.local import spawn
from realbench.models.shards import param_specs, tp_range
from realbench.runtime.worker import Worker


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    return save_model(tmp_path_factory.mktemp("llama") / "ckpt")


def job(folder, ckpt, edit=None, **kwargs):
    if not (folder / "ckpt").exists():
        (folder / "ckpt").symlink_to(ckpt)
    path = tiny_grpo_job(folder, **kwargs)
    if edit is not None:
        doc = yaml.safe_load(path.read_text())
        edit(doc)
        path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


def alone(scenario):
    return {c.name: Option(Mesh(0, 1, 0, 1), Strategy(1, 1, 1, 1)) for c in scenario.dataflow.calls}


def with_training(name, **training):
    doc = dict(BUILTIN[name])
    return Scenario.model_validate({**doc, "training": {**doc.get("training", {}), **training}})


# -- the section, checked ---------------------------------------------------------------------------
def test_a_typo_or_a_setting_the_algorithm_ignores_is_refused_by_name(cli, tmp_path, ckpt):
    def check(training, expected):
        path = job(tmp_path, ckpt, edit=lambda d: d["training"].update(training))
        code, out, err = cli("validate", path)
        assert code == 2 and err.count("\n") == 1 and expected in err, err
        path.unlink()

    check({"learnig_rate": 1e-5}, "training.learnig_rate: unknown setting (did you mean 'learning_rate'?")
    check({"gama": 0.9}, "did you mean 'gamma'?")
    check({"gamma": 0.9}, "training.gamma: a setting of PPO; grpo does not use it")
    check({"lr_scheduler_type": "exponential"}, "training.lr_scheduler_type")
    check({"critic": {"learning_rate": 1e-5}}, "training.critic: 'critic' is not a trained model (trained: actor)")
    check({"actor": {"learnig_rate": 1e-5}}, "training.actor.learnig_rate: unknown setting")
    check({"reward_weights": [1.0, 2.0]}, "2 weight(s) for 1 reward scorer(s)")
    check({"warmup_steps": 3, "warmup_ratio": 0.1}, "give warmup_steps or warmup_ratio, not both")
    check({"lr_scheduler_type": "constant", "warmup_steps": 3},
          "training.warmup_steps: transformers' constant schedule has no warm-up (it would be ignored): use "
          "lr_scheduler_type: constant_with_warmup")
    check({"loss_type": "rloo"}, "training.loss_type: rloo is RLOO's sequence-level loss")
    check({"normalize_advantages": True}, "training.normalize_advantages: a setting of RLOO; grpo does not use it")
    check({"max_new_tokens": 9}, "data.max_new_tokens: 6 here, 9 in training.max_new_tokens: give one")
    # TRL's names and defaults (GRPOConfig), and a model's own values
    s = load_scenario(str(job(tmp_path, ckpt, edit=lambda d: d.update(training={"actor": {"learning_rate": 2e-5}}))))
    t = s.training
    assert (t.learning_rate, t.lr_scheduler_type, t.max_grad_norm, t.epsilon, t.epsilon_high, t.num_iterations,
            t.loss_type_for("grpo"), t.scale_rewards, t.temperature, t.top_p, t.top_k, t.adam_epsilon) == \
        (1e-6, "linear", 1.0, 0.2, None, 1, "dapo", "group", 1.0, 1.0, 0, 1e-8)
    assert t.beta_for("grpo") == 0.0 and t.beta_for("rloo") == 0.05 and t.beta_for("dpo") == 0.1
    assert t.loss_type_for("rloo") == "rloo" and not t.normalize_advantages  # TRL's RLOOTrainer and RLOOConfig
    assert t.optimizer("actor").learning_rate == 2e-5 and t.optimizer("critic").learning_rate == 1e-6
    # max_new_tokens may be given here instead of in data:
    s = load_scenario(str(job(tmp_path, ckpt, edit=lambda d: (d["data"].pop("max_new_tokens"),
                                                           d["training"].update(max_new_tokens=5)))))
    assert s.dataflow.call("actor_gen").gen_len == 5


def test_the_settings_reach_the_algorithm():
    s = with_training("ppo-tiny-cpu", beta=0.1, epsilon=0.1, epsilon_high=0.3, gamma=0.9, lam=0.8, cliprange_value=0.5,
                      whiten_rewards=True, loss_type="grpo", temperature=0.7)
    a = make_algorithm("ppo", s)
    assert a == PPO(kl_coef=0.1, clip=0.1, clip_high=0.3, gamma=0.9, lam=0.8, value_clip=0.5, whiten_rewards=True,
                    loss_type="grpo", temperature=0.7)
    assert make_algorithm("grpo", with_training("grpo-tiny-cpu", scale_rewards="none")).scale_rewards == "none"
    assert make_algorithm("dpo", with_training("dpo-tiny-cpu", beta=0.3)).beta == 0.3


# -- the optimizer ----------------------------------------------------------------------------------
def test_learning_rate_schedules_worked_by_hand():
    base = dict(learning_rate=1.0, warmup_steps=2)
    lin, cos, const = (OptimizerSettings(**base, lr_scheduler_type=t) for t in ("linear", "cosine",
                                                                               "constant_with_warmup"))
    # 10 updates, 2 of warm-up: 0, 1/2, then from 1 down over the 8 others
    assert [lin.learning_rate_at(k, 10) for k in range(10)] == pytest.approx([0, 0.5] + [(10 - k) / 8 for k in range(2, 10)])
    assert [cos.learning_rate_at(k, 10) for k in (2, 6, 10)] == pytest.approx([1.0, 0.5, 0.0])
    assert [const.learning_rate_at(k, 10) for k in (0, 1, 5)] == pytest.approx([0, 0.5, 1.0])
    ratio = OptimizerSettings(learning_rate=1.0, warmup_ratio=0.25, lr_scheduler_type="constant_with_warmup")
    assert OptimizerSettings(learning_rate=1.0).model_copy(update={"lr_scheduler_type": "constant"}).warmup(10) == 0
    assert ratio.warmup(10) == 3 and ratio.learning_rate_at(1, 10) == pytest.approx(1 / 3)


def test_the_run_reports_the_scheduled_learning_rate_and_the_gradient_norm():
    s = with_training("grpo-tiny-cpu", learning_rate=0.01, lr_scheduler_type="linear", warmup_steps=2)
    w = Worker(0, s, alone(s), total_steps=3)  # 2 minibatches a step: 6 updates, 2 of warm-up
    rates = [w.step(k).metrics["actor/learning_rate"] for k in range(3)]
    assert rates == pytest.approx([0.0, 0.01 * 4 / 4, 0.01 * 2 / 4])
    rec = w.step(3)
    assert rec.metrics["actor_train/grad_norm"] > 0


def test_weight_decay_is_decoupled_and_spares_norms_biases_and_the_embedding():
    """Zero gradients: Adam moves nothing, so the step is the decay alone, w (1 - lr wd), on
    every matrix but the embedding (unless asked) and never on norms."""
    for embeddings in (False, True):
        s = with_training("sft-tiny-cpu", learning_rate=0.1, weight_decay=0.5, weight_decay_embeddings=embeddings)
        w = Worker(0, s, alone(s), total_steps=1)
        opt = w.optimizers[0]
        before = {k: v.clone() for k, v in w.masters[0].shards().items()}
        for p in w.masters[0].stage.parameters():
            p.grad = torch.zeros_like(p)
        opt.step()
        after = w.masters[0].shards()
        for name, old in before.items():
            decayed = name != "embed.weight" or embeddings
            factor = 1.0 if name.endswith("norm.weight") or not decayed else 1 - 0.1 * 0.5
            assert torch.allclose(after[name], old * factor, atol=1e-7), name


def _norm_worker(rank, world, scenario, plans):
    """Per plan: the actor's gradient norm at its first update and the gradients its optimizer
    applied (clipped), against one process's, on this rank's shards."""
    def first_update(worker):
        i = next(k for k, c in enumerate(worker.calls) if c.name == "actor_train")
        seen = {}
        if i in worker.optimizers:
            opt = worker.optimizers[i]
            step = opt.step

            def record(scale=1.0):
                if not seen:
                    seen.update({k: p.grad.clone() * scale for k, p in opt.model.stage.named_parameters()})
                step(scale)
            opt.step = record
        rec = worker.step(0)
        return rec.metrics.get("actor_train/grad_norm"), seen, worker.layouts[i]

    norm, full, _ = first_update(Worker(rank, scenario, {c.name: Option(Mesh(0, 1, rank, 1), Strategy(1, 1, 1, 1))
                                                          for c in scenario.dataflow.calls}, total_steps=1))
    specs = {p.name: p for p in param_specs(scenario.models["actor"])}
    out = [(norm, 0.0)]
    for options in plans:
        got, grads, layout = first_update(Worker(rank, scenario, options, total_steps=1))
        coord, err = layout.coord(rank), 0.0
        for name, g in grads.items():
            want = full["embed.weight" if name == "head.weight" and name not in full else name]
            if specs[name].split is not None:
                lo, hi = tp_range(specs[name], layout.dims.tp, coord.tp)
                want = want.narrow(specs[name].split, lo, hi - lo)
            err = max(err, float((g - want).abs().max()))
        out.append((got, err if grads else None))
    return out


def test_the_gradient_norm_and_the_clipped_step_do_not_depend_on_the_layout():
    """A tied embedding (counted once wherever its head copy sits), random dp/tp/pp/micro-batch
    layouts of the actor's train call on 4 processes, a clip far below the norm: every layout
    reports the single-process global norm (to 1e-6) and applies the single-process clipped
    gradient (to 1e-6)."""
    doc = dict(BUILTIN["grpo-tiny-cpu"])
    tied = {"arch": "llama-tiny", "tie_embeddings": True}
    s = Scenario.model_validate({**doc, "models": {**doc["models"], "actor": tied, "ref": tied},
                                 "training": {**doc["training"], "max_grad_norm": 0.01}})
    est = Estimator(s)
    i = est.call_names.index("actor_train")
    base = est.options_of(symmetric_plan(est))
    rng = random.Random(1)
    layouts = [o for o in est.options[i] if o.mesh.size == 4 and not o.strategy.checkpointing]
    picked = [rng.choice([o for o in layouts if o.strategy.pp == pp and o.strategy.tp == tp]) for tp, pp in
              ((1, 1), (2, 1), (1, 2), (2, 2), (1, 4))]
    per_rank = spawn(_norm_worker, 4, s, [{**base, "actor_train": o} for o in picked], timeout_s=300)
    reference = per_rank[0][0][0]
    assert reference > 0.01 * 10 and all(r[0][0] == pytest.approx(reference, rel=1e-12) for r in per_rank)
    for k, option in enumerate(picked, start=1):
        norms = {r[k][0] for r in per_rank}
        assert all(n == pytest.approx(reference, abs=1e-6) for n in norms), (option, norms, reference)
        errors = [r[k][1] for r in per_rank if r[k][1] is not None]
        assert len(errors) == 4 and max(errors) < 1e-6, (option, errors)


# -- sampling and the cost of the settings ----------------------------------------------------------
def test_top_k_and_top_p_keep_the_most_likely_tokens():
    from realbench.runtime.engine import truncated

    p = torch.tensor([[0.1, 0.5, 0.15, 0.25]])
    assert truncated(p, top_k=2).tolist() == [[0.0, 0.5, 0.0, 0.25]]
    assert truncated(p, top_p=0.6).tolist() == [[0.0, 0.5, 0.0, 0.25]]  # 0.5 < 0.6: the next one too
    assert truncated(p, top_p=0.5).tolist() == [[0.0, 0.5, 0.0, 0.0]]
    assert truncated(p, top_p=0.01, top_k=3).tolist() == [[0.0, 0.5, 0.0, 0.0]]  # at least one
    # top_k 1 samples what greedy decoding picks
    greedy = Worker(0, s := with_training("grpo-tiny-cpu", top_k=1), alone(s), total_steps=1)
    greedy.step(0)
    seqs = greedy.outputs[0]["seqs"]
    from realbench.runtime.engine import generate
    from realbench.runtime.worker import make_dataset

    ref = Worker(0, s, alone(s), total_steps=1)
    prompts = make_dataset(s.dataflow.call("actor_gen"), "prompts", s.models["actor"].vocab, 0, 0)
    want, _ = generate(ref.masters[ref.master_of[0]], prompts, 8, greedy=True)
    assert torch.equal(seqs, want)


def test_iterations_and_minibatches_multiply_the_train_calls_work():
    one, two = (Estimator(with_training("grpo-tiny-cpu", num_iterations=n), profile=None) for n in (1, 2))
    assert two.scenario.dataflow.call("actor_train").iterations == 2
    plan = symmetric_plan(one)
    a, b = (e.estimate(plan).calls["actor_train"].time_s for e in (one, two))
    from realbench.cost.calls import call_cost

    c1, c2 = (e.scenario.dataflow.call("actor_train") for e in (one, two))
    o = one.options_of(plan)["actor_train"]
    model = one.scenario.models["actor"]
    k1, k2 = call_cost(c1, model, one.cluster, o), call_cost(c2, model, two.cluster, o)
    # twice the updates; the behaviour forward covers 1 of 2 minibatches, then both
    assert k2.optimizer_s == pytest.approx(2 * k1.optimizer_s) and k2.dp_comm_s == pytest.approx(2 * k1.dp_comm_s)
    # compute in forwards of a minibatch per pipeline slot: 2 updates x 3 + 1 behaviour forward = 7,
    # then 4 x 3 + 2 = 14
    assert k2.compute_s == pytest.approx(2 * k1.compute_s)
    assert b > 1.9 * a
    # top-k, top-p and the schedule cost nothing
    same = Estimator(with_training("grpo-tiny-cpu", top_k=5, top_p=0.9, lr_scheduler_type="cosine"), profile=None)
    assert same.estimate(plan).time_per_iter_s == one.estimate(plan).time_per_iter_s


def test_where_the_old_log_probabilities_come_from_is_priced_as_forwards_of_a_minibatch():
    """grpo-tiny-cpu's actor trains in 2 optimizer steps of one micro-batch each, on one device
    without checkpointing: a step is a forward and a backward, 3 forwards of its minibatch; the
    old log-probabilities add a forward of 1 minibatch (later_steps), of both (whole_batch) or
    none (rollout): compute 2 x 3 + 1 = 7, 8 and 6 forwards."""
    from realbench.cost.calls import behaviour_forwards, call_cost

    option = Option(Mesh(0, 1, 0, 1), Strategy(1, 1, 1, 1))
    costs, counts = {}, {}
    for mode in ("later_steps", "whole_batch", "rollout"):
        s = with_training("grpo-tiny-cpu", old_logprobs=mode)
        train = s.dataflow.call("actor_train")
        assert train.optimizer_steps == 2 and s.training.old_logprobs == mode == train.old_logprobs
        costs[mode] = call_cost(train, s.models["actor"], s.cluster, option)
        counts[mode] = behaviour_forwards(train, s.models["actor"])
    assert counts == {"later_steps": 1, "whole_batch": 2, "rollout": 0}
    forward = costs["rollout"].compute_s / 6
    assert costs["later_steps"].compute_s == pytest.approx(7 * forward)
    assert costs["whole_batch"].compute_s == pytest.approx(8 * forward)
    assert costs["whole_batch"].optimizer_s == costs["rollout"].optimizer_s  # the updates are the same
    # with two passes over the batch later_steps computes every step's too; a value model's call none
    two = with_training("grpo-tiny-cpu", num_iterations=2, old_logprobs="later_steps")
    assert behaviour_forwards(two.dataflow.call("actor_train"), two.models["actor"]) == 2
    ppo = with_training("ppo-tiny-cpu", old_logprobs="whole_batch")
    assert behaviour_forwards(ppo.dataflow.call("critic_train"), ppo.models["critic"]) == 0
    assert behaviour_forwards(ppo.dataflow.call("actor_train"), ppo.models["actor"]) == \
        ppo.dataflow.call("actor_train").optimizer_steps


def test_old_logprobs_is_a_setting_of_the_policy_gradient_algorithms_only(cli, tmp_path):
    schema = {"schema": "realbench.scenario/1"}
    path = tmp_path / "my sft.yaml"
    path.write_text(yaml.safe_dump({**schema, **BUILTIN["sft-tiny-cpu"], "training": {"old_logprobs": "rollout"}},
                                   sort_keys=False))
    code, out, err = cli("validate", path)
    assert code == 2 and err.count("\n") == 1 and "training.old_logprobs" in err and "sft does not use it" in err, err
    path.write_text(yaml.safe_dump({**schema, **BUILTIN["grpo-tiny-cpu"], "training": {"old_logprobs": "generation"}},
                                   sort_keys=False))
    code, out, err = cli("validate", path)
    assert code == 2 and err.count("\n") == 1 and "old_logprobs" in err and "whole_batch" in err, err


# -- several reward scorers, weighted ---------------------------------------------------------------
SCORERS = '''
def length(completion_ids, **kwargs):
    return [float(len(ids)) for ids in completion_ids]


def half(completions, **kwargs):
    return [0.5 if i % 2 else None for i in range(len(completions))]
'''


def test_a_reward_model_and_functions_add_up_with_their_weights(tmp_path, ckpt):
    save_model(tmp_path / "rm", cls="LlamaForSequenceClassification", num_labels=1, seed=5)
    (tmp_path / "scorers.py").write_text(SCORERS)

    def edit(d):
        d["models"]["reward"] = [{"path": "rm"}, {"function": ["scorers.py:length", "scorers.py:half"]}]
        d["training"]["reward_weights"] = [2.0, 0.1, -1.0]
    s = load_scenario(str(job(tmp_path, ckpt, edit=edit)))
    calls = {c.name: c for c in s.dataflow.calls}
    assert calls["reward_inf"].outputs == ("model_rewards",) and calls["reward_inf_functions"].inputs == \
        ("seqs", "model_rewards") and calls["reward_inf_functions"].outputs == ("rewards",)
    assert s.models["reward_functions"].scorers == 3
    w = Worker(0, s, alone(s), total_steps=1)
    rec = w.step(0)
    index = {c.name: i for i, c in enumerate(w.calls)}
    model = w.outputs[index["reward_inf"]]["model_rewards"]
    ids = [[t for t in row[-6:] if t >= 0] for row in w.outputs[index["actor_gen"]]["seqs"].tolist()]
    want = [2.0 * float(m) + 0.1 * len(x) + (-0.5 if k % 2 else 0.0) for k, (m, x) in enumerate(zip(model, ids))]
    assert w.outputs[index["reward_inf_functions"]]["rewards"].tolist() == pytest.approx(want, abs=1e-5)
    assert rec.metrics["reward_inf_functions/length"] == pytest.approx(sum(map(len, ids)) / len(ids))
    assert rec.metrics["reward_inf_functions/half"] == 0.5 and rec.metrics["reward_inf_functions/no_reward"] == 0.0
    # the functions' call is costed per function
    est = Estimator(s, profile=None)
    fn = est.options_of(symmetric_plan(est))["reward_inf_functions"]
    assert est.estimate(symmetric_plan(est)).calls["reward_inf_functions"].time_s == pytest.approx(
        16 / fn.strategy.dp * 2 * s.models["reward_functions"].seconds_per_sample)


# -- trackers ---------------------------------------------------------------------------------------
def test_report_to_tensorboard_logs_every_metric_of_every_step(cli, tmp_path, ckpt):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    scenario = job(tmp_path, ckpt)
    plan = tmp_path / "plan.yaml"
    assert cli("estimate", "--scenario", scenario, "--baseline", "symmetric", "--out", plan)[0] == 0
    code, out, err = cli("run", "--scenario", scenario, "--plan", plan, "--nproc", 2, "--steps", 3, "--out",
                         tmp_path / "run", "--report-to", "tensorboard")
    assert code == 0, err
    lines = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    runs = list((tmp_path / "run" / "runs").iterdir())
    assert len(runs) == 1 and runs[0].name.startswith("grpo-arithmetic-")
    events = EventAccumulator(str(runs[0])).Reload()
    tags = set(events.Tags()["scalars"])
    for line in lines:
        for key, value in line.items():
            if key == "step" or not isinstance(value, (int, float)) or isinstance(value, bool):
                continue
            assert key in tags, key
            logged = {e.step: e.value for e in events.Scalars(key)}
            assert logged[line["step"]] == pytest.approx(value, rel=1e-6), (key, line["step"])
    assert {"reward", "loss", "actor_train/grad_norm", "actor/learning_rate", "seconds"} <= tags
    hparams = next(runs[0].rglob("hparams.yml")).read_text()
    assert "scenario/name: grpo-arithmetic" in hparams and "scenario/training/learning_rate: 0.001" in hparams
    # bad values: one line, exit 2
    for args, expected in ((("--report-to", "neptune", "--out", tmp_path / "r2"), "unknown tracker 'neptune'"),
                           (("--report-to", "tensorboard"), "give --out DIR"),
                           (("--report-to", "none", "tensorboard", "--out", tmp_path / "r3"), "none cannot be combined")):
        code, out, err = cli("run", "--scenario", scenario, "--plan", plan, "--nproc", 2, "--steps", 1, *args)
        assert code == 2 and err.count("\n") == 1 and expected in err, err


# -- data as TRL users hold it ---------------------------------------------------------------------
def test_a_datasets_folder_and_a_datasets_object_train_like_the_jsonl(tmp_path, ckpt):
    datasets = pytest.importorskip("datasets")
    rows = arithmetic_prompts()
    datasets.Dataset.from_list(rows).save_to_disk(str(tmp_path / "saved"))
    datasets.DatasetDict({"train": datasets.Dataset.from_list(rows)}).save_to_disk(str(tmp_path / "dict"))
    plain = load_scenario(str(job(tmp_path, ckpt)))
    for train in ("saved", "dict"):
        s = load_scenario(str(job(tmp_path, ckpt, edit=lambda d: d["data"].update(train=train))))
        assert s.data.rows == plain.data.rows and s.data.prompt_len == plain.data.prompt_len
        a, b = Worker(0, s, alone(s), total_steps=1), Worker(0, plain, alone(plain), total_steps=1)
        assert [a.step(0).reward] == [b.step(0).reward]  # the same rows, in the same order
    # the Python API: a datasets.Dataset object in the document
    doc = yaml.safe_load((tmp_path / "grpo-arithmetic.yaml").read_text())
    doc["data"]["train"] = datasets.Dataset.from_list(rows)
    s = scenario_from_document(doc, str(tmp_path / "grpo-arithmetic.yaml"))
    assert s.data.rows == plain.data.rows
    (tmp_path / "empty").mkdir()
    with pytest.raises(ConfigError, match="not one written by datasets' save_to_disk"):
        load_scenario(str(job(tmp_path, ckpt, edit=lambda d: d["data"].update(train="empty"))))


# -- the README's recipe, with files named as a user names them --------------------------------------
def test_the_recipe_works_whatever_the_scenario_file_is_called(cli, tmp_path, ckpt, monkeypatch):
    (tmp_path / "job").mkdir()
    path = job(tmp_path / "job", ckpt)
    mine = path.rename(tmp_path / "job" / "my-job.yaml")
    monkeypatch.chdir(tmp_path)
    (tmp_path / "plans").mkdir()
    code, out, err = cli("search", "--scenario", "job/my-job.yaml", "--method", "mcmc", "--time-budget", 1,
                         "--max-evals", 200, "--out", "plans/plan.yaml")
    assert code == 0, err
    assert yaml.safe_load((tmp_path / "plans" / "plan.yaml").read_text())["scenario"] == "../job/my-job.yaml"
    assert cli("estimate", "--scenario", "job/my-job.yaml", "--baseline", "symmetric", "--out", "plans/sym.yaml")[0] == 0
    for plan in ("plans/plan.yaml", "plans/sym.yaml"):
        assert cli("estimate", "--scenario", "job/my-job.yaml", "--plan", plan)[0] == 0
        assert cli("validate", plan)[0] == 0 and cli("validate", plan, "--scenario", mine)[0] == 0
        code, out, err = cli("export", "--plan", plan, "--format", "torchrun", "--out", plan + ".sh")
        assert code == 0 and "job/my-job.yaml" in (tmp_path / (plan + ".sh")).read_text(), err
    code, out, err = cli("run", "--scenario", "job/my-job.yaml", "--plan", "plans/plan.yaml", "--nproc", 2,
                         "--steps", 1)
    assert code == 0, err
    # a plan of another scenario is still refused
    other = BUILTIN["grpo-tiny-cpu"]["name"]
    code, out, err = cli("estimate", "--scenario", other, "--plan", "plans/plan.yaml")
    assert code == 2 and "the plan is for scenario '../job/my-job.yaml', not 'grpo-tiny-cpu'" in err, err


def test_bench_peers_quick_trains_the_same_job_with_trl_and_realbench(cli):
    code, out, err = cli("bench", "peers", "--quick", "--json")
    assert code == 0, err
    r = json.loads(out)
    # GRPO's summary at the top level, RLOO's under "rloo", GRPO with LoRA's under "lora": the same
    # keys, each algorithm's settings
    job_keys = {"model_params", "steps", "seeds", "smooth_steps", "rloo", "lora"}
    assert set(r["rloo"]) == set(r["lora"]) == set(r) - job_keys
    for summary, algorithm in ((r, "grpo"), (r["rloo"], "rloo"), (r["lora"], "lora")):
        for system in ("realbench", "trl"):
            (run,) = summary["runs"][system]
            assert len(run["rewards"]) == r["steps"] == 2 and all(x is not None for x in run["rewards"]), algorithm
            assert len(run["seconds"]) == 2 and all(t > 0 for t in run["seconds"]), algorithm
        # both train the same parameters: every weight, or under LoRA the same adapters alone (a
        # LoRA setting dropped on either side would train all 100,672)
        trained = {s: summary["runs"][s][0]["trained_params"] for s in ("realbench", "trl")}
        h, kv, f = 64, 32, 176  # the quick model: hidden, k/v width (4 of 8 heads), ffn; 2 layers
        adapters = 2 * 16 * ((h + h) + 2 * (h + kv) + (h + h) + 3 * (h + f))  # r (A + B) of q k v o gate up down
        assert trained == {s: adapters if algorithm == "lora" else r["model_params"] for s in trained}, algorithm
        assert summary["step_ratio"] == pytest.approx(summary["step_s"]["trl"] / summary["step_s"]["realbench"])
        assert summary["settings"]["group_size"] == 2 and summary["settings"]["epsilon"] == 0.2
        assert summary["realbench_mean_within_trl_spread"] == (
            summary["trl_spread"][0] <= summary["final_reward"]["realbench"][0] <= summary["trl_spread"][1])
        assert summary["first_step_reward"] == {s: summary["runs"][s][0]["rewards"][0] for s in ("realbench", "trl")}
        assert 0 <= summary["curve_inside_trl_band"] <= 1
    assert r["settings"]["loss_type"] == "dapo" and r["settings"]["beta"] == 0.04
    # RLOO: TRL's RLOOConfig has no loss_type, and its beta is RLOO's default
    assert "loss_type" not in r["rloo"]["settings"] and r["rloo"]["settings"]["beta"] == 0.05
    # LoRA: GRPO's settings at its own learning rate, with the adapters'
    lora = r["lora"]["settings"]
    assert {k: v for k, v in lora.items() if k != "learning_rate"} == {
        **{k: v for k, v in r["settings"].items() if k != "learning_rate"}, "r": 16, "lora_alpha": 32,
        "target_modules": ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]}
    assert r["model_params"] == 100672  # the base model's, adapters not counted


def test_bench_peers_lora_gives_both_systems_the_same_adapters_and_no_reference_model(tmp_path):
    from realbench.bench.peers import ALGORITHMS, LORA, QUICK_JOB, _job, bench_peers, trl_arguments

    paths = _job(tmp_path, QUICK_JOB, ["lora"])
    assert set(paths) == {"lora"} and paths["lora"].name == "grpo-lora-arithmetic.yaml"
    # realbench: the actor trained with the adapters, and no reference model: its reference call
    # runs the actor with the adapters off (as TRL's reference with a peft_config)
    s = load_scenario(str(paths["lora"]))
    lora = s.models["actor"].lora
    assert (lora.r, lora.lora_alpha, lora.target_modules) == (16, 32, tuple(LORA["target_modules"]))
    assert "ref" not in s.models
    ref = [c for c in s.dataflow.calls if not c.adapters]
    assert len(ref) == 1 and ref[0].model == "actor" and "ref_logprobs" in ref[0].outputs
    # TRL: GRPOTrainer, the same adapters as its peft_config, the same settings, no checkpointing
    given = trl_arguments(tmp_path, "lora", ALGORITHMS["lora"], QUICK_JOB, 2, 0)
    config, args = given["peft_config"], given["args"]
    assert given["trainer"].__name__ == "GRPOTrainer"
    assert (config.r, config.lora_alpha, set(config.target_modules)) == (16, 32, set(LORA["target_modules"]))
    assert (config.lora_dropout, config.bias, config.use_rslora) == (0.0, "none", False)
    assert args.learning_rate == ALGORITHMS["lora"]["learning_rate"] and args.beta == 0.04
    assert args.loss_type == "dapo" and not args.gradient_checkpointing
    assert trl_arguments(tmp_path, "grpo", ALGORITHMS["grpo"], QUICK_JOB, 2, 0)["peft_config"] is None
    with pytest.raises(ConfigError, match="'dpo' is not one of the algorithms"):
        bench_peers(True, algorithms=["lora", "dpo"])


def test_the_reward_curve_comparison_smooths_and_counts_steps_inside_the_band():
    from realbench.bench.peers import curve_inside_band, smoothed

    assert smoothed([1, 3, 5, 7], window=2) == [1, 2, 4, 6]
    # band after smoothing (window 5: running means): low 0,0,0 / high 2,2,2; the mean of the two
    # curves 1,1,1 then (1+5)/2=3 -> running mean (1+1+3)/3 = 5/3: inside at all three
    assert curve_inside_band([[1, 1, 1], [1, 1, 5]], [[0, 0, 0], [2, 2, 2]]) == 1.0
    # a mean curve of 1, 1, then 9 -> running mean 11/3 above 2: two steps of three inside
    assert curve_inside_band([[1, 1, 9]], [[0, 0, 0], [2, 2, 2]]) == pytest.approx(2 / 3)
