"""Response lengths as a distribution: the order statistics a synchronous generation call pays
for (hand-worked), the cost model's decode under a distribution, and scenarios that give one."""

import json
import math

import numpy as np
import pytest
import yaml

from realbench.cost import Estimator
from realbench.cost.baselines import symmetric_plan
from realbench.cost.calls import _decode_for_lengths, call_cost, elementwise_bytes, matmul_time, memory_time
from realbench.dataflow.lengths import LengthDistribution, alive_rows, expected_max, still_decoding
from realbench.plan import load_scenario
from realbench.plan.mesh import Mesh, Option, Strategy

# lengths 1 and 4, one half each, capped at 4: cdf[t] = P(L <= t) for t = 0..4
TWO_POINT = LengthDistribution(dist="empirical", max=4, lengths=(1, 4), counts=(1, 1))


def test_order_statistics_of_a_two_point_distribution_by_hand():
    assert TWO_POINT.cdf().tolist() == [0.0, 0.5, 0.5, 0.5, 1.0]
    assert TWO_POINT.expected == 2.5
    cdf = TWO_POINT.cdf()
    # two rows: the longest is 4 unless both are 1 (chance 1/4): 4 * 3/4 + 1 * 1/4 = 3.25
    assert expected_max(cdf, 2) == pytest.approx(3.25)
    assert still_decoding(cdf, 2).tolist() == [1.0, 0.75, 0.75, 0.75]
    assert alive_rows(cdf, 2).tolist() == [2.0, 1.0, 1.0, 1.0]
    # the longest of n grows with n toward the cap: 4 - 3 / 2^n
    assert [expected_max(cdf, n) for n in (1, 2, 4, 8)] == pytest.approx([4 - 3 / 2 ** n for n in (1, 2, 4, 8)])


def test_memory_is_planned_for_a_step_at_the_quantile_by_hand():
    """TWO_POINT: the longest of 2 rows is at most t with chance cdf[t]^2 = 0, 1/4, 1/4, 1/4, 1:
    its 0.99 quantile is 4, its 0.2 quantile 1, its expectation 3.25. Of 100 rows, p = 1/2 are
    alive at steps 1..3: 50 + z sqrt(100 / 4) at the quantile (z = 2.326 for 0.99)."""
    def at(q):
        return LengthDistribution(dist="empirical", max=4, lengths=(1, 4), counts=(1, 1), memory_at=q)

    assert TWO_POINT.memory_at == 0.99 and TWO_POINT.memory_longest(2) == 4
    assert at(0.2).memory_longest(2) == 1 and at("mean").memory_longest(2) == pytest.approx(3.25)
    z = 2.3263478740408408
    assert TWO_POINT.memory_alive(100).tolist() == pytest.approx([100, 50 + 5 * z, 50 + 5 * z, 50 + 5 * z])
    assert TWO_POINT.memory_alive(2).tolist() == [2.0, 2.0, 2.0, 2.0]  # never more rows than there are
    assert at("mean").memory_alive(100).tolist() == [100, 50, 50, 50]
    call = _scoring_call("train", TWO_POINT)
    assert call.width(2, memory=True) == 20 and call.width(2) == pytest.approx(19.25)  # memory: the quantile, time: E[max]


def test_the_lognormal_is_parameterized_by_its_mean_and_cv():
    d = LengthDistribution(dist="lognormal", mean=2000, cv=1.0, max=16384)
    # sigma^2 = ln(1 + cv^2) = ln 2, mu = ln 2000 - sigma^2 / 2: P(X <= mean) = Phi(sigma / 2)
    sigma = math.sqrt(math.log(2))
    assert d.cdf()[2000] == pytest.approx(0.5 * (1 + math.erf(sigma / 2 / math.sqrt(2))), abs=1e-9)
    assert d.cdf()[2000] == pytest.approx(0.6614, abs=1e-4)
    # the mean of the capped, rounded-up lengths: just above 2000 less what lies above the cap
    assert 1990 < d.expected < 2010
    assert d.cdf()[-1] == 1.0 and d.cdf()[0] == 0.0


def _generate_call(lengths, seqs=2, prompt=16):
    from realbench.dataflow import CallDef, CallKind

    return CallDef(name="gen", model="actor", kind=CallKind.GENERATE, inputs=("prompts",), outputs=("seqs",),
                   seqs=seqs, seq_len=prompt + 4, gen_len=4, lengths=lengths)


