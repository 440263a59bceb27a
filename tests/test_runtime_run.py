"""Plans executed on local CPU processes: every algorithm under two plans, learning, the CLI."""

import dataclasses
import json
import math

import pytest
import torch
import yaml

from nccl_order import recorded_steps, replay
from realbench.cost import Estimator
from realbench.cost.baselines import heuristic_plan, symmetric_plan
from realbench.plan import get_builtin, plan_from_options
from realbench.runtime.local import spawn
from realbench.runtime.worker import run_steps
from realbench.search import run_search


def _steps(rank, world, scenario, options, steps, seed):
    return [dataclasses.asdict(r) for r in run_steps(rank, scenario, options, steps, seed)]


def two_plans(name):
    """The symmetric plan and a different one: the searched optimum, else the heuristic, else
    every call on a device of its own."""
    est = Estimator(get_builtin(name))
    a = symmetric_plan(est)
    alone = tuple(next(k for k, o in enumerate(est.options[i]) if o.mesh.size == 1
                       and o.mesh.gpu == i % est.cluster.gpus_per_node) for i in range(est.n))
    others = [run_search(est, "mcmc", 60, seed=0, max_evaluations=2000).best_choice, heuristic_plan(est), alone]
    b = next(p for p in others if p != a)
    return est, [est.options_of(a), est.options_of(b)]


def metrics(records, key):
    steps = len(records[0])
    out = []
    for s in range(steps):
        vals = [r[s][key] for r in records if r[s][key] is not None]
        out.append(sum(vals) / len(vals) if vals else None)
    return out


@pytest.mark.parametrize("name", ["ppo-tiny-cpu", "grpo-tiny-cpu", "rloo-tiny-cpu", "remax-tiny-cpu",
                                  "dpo-tiny-cpu", "sft-tiny-cpu"])
def test_every_algorithm_runs_under_two_plans(name):
    est, plans = two_plans(name)
    scenario = est.scenario
    per_rank = spawn(recorded_steps, scenario.cluster.n_devices, [(scenario, p) for p in plans], 2)
    # the plan changes where and how things run, not what is trained: the same samples (draws per
    # global row), rewards and losses under both plans, to fp32 rounding
    runs = [[r[k][0] for r in per_rank] for k in range(len(plans))]
    for key in ("loss",) if scenario.algorithm in ("dpo", "sft") else ("loss", "reward"):
        a, b = metrics(runs[0], key), metrics(runs[1], key)
        assert a == pytest.approx(b, rel=1e-4, abs=1e-5), (key, a, b)
    for k in range(len(plans)):
        records = [r[k][0] for r in per_rank]
        replay([r[k][1] for r in per_rank])  # and the same messages would not hang on NCCL
        losses = metrics(records, "loss")
        assert all(x is not None and math.isfinite(x) for x in losses), losses
        if scenario.algorithm not in ("dpo", "sft"):
            rewards = metrics(records, "reward")
            assert all(x is not None and math.isfinite(x) for x in rewards)
        timed = set().union(*(r[0]["call_s"] for r in records))
        assert timed == set(scenario.dataflow.call_names)  # every call ran somewhere and was timed


def option(est, call, dp, tp, pp, size=None):
    """The call's option with that strategy on the mesh of `size` devices starting at device 0
    (the whole cluster by default), fewest micro-batches."""
    i = est.call_names.index(call)
    size = size or est.cluster.n_devices
    return min((o for o in est.options[i] if (o.strategy.dp, o.strategy.tp, o.strategy.pp) == (dp, tp, pp)
                and o.mesh.size == size and o.mesh.start(est.cluster.gpus_per_node) == 0),
               key=lambda o: o.strategy.micro_batches)


def test_reallocation_moves_the_bytes_worked_out_by_hand():
    """The actor trains as 4 pipeline stages and generates as 4 data-parallel replicas: each of
    the 4 ranks holds a quarter of the model (its stage) and needs all of it, so 3 model
    copies of fp32 values move per step. The symmetric plan moves nothing."""
    est, plans = two_plans("ppo-tiny-cpu")
    sym = plans[0]
    moving = {**sym, "actor_train": option(est, "actor_train", 1, 1, 4), "actor_gen": option(est, "actor_gen", 4, 1, 1)}
    per_rank = spawn(recorded_steps, 4, [(est.scenario, moving), (est.scenario, sym)], 1)
    records, sym_records = [r[0][0] for r in per_rank], [r[1][0] for r in per_rank]
    actor = est.scenario.models["actor"]
    assert sum(r[0]["realloc_bytes"] for r in records) == 3 * actor.n_params * 4
    assert {n for r in records for n in r[0]["realloc_s"]} == {"actor_gen"}
    assert sum(r[0]["realloc_bytes"] for r in sym_records) == 0  # one layout for everything: nothing moves


