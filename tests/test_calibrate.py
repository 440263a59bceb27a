"""`realbench calibrate`: engines' logs read, checked against the job, device factors fitted,
the calibrated device planned on (`estimate --device FILE`)."""

from __future__ import annotations

import json
import statistics

import pytest
import yaml

from realbench.calibrate import fit as F
from realbench.calibrate.logs import read_log
from realbench.cost import Estimator
from realbench.cost.baselines import BASELINES
from realbench.plan import load_plan, load_scenario, plan_from_options

SCENARIO = "ppo-7b-7b-16gpu"
TRUE = {"matmul_efficiency": 0.45, "mem_bw_efficiency": 0.55, "link_scale": 0.8, "link_latency_scale": 1.0,
        "kernel_overhead_s": 1e-9, "step_overhead_s": 2.0}
VERL_TIMERS = {"generation": "timing_s/gen", "weight sync": "timing_s/update_weights", "reference": "timing_s/ref",
               "values": "timing_s/values", "actor update": "timing_s/update_actor",
               "critic update": "timing_s/update_critic", "step": "timing_s/step"}


@pytest.fixture(scope="module")
def job(tmp_path_factory):
    """The built-in PPO job on 16 H100, its heuristic plan as a file, and the seconds each of
    verl's timers would log were the device at TRUE's factors."""
    folder = tmp_path_factory.mktemp("calibrate")
    scenario = load_scenario(SCENARIO)
    est = Estimator(scenario)
    options = est.options_of(BASELINES["heuristic"](est))  # (its generation reshards the actor)
    plan = folder / "plan.yaml"
    plan_from_options(scenario, options).save(plan)
    seconds = F.priced(F.with_factors(scenario, TRUE), options, F.engine_phases("verl", scenario))
    return {"folder": folder, "scenario": scenario, "options": options, "plan": plan,
            "timers": {VERL_TIMERS[p]: s for p, s in seconds.items()}}


def verl_lines(timers: dict, steps: int = 4, extra: dict = None) -> list[dict]:
    """verl's per-step metrics: the first step (warm-up) twice as slow, the others 1% apart."""
    return [{k: v * (2.0 if s == 1 else 1 + 0.01 * (s - 3)) for k, v in timers.items()} | (extra or {})
            for s in range(1, steps + 1)]


def write_jsonl(path, rows):
    path.write_text("".join(json.dumps({"step": s, "data": r}) + "\n" for s, r in enumerate(rows, 1)))
    return path


def test_calibration_recovers_the_device_factors_from_verl_file_logger(cli, job, tmp_path):
    log = write_jsonl(tmp_path / "ours.jsonl", verl_lines(job["timers"]))
    out = tmp_path / "h100-ours.yaml"
    code, text, err = cli("calibrate", "--engine", "verl", log, "--scenario", SCENARIO, "--plan", job["plan"],
                          "--out", out, "--json")
    assert code == 0, err
    c = json.loads(text)
    assert c["steps_used"] == [2, 3, 4]  # the first step left out as warm-up
    for name in ("matmul_efficiency", "mem_bw_efficiency", "link_scale"):
        assert c["factors"][name]["fitted"] and c["factors"][name]["after"] == pytest.approx(TRUE[name], rel=0.02)
    assert not c["factors"]["kernel_overhead_s"]["fitted"]  # a GPU preset: its datasheet's peaks
    # (the plan's weight sync and pipelines have latency-bound exchanges: a latency fitted too)
    assert c["factors"]["link_latency_scale"]["after"] == pytest.approx(TRUE["link_latency_scale"], rel=0.02)
    # the step's seconds beyond the phases that the priced step does not hold: the engine's own
    assert c["factors"]["step_overhead_s"]["after"] == pytest.approx(TRUE["step_overhead_s"], rel=0.02)
    rows = {r["phase"]: r for r in c["phases"]}
    # measured: the median of steps 2..4, i.e. step 3's seconds (factor 1.00)
    assert rows["generation"]["measured_s"] == pytest.approx(job["timers"]["timing_s/gen"])
    assert rows["step"]["fitted"] is False
    for r in rows.values():
        assert r["after_s"] == pytest.approx(r["measured_s"], rel=0.02)
        assert abs(r["before_s"] / r["measured_s"] - 1) > 0.1  # the presets are faster than TRUE
    # the device file: estimate and search plan on it, and the estimate is the measured step
    doc = yaml.safe_load(out.read_text())
    assert doc["schema"] == "realbench.device/1" and doc["calibration"]["log"] == "ours.jsonl"
    code, text, err = cli("estimate", "--scenario", SCENARIO, "--plan", job["plan"], "--device", out, "--json")
    assert code == 0, err
    assert json.loads(text)["time_per_iter_s"] == pytest.approx(rows["step"]["measured_s"], rel=0.02)
    code, text, err = cli("estimate", "--scenario", SCENARIO, "--plan", job["plan"], "--json")
    assert json.loads(text)["time_per_iter_s"] == pytest.approx(rows["step"]["before_s"], rel=1e-6)
    code, text, err = cli("search", "--scenario", SCENARIO, "--method", "mcmc", "--time-budget", "1",
                          "--device", out, "--json")
    assert code == 0, err
    # a second calibration does not overwrite the file it wrote
    code, _, err = cli("calibrate", "--engine", "verl", log, "--scenario", SCENARIO, "--plan", job["plan"],
                       "--out", out)
    assert code == 2 and "exists; pass --force" in err