def test_decode_under_a_distribution_by_hand():
    """Two rows on one device, one micro-batch: step t runs with chance 1, 3/4, 3/4, 3/4 on
    2, 4/3, 4/3, 4/3 rows alive (1 row alive on average over the 3/4 chance that some is)."""
    s = load_scenario("ppo-7b-7b-16gpu")
    model, cluster = s.models["actor"], s.cluster
    option = Option(Mesh(0, 1, 0, 1), Strategy(1, 1, 1, 1))
    call = _generate_call(TWO_POINT)
    compute, tp_comm, pp_comm, kv_tokens = _decode_for_lengths(call, model, cluster, option, 2.0, model.n_layers, False)
    d = cluster.device

    def step(rows, ctx):
        layer = max(matmul_time(cluster, 2 * rows * model.layer_matmul_params + 4 * rows * ctx * model.hidden, rows),
                    memory_time(cluster, model.layer_params * 2 + rows * ctx * model.kv_bytes_per_token_layer())) \
            + memory_time(cluster, rows * elementwise_bytes(model, 1)) + d.kernel_overhead_s
        head = max(matmul_time(cluster, 2 * rows * model.hidden * model.head_out, rows),
                   memory_time(cluster, model.head_params * 2)) + memory_time(cluster, rows * model.vocab * 14)
        return model.n_layers * layer + head

    want = sum(p * step(rows, 16 + t) for t, (p, rows) in enumerate([(1, 2), (0.75, 4 / 3), (0.75, 4 / 3), (0.75, 4 / 3)]))
    assert compute == pytest.approx(want, rel=1e-12)
    assert tp_comm == 0 and pp_comm == 0
    # the KV cache's largest size with the rows alive at their 0.99 quantile: both rows to the
    # end (2 x 20); at their expectation, both rows after the prompt's first token (2 x 17)
    # against one row of 20 at the end: 34 tokens
    assert kv_tokens == pytest.approx(40)
    expected = LengthDistribution(**{**TWO_POINT.model_dump(), "memory_at": "mean"})
    *_, kv_expected = _decode_for_lengths(_generate_call(expected), model, cluster, option, 2.0, model.n_layers, False)
    assert kv_expected == pytest.approx(34)


def _scoring_call(kind, lengths, seqs=256, prompt=16, width=None):
    from realbench.dataflow import CallDef, CallKind

    return CallDef(name="score", model="actor", kind=CallKind(kind), inputs=("seqs",), outputs=(),
                   seqs=seqs, seq_len=width or prompt + (lengths.max if lengths else 4), lengths=lengths)


def test_later_calls_process_the_prompt_and_the_longest_response_of_a_micro_batch():
    """A micro-batch of generated sequences is as wide as the prompt and its longest response
    (the runtime trims the padding after it): with TWO_POINT, two rows are 16 + 3.25 wide on
    average, one row 16 + 2.5; the cost of responses that all have 300 of at most 1024 tokens is
    the cost of sequences of 316 tokens, in time and in memory, for inference and training."""
    assert _scoring_call("inference", TWO_POINT).width(2) == pytest.approx(16 + 3.25)
    assert _scoring_call("train", TWO_POINT).width(1) == pytest.approx(16 + 2.5)
    assert _scoring_call("train", None).width(2) == 20.0
    short = LengthDistribution(dist="empirical", max=1024, lengths=(300,), counts=(5,))
    s = load_scenario("ppo-7b-7b-16gpu")
    model, cluster = s.models["actor"], s.cluster
    for kind in ("inference", "train"):
        for strategy in (Strategy(1, 1, 1, 1), Strategy(2, 2, 2, 2)):
            option = Option(Mesh(0, 1, 0, 8), strategy)
            trimmed = call_cost(_scoring_call(kind, short), model, cluster, option)
            narrow = call_cost(_scoring_call(kind, None, width=316), model, cluster, option)
            assert trimmed == narrow, (kind, strategy)
            padded = call_cost(_scoring_call(kind, None, width=16 + 1024), model, cluster, option)
            assert trimmed.time_s < padded.time_s / 2 and trimmed.working_bytes < padded.working_bytes / 2