def test_ppo_mean_reward_rises():
    est = Estimator(get_builtin("ppo-tiny-2cpu"))
    options = est.options_of(run_search(est, "mcmc", 60, seed=0, max_evaluations=3000).best_choice)
    records = spawn(_steps, 2, est.scenario, options, 40, 0, timeout_s=600)
    rewards = metrics(records, "reward")
    first, last = sum(rewards[:10]) / 10, sum(rewards[-10:]) / 10
    assert last > first + 0.5, (first, last)


@pytest.mark.parametrize("name", ["dpo-tiny-cpu", "sft-tiny-cpu"])
def test_supervised_losses_fall(name):
    est = Estimator(get_builtin(name))
    options = est.options_of(symmetric_plan(est))
    records = spawn(_steps, 4, est.scenario, options, 12, 0)
    losses = metrics(records, "loss")
    assert sum(losses[-3:]) / 3 < sum(losses[:3]) / 3 - 0.1, losses


def test_run_cli_through_accelerate(cli, tmp_path):
    est = Estimator(get_builtin("ppo-tiny-cpu"))
    plan_path = tmp_path / "plan.yaml"
    plan_from_options(est.scenario, est.options_of(symmetric_plan(est))).save(plan_path)
    code, out, err = cli("run", "--scenario", "ppo-tiny-cpu", "--plan", plan_path, "--nproc", 4, "--steps", 2, "--json")
    assert code == 0, err
    r = json.loads(out)
    assert r["steps"] == 2 and set(r["calls"]) == set(est.scenario.dataflow.call_names)
    for c in r["calls"].values():
        assert c["measured_s"] > 0 and c["estimated_s"] > 0
    assert [m["step"] for m in r["metrics"]] == [0, 1] and all(m["reward"] is not None for m in r["metrics"])
    assert "realloc_bytes" in r
    assert r["device"] == ("cuda" if torch.cuda.device_count() >= 4 else "cpu")  # auto
    code, _, err = cli("run", "--scenario", "ppo-tiny-cpu", "--plan", plan_path, "--nproc", 3, "--steps", 1)
    assert code == 2 and "--nproc" in err
    if torch.cuda.device_count() < 4:
        code, _, err = cli("run", "--scenario", "ppo-tiny-cpu", "--plan", plan_path, "--nproc", 4, "--steps", 1,
                           "--device", "cuda")
        assert code == 2 and "--device" in err and "4 process(es) need as many GPUs" in err
        assert len(err.strip().splitlines()) == 1


def test_auto_device_takes_cuda_only_with_a_gpu_for_every_process(monkeypatch):
    from realbench.errors import ConfigError
    from realbench.runtime.device import backend, resolve_device

    def cuda_runtime_query():
        raise AssertionError("asked the CUDA runtime: the calling process would hold a CUDA context")

    monkeypatch.setattr(torch.cuda, "is_available", cuda_runtime_query)
    monkeypatch.setattr(torch._C, "_cuda_getDeviceCount", cuda_runtime_query, raising=False)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    assert resolve_device("auto", 2) == "cuda" and backend("cuda") == "nccl"
    assert resolve_device("auto", 4) == "cpu" and backend("cpu") == "gloo"
    assert resolve_device("cpu", 2) == "cpu"
    with pytest.raises(ConfigError, match="need as many GPUs"):
        resolve_device("cuda", 4)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 0)
    assert resolve_device("auto", 1) == "cpu"
    with pytest.raises(ConfigError):
        resolve_device("tpu", 1)


def _tiny_plan(tmp_path):
    est = Estimator(get_builtin("ppo-tiny-2cpu"))
    plan_path = tmp_path / "plan.yaml"
    plan_from_options(est.scenario, est.options_of(heuristic_plan(est))).save(plan_path)
    return plan_path