def test_a_preset_name_and_a_bad_device_file(cli, job, tmp_path):
    code, text, err = cli("estimate", "--scenario", SCENARIO, "--plan", job["plan"], "--device", "h200", "--json")
    h200 = json.loads(text)["time_per_iter_s"]
    code, text, _ = cli("estimate", "--scenario", SCENARIO, "--plan", job["plan"], "--json")
    assert code == 0 and h200 < json.loads(text)["time_per_iter_s"]  # the H200's faster HBM
    bad = tmp_path / "dev.yaml"
    bad.write_text("schema: realbench.device/1\ndevice: {name: x, memory_bytes: 1, flops: 1, mem_bw: 1}\n"
                   "links: {intra_bww: 1}\n")
    code, _, err = cli("estimate", "--scenario", SCENARIO, "--plan", job["plan"], "--device", bad)
    assert code == 2 and "links: unknown link 'intra_bww'" in err and len(err.strip().splitlines()) == 1
    code, _, err = cli("estimate", "--scenario", SCENARIO, "--plan", job["plan"], "--device", "h900")
    assert code == 2 and "unknown device 'h900'" in err


def test_verl_console_with_ray_prefixes_colours_and_numpy_scalars(job, tmp_path):
    config = {"actor_rollout_ref": {"actor": {"checkpoint": {"save_contents": ["model"]}},
                                    "model": {"external_lib": None, "override_config": {"a": 1},
                                              "path": "/models/llama-7b"}},
              "critic": {"model": {"path": "/models/critic"}}}
    import pprint
    dump = ["(TaskRunner pid=811) " + line for line in pprint.pformat(config, width=60).splitlines()]
    steps = ["(TaskRunner pid=811) \x1b[36mstep:%d - timing_s/gen:np.float64(%s) - timing_s/step:%s - "
             "val-core/gsm8k/reward/mean@1:0.5\x1b[0m" % (s, 10.0 + s, 20.0 + s) for s in (1, 2, 3)]
    (tmp_path / "verl.log").write_text("\n".join(dump + ["some other line"] + steps) + "\n")
    log = read_log("verl", str(tmp_path / "verl.log"))
    assert log.format == "verl console" and log.model == "/models/llama-7b"
    assert log.steps[1] == {"step": 2, "timing_s/gen": 12.0, "timing_s/step": 22.0,
                            "val-core/gsm8k/reward/mean@1": 0.5}