def test_packed_rows_are_as_wide_as_the_mean_response_and_memory_holds_the_heaviest_micro_batch():
    """With rows packed end to end (training.padding_free: an engine's remove-padding), a micro-batch
    of any number of rows is as wide per row as the prompt and the mean response: TWO_POINT's
    16 + 2.5 for two rows (padded: 16 + 3.25); its time that of rows of that fixed width (lengths
    10 and 30 of at most 30 tokens: mean 20, rows of 16 + 20). Its memory is the heaviest of the
    device's micro-batches: 256 rows over dp 2 in 2 micro-batches of 64, a micro-batch's responses
    640 + 20 K tokens with K ~ Binomial(64, 1/2) rows of 30; the heavier of two at 0.99 is the least
    k with P(K <= k)^2 >= 0.99. Within a token budget (max_tokens) the engine fills a micro-batch up
    to it: memory as one of that many tokens, at most the device's 128 rows."""
    assert _scoring_call("inference", TWO_POINT).model_copy(update={"padding_free": True}).width(2) == \
        pytest.approx(16 + 2.5)
    even = LengthDistribution(dist="empirical", max=30, lengths=(10, 30), counts=(1, 1))
    binomial = np.cumsum([math.comb(64, k) / 2 ** 64 for k in range(65)])
    k = int(np.argmax(binomial ** 2 >= 0.99))
    assert k == 42  # (mean 32, sd 4)
    heaviest = 64 * 16 + 640 + 20 * k
    every = int(np.argmax(np.cumsum([math.comb(128, k) / 2 ** 128 for k in range(129)]) >= 0.99))
    assert every == 77  # (mean 64, sd 5.7)
    s = load_scenario("ppo-7b-7b-16gpu")
    model, cluster = s.models["actor"], s.cluster
    for kind in ("inference", "train"):
        packed_call = _scoring_call(kind, even).model_copy(update={"padding_free": True})
        assert packed_call.peak_tokens(64, 2) == heaviest
        assert packed_call.peak_tokens(64, 2, max_tokens=2000) == 2000
        # a budget above them: all 128 rows, 1,280 + 20 K' with K' ~ Binomial(128, 1/2) at 0.99
        assert packed_call.peak_tokens(64, 2, max_tokens=10 ** 6) == 128 * 16 + 1280 + 20 * every
        option = Option(Mesh(0, 1, 0, 8), Strategy(2, 2, 2, 2))
        packed = call_cost(packed_call, model, cluster, option)
        fixed = call_cost(_scoring_call(kind, None, width=16 + 20), model, cluster, option)
        assert packed.time_s == fixed.time_s and packed.compute_s == fixed.compute_s, kind
        assert packed.time_s < call_cost(_scoring_call(kind, even), model, cluster, option).time_s
        # memory: the heaviest micro-batch's tokens, as a call of micro-batches that large (8 rows of 313)
        assert heaviest == 8 * 313
        wide = call_cost(_scoring_call(kind, None, seqs=32, width=313), model, cluster, option)
        assert packed.working_bytes == wide.working_bytes > fixed.working_bytes, kind
        budget = call_cost(packed_call, model, cluster, Option(Mesh(0, 1, 0, 8), Strategy(2, 2, 2, 2, max_tokens=3200)))
        assert budget.working_bytes == call_cost(_scoring_call(kind, None, width=50), model, cluster, option).working_bytes


def test_the_heaviest_of_packed_micro_batches_by_hand_and_against_a_simulation():
    """TWO_POINT (1 or 4, one half each): two rows sum to 2, 5 or 8 (1/4, 1/2, 1/4). The heavier of
    two such sums: at 0.99 8 (P(<= 5)^2 = 9/16); at 0.5 5; on average 2/16 + 5 8/16 + 8 7/16 = 6.125.
    One row: the longest of the groups (memory_longest). Log-normal responses (mean 2,000, cv 1,
    cap 16,384): the computed quantile lies within 2% of 20,000 simulated steps' for 4 micro-batches
    of 4 rows and 2 of 16."""
    assert TWO_POINT.memory_heaviest(2, 2) == 8
    assert TWO_POINT.model_copy(update={"memory_at": 0.5}).memory_heaviest(2, 2) == 5
    assert TWO_POINT.model_copy(update={"memory_at": "mean"}).memory_heaviest(2, 2) == pytest.approx(6.125)
    tail = LengthDistribution(dist="lognormal", mean=2000, cv=1.0, max=16384)
    assert [tail.memory_heaviest(1, g) for g in (1, 4, 64)] == [tail.memory_longest(g) for g in (1, 4, 64)]
    rng = np.random.default_rng(0)
    pmf = np.diff(tail.cdf(), prepend=0.0)
    for rows, groups in ((4, 4), (16, 2)):
        sums = rng.choice(len(pmf), size=(20000, groups, rows), p=pmf / pmf.sum()).sum(-1).max(-1)
        assert tail.memory_heaviest(rows, groups) == pytest.approx(np.quantile(sums, 0.99), rel=0.02)
    # a sum too wide for the grid (256 rows of up to 16,384 tokens) is computed on a coarser one, erring high
    coarse = tail.memory_heaviest(256, 1)
    sums = rng.choice(len(pmf), size=(4000, 256), p=pmf / pmf.sum()).sum(-1)
    assert np.quantile(sums, 0.99) <= coarse * 1.01 and coarse == pytest.approx(np.quantile(sums, 0.99), rel=0.03)


