"""Hardware profiles: the file, interpolation, the profiler on this machine, the estimator's use
of measured costs, and the calibration benchmark."""

import json
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from realbench.cost import Estimator
from realbench.hardware.profile import CALL_MICRO_BATCHES, Curve1D, Grid2D, LAYER_OPS, Profile, load_profile, usable_cores
from realbench.models import get_model
from realbench.plan import load_scenario

BATCHES, LENGTHS = (1, 2, 4, 8), (4, 8, 16)


def synthetic_profile(op_seconds=None, model="llama-tiny", preset="cpu", tps=(1, 2)) -> Profile:
    """A profile whose every layer operation costs a fixed time per point (default 1 ms * tokens
    ** 0.5), with fast links and no optimizer cost."""
    spec = get_model(model)
    cost = op_seconds or (lambda op, b, s: 1e-3 * math.sqrt(b * s))
    point = lambda op, b, s: {"batch": b, "length": s, "median_s": cost(op, b, s), "p10_s": cost(op, b, s),  # noqa
                              "p90_s": cost(op, b, s), "repeats": 3}
    ops = {str(tp): {op: [point(op, b, s) for b in BATCHES for s in LENGTHS] for op in LAYER_OPS} for tp in tps}
    coll = {k: {"2": [{"nbytes": n, "median_s": 1e-6 + n * 1e-12, "p10_s": 1e-6, "p90_s": 1e-6, "repeats": 3}
                      for n in (1024, 1 << 20)]} for k in ("all_reduce", "all_gather", "broadcast", "p2p")}
    return Profile.model_validate({
        "device": {"kind": "cpu", "name": "test cpu", "preset": preset, "processes": 2, "threads_per_process": 1},
        "versions": {"torch": "x"}, "date": "2026-11-22",
        "models": {model: {"hidden": spec.hidden, "n_heads": spec.n_heads, "n_kv_heads": spec.n_kv_heads,
                           "ffn": spec.ffn, "vocab": spec.vocab, "ops": ops,
                           "optimizer": {str(tp): {"fixed_s": 0.0, "per_tensor_s": 0.0, "per_param_s": 0.0}
                                         for tp in tps}}},
        "collectives": coll})


# -- interpolation ------------------------------------------------------------------------------------------
monotone_grids = st.lists(st.lists(st.floats(1e-5, 1.0), min_size=3, max_size=3), min_size=4, max_size=4).map(
    lambda rows: np.cumsum(np.cumsum(np.array(rows), axis=0), axis=1))


@settings(max_examples=60, deadline=None)
@given(monotone_grids)
def test_grid_is_exact_at_points_and_monotone_between(table):
    points = [(b, s, float(table[i][j])) for i, b in enumerate(BATCHES) for j, s in enumerate(LENGTHS)]
    grid = Grid2D.from_points(points)
    for b, s, t in points:
        assert grid(b, s) == pytest.approx(t, rel=1e-9)
    bs = np.geomspace(1, 8, 23)
    ls = np.geomspace(4, 16, 17)
    values = np.array([[grid(b, s) for s in ls] for b in bs])
    assert (np.diff(values, axis=0) >= -1e-12).all() and (np.diff(values, axis=1) >= -1e-12).all()


def test_grid_between_points_lies_between_them_and_extrapolates_by_power_law():
    grid = Grid2D.from_points([(b, s, 1e-3 * b * s) for b in BATCHES for s in LENGTHS])  # t ~ tokens
    assert grid(3, 8) == pytest.approx(24e-3, rel=1e-9)  # linear in log-log: exact for a power law
    assert grid(16, 8) == pytest.approx(128e-3, rel=1e-9)  # beyond the grid, along the last segment
    assert grid(0.5, 4) == pytest.approx(4e-3)  # below the grid: the first value (fixed costs dominate)