def test_openrlhf_and_areal_consoles(tmp_path):
    (tmp_path / "openrlhf.log").write_text(
        "namespace(actor=namespace(num_nodes=1, model_name_or_path='Qwen/Qwen3-8B'), critic=namespace())\n"
        "INFO 05-07 16:27:41 ppo_trainer.py:547] ✨ Global step 3: {'policy_loss': 0.01, 'timing/generation': 45.6, "
        "'timing/step_total': 79.4, 'rollout/num_samples': 256.0, 'flag': True}\n")
    log = read_log("openrlhf", str(tmp_path / "openrlhf.log"))
    assert log.model == "Qwen/Qwen3-8B"
    assert log.steps == ({"step": 3, "policy_loss": 0.01, "timing/generation": 45.6, "timing/step_total": 79.4,
                          "rollout/num_samples": 256.0},)
    (tmp_path / "areal.log").write_text(
        "(AReaL) 20260507-16:27:41.123 StatsLogger INFO: Epoch 1/1 Step 3/100 Train step 3/100 done.\n"
        "╒══════════════════╤════════════╤═════════════════╤════════════╕\n"
        "│ timeperf/rollout │ 4.5600e+01 │ ppo_actor/n_seqs │ 5.1200e+02 │\n"
        "├──────────────────┼────────────┼─────────────────┼────────────┤\n"
        "│ timeperf/train_step │ 3.0000e+01 │ │ │\n")
    log = read_log("areal", str(tmp_path / "areal.log"))
    assert log.steps == ({"step": 3, "timeperf/rollout": 45.6, "ppo_actor/n_seqs": 512.0, "timeperf/train_step": 30.0},)


def test_tensorboard_event_files(tmp_path):
    tensorboard = pytest.importorskip("torch.utils.tensorboard")
    writer = tensorboard.SummaryWriter(str(tmp_path / "runs"))
    for step in (1, 2):
        writer.add_scalar("train/timing/generation", 10.0 * step, step)
        writer.add_scalar("train/timing/step_total", 30.0 * step, step)
    writer.close()
    log = read_log("openrlhf", str(tmp_path / "runs"))
    assert log.format == "openrlhf TensorBoard"
    assert [s["timing/generation"] for s in log.steps] == [10.0, 20.0]
    assert log.steps[1]["timing/step_total"] == 60.0


def refused(cli, job, log, *extra):
    code, out, err = cli("calibrate", "--engine", "verl", log, "--scenario", SCENARIO, "--plan", job["plan"], *extra)
    assert code == 2 and len(err.strip().splitlines()) == 1 and "Traceback" not in err, err
    return err


def test_logs_that_are_not_of_the_plan_are_refused_by_name(cli, job, tmp_path):
    t = job["timers"]
    gen = next(c for c in job["scenario"].dataflow.calls if c.name == "actor_gen")
    # verl's perf metrics of a run on 8 GPUs (throughput = tokens / (time * GPUs))
    tokens = gen.seqs * 600.0
    eight = {"perf/total_num_tokens": tokens, "perf/time_per_step": 100.0, "perf/throughput": tokens / (100.0 * 8)}
    err = refused(cli, job, write_jsonl(tmp_path / "a.jsonl", verl_lines(t, extra=eight)))
    assert "the log's run had 8 GPUs" in err and "the plan 16" in err
    # a batch of half the plan's sequences
    half = {"perf/total_num_tokens": gen.seqs / 2 * 600.0, "prompt_length/mean": 100.0, "response_length/mean": 500.0}
    err = refused(cli, job, write_jsonl(tmp_path / "b.jsonl", verl_lines(t, extra=half)))
    assert f"generate {gen.seqs // 2} sequences" in err
    # responses longer than the scenario's cap
    long = {"response_length/mean": gen.gen_len * 2.0}
    assert "above the scenario's cap" in refused(cli, job, write_jsonl(tmp_path / "c.jsonl", verl_lines(t, extra=long)))
    # a generation longer than its whole step
    slow = verl_lines(t)
    slow[2]["timing_s/gen"] = slow[2]["timing_s/step"] * 2
    err = refused(cli, job, write_jsonl(tmp_path / "d.jsonl", slow))
    assert "step 3: timing_s/gen" in err and "longer than the whole step" in err
    # a generation faster than the HBM allows: decoding above the peak bandwidth
    fast = dict(t, **{"timing_s/gen": t["timing_s/gen"] / 20})
    err = refused(cli, job, write_jsonl(tmp_path / "e.jsonl", verl_lines(fast)))
    assert "need mem_bw_efficiency" in err and "above its physical 1" in err
    # another model than the scenario's (verl's console names it)
    console = "{'actor_rollout_ref': {'model': {'path': '/models/Qwen3-8B'}}}\n" + "".join(
        f"step:{s} - " + " - ".join(f"{k}:{v}" for k, v in row.items()) + "\n" for s, row in enumerate(verl_lines(t), 1))
    (tmp_path / "f.log").write_text(console)
    assert "trains '/models/Qwen3-8B'" in refused(cli, job, tmp_path / "f.log")
    # no timers of the engine; no format at all; a warm-up that leaves nothing
    err = refused(cli, job, write_jsonl(tmp_path / "g.jsonl", [{"loss": 1.0}]))
    assert "no timing lines of verl" in err
    (tmp_path / "h.log").write_text("hello\nworld\n")
    assert "no line of a known logger format" in refused(cli, job, tmp_path / "h.log")
    err = refused(cli, job, write_jsonl(tmp_path / "i.jsonl", verl_lines(t, steps=2)), "--skip", "2")
    assert "--skip: the log has 2 timed step(s)" in err