def test_rows_packed_without_padding_are_an_engines(cli, tmp_path):
    """training.padding_free reaches every scoring and training call of an engine's scenario; a
    scenario of realbench's own runtime (which pads) is refused it by name. Priced as an engine,
    a scenario packs as the engine does by default (verl and AReaL: yes, OpenRLHF: --ds.packing_samples
    off); one read from that engine's configuration keeps its own setting."""
    from dataclasses import replace

    from realbench.dataflow import CallKind
    from realbench.engines import priced_as
    from realbench.plan import Option, get_builtin

    doc = get_builtin("ppo-8b-16gpu-longtail").to_document()
    path = tmp_path / "my long tail.yaml"
    path.write_text(yaml.safe_dump({**doc, "training": {**doc.get("training", {}), "padding_free": True}}))
    code, _, err = cli("validate", path)
    assert code == 2 and err.count("\n") == 1 and "training.padding_free" in err and "engine" in err, err
    path.write_text(yaml.safe_dump({**doc, "engine": "verl", "training": {**doc.get("training", {}), "padding_free": True}}))
    scenario = load_scenario(str(path))
    assert {c.name: c.padding_free for c in scenario.dataflow.calls} == \
        {c.name: c.kind in (CallKind.TRAIN, CallKind.INFERENCE) for c in scenario.dataflow.calls}
    builtin = get_builtin("ppo-8b-16gpu-longtail")
    assert [priced_as(builtin, e).training.padding_free for e in ("verl", "openrlhf", "areal")] == [True, False, True]
    unpacked = scenario.with_padding_free(False)
    assert priced_as(unpacked, "verl").training.padding_free is False  # its own configuration's
    assert not any(c.padding_free for c in priced_as(unpacked, "verl").dataflow.calls)
    from realbench.engines import verl

    plan = verl.default_plan(builtin)  # (micro-batches of many rows: a padded one waits for its longest)
    # (the same micro-batches padded: without the token budgets that only packed rows are formed by)
    padded = {n: Option(o.mesh, replace(o.strategy, max_tokens=None)) for n, o in plan.items()}
    assert any(o.strategy.max_tokens for o in plan.values())

    def step(sc, plan):
        est = Estimator(sc)
        return est.estimate(est.choice_of(plan)).time_per_iter_s

    as_verl = priced_as(builtin, "verl")
    assert step(as_verl, plan) < step(as_verl.with_padding_free(False), padded)


def test_memory_at_the_mean_survives_the_scenario_document(tmp_path):
    from realbench.plan.scenario import scenario_from_document

    path = tmp_path / "tail.yaml"
    path.write_text(TAIL.replace("cv: 1.0,", "cv: 1.0, memory_at: mean,"))
    s = load_scenario(str(path))
    again = scenario_from_document(s.to_document())
    assert again.dataflow.call("actor_gen").lengths.memory_at == "mean" and again.dataflow == s.dataflow


def test_a_distribution_reaches_the_calls_that_process_the_generated_sequences(tmp_path):
    """`gen_len: {dist: ...}` sets the lengths of the generation call and of every inference and
    train call that reads its sequences, and nothing else."""
    path = tmp_path / "my run.yaml"
    path.write_text(TAIL.replace("algorithm: grpo", "algorithm: ppo").replace(", group_size: 8", "")
                    .replace("reward: llama3-8b", "reward: llama3-8b, critic: llama3-8b"))
    s = load_scenario(str(path))
    assert [c.name for c in s.dataflow.calls if c.lengths is not None] == list(s.dataflow.call_names)  # all six
    assert {c.lengths for c in s.dataflow.calls} == {s.dataflow.call("actor_gen").lengths}
    only_gen = s.dataflow.with_lengths("actor_gen", None)
    assert all(c.lengths is None for c in only_gen.calls)


def test_a_fixed_distribution_costs_what_the_number_costs_and_a_tail_costs_in_between(tmp_path):
    doc = yaml.safe_load(TAIL)
    times = {}
    for name, gen_len in [("cap", 16384), ("fixed", {"dist": "fixed", "max": 16384}),
                          ("tail", {"dist": "lognormal", "mean": 2000, "cv": 1.0, "max": 16384}), ("mean", 2000)]:
        path = tmp_path / f"{name}.yaml"
        path.write_text(yaml.safe_dump({**doc, "dataflow": {**doc["dataflow"], "gen_len": gen_len}}))
        est = Estimator(load_scenario(str(path)))
        option = est.options_of(symmetric_plan(est))["actor_gen"]
        c = est.scenario.dataflow.calls[0]
        times[name] = call_cost(c, est.scenario.models["actor"], est.scenario.cluster, option).time_s
    assert times["fixed"] == pytest.approx(times["cap"], rel=5e-3)
    # a long tail: far below every response at the cap, well above every response at the mean
    # (a group of 8 waits for its longest; 64 x 8 rows per step)
    assert times["mean"] * 1.5 < times["tail"] < times["cap"] / 2, times
    # the README's numbers
    assert [round(times[k]) for k in ("cap", "tail", "mean")] == [162, 32, 8]
    tail = LengthDistribution(dist="lognormal", mean=2000, cv=1.0, max=16384)
    assert round(expected_max(tail.cdf(), 512) / tail.expected, 1) == 7.7


