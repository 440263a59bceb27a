"""The GPU presets against published measurements (realbench.bench.fidelity and its data file)."""

import json
import statistics

import pytest
import yaml

from realbench.bench import fidelity
from realbench.cost import comm
from realbench.hardware import FITTED, ClusterSpec, DeviceSpec


@pytest.fixture(scope="module")
def data():
    return fidelity.load_published()


@pytest.fixture(scope="module")
def bench(cli_once):
    code, out, err = cli_once("bench", "fidelity", "--json")
    assert code == 0, err
    return json.loads(out)


def test_the_data_file_has_30_rows_of_every_kind_from_3_independent_sources(data):
    rows = data.rows()
    assert len(rows) >= 30
    used = {}
    for kind, _, row in rows:
        used.setdefault(row.source, set()).add(kind)
        assert data.sources[row.source].cite.strip()
    assert {k for kinds in used.values() for k in kinds} == set(fidelity.KINDS)
    fitted_sources = {s for s in used if not data.sources[s].reserved and not data.sources[s].excluded}
    assert len(fitted_sources) >= 3
    reserved = [row for kind, _, row in rows if data.sources[row.source].reserved]
    assert len(reserved) == 10 and {row.source for row in reserved} == {"megatron-sc21"}


def test_the_presets_are_the_fit_and_the_held_out_rows_meet_the_target(bench):
    assert bench["presets_match_fit"], {k: (bench["fitted"][k], bench["presets"][k]) for k in bench["presets"]}
    assert bench["rows"] == len(bench["predictions"]) >= 30
    for kind in fidelity.KINDS:
        held = bench["summary"][kind]["held-out"]
        assert held["rows"] >= 2 and held["median_error"] <= fidelity.TARGET_MEDIAN_ERROR, (kind, held)
    assert bench["meets_target"]
    assert bench["reserved_sources"] == ["megatron-sc21"]
    for row in bench["predictions"]:  # predicted beside published, and the error between them
        assert row["error"] == pytest.approx(row["predicted"] / row["published"] - 1)


def test_reserved_and_excluded_rows_never_move_the_fit(data):
    base = fidelity.fit(data)
    changed = data.model_copy(update={
        "train": [r.model_copy(update={"tflops_per_gpu": r.tflops_per_gpu * 3}) if r.source == "megatron-sc21" else r
                  for r in data.train],
        "collective": [r.model_copy(update={"busbw_GBps": r.busbw_GBps / 3}) if r.source == "gcp-a3mega" else r
                       for r in data.collective]})
    assert fidelity.fit(changed) == pytest.approx(base, rel=1e-9)
    moved = data.model_copy(update={"train": [r.model_copy(update={"tokens_per_s_per_gpu": r.tokens_per_s_per_gpu * 2})
                                              if r.source == "torchtitan" else r for r in data.train]})
    assert fidelity.fit(moved)["matmul_efficiency"] > base["matmul_efficiency"] * 1.1  # fit rows do


def test_published_training_flops_convert_to_tokens_per_second_by_the_sources_formula(data):
    sc21 = next(r for r in data.train if r.source == "megatron-sc21" and r.model == "gpt-1.7b")
    # 96 B s l h^2 (1 + s/6h + V/16lh) / (B s): 24 layers, h 2304, s 2048, V 51200, 137 TFLOP/s
    per_token = 96 * 24 * 2304**2 * (1 + 2048 / 13824 + 51200 / 884736)
    assert per_token == pytest.approx(14.750e9, rel=1e-4)
    assert fidelity.published_value(data, "train", sc21) == pytest.approx(137e12 / 14.750e9, rel=1e-4)
    meta = next(r for r in data.train if r.source == "llama3" and r.gpus == 8192)
    # 6 N + 12 l h s with N = 405,853,388,800, l 126, h 16384, s 8192; 430 TFLOP/s
    assert fidelity.published_value(data, "train", meta) == pytest.approx(430e12 / (6 * 405_853_388_800 + 12 * 126 * 16384 * 8192))