def test_noise_spike_at_a_small_size_does_not_raise_larger_ones():
    pts = [(b, s, 1e-3 * b * s) for b in BATCHES for s in LENGTHS]
    pts[0] = (1, 4, 1.0)  # a spike
    grid = Grid2D.from_points(pts)
    assert grid(8, 16) == pytest.approx(0.128)
    assert grid(1, 4) <= grid(1, 8)
    curve = Curve1D.from_points([(1, 5.0), (10, 1.0), (100, 2.0)])
    assert curve(1) == 1.0 and curve(100) == 2.0 and curve(1) <= curve(10) <= curve(50) <= curve(100)


def test_incomplete_grid_is_a_clear_error():
    from realbench.errors import ConfigError

    with pytest.raises(ConfigError, match="not complete"):
        Grid2D.from_points([(1, 4, 1.0), (2, 8, 2.0)])


# -- files ----------------------------------------------------------------------------------------------------
def test_profile_round_trip_and_validate(cli, tmp_path):
    prof = synthetic_profile()
    path = tmp_path / "p.json"
    prof.save(path)
    assert load_profile(str(path)) == prof
    code, out, err = cli("validate", path)
    assert code == 0 and "valid profile" in out


@pytest.mark.parametrize("mutate, field", [
    (lambda d: d["models"]["llama-tiny"]["ops"]["1"].update({"warp.fwd": []}), "warp.fwd"),
    (lambda d: d["models"]["llama-tiny"]["ops"].update({"two": {}}), "two"),
    (lambda d: d["models"]["llama-tiny"]["ops"]["1"]["block.fwd"][0].update({"median_s": -1}), "median_s"),
    (lambda d: d.update({"schema": "realbench.profile/9"}), "schema"),
    (lambda d: d["collectives"].update({"gossip": {}}), "gossip"),
    (lambda d: d.pop("device"), "device"),
])
def test_bad_profiles_are_one_line_errors(cli, tmp_path, mutate, field):
    doc = synthetic_profile().to_document()
    mutate(doc)
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(doc))
    for argv in (("validate", path), ("estimate", "--scenario", "ppo-tiny-2cpu", "--baseline", "symmetric",
                                      "--profile", path)):
        code, _, err = cli(*argv)
        assert code == 2 and field in err and len(err.strip().splitlines()) == 1
    path.write_text(json.dumps(synthetic_profile().to_document())[:200])  # truncated
    code, _, err = cli("validate", path)
    assert code == 2 and "JSON" in err


def test_profile_of_another_device_is_refused_unless_forced(cli, tmp_path):
    path = tmp_path / "cpu.json"
    synthetic_profile().save(path)
    base = ("estimate", "--scenario", "ppo-7b-7b-16gpu", "--baseline", "symmetric", "--profile", path, "--json")
    code, _, err = cli(*base)
    assert code == 2 and "--profile" in err and "h100" in err and "--force-profile" in err
    code, out, _ = cli(*base, "--force-profile")
    assert code == 0 and set(json.loads(out)["cost_source"].values()) == {"analytic"}  # other model shapes