TAIL = """
schema: realbench.scenario/1
name: grpo-tail
cluster: {device: h100, nodes: 4, gpus_per_node: 8}
models: {actor: llama3-8b, ref: llama3-8b, reward: llama3-8b}
dataflow: {algorithm: grpo, prompts: 64, prompt_len: 512, group_size: 8,
           gen_len: {dist: lognormal, mean: 2000, cv: 1.0, max: 16384}}
"""


@pytest.mark.parametrize("old,new,needle", [
    ("cv: 1.0, ", "", "dataflow.gen_len.cv: a lognormal distribution needs mean and cv"),
    ("cv: 1.0", "cv: -1", "dataflow.gen_len.cv: Input should be greater than 0"),
    ("dist: lognormal", "dist: lognormol", "dataflow.gen_len.dist: Input should be 'fixed', 'lognormal' or 'empirical'"),
    ("cv: 1.0", "cv: 1.0, mode: 3", "dataflow.gen_len.mode: unknown setting (valid: dist, max, mean, cv, lengths, "
                                    "counts, memory_at)"),
    ("cv: 1.0", "cv: 1.0, maxx: 3", "dataflow.gen_len.maxx: unknown setting (did you mean 'max'?"),
    ("mean: 2000", "mean: 20000", "dataflow.gen_len.mean: 20000 is above the cap max = 16384"),
    ("cv: 1.0", "cv: 1.0, memory_at: 1.5", "dataflow.gen_len.memory_at: 1.5 is neither a quantile between 0 and 1 "
                                           "nor mean"),
    ("cv: 1.0", "cv: 1.0, memory_at: median", "dataflow.gen_len.memory_at: 'median' is neither a quantile"),
    ("gen_len: {dist: lognormal, mean: 2000, cv: 1.0, max: 16384}", "gen_len: {from: nowhere.jsonl}",
     "nowhere.jsonl: dataflow.gen_len.from: cannot read it"),
])
def test_a_malformed_distribution_is_refused_naming_the_field(cli, tmp_path, old, new, needle):
    path = tmp_path / "my tail job.yaml"
    path.write_text(TAIL.replace(old, new))
    code, out, err = cli("validate", path)
    assert code == 2 and needle in err and len(err.strip().splitlines()) == 1, err


def test_a_data_scenario_takes_its_lengths_from_a_runs_lengths_file(cli, tmp_path):
    """`gen_len: {from: FILE}` beside data files: the histogram of the measured lengths, capped
    by max_new_tokens; the path is the scenario folder's; a file without lengths is refused."""
    from realbench.examples import tiny_grpo_job

    scenario = tiny_grpo_job(tmp_path, devices=1, max_new_tokens=6)
    (tmp_path / "run").mkdir()
    steps = [{"step": 0, "actor_gen": [1, 2, 2, 6]}, {"step": 1, "actor_gen": [6, 2, 1, 9]}]  # 9: above the cap
    (tmp_path / "run" / "lengths.jsonl").write_text("".join(json.dumps(x) + "\n" for x in steps))
    doc = yaml.safe_load(scenario.read_text())
    doc["dataflow"]["gen_len"] = {"from": "run/lengths.jsonl"}
    renamed = tmp_path / "my job.yaml"
    renamed.write_text(yaml.safe_dump(doc))
    s = load_scenario(str(renamed))
    gen = s.dataflow.calls[0]
    assert gen.gen_len == 6 and gen.lengths.dist == "empirical"
    assert (gen.lengths.lengths, gen.lengths.counts) == ((1, 2, 6), (2, 3, 3))
    assert gen.lengths.cdf().tolist() == pytest.approx([0, 2 / 8, 5 / 8, 5 / 8, 5 / 8, 5 / 8, 1])
    # the scenario's document loads back to the same scenario (plans and checkpoints store it)
    again = tmp_path / "again.yaml"
    again.write_text(yaml.safe_dump(s.to_document()))
    assert load_scenario(str(again)).dataflow == s.dataflow
    code, out, err = cli("validate", renamed)
    assert code == 0, err
    (tmp_path / "run" / "lengths.jsonl").write_text(json.dumps({"step": 0}) + "\n")
    code, out, err = cli("validate", renamed)
    assert code == 2 and "lengths.jsonl: dataflow.gen_len.from: holds no response lengths" in err, err
    doc["dataflow"]["gen_len"] = {"from": "run/lengths.jsonl", "max": 8}
    renamed.write_text(yaml.safe_dump(doc))
    code, out, err = cli("validate", renamed)
    assert code == 2 and "dataflow.gen_len.max: 8 is above max_new_tokens (6), the cap" in err, err