def test_a_log_of_the_plan_passes_the_checks(cli, job, tmp_path):
    gen = next(c for c in job["scenario"].dataflow.calls if c.name == "actor_gen")
    mean = 0.5 * gen.gen_len
    tokens = gen.seqs * (gen.seq_len - gen.gen_len + mean)
    step = job["timers"]["timing_s/step"]
    perf = {"perf/total_num_tokens": tokens, "perf/time_per_step": step, "perf/throughput": tokens / (step * 16),
            "prompt_length/mean": float(gen.seq_len - gen.gen_len), "response_length/mean": mean}
    code, out, err = cli("calibrate", "--engine", "verl", write_jsonl(tmp_path / "ok.jsonl", verl_lines(job["timers"], extra=perf)),
                         "--scenario", SCENARIO, "--plan", job["plan"], "--json")
    assert code == 0, err
    checks = json.loads(out)["checks"]
    assert checks[0].startswith("GPUs: 16") and checks[1].startswith(f"sequences a step: {gen.seqs}")
    assert checks[2] == f"response lengths: mean {mean:.1f} tokens, as logged"
    # the estimates are at the logged lengths: every response at the mean (the scenario has no
    # distribution), not at the scenario's cap
    from realbench.dataflow.lengths import LengthDistribution

    assert job["scenario"].dataflow.call("actor_gen").lengths is None
    at_mean = job["scenario"].with_lengths({"actor_gen": LengthDistribution(dist="empirical", max=gen.gen_len,
                                                                            lengths=(round(mean),), counts=(1,))})
    phases = F.engine_phases("verl", job["scenario"])
    gen_row = next(r for r in json.loads(out)["phases"] if r["phase"] == "generation")
    assert gen_row["before_s"] == pytest.approx(F.priced(at_mean, job["options"], phases)["generation"])
    assert gen_row["before_s"] < 0.8 * F.priced(job["scenario"], job["options"], phases)["generation"]


def test_measured_is_the_median_after_warm_up():
    steps = [{"step": 1, "a": 9.0}, {"step": 2, "a": 1.0, "b": 2.0}, {"step": 3, "a": 3.0}, {"step": 4, "a": 2.0}]
    assert F._median(steps[1:], ("a", "b")) == statistics.median([3.0, 3.0, 2.0])


def test_the_calibration_panel_shows_the_phases_and_hands_the_device_to_the_search(job, tmp_path):
    pytest.importorskip("ipywidgets")
    from realbench.widgets import Workbench

    log = write_jsonl(tmp_path / "ours.jsonl", verl_lines(job["timers"]))
    wb = Workbench(SCENARIO, budget_s=1)
    panel = wb.calibration
    panel.log_box.value, panel.plan_box.value = str(log), str(job["plan"])
    panel.skip_box.value = -1
    assert not panel.calibrate() and "warm-up: must not be negative" in panel.status.value
    panel.skip_box.value = 1
    panel.out_box.value = str(tmp_path / "dev.yaml")
    assert panel.calibrate() and (tmp_path / "dev.yaml").is_file()
    bars = panel.plot._model.renderers[0].data_source.data  # (the figure the bars are drawn in)
    assert list(bars["phase"]) == [r["phase"] for r in panel.result.phases]
    assert list(bars["measured"]) == [r["measured_s"] for r in panel.result.phases]
    assert "generation" in panel.table.value and "mem_bw_efficiency 0.772 &rarr; 0.55" in panel.status.value
    assert not panel.calibrate() and "exists; pass --force" in panel.status.value  # the file it wrote stays
    # the searches that follow plan on the calibrated device
    assert panel.apply() and wb.search.device is not None
    scenario = wb.search._inputs()[0]
    assert scenario.cluster.device.mem_bw_efficiency == pytest.approx(TRUE["mem_bw_efficiency"], rel=0.02)


