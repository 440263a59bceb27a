"""Plans executed on local CPU processes: every algorithm under two plans, learning, the CLI."""

import dataclasses
import json
import math

import pytest
import torch

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


def test_reallocation_moves_bytes_when_layouts_differ():
    est, plans = two_plans("ppo-tiny-cpu")
    searched = plans[1]
    gen, train = searched["actor_gen"], searched["actor_train"]
    per_rank = spawn(recorded_steps, 4, [(est.scenario, searched), (est.scenario, plans[0])], 1)
    records, sym = [r[0][0] for r in per_rank], [r[1][0] for r in per_rank]
    moved = sum(r[0]["realloc_bytes"] for r in records)
    if (gen.mesh, gen.strategy.tp, gen.strategy.pp) != (train.mesh, train.strategy.tp, train.strategy.pp):
        assert moved > 0
    assert sum(r[0]["realloc_bytes"] for r in sym) == 0  # one layout for everything: nothing moves


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
        raise AssertionError("asked the CUDA runtime: the forked workers could not use CUDA")

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


def test_resumed_run_equals_uninterrupted_run(cli, tmp_path):
    plan = _tiny_plan(tmp_path)
    base = ("run", "--scenario", "ppo-tiny-2cpu", "--plan", plan, "--nproc", 2, "--json")
    code, out, err = cli(*base, "--steps", 4)
    assert code == 0, err
    whole = json.loads(out)["metrics"]
    ck = tmp_path / "ck"
    code, _, err = cli(*base, "--steps", 2, "--save-every", 2, "--checkpoint-dir", ck)
    assert code == 0, err
    assert (ck / "step2" / "rank0.safetensors").is_file() and (ck / "step2" / "rank1.safetensors").is_file()
    code, out, err = cli(*base, "--steps", 4, "--checkpoint-dir", ck, "--resume")
    assert code == 0, err
    resumed = json.loads(out)["metrics"]
    assert [m["step"] for m in resumed] == [2, 3]
    assert resumed == whole[2:]
    # a non-empty checkpoint folder is not overwritten by a fresh run
    code, _, err = cli(*base, "--steps", 2, "--save-every", 1, "--checkpoint-dir", ck)
    assert code == 2 and "not empty" in err


def test_a_dead_worker_stops_the_run_with_one_clear_line(cli, tmp_path, monkeypatch):
    import time

    plan = _tiny_plan(tmp_path)
    monkeypatch.setenv("REALBENCH_FAULT", "1:critic_train")
    t0 = time.perf_counter()
    code, out, err = cli("run", "--scenario", "ppo-tiny-2cpu", "--plan", plan, "--nproc", 2, "--steps", 2)
    assert time.perf_counter() - t0 < 90
    assert code == 1
    lines = [l for l in err.splitlines() if l.startswith("realbench:")]
    assert len(lines) == 1 and "rank 1" in lines[0] and "critic_train" in lines[0], err