def test_hierarchical_collectives_match_hand_worked_times():
    d = DeviceSpec(name="x", memory_bytes=1, flops=1, mem_bw=1)
    c = ClusterSpec(nodes=2, gpus_per_node=4, device=d, intra_bw=100, inter_bw=10, intra_latency_s=1, inter_latency_s=2)
    # k = 4 per node, N = 2 nodes, S = 800: NVLink 2*3/4*800/100 = 12, NICs 2*1/2*200/10 = 20,
    # latencies 2 (3*1 + 1*2) = 10: 10 + max(12, 20)
    assert comm.all_reduce(c, 8, 800, True, per_node=4) == pytest.approx(30.0)
    assert comm.all_gather(c, 8, 800, True, per_node=4) == pytest.approx(5.0 + max(6.0, 10.0))
    # one device per node: the plain ring over the NICs, 2*1/2*800/10 + 2*1*2
    assert comm.all_reduce(c, 2, 800, True) == pytest.approx(84.0)
    assert comm.all_reduce(c, 4, 800, False) == pytest.approx(2 * 3 / 4 * 800 / 100 + 2 * 3 * 1)


def test_a_cross_node_data_parallel_all_reduce_uses_every_nic_of_a_node():
    from realbench.cost.calls import call_cost, shard_params
    from realbench.dataflow import CallDef, CallKind
    from realbench.hardware import cluster
    from realbench.models import get_model
    from realbench.plan.mesh import Mesh, Option, Strategy

    spec, c = get_model("llama-7b"), cluster(2, 8, "h100")
    call = CallDef(name="t", model="m", kind=CallKind.TRAIN, seqs=64, seq_len=1024)
    mesh = Mesh(node=0, nodes=2, gpu=0, gpus=8)
    grads = lambda tp: shard_params(spec, tp, 1) * 2  # noqa: E731 (bf16 gradients of a tp shard, pp 1)
    for tp, per_node in ((1, 8), (2, 4), (8, 1)):
        dp = 16 // tp
        cost = call_cost(call, spec, c, Option(mesh, Strategy(dp=dp, tp=tp, pp=1, micro_batches=1)))
        assert cost.dp_comm_s == pytest.approx(comm.all_reduce(c, dp, grads(tp), True, per_node), rel=1e-6)
    assert FITTED["nic_efficiency"] > 0


def test_the_manuals_table_is_what_bench_fidelity_prints(bench):
    """docs/measurements/presets.md draws its table from `bench fidelity` at build time (the marker);
    the table's cells are the summary's, and the page's prose quotes the same run."""
    import re

    from manual import section as manual_section
    from realbench.bench.tables import fidelity_summary

    section = manual_section("## How far to trust the GPU presets")
    assert "\n<!-- generated: table fidelity -->\n" in section
    rendered = fidelity_summary(bench)
    table = re.findall(r"^\| (train|decode|collective|host_adam) \| ([a-z-]+) \| (\d+) \| ([\d.]+)% \| ([\d.]+)% \|$", rendered, re.M)
    expected = {(k, role): v for k, roles in bench["summary"].items() for role, v in roles.items()}
    assert {(k, role) for k, role, *_ in table} == set(expected)
    for kind, role, n, median, worst in table:
        got = expected[(kind, role)]
        assert int(n) == got["rows"] and float(median) == round(got["median_error"] * 100, 1), (kind, role)
        assert float(worst) == round(got["worst_error"] * 100, 1), (kind, role)
    assert f"{bench['rows']} rows" in section
    # the SC21 rows through `realbench estimate`, 1.7B to 1T, as the section lists them
    listed = re.search(r"Errors, 1\.7B to 1T: (.*?): median ([\d.]+)%, worst ([\d.]+)%", section, re.S)
    through = bench["sc21_through_estimate"]
    assert [float(x.rstrip("%")) for x in re.findall(r"[-+][\d.]+%?", listed.group(1))] == \
        [round(r["error"] * 100, 1) for r in through["rows"]]
    assert (float(listed.group(2)), float(listed.group(3))) == (round(through["median_error"] * 100, 1),
                                                                round(through["worst_error"] * 100, 1))
    assert ("is met for all four" in section) == bench["meets_target"]