def test_play_verls_published_step_calibrates_to_physical_factors(cli, tmp_path, monkeypatch):
    """The one published verl run realbench can write down (realbench/hardware/published.yaml,
    play-verl: PPO of Qwen2-7B-Instruct on 8 H100), its timers of the calls realbench prices as
    the run ran them made a log: the fit stays physical, and docs/guides/calibrate.md quotes it."""
    import re
    from pathlib import Path

    from realbench.bench.fidelity import load_published

    row = load_published().engine_steps[0]
    monkeypatch.chdir(tmp_path)
    (tmp_path / "gsm8k.py").write_text("def compute_score(*args, **kwargs):\n    return 0.0\n")
    (tmp_path / "job.yaml").write_text(yaml.safe_dump({"schema": "realbench.scenario/1", **row.scenario}))
    (tmp_path / "plan.yaml").write_text(yaml.safe_dump({"schema": "realbench.plan/1", "scenario": "job.yaml", **row.plan}))
    timers = [t for call in row.compared.values() for t in call] + ["timing_s/step"]
    write_jsonl(tmp_path / "play.jsonl", [{t: row.published_s[t] for t in timers}])
    code, out, err = cli("calibrate", "--engine", "verl", "play.jsonl", "--scenario", "job.yaml", "--plan", "plan.yaml",
                         "--skip", "0", "--json")
    assert code == 0, err
    c = json.loads(out)
    f = {n: v["after"] for n, v in c["factors"].items() if v["fitted"]}
    assert set(f) == {"matmul_efficiency", "mem_bw_efficiency", "step_overhead_s"}
    assert 0 < f["matmul_efficiency"] <= 1 and 0 < f["mem_bw_efficiency"] <= 1
    gen = next(r for r in c["phases"] if r["phase"] == "generation")
    page = (Path(__file__).resolve().parent.parent / "docs" / "guides" / "calibrate.md").read_text()
    said = re.search(r"`mem_bw_efficiency` ([\d.]+) -> ([\d.]+) and `matmul_efficiency` ([\d.]+) -> ([\d.]+); "
                     r"generation ([-+][\d.]+)% -> ([-+][\d.]+)%", " ".join(page.split()))
    assert [float(x) for x in said.groups()] == [
        round(c["factors"]["mem_bw_efficiency"]["before"], 3), round(f["mem_bw_efficiency"], 3),
        round(c["factors"]["matmul_efficiency"]["before"], 3), round(f["matmul_efficiency"], 3),
        round(F.error(gen, "before_s") * 100, 1), round(F.error(gen, "after_s") * 100, 1)]
    # the files page's device file is this calibration's
    files = (Path(__file__).resolve().parent.parent / "docs" / "reference" / "files.md").read_text()
    example = yaml.safe_load(next(b for b in re.findall(r"```yaml\n(.*?)```", files, re.S) if "realbench.device/1" in b))
    assert {k: example["device"][k] for k in f} == {"matmul_efficiency": round(f["matmul_efficiency"], 3),
                                                    "mem_bw_efficiency": round(f["mem_bw_efficiency"], 3),
                                                    "step_overhead_s": round(f["step_overhead_s"], 2)}


def test_the_files_pages_device_example_plans(cli, job, tmp_path):
    import re
    from pathlib import Path

    page = (Path(__file__).resolve().parent.parent / "docs" / "reference" / "files.md").read_text()
    block = next(b for b in re.findall(r"```yaml\n(.*?)```", page, re.S) if "realbench.device/1" in b)
    (tmp_path / "mine.yaml").write_text(block)
    code, out, err = cli("estimate", "--scenario", SCENARIO, "--plan", job["plan"], "--device", tmp_path / "mine.yaml",
                         "--json")
    assert code == 0, err
    from realbench.hardware import DeviceSpec

    from realbench.schema import load_yaml

    doc = load_yaml(block)
    moved = job["scenario"].with_device(DeviceSpec(**doc["device"]), doc["links"])
    assert moved.cluster.intra_bw == doc["links"]["intra_bw"] and moved.cluster.host_bw == job["scenario"].cluster.host_bw
    est = Estimator(moved, profile=None)
    assert json.loads(out)["time_per_iter_s"] == pytest.approx(est.estimate(est.choice_of(job["options"])).time_per_iter_s)