def test_measured_decode_steps_weigh_by_the_chance_that_a_micro_batch_still_decodes():
    """On a profile (every operation 1 ms whatever its size, links of about 1 us), pp = 2 and m
    micro-batches of b rows, lengths 1 or 8 (one half each): decode step t = 1..7 costs
    max((1 - 2^-b) m x the slowest stage, (1 - 2^-(b m)) x a token's trip through the pipeline)."""
    from test_profile import synthetic_profile

    from realbench.dataflow import Dataflow

    prof = synthetic_profile(lambda op, b, s: 1e-3)
    fixed = load_scenario("ppo-tiny-2cpu")
    lengths = LengthDistribution(dist="empirical", max=8, lengths=(1, 8), counts=(1, 1))
    calls = tuple(c.model_copy(update={"lengths": lengths}) if c.name == "actor_gen" else c for c in fixed.dataflow.calls)
    tail = fixed.model_copy(update={"dataflow": Dataflow(name="tail", calls=calls)})
    call = fixed.dataflow.call("actor_gen")
    L, G = fixed.models["actor"].n_layers, call.gen_len
    assert G == 8
    per_stage = [1e-3 + (L // 2) * 1e-3, (L // 2) * 1e-3 + 1e-3 + 1e-3]  # embed; head + sampling
    loop = sum(per_stage)
    for m in (1, 2, 4):
        option = Option(Mesh(0, 1, 0, 2), Strategy(1, 1, 2, m))
        times = {}
        for name, s in (("fixed", fixed), ("tail", tail)):
            est = Estimator(s, profile=prof)
            i = est.call_names.index("actor_gen")
            times[name] = est.dur[i][est.index_of(i, option)]
        b = call.seqs / m
        running, any_running = 1 - 0.5 ** b, 1 - 0.5 ** (b * m)
        saved = (G - 1) * (max(m * max(per_stage), loop) - max(running * m * max(per_stage), any_running * loop))
        assert times["fixed"] - times["tail"] == pytest.approx(saved, rel=1e-2), m  # the links' us


def test_validate_says_what_a_group_waits_for(cli, tmp_path):
    path = tmp_path / "tail.yaml"
    path.write_text(TAIL)
    code, out, err = cli("validate", path, "--json")
    assert code == 0, err
    got = json.loads(out)["lengths"]["actor_gen"]
    d = LengthDistribution(dist="lognormal", mean=2000, cv=1.0, max=16384)
    assert got == {"mean": pytest.approx(d.expected), "max": 16384, "of_rows": 8,
                   "expected_longest": pytest.approx(expected_max(d.cdf(), 8))}
    # a group of 8 waits for well over twice the mean response
    assert got["expected_longest"] > 2.5 * got["mean"]
    code, out, err = cli("validate", path)
    assert f"the longest of 8 samples of a prompt {got['expected_longest']:.0f} on average" in out


def test_bench_lengths_quick_estimates_the_measured_lengths_below_the_cap(cli):
    code, out, err = cli("bench", "lengths", "--quick", "--json")
    assert code == 0, err
    r = json.loads(out)
    cap = r["max_new_tokens"]
    assert len(r["end_token_ids"]) == 12 and 1 in r["end_token_ids"] and 0 not in r["end_token_ids"]  # eos in, pad out
    lengths = r["lengths"]
    assert lengths["responses"] == 2 * 2 * 2 and 1 <= lengths["median"] <= lengths["max"] <= cap
    # responses that end before the cap cost less than responses at the cap
    assert lengths["mean"] < cap and 0 < r["estimated_with_lengths_s"] < r["estimated_at_cap_s"]
    for key, estimate in (("at_cap", r["estimated_at_cap_s"]), ("with_lengths", r["estimated_with_lengths_s"])):
        assert r["rel_err"][key] == pytest.approx(abs(estimate - r["measured_s"]) / r["measured_s"])
    assert r["meets_target"] == (r["rel_err"]["with_lengths"] <= 0.25)


def curve_in_bar(p, name: str, call: str = "actor_gen"):
    """(the curve's x, its offsets inside the bar, the bar's start and end) of a timeline figure."""
    (line,) = p.select(name=f"{name} {call}")
    bars = p.renderers[0].data_source.data
    k = [i for i, (c, w) in enumerate(zip(bars["call"], bars["what"])) if c == call and w == "generate"][0]
    xs, ys = line.data_source.data["x"], line.data_source.data["y"]
    assert all(y[0] == call for y in ys)
    return xs, [y[1] for y in ys], bars["start"][k], bars["end"][k]


def symmetric_of(tmp_path, text: str):
    """(scenario, its estimator, the symmetric plan) of a scenario document written to a file."""
    path = tmp_path / "tail.yaml"
    path.write_text(text)
    s = load_scenario(str(path))
    est = Estimator(s)
    return s, est, symmetric_plan(est)


def test_the_timeline_and_the_report_draw_the_live_batch_shrinking(tmp_path):
    from realbench.export.html import plan_report_html
    from realbench.report.figures import timeline_figure

    s, est, choice = symmetric_of(tmp_path, TAIL)
    xs, offsets, start, end = curve_in_bar(timeline_figure(s, est.estimate(choice)), "live batch")
    assert xs[0] == pytest.approx(start) and xs[-1] == pytest.approx(end)
    assert all(a <= b for a, b in zip(xs, xs[1:]))
    assert offsets[0] == pytest.approx(0.3)  # every row alive at first
    assert all(a >= b for a, b in zip(offsets, offsets[1:])) and offsets[-1] < -0.29  # then hardly any
    # at 64 steps evenly spread: the share of rows alive, 1 - cdf[t], at the expected elapsed
    # steps of the call (sum of P(some row of the 512 still decodes) before t)
    cdf = s.dataflow.calls[0].lengths.cdf()
    steps = np.unique(np.linspace(0, 16383, 64).astype(int))
    assert offsets[:-1] == pytest.approx([-0.3 + 0.6 * (1 - cdf[t]) for t in steps])
    running = 1 - cdf[:-1] ** 512
    t = steps[1]
    assert xs[1] == pytest.approx(xs[0] + (xs[-1] - xs[0]) * running[:t].sum() / running.sum())
    # the report knows the plan: without a pipeline, generation runs by continuous batching and
    # its bar draws the slots busy (tests/test_rollout.py), on a pipeline the live batch
    options = est.options_of(choice)
    drawn = "slots busy" if options["actor_gen"].strategy.pp == 1 else "live batch"
    assert f"{drawn} actor_gen" in plan_report_html(s, options)
    # a fixed length draws no curve
    fixed = Estimator(load_scenario("ppo-7b-7b-16gpu"))
    assert not timeline_figure(fixed.scenario, fixed.estimate(symmetric_plan(fixed))).select(name="live batch actor_gen")


def test_the_mean_twin_prices_every_response_at_the_mean():
    from realbench.plan import get_builtin
    from realbench.search.tail import mean_twin

    s = get_builtin("ppo-8b-16gpu-longtail")
    mean = round(s.dataflow.call("actor_gen").lengths.expected)
    assert 950 < mean < 1000  # the cap (4096) cuts the log-normal's tail: 971
    short, padded = mean_twin(s), mean_twin(s, shorten_later=False)
    for twin in (short, padded):
        gen = twin.dataflow.call("actor_gen")
        assert gen.lengths is None and gen.gen_len == mean and gen.seq_len == 512 + mean
    assert {c.seq_len for c in short.dataflow.calls} == {512 + mean}
    assert {c.seq_len for c in padded.dataflow.calls if c.name != "actor_gen"} == {512 + 4096}


def test_sampled_lengths_invert_the_cdf_with_the_seed():
    from realbench.search.tail import sampled_lengths

    s = load_scenario("ppo-tiny-2cpu")
    calls = tuple(c.model_copy(update={"lengths": LengthDistribution(dist="empirical", max=8, lengths=(1, 8),
                                                                     counts=(1, 1))})
                  if c.name == "actor_gen" else c for c in s.dataflow.calls)
    from realbench.dataflow import Dataflow

    s = s.model_copy(update={"dataflow": Dataflow(name="tail", calls=calls)})
    (step,) = sampled_lengths(s, 1, seed=4)
    # cdf = 0, 1/2, ..., 1/2, 1: a uniform u <= 1/2 draws 1, above it 8
    u = np.random.default_rng(4).random(s.dataflow.call("actor_gen").seqs)
    drawn = step["actor_gen"]
    assert drawn.lengths == (1, 8) and drawn.counts == (int((u <= 0.5).sum()), int((u > 0.5).sum()))


def test_a_plan_that_does_not_fit_the_sampled_lengths_takes_forever_and_one_that_does_its_mean_time():
    from realbench.plan import get_builtin
    from realbench.search.tail import sampled_lengths, sampled_time

    s = get_builtin("ppo-8b-16gpu-longtail")
    est = Estimator(s)
    fits = est.options_of(symmetric_plan(est))
    samples = sampled_lengths(s, 2, seed=0)
    per_step = []
    for drawn in samples:
        (name, dist), = drawn.items()  # one generation call: its lengths and its sequences' in later calls
        one = Estimator(s.model_copy(update={"dataflow": s.dataflow.with_lengths(name, dist)}))
        per_step.append(one.estimate(one.choice_of(fits)).time_per_iter_s)
    assert sampled_time(s, fits, samples) == pytest.approx(sum(per_step) / 2)
    i = est.call_names.index("actor_train")
    alone = next(o for o in est.options[i] if o.mesh.size == 1)  # an 8B model trained on one GPU
    assert sampled_time(s, {**fits, "actor_train": alone}, samples) == float("inf")


def test_a_long_tailed_scenario_planned_again_with_another_staleness():
    """Two equal length distributions whose tables were computed compare equal (the computed arrays
    do not take part), so a long-tailed scenario planned at staleness 1, then 2, builds its options
    again (the cached strategies are looked up by the call, lengths included: this raised)."""
    from realbench.plan import get_builtin

    a = LengthDistribution(dist="lognormal", max=512, mean=100, cv=1.2)
    b = LengthDistribution(dist="lognormal", max=512, mean=100, cv=1.2)
    a.cdf(), b.cdf()
    assert a == b and hash(a) == hash(b) and a != LengthDistribution(dist="lognormal", max=512, mean=100, cv=1.0)
    base = get_builtin("ppo-8b-16gpu-longtail")
    for staleness in (1, 2):
        est = Estimator(base.with_staleness(staleness))
        assert math.isfinite(est.estimate(symmetric_plan(est)).time_per_iter_s)


def test_a_plans_token_budget_is_read_priced_and_refused_where_nothing_packs_by_tokens(cli, tmp_path):
    """`max_tokens` on a packed call of an engine's scenario (AReaL's max_tokens_per_mb): the plan
    file reads, and the call's memory is planned for a micro-batch that full (more memory with a
    larger budget, the time the same). Refused in one line naming the call's field: on generation,
    below a whole row, and on a scenario whose rows are padded."""
    from realbench.engines import areal, priced_as
    from realbench.plan import get_builtin
    from realbench.plan.plan import plan_from_options

    scenario = areal.job_of(priced_as(get_builtin("ppo-8b-16gpu-longtail"), "areal"))
    (tmp_path / "job scenario.yaml").write_text(yaml.safe_dump(scenario.to_document()))
    options = areal.default_plan(scenario)
    doc = plan_from_options(scenario, options, scenario_ref="job scenario.yaml").to_document()
    budget = doc["calls"]["actor_train"]["max_tokens"]
    seconds, memory = {}, {}
    for tokens in (budget, 2 * budget):
        doc["calls"]["actor_train"]["max_tokens"] = tokens
        path = tmp_path / f"plan {tokens}.yaml"
        path.write_text(yaml.safe_dump(doc))
        code, out, err = cli("estimate", "--scenario", tmp_path / "job scenario.yaml", "--plan", path, "--json")
        assert code == 0, err
        result = json.loads(out)
        seconds[tokens], memory[tokens] = result["time_per_iter_s"], result["calls"]["actor_train"]["mem_bytes"]
    assert seconds[budget] == seconds[2 * budget] and memory[budget] < memory[2 * budget]
    row = scenario.dataflow.call("actor_train").seq_len
    for call, tokens, says in (("actor_gen", budget, "padding_free"), ("actor_train", row - 1, "whole row")):
        bad = {**doc, "calls": {**doc["calls"], call: {**doc["calls"][call], "max_tokens": tokens}}}
        path = tmp_path / "bad plan.yaml"
        path.write_text(yaml.safe_dump(bad))
        code, _, err = cli("estimate", "--scenario", tmp_path / "job scenario.yaml", "--plan", path)
        assert code == 2 and err.count("\n") == 1 and f"calls.{call}.max_tokens" in err and says in err, err
    padded = scenario.with_padding_free(False)
    (tmp_path / "padded.yaml").write_text(yaml.safe_dump(padded.to_document()))
    code, _, err = cli("estimate", "--scenario", tmp_path / "padded.yaml", "--plan", tmp_path / f"plan {budget}.yaml")
    assert code == 2 and err.count("\n") == 1 and ".max_tokens: " in err and "padding_free" in err, err