# -- the estimator on measured costs ---------------------------------------------------------------------------
def test_estimator_composes_profiled_operations():
    """Inference on one device, one micro-batch: embed + L blocks + head + logprobs, exactly."""
    from realbench.plan.mesh import Mesh, Option, Strategy

    cost = {"embed.fwd": 1e-3, "block.fwd": 2e-3, "head.fwd": 3e-3, "value_head.fwd": 5e-4, "logprobs.fwd": 4e-4}
    prof = synthetic_profile(lambda op, b, s: cost.get(op, 1e-3))
    scenario = load_scenario("ppo-tiny-2cpu")
    est = Estimator(scenario, profile=prof)
    assert set(est.cost_source) == {"profile"}
    L = scenario.models["ref"].n_layers
    i = est.call_names.index("ref_inf")
    k = est.index_of(i, Option(Mesh(0, 1, 0, 1), Strategy(1, 1, 1, 1)))
    assert est.dur[i][k] == pytest.approx(1e-3 + L * 2e-3 + 3e-3 + 4e-4)
    # two micro-batches on two stages: sum of stage times + one more slot of the slowest stage
    k2 = est.index_of(i, Option(Mesh(0, 1, 0, 2), Strategy(1, 1, 2, 2)))
    call, h = scenario.dataflow.call("ref_inf"), scenario.models["ref"].hidden
    p2p = prof.collective_time("p2p", 2, call.seqs // 2 * call.seq_len * h * 4)  # fp32 activations
    first, last = 1e-3 + (L // 2) * 2e-3 + p2p, (L // 2) * 2e-3 + 3e-3
    assert est.dur[i][k2] == pytest.approx(first + last + max(first, last) + 4e-4)


def test_pipelined_generation_costs_max_of_busy_stages_and_token_loop():
    """Decoding on pp stages with m micro-batches: per token, max(m slots of the slowest stage,
    one trip of a token around the pipeline). With every op at 1 ms whatever its size and free
    links: pp=2, m=1 pays the token's loop (bubbles), larger m is bound by the busy stages."""
    from realbench.plan.mesh import Mesh, Option, Strategy

    prof = synthetic_profile(lambda op, b, s: 1e-3)
    scenario = load_scenario("ppo-tiny-2cpu")
    est = Estimator(scenario, profile=prof)
    i = est.call_names.index("actor_gen")
    call = scenario.dataflow.call("actor_gen")
    L, G = scenario.models["actor"].n_layers, call.gen_len

    def time(m):
        return est.dur[i][est.index_of(i, Option(Mesh(0, 1, 0, 2), Strategy(1, 1, 2, m)))]

    per_stage = [1e-3 + (L // 2) * 1e-3, (L // 2) * 1e-3 + 1e-3 + 1e-3]  # embed; head + sampling
    loop = sum(per_stage)  # links cost ~0
    for m in (1, 2, 4):
        decode = (G - 1) * max(m * max(per_stage), loop)
        prefill = sum(per_stage) - 1e-3 + (m - 1) * (max(per_stage) - 1e-3) + m * 1e-3
        assert time(m) == pytest.approx(decode + prefill, rel=1e-3), m
    assert (time(4) - time(2)) > 0.9 * (G - 1) * 2 * max(per_stage)


def test_a_measured_whole_call_scales_the_composed_estimate_of_its_layout():
    """A whole call measured at CALL_REFERENCE on a (tp, pp) layout makes every call of its
    kind on that layout cost composed x (measured / composed at the reference); other kinds
    and layouts keep the composition (factor 1)."""
    from realbench.cost.profiled import _composed, call_factor
    from realbench.dataflow import CallKind
    from realbench.hardware.profile import CALL_REFERENCE
    from realbench.plan.mesh import Mesh, Option, Strategy

    cost = {"embed.fwd": 1e-3, "block.fwd": 2e-3, "head.fwd": 3e-3, "logprobs.fwd": 4e-4}
    plain = synthetic_profile(lambda op, b, s: cost.get(op, 1e-3))
    spec = get_model("llama-tiny")
    # the reference inference on one device: embed + L blocks + head + logprobs = 1 + 8 + 3 + 0.4 ms
    reference = 1e-3 + spec.n_layers * 2e-3 + 3e-3 + 4e-4
    point = {"kind": "inference", "tp": 1, "pp": 1, "layers": spec.n_layers, "copies": 2, **CALL_REFERENCE,
             "median_s": 2.5 * reference, "p10_s": 2.5 * reference, "p90_s": 2.5 * reference, "repeats": 3}
    doc = plain.model_dump()
    doc["models"]["llama-tiny"]["calls"] = [point]
    prof = Profile.model_validate(doc)
    assert call_factor(prof, "llama-tiny", spec, CallKind.INFERENCE, 1, 1) == pytest.approx(2.5)
    assert call_factor(prof, "llama-tiny", spec, CallKind.INFERENCE, 1, 2) == 1.0  # not measured
    assert call_factor(prof, "llama-tiny", spec, CallKind.TRAIN, 1, 1) == 1.0
    scenario = load_scenario("ppo-tiny-2cpu")
    plain_est, est = Estimator(scenario, profile=plain), Estimator(scenario, profile=prof)
    i = est.call_names.index("ref_inf")
    one, two = (Option(Mesh(0, 1, 0, n), Strategy(1, 1, n, 1)) for n in (1, 2))
    assert est.dur[i][est.index_of(i, one)] == pytest.approx(2.5 * plain_est.dur[i][plain_est.index_of(i, one)])
    assert est.dur[i][est.index_of(i, two)] == pytest.approx(plain_est.dur[i][plain_est.index_of(i, two)])
    call = scenario.dataflow.call("ref_inf")
    assert plain_est.dur[i][plain_est.index_of(i, one)] == pytest.approx(
        _composed(call, scenario.models["ref"], one, plain, "llama-tiny"))


def test_slower_measured_blocks_make_slower_estimates():
    scenario = load_scenario("ppo-tiny-2cpu")
    fast = Estimator(scenario, profile=synthetic_profile(lambda op, b, s: 1e-3))
    slow = Estimator(scenario, profile=synthetic_profile(lambda op, b, s: 3e-3 if op.startswith("block") else 1e-3))
    from realbench.cost.baselines import BASELINES

    choice = BASELINES["symmetric"](fast)
    assert slow.evaluate(choice)[0] > 2 * fast.evaluate(choice)[0]


# -- the profiler on this machine, and calibration --------------------------------------------------------------
@pytest.fixture(scope="module")
def measured(tmp_path_factory):
    from realbench.cli import main

    path = tmp_path_factory.mktemp("profile") / "cpu.json"
    assert main(["profile", "--nproc", "2", "--batches", "1,4", "--lengths", "4,16", "--repeats", "3",
                 "--warmup", "1", "--call-passes", "1", "--out", str(path)]) == 0
    return path


def test_small_real_profile(measured, cli):
    prof = load_profile(str(measured))
    tiny = prof.models["llama-tiny"]
    assert set(tiny.ops) == {"1", "2"} and set(tiny.ops["1"]) == set(LAYER_OPS)
    assert prof.device.kind == "cpu" and prof.device.processes == 2 and "torch" in prof.versions
    assert {p.nbytes for p in prof.collectives["p2p"]["2"]} and set(prof.collectives) == {
        "all_reduce", "all_gather", "broadcast", "p2p", "exchange"}
    for p in tiny.ops["1"]["block.fwd"]:
        assert 0 < p.p10_s <= p.median_s <= p.p90_s
    # whole calls: every kind on every layout of 2 processes at every micro-batch count, copies
    # filling them (and one copy alone where 2 processes outnumber the cores)
    alone = usable_cores() < 2
    assert {(c.kind, c.tp, c.pp, c.micro_batches, c.copies) for c in tiny.calls} == {
        (k, tp, pp, m, n) for k in ("generate", "inference", "train") for tp, pp in ((1, 1), (1, 2), (2, 1))
        for m in CALL_MICRO_BATCHES for n in {2 // (tp * pp), 1 if alone else 2 // (tp * pp)}}
    assert tiny.has_whole_calls(contended=alone)
    assert all(0 < c.p10_s <= c.median_s <= c.p90_s for c in tiny.calls)
    code, out, _ = cli("estimate", "--scenario", "ppo-tiny-cpu", "--baseline", "symmetric", "--profile", measured,
                       "--json")
    assert code == 0 and set(json.loads(out)["cost_source"].values()) == {"profile"}
    code, _, err = cli("profile", "--nproc", 2, "--out", measured)  # refuses before measuring anything
    assert code == 2 and "--force" in err


def test_calibration_benchmark_quick(measured, cli):
    code, out, err = cli("bench", "calibration", "--quick", "--profile", measured, "--json")
    assert code == 0, err
    r = json.loads(out)
    assert r["plans"] == 2 and set(r["per_kind"]) == {"generate", "inference", "train"}
    for kind in r["per_kind"].values():
        assert 0 <= kind["median_rel_err"] <= kind["p90_rel_err"] and kind["calls"] >= 2
    assert -1 <= r["kendall_tau"] <= 1
    for run in r["runs"]:
        assert run["measured_iter_s"] > 0 and run["estimated_iter_s"] > 0
    race = r["race"]  # the searched plan against the symmetric one on ppo-tiny-cpu, 1 round here
    assert race["scenario"] == "ppo-tiny-cpu" and set(race["plans"]) == {"searched", "symmetric"}
    searched, symmetric = race["plans"]["searched"], race["plans"]["symmetric"]
    assert race["measured_speedup"] == pytest.approx(symmetric["measured_iter_s"] / searched["measured_iter_s"])
    assert race["predicted_speedup"] == pytest.approx(symmetric["estimated_iter_s"] / searched["estimated_iter_s"])
    assert race["speedup_rel_err"] == pytest.approx(abs(race["predicted_speedup"] / race["measured_speedup"] - 1))
    for plan in (searched, symmetric):
        errs = [abs(c["estimated_s"] - c["measured_s"]) / c["measured_s"] for c in plan["calls"].values()]
        assert len(errs) == 6 and plan["median_call_rel_err"] == pytest.approx(float(np.median(errs)))


def test_profile_on_cuda_needs_a_gpu_per_process(cli, tmp_path, monkeypatch):
    import torch

    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    code, _, err = cli("profile", "--device", "cuda", "--nproc", 2, "--out", tmp_path / "p.json")
    assert code == 2 and "--device" in err and "has 1" in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "p.json").exists()


def test_profile_refuses_no_passes_over_the_whole_calls(cli, tmp_path):
    code, _, err = cli("profile", "--call-passes", 0, "--out", tmp_path / "p.json")
    assert code == 2 and "--call-passes" in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "p.json").exists()


def test_profile_computes_in_the_dtype_a_run_uses(cli, tmp_path):
    """bf16 on CUDA and fp32 on the CPU unless --dtype says otherwise: a GPU profile taken in
    fp32 would price a bf16 run's matmuls several times too slow (measured on an H100: actor
    training 2.28 s in fp32 against 0.40 s in bf16)."""
    from realbench.runtime.profiler import ProfileRequest, profile_dtype

    assert profile_dtype(ProfileRequest(device="cuda")) == "bf16"
    assert profile_dtype(ProfileRequest(device="cpu")) == "fp32"
    assert profile_dtype(ProfileRequest(device="cuda", dtype="fp32")) == "fp32"
    path = tmp_path / "bf16 profile.json"
    code, _, err = cli("profile", "--nproc", 1, "--dtype", "bf16", "--batches", "1", "--lengths", "4",
                       "--repeats", 3, "--warmup", 1, "--passes", 1, "--call-passes", 1, "--out", path)
    assert code == 0, err
    prof = load_profile(str(path))
    assert (prof.dtype, prof.bytes_per_value) == ("bfloat16", 2)
    code, _, err = cli("profile", "--dtype", "fp16", "--out", tmp_path / "p.json")
    assert code == 2 and "--dtype" in err and not (tmp_path / "p.json").exists()


def _with_calls(profile: Profile, points: list[dict], processes: int = 2, cores: int = 0) -> Profile:
    doc = profile.model_dump()
    doc["models"]["llama-tiny"]["calls"] = points
    doc["device"].update(processes=processes, cores=cores)
    return Profile.model_validate(doc)


def _reference_point(profile: Profile, kind: str, tp: int, pp: int, m: int, ratio: float, copies: int) -> dict:
    """A whole call measured at `ratio` times its composition at the reference."""
    from realbench.cost.profiled import _composed
    from realbench.dataflow import CallDef, CallKind
    from realbench.hardware.profile import CALL_REFERENCE
    from realbench.plan.mesh import Mesh, Option, Strategy

    R, P, G = CALL_REFERENCE["rows"], CALL_REFERENCE["prompt_len"], CALL_REFERENCE["gen_len"]
    reference = CallDef(name="reference", model="reference", kind=CallKind(kind), seqs=R, seq_len=P + G,
                        gen_len=G if kind == "generate" else 0)
    spec = get_model("llama-tiny")
    composed = _composed(reference, spec, Option(Mesh(0, 1, 0, tp * pp), Strategy(1, tp, pp, micro_batches=m)),
                         profile, "llama-tiny")
    t = ratio * composed
    return {"kind": kind, "tp": tp, "pp": pp, "micro_batches": m, "layers": spec.n_layers, "copies": copies,
            **CALL_REFERENCE, "median_s": t, "p10_s": t, "p90_s": t, "repeats": 3}


def test_a_gpu_profile_prices_generation_on_one_device_by_its_graphed_steps_alone():
    """On a GPU the engine replays its decode steps as CUDA graphs, and the profile times the
    steps' operations so: the whole-call factor of generation on one device (its reference call
    of 8 tokens is mostly the graphs' capture) is not applied there, where a CPU profile applies
    it; a pipeline's generation (the eager micro-batched loop) and the other kinds keep theirs."""
    from realbench.cost.profiled import call_factor
    from realbench.dataflow import CallKind

    plain = synthetic_profile()
    cpu = _with_calls(plain, [_reference_point(plain, "generate", 1, 1, 1, 2.0, 1),
                              _reference_point(plain, "generate", 1, 2, 1, 3.0, 1),
                              _reference_point(plain, "inference", 1, 1, 1, 2.5, 1)], processes=1)
    doc = cpu.model_dump()
    doc["device"].update(kind="cuda", name="NVIDIA H200", preset="nvidia-h200")
    gpu = Profile.model_validate(doc)
    spec = get_model("llama-tiny")
    assert call_factor(cpu, "llama-tiny", spec, CallKind.GENERATE, 1, 1) == pytest.approx(2.0)
    assert call_factor(gpu, "llama-tiny", spec, CallKind.GENERATE, 1, 1) == 1.0
    assert call_factor(gpu, "llama-tiny", spec, CallKind.GENERATE, 1, 2) == pytest.approx(3.0)
    assert call_factor(gpu, "llama-tiny", spec, CallKind.INFERENCE, 1, 1) == pytest.approx(2.5)


def test_the_call_factor_follows_the_micro_batch_count_it_was_measured_at():
    """Measured at 1 and 4 micro-batches (ratios 2 and 4 to the composition): at 2 the ratio is
    halfway in log(count), 3; below and above the measured counts it holds the nearest."""
    from realbench.cost.profiled import call_factor
    from realbench.dataflow import CallKind

    plain = synthetic_profile()
    prof = _with_calls(plain, [_reference_point(plain, "generate", 1, 2, 1, 2.0, 1),
                               _reference_point(plain, "generate", 1, 2, 4, 4.0, 1)])
    spec = get_model("llama-tiny")
    factor = {m: call_factor(prof, "llama-tiny", spec, CallKind.GENERATE, 1, 2, m) for m in (1, 2, 4, 8)}
    assert factor == pytest.approx({1: 2.0, 2: 3.0, 4: 4.0, 8: 4.0})
    assert not prof.models["llama-tiny"].has_whole_calls()  # 2 is not measured: a cache measures again


def test_alone_and_crowded_calls_and_the_estimate_between_them():
    """On a CPU whose 4 processes outnumber its 2 cores, a whole call measured with copies filling
    the processes (crowded) and alone: call_factor gives each; a plan's calls are costed between
    them by how many processes are busy beside them (Estimator._crowded, hand-worked)."""
    from realbench.cost.profiled import call_factor
    from realbench.cost.simulate import _Schedule
    from realbench.dataflow import CallKind

    plain = synthetic_profile()
    prof = _with_calls(plain, [_reference_point(plain, "train", 1, 1, 1, 3.0, 4),
                               _reference_point(plain, "train", 1, 1, 1, 1.5, 1)], processes=4, cores=2)
    spec = get_model("llama-tiny")
    assert call_factor(prof, "llama-tiny", spec, CallKind.TRAIN, 1, 1) == pytest.approx(3.0)
    assert call_factor(prof, "llama-tiny", spec, CallKind.TRAIN, 1, 1, alone=True) == pytest.approx(1.5)
    assert prof.models["llama-tiny"].has_whole_calls(contended=False) is False  # only m = 1

    est = Estimator(load_scenario("ppo-tiny-cpu"), profile=prof)
    assert est.contended
    # two calls in the last of 2 iterations: u0 on 1 process over [0, 10], u1 on 2 over [5, 15];
    # the first iteration's far before. busy(u0) = 1 + 2 * 5/10 = 2: the cores, so alone;
    # busy(u1) = 2 + 1 * 5/10 = 2.5: a quarter of the way from 2 (the cores) to 4 processes
    start = np.array([[[-100.0, -95.0]], [[0.0, 5.0]]])
    first = _Schedule(np.zeros(1), np.zeros(1), start, start + 10.0)
    times = est._crowded(first, np.array([[1, 2]]), np.array([[1.0, 2.0]]), np.array([[5.0, 6.0]]), [0, 1])
    assert times == pytest.approx(np.array([[1.0, 2.0 + 0.25 * 4.0]]))
    # a call on every process is costed as measured with them (it is its own crowd)
    whole = est._crowded(first, np.array([[4, 4]]), np.array([[1.0, 1.0]]), np.array([[5.0, 5.0]]), [0, 1])
    assert whole == pytest.approx(np.array([[5.0, 5.0]]))


def test_a_profile_with_the_runtimes_exchange_prices_every_data_transfer_by_it():
    """The runtime moves a call's inputs in two rounds of an exchange among the producers' heads
    and the consumer's processes, even on one mesh, and its processes wait in it: with a measured
    exchange of 1 ms a round (whatever the size), a call starts 2 ms after the call it reads
    from, or after the call before it on its processes; without one, at once."""
    from realbench.cost.baselines import BASELINES
    from realbench.cost.profiled import profiled_exchange

    plain = synthetic_profile()
    doc = plain.model_dump()
    doc["collectives"]["exchange"] = {"2": [{"nbytes": n, "median_s": 1e-3, "p10_s": 1e-3, "p90_s": 1e-3,
                                             "repeats": 3} for n in (64, 1 << 20)]}
    prof = Profile.model_validate(doc)
    exchange = profiled_exchange(prof)
    assert profiled_exchange(plain) is None
    assert exchange(np.array([2, 1]), 4096) == pytest.approx([2e-3, 0.0])  # a process alone moves nothing
    scenario = load_scenario("ppo-tiny-2cpu")
    for profile, gap in ((plain, 0.0), (prof, 2e-3)):
        est = Estimator(scenario, profile=profile)
        e = est.estimate(BASELINES["symmetric"](est))  # every call on both processes
        calls = e.calls
        assert calls["reward_inf"].start_s - calls["actor_gen"].end_s == pytest.approx(gap, abs=1e-9)
        # the exchange keeps the processes busy: the next consumer's inputs move after this
        # consumer's call, and an iteration on one mesh is its calls and transfers end to end
        assert calls["ref_inf"].start_s - calls["reward_inf"].end_s == pytest.approx(gap, abs=1e-9)
        moves = [t for t in e.tasks if t.kind == "transfer" and t.iteration == 1]
        assert len(moves) == (5 if gap else 0)  # every call but the generation reads another's outputs
        assert all(t.devices == ((0, 2),) and t.end_s - t.start_s == pytest.approx(gap) for t in moves)
        assert e.time_per_iter_s == pytest.approx(sum(c.time_s for c in calls.values()) + 5 * gap)


def _compiled_in_a_profile(rank, world, compile_decode):
    """What a profile's measurements pass through torch.compile (the layers' grid and the whole
    calls), on one process."""
    import torch

    from realbench.runtime import profiler
    from realbench.runtime.profiler import ProfileRequest

    seen, real = [], torch.compile
    torch.compile = lambda module, **kw: seen.append(type(module).__name__) or real(module, **kw)
    req = ProfileRequest(batches=(2,), lengths=(4,), repeats=3, warmup=1, passes=1, call_passes=1, nproc=1,
                         compile_decode=compile_decode)
    clock = lambda fn: (fn(), {"median_s": 0.0, "p10_s": 0.0, "p90_s": 0.0, "repeats": 1})[1]  # noqa: E731
    ops = profiler._layer_ops(get_model("llama-tiny"), 1, 0, None, req, clock, lambda: None, torch.device("cpu"))
    layers = list(seen)
    profiler._whole_calls(get_model("llama-tiny"), 0, 1, req, lambda: None, torch.device("cpu"))
    return layers, seen[len(layers):], sorted(ops)


def test_a_compiled_profile_times_decode_steps_as_compiled_runs_take_them(cli, tmp_path, monkeypatch):
    """`profile --compile-decode`: the decode operation of the grid is the block's step through
    torch.compile, and the whole generation calls run the engine compiled (as `run
    --compile-decode`); nothing else compiles, and without the flag nothing does. The file says
    so; a run whose decode steps differ from its profile's is told; the cached profile (which
    prices plain runs) is not written compiled."""
    from realbench.runtime.local import spawn

    compiled = spawn(_compiled_in_a_profile, 1, True, timeout_s=300)[0]
    assert compiled[0] == ["Block"] and compiled[1] and set(compiled[1]) == {"LlamaStage"}
    assert "block.decode" in compiled[2]
    import torch

    from realbench.runtime import profiler
    from realbench.runtime.profiler import ProfileRequest

    seen = []
    monkeypatch.setattr(torch, "compile", lambda module, **kw: seen.append(module))
    clock = lambda fn: (fn(), {"median_s": 0.0, "p10_s": 0.0, "p90_s": 0.0, "repeats": 1})[1]  # noqa: E731
    plain = profiler._layer_ops(get_model("llama-tiny"), 1, 0, None, ProfileRequest(batches=(2,), lengths=(4,)), clock,
                                lambda: None, torch.device("cpu"))
    assert seen == [] and sorted(plain) == compiled[2]
    code, _, err = cli("profile", "--compile-decode", "--nproc", 1)
    assert code == 2 and "--compile-decode" in err and "--out" in err and len(err.strip().splitlines()) == 1
    path = tmp_path / "compiled profile.json"
    code, _, err = cli("profile", "--nproc", 1, "--batches", "1", "--lengths", "4", "--repeats", 3, "--warmup", 1,
                       "--passes", 1, "--call-passes", 1, "--compile-decode", "--out", path)
    assert code == 0, err
    assert load_profile(str(path)).compile_decode and not Profile.model_validate(
        {k: v for k, v in json.loads(path.read_text()).items() if k not in ("schema", "compile_decode")}).compile_decode
    est = Estimator(load_scenario("ppo-tiny-2cpu"))
    from realbench.cost.baselines import symmetric_plan
    from realbench.plan import plan_from_options

    plan_from_options(est.scenario, est.options_of(symmetric_plan(est))).save(tmp_path / "plan.yaml")
    code, _, err = cli("run", "--scenario", "ppo-tiny-2cpu", "--plan", tmp_path / "plan.yaml", "--nproc", 2, "--steps", 1,
                       "--profile", path, "--force-profile")
    assert code == 0, err
    assert "profile measured decode steps compiled and the run's are not" in err


def test_a_failed_measuring_process_is_one_line_and_writes_nothing(cli, tmp_path, monkeypatch):
    from realbench.runtime import profiler
    from realbench.runtime.local import WorkerError

    def fails(*a, **kw):
        raise WorkerError("rank 0 failed: FailOnRecompileLimitHit: Hard failure\nTraceback ...")
    monkeypatch.setattr(profiler, "profile_machine", fails)
    code, _, err = cli("profile", "--nproc", 1, "--out", tmp_path / "p.json")
    assert code == 1 and err.strip() == "realbench: profile failed: rank 0 failed: FailOnRecompileLimitHit: Hard failure"
    assert not (tmp_path / "p.json").exists()