def test_openrlhfs_tensorboard_calibrates_through_its_grouped_timers(cli, job, tmp_path):
    """OpenRLHF times the experience (reference, critic and reward model forwards) and the training
    (actor and critic) as one each: the phases sum realbench's calls, and the fit still finds the
    factors the log was made with."""
    tensorboard = pytest.importorskip("torch.utils.tensorboard")
    phases = F.engine_phases("openrlhf", job["scenario"])
    assert {p.name: p.calls for p in phases}["experience"] == ("ref_inf", "critic_inf", "reward_inf")
    seconds = F.priced(F.with_factors(job["scenario"], TRUE), job["options"], phases)
    by_call = F.priced(F.with_factors(job["scenario"], TRUE), job["options"],
                       [F.Phase(c, (), (c,)) for c in ("actor_train", "critic_train")])
    assert seconds["training"] == pytest.approx(by_call["actor_train"] + by_call["critic_train"])
    writer = tensorboard.SummaryWriter(str(tmp_path / "tb"))
    for step in (1, 2, 3):
        for p in phases:
            writer.add_scalar(f"train/{p.timers[0]}", seconds[p.name] * (3.0 if step == 1 else 1.0), step)
    writer.close()
    code, out, err = cli("calibrate", "--engine", "openrlhf", tmp_path / "tb", "--scenario", SCENARIO,
                         "--plan", job["plan"], "--json")
    assert code == 0, err
    factors = json.loads(out)["factors"]
    for name in ("matmul_efficiency", "mem_bw_efficiency", "link_scale"):
        assert factors[name]["after"] == pytest.approx(TRUE[name], rel=0.02)


def test_realbench_runs_own_log(cli, tmp_path):
    """metrics.jsonl as `realbench run --out` writes it (each call's timing_s/<call>, the step's
    seconds, the processes) with lengths.jsonl beside it: the measured seconds are the medians after
    the warm-up, the lengths the run's, and a run on other processes than the plan's is refused."""
    scenario = load_scenario("ppo-tiny-2cpu")
    est = Estimator(scenario, profile=None)
    options = est.options_of(BASELINES["symmetric"](est))
    plan_from_options(scenario, options).save(tmp_path / "plan.yaml")
    calls = scenario.dataflow.call_names
    run = tmp_path / "run"
    run.mkdir()
    rows = [{"step": s, "seconds": 0.2 + 0.01 * s, "processes": 2,
             **{f"timing_s/{c}": 0.01 * (i + 1) * (1 + 0.1 * s) for i, c in enumerate(calls)}} for s in range(4)]
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (run / "lengths.jsonl").write_text("".join(json.dumps({"step": s, "actor_gen": [3, 5, 8, 8]}) + "\n" for s in range(4)))
    code, out, err = cli("calibrate", "--engine", "realbench", run / "metrics.jsonl", "--scenario", "ppo-tiny-2cpu",
                         "--plan", tmp_path / "plan.yaml", "--json")
    assert code == 0, err
    c = json.loads(out)
    assert c["steps_used"] == [1, 2, 3]
    rows_by = {r["phase"]: r for r in c["phases"]}
    assert rows_by["actor_train"]["measured_s"] == pytest.approx(0.01 * (calls.index("actor_train") + 1) * 1.2)
    assert rows_by["step"]["measured_s"] == pytest.approx(0.22)
    assert c["checks"] == ["GPUs: 2 (processes), as the plan",
                           "response lengths from lengths.jsonl (actor_gen: mean 6.0 tokens)"]
    # (this log's made-up seconds are no device's: the fit's factors are tested on a priced log below)
    (run / "metrics.jsonl").write_text("".join(json.dumps({**r, "processes": 4}) + "\n" for r in rows))
    code, _, err = cli("calibrate", "--engine", "realbench", run / "metrics.jsonl", "--scenario", "ppo-tiny-2cpu",
                       "--plan", tmp_path / "plan.yaml")
    assert code == 2 and "the log's run had 4 GPUs (processes), the plan 2" in err