def test_latest_checkpoint_is_the_highest_complete_step(tmp_path):
    from realbench.errors import ConfigError
    from realbench.runtime.checkpoint import write_manifest
    from realbench.runtime.launch import latest_checkpoint

    with pytest.raises(ConfigError, match="holds no complete checkpoint"):
        latest_checkpoint(tmp_path)
    for name in ("step2", "step9", "step10", "step11", "step10-old", "stepx", "steps"):
        (tmp_path / name).mkdir()
        if name != "step11":  # step11: a save that did not finish (no manifest)
            write_manifest(tmp_path / name, 0, "s", {}, 1)
    assert latest_checkpoint(tmp_path) == 10  # not step9, which sorts after step10 as text, nor step11


def test_resume_takes_the_latest_checkpoint_and_equals_the_uninterrupted_run(cli, tmp_path):
    """The actor trains on two pipeline stages and generates on two data-parallel replicas (it
    is reallocated every step); checkpoints at steps 5 and 10; resuming continues from 10 and
    gives what the uninterrupted run gave."""
    est = Estimator(get_builtin("ppo-tiny-2cpu"))
    options = {**est.options_of(symmetric_plan(est)), "actor_train": option(est, "actor_train", 1, 1, 2),
               "actor_gen": option(est, "actor_gen", 2, 1, 1)}
    plan = tmp_path / "plan.yaml"
    plan_from_options(est.scenario, options).save(plan)
    ck = tmp_path / "ck"
    base = ("run", "--scenario", "ppo-tiny-2cpu", "--plan", plan, "--nproc", 2, "--json", "--checkpoint-dir", ck)
    code, out, err = cli(*base, "--steps", 12, "--save-every", 5)
    assert code == 0, err
    whole = json.loads(out)
    assert whole["realloc_bytes"] == est.scenario.models["actor"].n_params * 4  # each rank gets the other half
    assert sorted(p.name for p in ck.iterdir()) == ["step10", "step5"]
    assert all((ck / s / f"rank{r}.safetensors").is_file() for s in ("step5", "step10") for r in (0, 1))
    manifest = json.loads((ck / "step10" / "checkpoint.json").read_text())
    assert manifest["step"] == 10 and manifest["processes"] == 2 and manifest["calls"]["actor_gen"]["dp"] == 2
    code, out, err = cli(*base, "--steps", 12, "--resume")
    assert code == 0, err
    resumed = json.loads(out)["metrics"]
    assert [m["step"] for m in resumed] == [10, 11]
    assert resumed == whole["metrics"][10:]
    # under a plan of another scenario: refused by name, before any process starts
    other_est = Estimator(get_builtin("ppo-tiny-cpu"))
    other = tmp_path / "other.yaml"
    plan_from_options(other_est.scenario, other_est.options_of(symmetric_plan(other_est))).save(other)
    code, _, err = cli("run", "--scenario", "ppo-tiny-cpu", "--plan", other, "--nproc", 4, "--steps", 12,
                       "--checkpoint-dir", ck, "--resume")
    assert code == 2 and err.count("\n") == 1 and "of scenario 'ppo-tiny-2cpu', not 'ppo-tiny-cpu'" in err, err
    # a non-empty checkpoint folder is not overwritten by a fresh run
    code, _, err = cli(*base, "--steps", 2, "--save-every", 1)
    assert code == 2 and "not empty" in err
    assert sorted(p.name for p in ck.iterdir()) == ["step10", "step5"]