def test_every_sc21_row_runs_through_realbench_estimate_as_a_user_writes_it(bench):
    """SC21 Table 1 as scenario and plan files (up to 512 micro-batches per replica, the 530B
    row's 280 among them; materialized attention; the interleaved schedule where SC21 used it):
    `realbench estimate` (on the presets) costs each as the internal prediction (on the refit,
    equal to the presets to 1e-3), every plan fits, and the errors meet the target."""
    through = bench["sc21_through_estimate"]
    internal = {r["config"]["model"]: r["error"] for r in bench["predictions"] if r["source"] == "megatron-sc21"}
    assert len(through["rows"]) == len(internal) == 10
    by_model = {r["model"]: r for r in through["rows"]}
    assert by_model["gpt-529.6b"]["micro_batches"] == 280 and by_model["gpt-1008b"]["micro_batches"] == 512
    assert [by_model[m]["virtual_stages"] for m in ("gpt-76.1b", "gpt-145.6b", "gpt-310.1b", "gpt-529.6b")] == [3, 2, 2, 3]
    # the target: median error at most 12%, every row within 30% (README: 1.9% and 5.6%)
    assert through["median_error"] <= 0.12 and through["worst_error"] <= 0.30, through
    for row in through["rows"]:
        assert row["fits"], row
        assert 1 + row["error"] == pytest.approx(1 + internal[row["model"]], rel=1e-3), row
    assert through["median_error"] == pytest.approx(statistics.median(abs(e) for e in internal.values()), abs=1e-3)


def test_an_engines_published_step_is_compared_call_by_call(bench, data, tmp_path, monkeypatch):
    """play-verl's verl run: each compared call's published time is the sum of verl's timers it
    covers (the actor's update and its old-log-probability forward), its prediction the estimate
    of the row's scenario and plan (recomputed here through the API), the error their ratio; the
    calls not compared are named with a reason, and every call of the plan is one or the other.
    The manual's errors are the bench's."""
    import re

    from realbench.cost import Estimator
    from realbench.plan.plan import plan_from_document, resolve_plan
    from realbench.plan.scenario import scenario_from_document

    (row,) = [r for r in bench["engine_steps"] if r["source"] == "play-verl"]
    (step,) = [r for r in data.engine_steps if r.source == "play-verl"]
    assert (row["source"], row["engine"], row["fits"]) == ("play-verl", "verl", True)
    by_call = {c["call"]: c for c in row["calls"]}
    assert by_call["actor_train"]["published_s"] == pytest.approx(33.696 + 6.505)
    assert set(by_call) | set(row["not_compared"]) == set(step.plan["calls"])
    assert not set(by_call) & set(row["not_compared"]) and all(row["not_compared"].values())
    monkeypatch.chdir(tmp_path)
    (tmp_path / "gsm8k.py").write_text("def compute_score(*args, **kwargs):\n    return 0.0\n")
    scenario = scenario_from_document({"schema": "realbench.scenario/1", **step.scenario})
    options = resolve_plan(plan_from_document({"schema": "realbench.plan/1", "scenario": "job.yaml", **step.plan}),
                           scenario)
    est = Estimator(scenario)
    result = est.estimate(est.choice_of(options))
    assert result.time_per_iter_s == pytest.approx(row["predicted_step_s"], rel=1e-9)
    for call, c in by_call.items():
        assert c["predicted_s"] == pytest.approx(result.to_json()["calls"][call]["time_s"], rel=1e-9)
        assert c["error"] == pytest.approx(c["predicted_s"] / c["published_s"] - 1)
    assert row["median_error"] == pytest.approx(statistics.median(abs(c["error"]) for c in row["calls"]))
    from manual import MANUAL as text

    said = re.search(r"Errors: generation ([-+][\d.]+)%, the reference's forward ([-+][\d.]+)%, the\s+actor's "
                     r"training with its old-log-probability forward ([-+][\d.]+)%", text)
    assert [float(x) for x in said.groups()] == \
        [round(by_call[c]["error"] * 100, 1) for c in ("actor_gen", "ref_inf", "actor_train")]


