"""Re-planning while training, resharded resume, and checkpoint conversion."""

import json

import numpy as np
import pytest
import torch

from realbench.cost import Estimator
from realbench.plan import get_builtin, plan_from_options
from realbench.runtime.local import spawn

SCENARIO = "ppo-tiny-cpu"  # 4 CPU processes


def poor_plan(est):
    """Every call on all 4 processes with tp 2 and pp 2: the issue's deliberately poor plan."""
    out = {}
    for i, name in enumerate(est.call_names):
        out[name] = min((o for o in est.options[i] if (o.strategy.dp, o.strategy.tp, o.strategy.pp) == (1, 2, 2)
                         and o.mesh.size == 4), key=lambda o: o.strategy.micro_batches)
    return out


@pytest.fixture(scope="module")
def est():
    return Estimator(get_builtin(SCENARIO))


def by_step(result, key):
    return [m[key] for m in result["metrics"]]


@pytest.mark.alone  # the switch is decided on, and judged by, the step times it measures
def test_a_poor_plan_switches_within_12_steps_runs_faster_and_trains_the_same(cli, est, tmp_path):
    plan = tmp_path / "poor.yaml"
    plan_from_options(est.scenario, poor_plan(est)).save(plan)
    common = ("run", "--scenario", SCENARIO, "--plan", plan, "--nproc", 4, "--steps", 12, "--seed", 3, "--json")
    code, out, err = cli(*common, "--replan-every", 3, "--replan-budget", 1)
    assert code == 0, err
    replanned = json.loads(out)
    switches = replanned["switches"]
    assert switches, "no switch in 12 steps"
    first = switches[0]
    assert first["step"] <= 11 and first["new_plan"] != first["old_plan"] and first["predicted_gain"] >= 0.05
    assert first["predicted_gain"] == pytest.approx(1 - first["predicted_new_s"] / first["predicted_old_s"])
    assert set(first["calibration"]) == set(est.call_names)
    # it planned for the response lengths of the 3 steps it calibrated with: every row's, from
    # every replica (this toy model's responses all run to the cap)
    rows = [n for row in replanned["lengths"] for n in row["actor_gen"]]
    assert first["lengths"]["actor_gen"] == {"mean": np.mean(rows), "max": max(rows), "responses": 3 * len(rows) // 12}
    # the switch waited for the boundary after the step during which its search finished, and
    # every step ran under one plan: the versions change exactly at the switches
    assert all(s["step"] == s["requested_in_step"] + 1 for s in switches)
    versions = [t["plan_version"] for t in replanned["timings"]]
    assert versions == [sum(s["step"] <= step for s in switches) for step in range(12)]
    # the run's own step times: faster after the switch (its first step, which binds the new
    # reallocations, left out) than before. The fastest steps are compared: the later searches
    # share this machine's cores with the training, which adds time to some steps, never takes.
    seconds = [t["seconds"] for t in replanned["timings"]]
    before, after = seconds[1:first["step"]], seconds[first["step"] + 1:]
    assert after and min(after) < min(before), (before, after)
    assert isinstance(first["measured_gain"], float)
    # the same seed without re-planning: the same rewards and losses, to 1e-5
    code, out, err = cli(*common)
    assert code == 0, err
    kept = json.loads(out)
    assert "switches" not in kept and {t["plan_version"] for t in kept["timings"]} == {0}
    for key in ("reward", "loss"):
        assert by_step(replanned, key) == pytest.approx(by_step(kept, key), abs=1e-5, rel=1e-5), key


@pytest.mark.alone  # its replanner searches for a second of wall time
def test_responses_that_grow_re_plan_for_the_lengths_they_have_now():
    """Rank 0's replanner, fed a run whose responses grow from a mean of 50 to 2,000 tokens
    (cap 4,096) with the seconds a device that is exactly the cost model would take: it
    calibrates with the lengths the window measured, so the growth is not read as a slower
    device (every scale near 1), and switches to a plan for the longer lengths."""
    from realbench.dataflow.lengths import LengthDistribution
    from realbench.runtime.replan import Replanner
    from realbench.search import run_search
    from realbench.search.tail import sampled_lengths

    base = get_builtin("ppo-8b-16gpu-longtail")

    def lognormal(mean):
        return base.with_lengths({"actor_gen": LengthDistribution(dist="lognormal", mean=mean, cv=1.0, max=4096)})

    short, long = lognormal(50), lognormal(2000)
    searched = Estimator(short)
    # a plan for the short responses found by a search long enough to give generation one node
    # while the other node runs inference (6.45 s vs 6.55 s with both nodes generating): continuous
    # batching prices the both-nodes plans of shorter searches within 2% of the best for the grown
    # lengths too, which would leave nothing to switch to. Counted evaluations keep it deterministic.
    running = searched.options_of(run_search(searched, "mcmc", 600, seed=0, max_evaluations=80_000).best_choice)
    assert "/" in running["actor_gen"].label(8) and not running["actor_gen"].label(8).startswith("n0-1/")
    replanner = Replanner(base, running, every=2, budget_s=1, seed=0)
    steps = sampled_lengths(short, 2, seed=1) + sampled_lengths(long, 2, seed=2)  # the responses grow at step 2
    switch = None
    for k, drawn in enumerate(steps):
        replanner.running_step = k  # as the run's driver says before each step
        est = Estimator(base.with_lengths(drawn), only={n: [o] for n, o in replanner.options.items()})
        e = est.estimate((0,) * est.n)
        rows = {n: np.repeat(d.lengths, d.counts).tolist() for n, d in drawn.items()}
        replanner.observe(k, {n: c.time_s for n, c in e.calls.items()}, e.time_per_iter_s, rows)
        if replanner._thread is not None:
            replanner._thread.join()
        if replanner.poll() is not None:
            switch = replanner.switches[-1]
    assert switch is not None and switch.requested_in_step == 3 and switch.step == 4, replanner.switches
    grown = [n for drawn in steps[2:] for n in np.repeat(drawn["actor_gen"].lengths, drawn["actor_gen"].counts)]
    assert switch.lengths["actor_gen"]["mean"] == pytest.approx(np.mean(grown)) and switch.lengths["actor_gen"]["mean"] > 1500
    assert all(0.8 < x < 1.25 for x in switch.calibration.values()), switch.calibration
    # the plan it switched to is, on the longer lengths, what a search for them finds
    measured, _ = replanner.measured_scenario()
    judge = Estimator(measured)
    new = judge.evaluate(judge.choice_of(replanner.options))
    old = judge.evaluate(judge.choice_of(running))
    assert new[1] <= judge.capacity and (old[1] > judge.capacity or new[0] < 0.95 * old[0]), (new, old)
    assert switch.old_fits == (old[1] <= judge.capacity) and (switch.old_fits or switch.predicted_gain == 1.0)
    fresh = run_search(judge, "mcmc", 1, seed=7)
    assert new[0] < 1.1 * fresh.best_time_s, (new[0], fresh.best_time_s)


def test_closing_the_replanner_ends_its_search_and_joins_its_thread(est):
    """At the end of a run, a search still going is stopped and waited for: a thread left
    computing while the worker's interpreter exits aborts it, failing a run that finished."""
    import time

    from realbench.runtime.replan import Replanner

    options = poor_plan(est)
    replanner = Replanner(est.scenario, options, every=1, budget_s=60, seed=0)
    e = est.estimate(est.choice_of(options))
    replanner.observe(0, {n: c.time_s for n, c in e.calls.items()}, e.time_per_iter_s)
    thread = replanner._thread
    assert thread is not None and thread.is_alive()  # a search of a 60 s budget has begun
    t0 = time.perf_counter()
    replanner.close()
    assert not thread.is_alive() and time.perf_counter() - t0 < 30


@pytest.mark.parametrize("flags,needle", [
    (("--replan-every", "0"), "must be 1 or more"),
    (("--replan-every", "2", "--replan-budget", "-1"), "must be a positive number"),
    (("--replan-every", "2", "--replan-min-gain", "1.5"), "must be a fraction"),
])
def test_bad_replan_flags_get_one_line(cli, est, tmp_path, flags, needle):
    plan = tmp_path / "poor.yaml"
    plan_from_options(est.scenario, poor_plan(est)).save(plan)
    code, _, err = cli("run", "--scenario", SCENARIO, "--plan", plan, "--nproc", 4, "--steps", 4, *flags)
    assert code == 2 and needle in err and err.count("\n") == 1, err


def test_replanning_needs_every_device_of_the_scenario(cli, est, tmp_path):
    two = random_plan(est, np.random.default_rng(0), devices=2)
    plan = tmp_path / "two.yaml"
    plan_from_options(est.scenario, two).save(plan)
    code, _, err = cli("run", "--scenario", SCENARIO, "--plan", plan, "--nproc", 2, "--steps", 4, "--replan-every", 2)
    assert code == 2 and "run with 4 processes" in err and err.count("\n") == 1, err


# -- resume under another plan or process count --------------------------------------------------------------

def random_plan(est, rng, devices: int) -> dict:
    """Random options, every call within devices 0..devices-1 and the last device used."""
    G = est.cluster.gpus_per_node
    while True:
        out = {}
        for i, name in enumerate(est.call_names):
            fits = [o for o in (est.options[i][int(k)] for k in est.candidates(i))
                    if o.mesh.start(G) + o.mesh.size <= devices]
            out[name] = fits[rng.integers(len(fits))]
        if max(o.mesh.start(G) + o.mesh.size for o in out.values()) == devices:
            return out


def _metrics(rec):
    return {"reward": rec.reward, "loss": rec.loss}


def _switching_run(rank, world, scenario, a, b, switch_at, steps, folder):
    """Plan a until `switch_at` (a checkpoint written there, and the actor's full weights
    gathered on rank 0), then plan b through the in-memory switch."""
    import os

    import torch.distributed as dist

    from realbench.plan import plan_from_options
    from realbench.runtime.checkpoint import write_manifest
    from realbench.runtime.replan import switch_plan
    from realbench.runtime.worker import Worker

    worker = Worker(rank, scenario, a, seed=5)
    out = [_metrics(worker.step(s)) for s in range(switch_at)]
    worker.save(folder, switch_at)
    dist.barrier()
    if rank == 0:
        write_manifest(folder, switch_at, scenario.name, plan_from_options(scenario, a).to_document()["calls"], world,
                       scenario.to_document())
    train = next(i for i, c in enumerate(worker.calls) if c.name == "actor_train")
    full = worker.gather_full(train)
    worker = switch_plan(worker, b)
    out += [_metrics(worker.step(s)) for s in range(switch_at, steps)]
    return out, ({k: v.tolist() for k, v in full.items()} if full is not None else None), os.getpid()


def _resumed_run(rank, world, scenario, b, steps, folder):
    from realbench.runtime.checkpoint import load_resharded
    from realbench.runtime.worker import Worker

    worker = Worker(rank, scenario, b, seed=5, weights=False)
    start = load_resharded(worker, folder)
    return [_metrics(worker.step(s)) for s in range(start, steps)]


def mean_by_step(per_rank, key):
    steps = len(per_rank[0])
    out = []
    for s in range(steps):
        values = [r[s][key] for r in per_rank if r[s][key] is not None]
        out.append(sum(values) / len(values))
    return out


@pytest.mark.parametrize("devices_a,devices_b,seed", [(4, 2, 0), (2, 4, 1), (4, 4, 2), (4, 1, 3)])
def test_resume_under_another_plan_equals_the_run_that_switches_there(est, tmp_path, devices_a, devices_b, seed):
    """A checkpoint written under plan A (devices_a processes) resumes under plan B (devices_b
    processes) and gives what the uninterrupted run that switches from A to B at that step gives;
    the checkpoint converted to Hugging Face holds the actor's weights as the run had them."""
    from realbench.runtime.checkpoint import convert_to_hf, load_hf_checkpoint

    rng = np.random.default_rng(seed)
    a, b = random_plan(est, rng, devices_a), random_plan(est, rng, devices_b)
    folder = tmp_path / "step2"
    folder.mkdir()
    switching = spawn(_switching_run, max(devices_a, devices_b), est.scenario, a, b, 2, 4, str(folder),
                      timeout_s=300)
    resumed = spawn(_resumed_run, devices_b, est.scenario, b, 4, str(folder), timeout_s=300)
    # the resumed ranks only read the files of plan A's ranks, whatever their number
    assert len({pid for _, _, pid in switching}) == max(devices_a, devices_b)
    for key in ("reward", "loss"):
        whole = mean_by_step([r[0] for r in switching], key)[2:]
        assert mean_by_step(resumed, key) == pytest.approx(whole, abs=1e-6, rel=1e-6), (key, a, b)
    made = convert_to_hf(folder, tmp_path / "hf")
    assert sorted(p.name for p in made) == ["actor", "critic"]
    _, weights = load_hf_checkpoint(tmp_path / "hf" / "actor")
    gathered = switching[0][1]
    assert set(weights) == set(gathered)
    for name, value in gathered.items():
        assert torch.equal(weights[name], torch.tensor(value)), name


def test_checkpoint_convert_cli(cli, est, tmp_path):
    """`realbench checkpoint convert` on a checkpoint folder of a run: the latest complete one,
    as transformers loads it; bad input gets one line."""
    from transformers import AutoModelForCausalLM

    plan = tmp_path / "plan.yaml"
    plan_from_options(est.scenario, random_plan(est, np.random.default_rng(7), 4)).save(plan)
    ck = tmp_path / "ck"
    code, _, err = cli("run", "--scenario", SCENARIO, "--plan", plan, "--nproc", 4, "--steps", 2, "--save-every", 1,
                       "--checkpoint-dir", ck)
    assert code == 0, err
    from realbench.runtime.checkpoint import load_hf_checkpoint

    code, _, err = cli("checkpoint", "convert", ck, "--to-hf", tmp_path / "hf")
    assert code == 0, err
    assert err.count("wrote") == 2
    for step in (1, 2):
        code, _, err = cli("checkpoint", "convert", ck / f"step{step}", "--to-hf", tmp_path / f"hf{step}")
        assert code == 0, err
    latest, one, two = (load_hf_checkpoint(tmp_path / d / "actor")[1] for d in ("hf", "hf1", "hf2"))
    assert all(torch.equal(latest[k], two[k]) for k in latest)  # the folder's latest checkpoint: step 2
    assert not all(torch.equal(latest[k], one[k]) for k in latest)
    model = AutoModelForCausalLM.from_pretrained(tmp_path / "hf" / "actor")
    assert model.config.num_hidden_layers == est.scenario.models["actor"].n_layers
    code, _, err = cli("checkpoint", "convert", ck, "--to-hf", tmp_path / "hf")  # not empty: refused
    assert code == 2 and "not empty" in err and err.count("\n") == 1
    code, _, err = cli("checkpoint", "convert", tmp_path / "nothing", "--to-hf", tmp_path / "hf3")
    assert code == 2 and "is not a folder" in err and err.count("\n") == 1


def _round_trip(rank, world, scenario, a, b, dtype):
    """One step under a, then switch a -> b -> a: every rank's master weights, Adam moments and
    step count, and the compute weights, as before (bit for bit)."""
    from realbench.runtime.replan import switch_plan
    from realbench.runtime.worker import Worker

    worker = Worker(rank, scenario, a, seed=1, dtype=dtype)
    worker.step(0)

    def snapshot(w):
        out = {}
        for m in w.masters:
            for kind, views in w.master_state(m).items():
                out.update({f"{m}/{kind}/{k}": v.clone() for k, v in views.items()})
            out.update({f"{m}/compute/{k}": v.clone() for k, v in w.masters[m].shards().items()})
        steps = {m: opt.steps_taken for m, opt in w.optimizers.items()}
        return out, steps

    before = snapshot(worker)
    back = switch_plan(switch_plan(worker, b), a)
    after = snapshot(back)
    same = set(before[0]) == set(after[0]) and all(torch.equal(before[0][k], after[0][k]) for k in before[0])
    return same, before[1] == after[1], len(before[0]), str(back.masters[next(iter(back.masters))].stage.flat.dtype) \
        if back.masters else None


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_switch_there_and_back_gives_every_state_back_bit_for_bit(est, dtype):
    rng = np.random.default_rng(11)
    a, b = random_plan(est, rng, 4), random_plan(est, rng, 4)
    results = spawn(_round_trip, 4, est.scenario, a, b, dtype, timeout_s=300)
    assert all(same for same, _, _, _ in results)
    assert all(steps for _, steps, _, _ in results)
    assert sum(n for _, _, n, _ in results) > 0
    assert {d for _, _, _, d in results if d} == {str(dtype)}


def test_a_run_ended_by_a_signal_names_the_rank_and_the_native_message():
    """No worker wrote an error (a process aborted in native code): the one line says which
    rank ended how, from the launcher's log, instead of its last line of '='."""
    from realbench.runtime.launch import launcher_cause

    log = """per iteration: measured 0.4027 s, estimated 0.0386 s
terminate called without an active exception
W1125 16:41:11.096000 4290 api.py:1028] Sending process 4295 closing signal SIGTERM
torch.distributed.elastic.multiprocessing.errors.ChildFailedError:
======================================================
Failures:
[1]:
  rank      : 1 (local_rank: 1)
  exitcode  : -15 (pid: 4295)  (SIGTERM)
------------------------------------------------------
Root Cause (first observed failure):
[0]:
  time      : 2026-11-25_16:41:11
  host      : localhost
  rank      : 0 (local_rank: 0)
  exitcode  : -6 (pid: 4294)  (SIGABRT)
  error_file: <N/A>
======================================================
"""
    assert launcher_cause(log) == ("rank 0 ended with exit code -6 (pid: 4294)  (SIGABRT) "
                                   "(terminate called without an active exception)")
    assert launcher_cause("starting\nsomething went wrong\n") == "something went wrong"