def test_a_dead_worker_stops_the_run_with_one_clear_line(cli, tmp_path, monkeypatch):
    """The whole of stderr is one line naming the rank and the call, in-process (where the
    launchers' loggers write) and as a command (where the worker processes' output goes too)."""
    import subprocess
    import sys
    import time

    plan = _tiny_plan(tmp_path)
    monkeypatch.setenv("REALBENCH_FAULT", "1:critic_train")
    args = ("run", "--scenario", "ppo-tiny-2cpu", "--plan", plan, "--nproc", 2, "--steps", 2)
    t0 = time.perf_counter()
    code, out, err = cli(*args)
    assert time.perf_counter() - t0 < 90
    assert code == 1 and out == ""
    assert err == "realbench: run failed: rank 1 failed in call critic_train: RuntimeError: injected fault " \
                  "(REALBENCH_FAULT)\n", err
    proc = subprocess.run([sys.executable, "-m", "realbench", *map(str, args)], capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 1 and proc.stdout == "" and proc.stderr == err, proc.stderr


def test_a_long_sample_is_cut_on_the_terminal_and_kept_whole_in_samples_jsonl(tmp_path, capsys):
    """256 generated token ids of the toy task made each step's line 2 kB on a GPU run."""
    import json

    from realbench.cli.run import Progress

    completion = list(range(1000, 1256))
    summary = {"metrics": [{"step": 0, "reward": 1.0, "loss": 0.5}], "timings": [{"step": 0, "seconds": 1.0}],
               "samples": [{"step": 0, "samples": [{"prompt": [1, 2, 3], "completion": completion}]}]}
    Progress(1, str(tmp_path))(summary)
    line = [x for x in capsys.readouterr().err.splitlines() if "->" in x][0]
    assert line.startswith("  [1, 2, 3] -> [1000, 1001,") and line.endswith("... (256 token ids)")
    assert len(line) < 200
    kept = json.loads((tmp_path / "samples.jsonl").read_text())
    assert kept["samples"][0]["completion"] == completion


def test_an_interleaved_train_layout_trains_as_the_plain_one():
    """PPO's actor trains on 2 stages of 2 virtual stages each (its 4 layers round robin) or on
    the plain pipeline, the weights reallocated from and to its data-parallel generation layout
    each step: the same rewards and losses."""
    est, plans = two_plans("ppo-tiny-cpu")
    i = est.call_names.index("actor_train")
    inter = next(o for o in est.options[i] if (o.strategy.dp, o.strategy.tp, o.strategy.pp, o.strategy.virtual_stages)
                 == (2, 1, 2, 2) and o.mesh.size == 4 and not o.strategy.checkpointing)
    plain = dataclasses.replace(inter, strategy=dataclasses.replace(inter.strategy, virtual_stages=1))
    gen = option(est, "actor_gen", 4, 1, 1)
    runs = [{**plans[0], "actor_train": o, "actor_gen": gen} for o in (plain, inter)]
    per_rank = spawn(recorded_steps, 4, [(est.scenario, p) for p in runs], 2)
    records = [[r[k][0] for r in per_rank] for k in range(2)]
    for key in ("loss", "reward"):
        a, b = metrics(records[0], key), metrics(records[1], key)
        assert all(x is not None for x in a) and a == pytest.approx(b, rel=1e-5, abs=1e-6), (key, a, b)
    assert sum(r[0]["realloc_bytes"] for r in records[1]) > 0  # the layouts differ: weights moved


def test_a_run_refuses_materialized_attention():
    """Materialized attention prices another engine than the runtime's fused kernel."""
    from realbench.errors import ConfigError
    from realbench.runtime.launch import check_run

    est, plans = two_plans("ppo-tiny-cpu")
    eager = est.scenario.model_copy(update={"cluster": est.scenario.cluster.model_copy(update={"attention": "materialized"})})
    with pytest.raises(ConfigError) as e:
        check_run(eager, plans[0], 4, 2, 0, "", False)
    assert e.value.field == "cluster.attention" and "fused kernel" in e.value.message
    assert check_run(est.scenario, plans[0], 4, 2, 0, "", False) == 0


def test_grpo_without_a_reference_runs(cli, tmp_path):
    """A scenario without a reference (dataflow with_ref: false, as AReaL's kl_ctl 0 imports): the
    runtime runs generation, reward and training only, and trains."""
    from realbench.plan.builtin import BUILTIN

    doc = {**BUILTIN["grpo-tiny-cpu"], "schema": "realbench.scenario/1", "name": "no ref",
           "cluster": {"nodes": 1, "gpus_per_node": 2, "device": "cpu"},
           "dataflow": {**BUILTIN["grpo-tiny-cpu"]["dataflow"], "with_ref": False}}
    doc["models"] = {k: v for k, v in doc["models"].items() if k != "ref"}
    (tmp_path / "no ref.yaml").write_text(yaml.safe_dump(doc))
    code, _, err = cli("estimate", "--scenario", tmp_path / "no ref.yaml", "--baseline", "symmetric",
                       "--out", tmp_path / "plan.yaml")
    assert code == 0, err
    code, out, err = cli("run", "--scenario", tmp_path / "no ref.yaml", "--plan", tmp_path / "plan.yaml",
                         "--nproc", 2, "--steps", 1, "--json")
    assert code == 0, err
    result = json.loads(out)
    assert set(result["calls"]) == {"actor_gen", "reward_inf", "actor_train"}, result