def test_bench_prediction_calibrates_on_one_plans_run_and_predicts_another(cli):
    code, out, err = cli("bench", "prediction", "--quick", "--json")
    assert code == 0, err
    r = json.loads(out)
    a, b, c = r["plans"]["A"], r["plans"]["B"], r["plans"]["C"]
    assert set(a) == set(b) and a["actor_train"] != b["actor_train"] and "tp2" in b["actor_train"]
    # C: B's training calls, A's others
    assert c == {n: (b[n] if n.endswith("_train") else a[n]) for n in a}
    assert r["steps"] == 4 and r["rounds"] == 1 and r["calibration"]["steps_used"] == [1, 2, 3]
    # A's log has no tensor-parallel collective: its latency stays the preset's
    assert all(o.startswith("n0/dp2tp1pp1") for o in a.values())  # A: data parallel only
    latency = r["from_a"]["calibration"]["factors"]["link_latency_scale"]
    assert not latency["fitted"] and latency["after"] == 1.0 and latency["why"] == F.NOT_DEPENDED
    for plan in ("A", "B"):
        for k, v in r["estimated_iter_s"][plan].items():
            assert r["errors"][plan][k] == pytest.approx(v / r["measured_iter_s"][plan] - 1)
    assert r["meets_target"] == (max(abs(r["errors"][p]["calibrated"]) for p in "AB") <= r["target"] == 0.10)


def test_the_limits_page_quotes_the_stored_prediction_run():
    import re
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent
    stored = json.loads((root / "docs" / "measurements" / "data" / "bench-prediction.json").read_text())
    page = " ".join((root / "docs" / "limits.md").read_text().split())
    said = re.search(r"calibrated on plan C's log, the estimates of plans A and B are ([-+]\d+)% and ([-+]\d+)% off "
                     r"their measured runs \(the cached profile's ([-+]\d+)% and ([-+]\d+)%\), where two runs of one plan "
                     r"differ by up to (\d+)%; calibrated on A's log, B's estimate is ([-+]\d+)% off", page)
    e = stored["errors"]
    assert [int(x) for x in said.groups()] == [
        round(e["A"]["calibrated"] * 100), round(e["B"]["calibrated"] * 100), round(e["A"]["profile"] * 100),
        round(e["B"]["profile"] * 100), round(max(stored["spread_between_rounds"].values()) * 100),
        round(stored["from_a"]["errors"]["B"] * 100)]
    assert stored["steps"] == 40 and stored["rounds"] == 2 and not stored["meets_target"]
    latency = re.search(r"while gloo's on this machine fits at about (\d+) times it", page).group(1)
    assert int(latency) == round(stored["calibration"]["factors"]["link_latency_scale"]["after"])
    assert "is met for A, not for B" in page and abs(e["A"]["calibrated"]) <= 0.1 < abs(e["B"]["calibrated"])


def test_what_is_not_fitted_keeps_its_preset_value(cli, job, tmp_path):
    """A log of generation alone fits the HBM efficiency only: the calibrated device keeps every other
    field of the preset, the links included."""
    log = write_jsonl(tmp_path / "gen.jsonl", [{"timing_s/gen": job["timers"]["timing_s/gen"]}] * 3)
    out = tmp_path / "dev.yaml"
    code, text, err = cli("calibrate", "--engine", "verl", log, "--scenario", SCENARIO, "--plan", job["plan"],
                          "--out", out, "--json")
    assert code == 0, err
    c = json.loads(text)
    assert [n for n, f in c["factors"].items() if f["fitted"]] == ["mem_bw_efficiency"]
    preset = job["scenario"].cluster
    assert c["device"] == {**preset.device.model_dump(), "mem_bw_efficiency": c["factors"]["mem_bw_efficiency"]["after"]}
    assert c["links"] == {k: getattr(preset, k) for k in c["links"]}