def test_cpu_adam_rows_are_one_rate_a_thread_by_hand(data, bench):
    """DeepSpeed's CPU Adam on `threads` host threads: parameters / (threads x one thread's rate).
    The rows measured on one and two cores fit the rate; every core of a host at once (ZeRO-Offload's
    DGX-2, SuperOffload's GH200: bound by the host's memory) is reported apart, never fitted."""
    row = next(r for r in data.host_adam if r.params == 1e8 and r.threads == 2)
    assert fidelity.predict(data, "host_adam", row) == pytest.approx(1e8 / (2 * FITTED["host_adam_rate"]))
    assert fidelity.published_value(data, "host_adam", row) == 0.0701
    roles = {(r["source"], r["role"]) for r in bench["predictions"] if r["kind"] == "host_adam"}
    assert roles == {("realbench-spr", "fit"), ("realbench-spr", "held-out"), ("zero-offload", "excluded"),
                     ("superoffload", "excluded")}
    moved = data.model_copy(update={"host_adam": [r.model_copy(update={"seconds": r.seconds * 2})
                                                  if r.source == "realbench-spr" else r for r in data.host_adam]})
    assert fidelity.fit(moved)["host_adam_rate"] == pytest.approx(FITTED["host_adam_rate"] / 2, rel=1e-3)


def test_bench_host_adam_times_one_adam_step_a_row_on_one_and_two_threads(cli):
    """`bench host-adam`: each row one AdamW step over `params` fp32 parameters on `threads` threads
    (DeepSpeed's kernel where installed, else PyTorch's fused one, named), its rate per thread
    computed from the time measured."""
    code, out, err = cli("bench", "host-adam", "--quick", "--json")
    assert code == 0, err
    result = json.loads(out)
    rows = result["rows"]
    assert {r["params"] for r in rows} == {1_000_000, 4_000_000} and 1 in {r["threads"] for r in rows}
    for r in rows:
        assert r["seconds"] > 0 and r["implementation"].startswith(("torch", "deepspeed"))
        assert r["params_per_s_per_thread"] == pytest.approx(r["params"] / r["seconds"] / r["threads"])
    rates = sorted(r["params_per_s_per_thread"] for r in rows)
    assert result["median_params_per_s_per_thread"] == rates[len(rates) // 2]


def test_nemo_rls_published_whole_steps_are_estimated_and_predict_each_other(bench, data, tmp_path, monkeypatch):
    """NeMo-RL's published H100 steps (realbench/hardware/published.yaml, source nemo-rl): each row's
    job and plan estimated through `realbench estimate`, the error the estimated over the published
    whole step; and the prediction: a row's factor k (both device efficiencies times k) makes its
    estimate the published step, and another row's prediction is its estimate at that k (recomputed
    here through the API on a device with the scaled efficiencies)."""
    from realbench.cost import Estimator
    from realbench.plan import load_plan, load_scenario

    rows = [r for r in bench["engine_steps"] if r["source"] == "nemo-rl"]
    steps = [r for r in data.engine_steps if r.source == "nemo-rl"]
    assert len(rows) == len(steps) == 6 and {r.group for r in steps} == {"nemo-rl v0.5 H100 BF16"}
    assert all(r["fits"] for r in rows)  # (the colocated ones with the training state offloaded, as NeMo-RL does)
    for r, row in zip(rows, steps):
        assert r["published_step_s"] == row.published_s["total_step_time"]
        assert r["step_error"] == pytest.approx(r["predicted_step_s"] / r["published_step_s"] - 1)
        assert r["median_error"] is None and r["calls"] == []
    group = bench["engine_step_predictions"]["nemo-rl v0.5 H100 BF16"]
    first = group["rows"][0]
    assert first["fit_on"] == steps[0].label and len(first["predicted"]) == 5

    monkeypatch.chdir(tmp_path)
    (tmp_path / "math_verify.py").write_text("def verify(*args, **kwargs):\n    return 0.0\n")

    def step_at(row, k):
        (tmp_path / "job.yaml").write_text(yaml.safe_dump({"schema": "realbench.scenario/1", **row.scenario}))
        (tmp_path / "plan.yaml").write_text(yaml.safe_dump({"schema": "realbench.plan/1", "scenario": "job.yaml",
                                                            **row.plan}))
        scenario = load_scenario("job.yaml")
        options = load_plan("plan.yaml", scenario)[2]
        d = scenario.cluster.device
        device = d.model_copy(update={"matmul_efficiency": d.matmul_efficiency * k,
                                      "mem_bw_efficiency": d.mem_bw_efficiency * k})
        moved = scenario.model_copy(update={"cluster": scenario.cluster.model_copy(update={"device": device})})
        est = Estimator(moved, profile=None)
        return est.estimate(est.choice_of(options)).time_per_iter_s

    k = first["k"]
    assert step_at(steps[0], k) == pytest.approx(steps[0].published_s["total_step_time"], rel=1e-4)
    second = first["predicted"][0]
    assert second["row"] == steps[1].label
    assert second["predicted_s"] == pytest.approx(step_at(steps[1], k), rel=1e-6)
    assert second["error"] == pytest.approx(second["predicted_s"] / second["published_s"] - 1)
    errors = [abs(p["error"]) for r in group["rows"] for p in r["predicted"]]
    assert group["median_error"] == pytest.approx(statistics.median(errors))


def test_the_readme_shows_the_engine_steps_bench_fidelity_computes(bench):
    import re

    from manual import README

    from realbench.bench.tables import engine_fit_table, engine_predictions_table, engine_steps_table

    assert engine_steps_table(bench) in README
    assert engine_predictions_table(bench) in README
    assert engine_fit_table(bench) in README
    text = " ".join(README.split())
    f = bench["engine_fit"]
    said = re.search(r"the matmul efficiency times ([\d.]+) and decoding's HBM efficiency times ([\d.]+) .*? bring the "
                     r"checked steps to a median error of ([\d.]+)%", text)
    assert [float(x) for x in said.groups()] == [round(f["k_matmul"], 3), round(f["k_decode"], 3),
                                                 round(f["checked_median_error"] * 100, 1)]
    assert f"the engines' two factors leave the checked steps {f['checked_median_error'] * 100:.1f}% off" in text


def test_the_engines_two_factors_are_fitted_to_the_published_calls_and_checked_on_whole_steps(bench, data):
    """engine_fit: k_matmul and k_decode minimise the squared log errors of the published calls
    (moving either by 1% either way makes the sum larger); every row that publishes a whole step is
    checked, none of its calls fitted unless the row publishes calls; each error is estimated over
    published, minus 1."""
    import numpy as np

    f = bench["engine_fit"]
    fitted_rows = {r.label for r in data.engine_steps if r.compared}
    assert {r["row"] for r in f["fitted_calls"]} == fitted_rows == {
        "qwen2-7b-instruct PPO, 8 GPUs", "deepseek-r1-distill-qwen-1.5b GRPO, 8 GPUs"}
    assert len(f["checked_steps"]) == sum(1 for r in data.engine_steps if r.step) == 7
    for r in f["fitted_calls"] + f["checked_steps"]:
        assert r["error"] == pytest.approx(r["estimated_s"] / r["published_s"] - 1)
    assert f["checked_median_error"] == pytest.approx(statistics.median(abs(r["error"]) for r in f["checked_steps"]))
    jobs = fidelity._jobs(data)
    fitted = [j for j in jobs.values() if j[0].compared]

    def squares(km, kd):
        total = 0.0
        for job in fitted:
            at = fidelity._priced_at(job, km, kd)
            total += sum(np.log(at[c] / sum(job[0].published_s[t] for t in ts)) ** 2 for c, ts in job[0].compared.items())
        return total

    best = squares(f["k_matmul"], f["k_decode"])
    for km, kd in ((1.01, 1), (0.99, 1), (1, 1.01), (1, 0.99)):
        assert squares(f["k_matmul"] * km, f["k_decode"] * kd) > best


def test_rlinfs_prompt_length_is_what_its_throughputs_count_beyond_the_response(data):
    """The RLinf row's 150-token prompt: the table's generation throughput (3,533.27 tokens/s/GPU over
    260.92 s on 8 GPUs) counts 14,405 tokens a sequence of its 512, 150 beyond the mean response."""
    row = next(r for r in data.engine_steps if r.source == "rlinf-verl")
    flow = row.scenario["dataflow"]
    sequences = flow["prompts"] * flow["group_size"]
    assert sequences == 512 and row.published_s["generation time"] == 260.92
    counted = 3533.27 * 260.92 * 8 / sequences
    assert round(counted - 14254.84) == flow["prompt_len"] == 150
    assert flow["gen_len"]["lengths"] == [round(14254.84)]


def test_an_engine_step_compares_something(data):
    from realbench.bench.fidelity import EngineStep

    row = next(r for r in data.engine_steps if r.source == "nemo-rl").model_dump()  # (a whole step only)
    with pytest.raises(ValueError, match="compare some calls or the whole step"):
        EngineStep(**{**row, "step": ""})
    with pytest.raises(ValueError, match="step: no published timer 'total'"):
        EngineStep(**{**row, "step": "total"})


def test_the_limits_page_says_how_far_the_published_steps_are(bench):
    import re

    from manual import MANUAL

    said = re.search(r"estimates are (\d+)% to (\d+)% below the published\s+steps, and one factor fitted to a row "
                     r"predicts the others with a median error of (\d+)%", MANUAL)
    errors = [r["step_error"] for r in bench["engine_steps"] if r["step_error"] is not None]
    group = bench["engine_step_predictions"]["nemo-rl v0.5 H100 BF16"]
    assert [int(x) for x in said.groups()] == [round(-max(errors) * 100), round(-min(errors) * 100),
                                               round(group["median_error"] * 100)]


def test_the_h100_rl_preset_is_the_h100_with_the_engines_fitted_factors(bench, data, cli, tmp_path, monkeypatch):
    """ENGINE_FACTORS are bench fidelity's fit (refitted here), and a published whole step planned on
    `device: h100-rl` is estimated as the fit's check estimates it."""
    from realbench.hardware import DEVICES, ENGINE_FACTORS, LINKS

    f = bench["engine_fit"]
    assert ENGINE_FACTORS == {"k_matmul": pytest.approx(f["k_matmul"], rel=5e-4),
                              "k_decode": pytest.approx(f["k_decode"], rel=5e-4)}
    h100, rl = DEVICES["h100"], DEVICES["h100-rl"]
    assert rl == h100.model_copy(update={"matmul_efficiency": h100.matmul_efficiency * ENGINE_FACTORS["k_matmul"],
                                         "mem_bw_efficiency": h100.mem_bw_efficiency * ENGINE_FACTORS["k_decode"]})
    assert LINKS["h100-rl"] == LINKS["h100"]
    row = next(r for r in data.engine_steps if r.source == "nemo-rl")
    monkeypatch.chdir(tmp_path)
    (tmp_path / "math_verify.py").write_text("def verify(*args, **kwargs):\n    return 0.0\n")
    scenario = {**row.scenario, "cluster": {**row.scenario["cluster"], "device": "h100-rl"}}
    (tmp_path / "job.yaml").write_text(yaml.safe_dump({"schema": "realbench.scenario/1", **scenario}))
    (tmp_path / "plan.yaml").write_text(yaml.safe_dump({"schema": "realbench.plan/1", "scenario": "job.yaml", **row.plan}))
    code, out, err = cli("estimate", "--scenario", "job.yaml", "--plan", "plan.yaml", "--json")
    assert code == 0, err
    checked = next(s for s in f["checked_steps"] if s["row"] == row.label)
    assert json.loads(out)["time_per_iter_s"] == pytest.approx(checked["estimated_s"], rel=1e-3)