def _cpu_plans():
    """ppo-tiny-2cpu's symmetric plan A, its tensor-parallel variant B, and C: B's training calls
    with A's others (realbench.bench.prediction)."""
    from realbench.bench.prediction import other_plan

    scenario = load_scenario("ppo-tiny-2cpu")
    est = Estimator(scenario, profile=None)
    a = est.options_of(BASELINES["symmetric"](est))
    b = other_plan(est, a)
    return scenario, {"A": a, "B": b, "C": {n: (b[n] if n.endswith("_train") else a[n]) for n in a}}


def _realbench_log(folder, scenario, options, values: dict):
    """metrics.jsonl of a run of `options` on a device at `values`' factors (each call and the step
    as priced there), three steps alike."""
    phases = F.engine_phases("realbench", scenario)
    seconds = F.priced(F.with_factors(scenario, values), options, phases)
    row = {**{p.timers[0]: seconds[p.name] for p in phases}, "processes": 2}
    folder.mkdir()
    (folder / "metrics.jsonl").write_text("".join(json.dumps({"step": s, **row}) + "\n" for s in range(3)))
    return read_log("realbench", str(folder / "metrics.jsonl"))


CPU_TRUE = {"matmul_efficiency": 0.5, "mem_bw_efficiency": 0.3, "link_scale": 1.0, "link_latency_scale": 12.0,
            "kernel_overhead_s": 2e-4, "step_overhead_s": 0.02}


def test_the_links_latency_is_fitted_from_a_log_whose_plan_has_tp_collectives(tmp_path):
    """C's log (tensor-parallel training beside data-parallel calls) fits the links' latency, and the
    calibrated device estimates A and B as the device the log was made on does; A's log (no
    tensor-parallel collective) leaves the latency at the preset's and says why, and B's estimate
    on that device is far off."""
    from realbench.hardware import DeviceSpec

    scenario, plans = _cpu_plans()
    truth = F.with_factors(scenario, CPU_TRUE)

    def step_s(s, plan):
        e = Estimator(s, profile=None)
        return e.estimate(e.choice_of(plans[plan])).time_per_iter_s

    c = F.calibrate("realbench", _realbench_log(tmp_path / "c", scenario, plans["C"], CPU_TRUE), scenario,
                    plans["C"], skip=1)
    assert c.factors["link_latency_scale"]["fitted"]
    assert c.factors["link_latency_scale"]["after"] == pytest.approx(CPU_TRUE["link_latency_scale"], rel=0.05)
    assert c.factors["step_overhead_s"]["after"] == pytest.approx(CPU_TRUE["step_overhead_s"], rel=0.02)
    # the CPU has no datasheet: a per-layer overhead is fitted (its calls are bound by it)
    assert c.factors["kernel_overhead_s"]["after"] == pytest.approx(CPU_TRUE["kernel_overhead_s"], rel=0.05)
    calibrated = scenario.with_device(DeviceSpec(**c.device), c.links)
    for plan in ("A", "B"):
        assert step_s(calibrated, plan) == pytest.approx(step_s(truth, plan), rel=0.02)
    a = F.calibrate("realbench", _realbench_log(tmp_path / "a", scenario, plans["A"], CPU_TRUE), scenario,
                    plans["A"], skip=1)
    latency = a.factors["link_latency_scale"]
    assert not latency["fitted"] and latency["after"] == 1.0 and latency["why"] == F.NOT_DEPENDED
    assert step_s(scenario.with_device(DeviceSpec(**a.device), a.links), "B") < 0.7 * step_s(truth, "B")


def test_a_devices_step_overhead_adds_to_every_plans_step():
    """DeviceSpec.step_overhead_s: the engine's seconds a step outside its calls, on each step of
    a synchronous plan and of an asynchronous one alike."""
    from realbench.hardware import DeviceSpec

    scenario = load_scenario(SCENARIO)
    est = Estimator(scenario)
    plan = est.options_of(BASELINES["heuristic"](est))
    for s in (scenario, scenario.with_staleness(1)):
        slower = s.with_device(DeviceSpec(**{**s.cluster.device.model_dump(), "step_overhead_s": 1.5}), {})
        before, after = (Estimator(x).estimate(Estimator(x).choice_of(plan)).time_per_iter_s for x in (s, slower))
        assert after == pytest.approx(before + 1.5, rel=1e-9)
