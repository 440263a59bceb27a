"""The models of 2026, planned from their config.json alone: the families' readings against the
published sizes, a config named by folder, file, cached hub id or catalogue entry, what is refused
by name; and the cost model of a mixture of experts against hand-worked values (the experts'
compute and weights read, the all-to-alls, memory with expert parallelism, reallocation between
expert layouts), and expert parallelism as a plan dimension (options, refusals, the search)."""

import json
import math

import pytest

from realbench.cost import calls, comm
from realbench.cost.realloc import realloc_time
from realbench.dataflow import CallDef
from realbench.hardware import cluster
from realbench.models import catalogue, get_model
from realbench.models.hf import spec_from_config
from realbench.plan import Mesh, Option, Strategy
from realbench.plan.options import enumerate_options, expert_layouts, strategy_problem

# Published sizes (total, active parameters): the model cards' and papers' figures, rounded as they
# give them (Qwen3 technical report, Table 1/2; DeepSeek-V3 report: 671B/37B; Mixtral paper: 46.7B/12.9B;
# gpt-oss model card: 20.9B/3.6B and 116.8B/5.1B active counted without the input embedding; the model
# cards of Qwen2-1.5B-Instruct and Qwen2.5-Math-1.5B: 1.54B, DeepSeek-R1-Distill-Qwen-1.5B: 1.78B, and
# Mistral-Nemo-Instruct-2407's published checkpoint: 12.2B)
PUBLISHED = {"qwen3-0.6b": (0.6e9, None), "qwen3-8b": (8.2e9, None), "qwen3-32b": (32.8e9, None),
             "qwen3-30b-a3b": (30.5e9, 3.3e9), "qwen3-235b-a22b-instruct-2507": (235e9, 22e9),
             "deepseek-v3": (671e9, 37e9), "mixtral-8x7b": (46.7e9, 12.9e9), "llama-3.1-70b": (70.6e9, None),
             "llama-3.1-405b": (405.9e9, None), "qwen3-next-80b-a3b": (79.7e9, None),
             "qwen2-1.5b": (1.54e9, None), "qwen2.5-math-1.5b": (1.54e9, None),
             "deepseek-r1-distill-qwen-1.5b": (1.78e9, None), "mistral-nemo-12b": (12.2e9, None)}


@pytest.mark.parametrize("name", sorted(PUBLISHED))
def test_catalogue_sizes_match_the_published_ones(name):
    spec = get_model(name)
    total, active = PUBLISHED[name]
    digits = len(f"{total:.3g}".split("e")[0].replace(".", "")) - 1  # the figure's precision: half its last digit
    assert abs(spec.n_params - total) <= 0.5 * 10 ** (math.floor(math.log10(total)) - digits), spec.n_params
    if active is not None:
        # (publishers count the embeddings into "active" or not: within 3%)
        assert abs(spec.active_params - active) <= 0.03 * active, spec.active_params


def test_exact_parameter_counts_by_hand():
    # Llama 3.1 8B: 32 layers of 2 h^2 + 2 h 1024 + 3 h 14336 + 2 h, the embedding and head (V h each), the norm
    h, V = 4096, 128256
    assert get_model("llama-3.1-8b").n_params == 32 * (2 * h * h + 2 * h * 1024 + 3 * h * 14336 + 2 * h) + 2 * V * h + h \
        == 8_030_261_248
    # Qwen3-30B-A3B: q 32 x 128, kv 4 x 128 over h 2048, q/k norms 128 each, router 128 h, 128 experts of
    # 3 h 768, two norms; untied head over 151,936
    h, V = 2048, 151936
    attention = h * 4096 + 2 * h * 512 + 4096 * h + 2 * 128
    layer = attention + 128 * h + 128 * 3 * h * 768 + 2 * h
    spec = get_model("qwen3-30b-a3b")
    assert spec.n_params == 48 * layer + 2 * V * h + h
    assert spec.active_params == spec.n_params - 48 * 120 * 3 * h * 768
    # DeepSeek-V3's multi-head latent attention: q through a rank-1536 latent, kv through 512 + 64
    ds, h = get_model("deepseek-v3"), 7168
    q = h * 1536 + 1536 + 1536 * 128 * 192
    kv = h * (512 + 64) + 512 + 512 * 128 * (128 + 128)
    assert ds.attention_params() == q + kv + 128 * 128 * h
    assert ds.kv_bytes_per_token_layer() == (512 + 64) * 2 and not ds.kv_split_by_tp
    assert ds.moe.dense_layers == (0, 1, 2) and ds.moe.shared_ffn == 2048 and ds.moe.scoring == "sigmoid"


def test_hybrid_attention_and_windows_as_priced():
    nxt = get_model("qwen3-next-80b-a3b")
    assert nxt.layer_types.count("full_attention") == 12 and nxt.layer_types[3] == "full_attention"
    # a quarter of the layers attend; linear attention's state: 32 value heads of 128 x 128 plus the conv's
    la = nxt.linear_attention
    assert nxt.attended(1000) == 250 and la.state_values() == 32 * 128 * 128 + (2 * 16 * 128 + 32 * 128) * 3
    assert nxt.state_bytes_per_layer() == 0.75 * la.state_values() * 2
    oss = get_model("gpt-oss-20b")
    assert oss.attended(1000) == (1000 + 128) / 2  # every other layer over a 128-token window
    assert oss.sequence_cache_bytes(1000, 24, 1) == 24 * (1000 + 128) / 2 * 2 * 8 * 64 * 2


# -- where a config comes from -----------------------------------------------------------------------
def _scenario(tmp_path, actor, name="s.yaml"):
    doc = {"schema": "realbench.scenario/1", "name": "moe", "algorithm": "grpo",
           "cluster": {"nodes": 2, "gpus_per_node": 8, "device": "h100"},
           "models": {"actor": actor, "ref": actor, "reward": {"arch": "qwen3-1.7b", "value_head": True}},
           "dataflow": {"algorithm": "grpo", "prompts": 64, "prompt_len": 512, "gen_len": 1024, "group_size": 8}}
    path = tmp_path / name
    path.write_text(json.dumps(doc))
    return path


def test_plans_need_the_config_alone_and_run_names_the_missing_weights(cli, tmp_path, monkeypatch):
    """A folder holding only config.json, the config.json file itself, a hub id in the local cache
    (HF_HUB_CACHE's layout: models--org--name/snapshots/REV/, refs/main) and a catalogue entry are
    planned alike; `run` refuses the ones without weights in one line naming what is missing."""
    config = catalogue.config("qwen3-30b-a3b")
    (tmp_path / "only-config").mkdir()
    (tmp_path / "only-config" / "config.json").write_text(json.dumps(config))
    (tmp_path / "my qwen.json").write_text(json.dumps(config))
    cache = tmp_path / "hub"
    snapshot = cache / "models--Acme--Qwen3-MoE" / "snapshots" / "abc123"
    snapshot.mkdir(parents=True)
    (snapshot / "config.json").write_text(json.dumps(config))
    (cache / "models--Acme--Qwen3-MoE" / "refs").mkdir()
    (cache / "models--Acme--Qwen3-MoE" / "refs" / "main").write_text("abc123")
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    times = []
    for actor in ({"path": "only-config"}, {"path": "my qwen.json"}, {"path": "Acme/Qwen3-MoE"},
                  {"path": "Qwen/Qwen3-30B-A3B"}, "qwen3-30b-a3b", {"arch": "qwen3-30b-a3b"}):
        scenario = _scenario(tmp_path, actor)
        code, out, err = cli("estimate", "--scenario", scenario, "--baseline", "symmetric", "--json")
        assert code == 0, (actor, err)
        times.append(json.loads(out)["time_per_iter_s"])
    assert len(set(times)) == 1  # one config, one price, wherever it came from
    # run: the weights are read only now, and their absence named
    scenario = _scenario(tmp_path, {"path": "only-config"})
    plan = tmp_path / "plan.yaml"
    assert cli("estimate", "--scenario", scenario, "--baseline", "symmetric", "--out", plan)[0] == 0
    code, _, err = cli("run", "--scenario", scenario, "--plan", plan, "--nproc", 2, "--steps", 1)
    assert code == 2 and err.count("\n") == 1 and "missing weights file model.safetensors" in err, err
    scenario = _scenario(tmp_path, "qwen3-30b-a3b")
    code, _, err = cli("run", "--scenario", scenario, "--plan", plan, "--nproc", 2, "--steps", 1)
    assert code == 2 and "read from its config alone (catalogue entry qwen3-30b-a3b" in err, err


def test_bad_models_are_one_line_and_exit_2(cli, tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "empty-cache"))
    config = catalogue.config("qwen3-30b-a3b")

    def check(actor, needle, config_change=None):
        if config_change is not None:
            (tmp_path / "m").mkdir(exist_ok=True)
            (tmp_path / "m" / "config.json").write_text(json.dumps({**config, **config_change}))
        code, _, err = cli("validate", _scenario(tmp_path, actor))
        assert code == 2 and err.count("\n") == 1 and needle in err, err

    check({"path": "Nobody/Nothing-7B"}, "no hub id 'Nobody/Nothing-7B' in the local Hugging Face cache")
    check("qwen3-8bb", "unknown model 'qwen3-8bb' (did you mean 'qwen3-8b'?")
    check({"path": "m"}, "architecture 'FooForCausalLM' is not supported", {"architectures": ["FooForCausalLM"]})
    check({"path": "m"}, "model_type: 'foo' is not a model type realbench reads", {"model_type": "foo"})
    check({"path": "m"}, "scoring_func: router scoring 'relu' is not priced",
          {**catalogue.config("deepseek-v3"), "scoring_func": "relu"})
    check({"path": "m"}, "num_experts_per_tok: 0 is not a whole number of at least 1", {"num_experts_per_tok": 0})
    check({"path": "m", "expert_imbalance": 0.5}, "expert_imbalance: 0.5: the busiest expert-parallel device's", {})
    check({"arch": "qwen3-8b", "expert_imbalance": 1.2}, "qwen3-8b is dense: it has no experts")
    check({"path": "m"}, "rope type 'yarnish' is not known", {"rope_scaling": {"rope_type": "yarnish", "factor": 4}})


def test_a_config_written_with_nulls_reads_as_transformers_reads_it():
    """A key written as null takes None (Mistral v0.3's sliding_window, Moonlight's q_lora_rank), a
    key left out the family's default (Mistral's 4096-token window, Qwen3's head_dim 128)."""
    mistral = catalogue.config("mistral-7b")
    assert mistral["sliding_window"] is None and not spec_from_config(mistral, "m").layer_types
    without = {k: v for k, v in mistral.items() if k != "sliding_window"}
    assert spec_from_config(without, "m").sliding_window == 4096
    assert get_model("moonlight-16b-a3b").mla.q_lora_rank is None
    qwen3 = {k: v for k, v in catalogue.config("qwen3-8b").items() if k != "head_dim"}
    assert spec_from_config(qwen3, "q").head_dim == 128


# -- the cost of a mixture of experts ----------------------------------------------------------------
MOE = get_model("qwen3-30b-a3b")
H100x2 = cluster(2, 8, "h100")


def test_expert_compute_and_weights_read_by_hand():
    """One layer's routed experts on a device of t tokens, tp 1, ep 8 (module doc of realbench.cost.calls):
    2 t k 3 h f_e FLOPs x the imbalance at the efficiency of t ep k / E rows an expert, and the weights
    of the device's E/ep experts its group's tokens reach: E/ep (1 - (1 - k/E)^(t ep))."""
    m, c, t = MOE.moe, H100x2, 64.0
    seconds, nbytes = calls._expert_compute(c, MOE, 1, t, 8, 0)
    flops = 2 * t * 8 * 3 * 2048 * 768 * m.imbalance
    rows = t * 8 * 8 / 128
    assert seconds == pytest.approx(calls.matmul_time(c, flops, rows))
    touched = 128 / 8 * (1 - (1 - 8 / 128) ** (t * 8))
    assert nbytes == pytest.approx(touched * 3 * 2048 * 768 * 2)
    # without expert parallelism no device waits for a busier one: no imbalance
    s1, _ = calls._expert_compute(c, MOE, 1, t, 1, 0)
    assert s1 == pytest.approx(calls.matmul_time(c, flops / m.imbalance, t * 8 / 128))
    # a decode step of 2 rows reads about 16 of 128 experts, not all
    _, few = calls._expert_compute(c, MOE, 1, 2.0, 1, 0)
    assert few == pytest.approx(128 * (1 - (1 - 8 / 128) ** 2) * 3 * 2048 * 768 * 2)


def test_expert_all_to_alls_by_hand():
    """Dispatch and combine, forward, (t / tp) k h bf16 a device over ep: inside a node (n-1)/n S / B + a;
    across two nodes of 8, the slower of NVLink's 7/16 and the NICs' 8/16."""
    c, t = H100x2, 4096.0
    S = t * 8 * 2048 * 2
    inside = 2 * (7 / 8 * S / c.intra_bw + c.intra_latency_s)
    assert calls._expert_exchanges(c, MOE, Strategy(8, 1, 1, ep=8), t) == pytest.approx(inside)
    across = 2 * max(7 / 16 * S / c.intra_bw + c.intra_latency_s, 8 / 16 * S / c.inter_bw + c.inter_latency_s)
    assert calls._expert_exchanges(c, MOE, Strategy(16, 1, 1, ep=16), t) == pytest.approx(across)
    assert comm.all_to_all(c, 16, S, 8) == pytest.approx(across / 2)
    assert calls._expert_exchanges(c, MOE, Strategy(8, 1, 1), t) == 0.0


def test_memory_with_expert_parallelism_by_hand():
    """A train call's master state (16 bytes a parameter; zero 1 shards the fp32 state over its group):
    the rest over tp, the routed experts over ep x etp; Megatron's distributed optimizer shards the
    experts' state over their expert-data-parallel group (dp tp / (ep etp))."""
    routed = 48 * 128 * 3 * 2048 * 768
    dense = MOE.n_params - routed
    call = CallDef(name="t", model="m", kind="train", seqs=64, seq_len=1024)
    for dp, tp, ep, etp, zero in ((8, 1, 8, 0, 0), (4, 2, 8, 1, 0), (8, 1, 4, 0, 1), (16, 1, 1, 0, 0)):
        s = Strategy(dp, tp, 1, 16, zero=zero, ep=ep, etp=etp)
        cost = calls.call_cost(call, MOE, H100x2, Option(Mesh(0, 2, 0, 8) if dp * tp > 8 else Mesh(0, 1, 0, 8), s))
        on_dense, on_routed = dense / tp, routed / (ep * (etp or tp))
        edp = dp * tp // (ep * (etp or tp))
        state = (4 + 12 / dp) if zero else 16
        expert_state = (4 + 12 / edp) if zero else 16
        assert cost.master_bytes == int(on_dense * state + on_routed * expert_state), (dp, tp, ep, etp, zero)
        assert cost.weights_bytes == int((on_dense + on_routed) * 2)


def test_reallocation_moves_each_devices_experts_by_hand():
    """From a layout holding every expert (dp 8, ep 1) to one of ep 8 on the other node: each destination
    receives the rest's bf16 weights and its eighth of the experts over the NICs."""
    c = H100x2
    src = Option(Mesh(0, 1, 0, 8), Strategy(8, 1, 1))
    dst = Option(Mesh(1, 1, 0, 8), Strategy(8, 1, 1, ep=8))
    routed = 48 * 128 * 3 * 2048 * 768
    nbytes = ((MOE.n_params - routed) + routed / 8) * 2
    assert realloc_time(MOE, c, src, dst) == pytest.approx(nbytes / c.inter_bw + c.inter_latency_s)
    # on the same devices with the same split nothing moves; another split moves it
    assert realloc_time(MOE, c, dst, dst) == 0.0
    assert realloc_time(MOE, c, Option(Mesh(1, 1, 0, 8), Strategy(8, 1, 1, ep=4)), dst) > 0


def test_expert_parallelism_is_a_plan_dimension():
    """What the search offers: realbench's runtime splits experts over replicas (ep dividing dp); the
    engines Megatron's folding (ep x etp dividing dp x sp x tp, etp tp's or 1) and the serving engines'
    expert parallelism over whole tp replicas; refused by name otherwise."""
    train = CallDef(name="t", model="m", kind="train", seqs=64, seq_len=1024)
    gen = CallDef(name="g", model="m", kind="generate", seqs=64, seq_len=1024, gen_len=512)
    assert expert_layouts(train, MOE, 8, 1, 1, False) == ((1, 0), (2, 0), (4, 0), (8, 0))
    assert set(expert_layouts(train, MOE, 4, 1, 2, True)) == {(1, 0), (2, 0), (4, 0), (1, 1), (2, 1), (4, 1), (8, 1)}
    assert expert_layouts(gen, MOE, 4, 1, 2, True) == ((1, 0), (2, 1), (4, 1), (8, 1))
    assert expert_layouts(gen, MOE, 4, 1, 2, False) == ((1, 0),)
    assert expert_layouts(train, get_model("qwen3-8b"), 8, 1, 1, True) == ((1, 0),)
    mesh = Mesh(0, 1, 0, 8)
    bad = [(train, Strategy(8, 1, 1, ep=3), "ep", "the 128 experts of qwen3-30b-a3b do not split over ep 3"),
           (train, Strategy(4, 2, 1, ep=8), "ep", "ep x etp = 8 x 2 does not divide"),
           (train, Strategy(8, 1, 1, zero=3, ep=2), "zero", "zero 3 shards experts as any weight"),
           (gen, Strategy(8, 1, 1, etp=1, ep=1), "etp", "generation without expert parallelism"),
           (gen, Strategy(4, 2, 1, ep=4, etp=2), "etp", "generation's expert parallelism holds each expert whole"),
           (gen, Strategy(4, 2, 1, ep=3, etp=1), "ep", "do not split over ep 3"),
           (train, Strategy(8, 1, 1, ep=2), "ep", None)]
    for call, s, field, why in bad:
        problem = strategy_problem(call, MOE, H100x2, mesh, s)
        assert (problem is None) == (why is None) and (why is None or (problem[0] == field and why in problem[1])), \
            (s, problem)
    dense = strategy_problem(train, get_model("qwen3-8b"), H100x2, mesh, Strategy(8, 1, 1, ep=2))
    assert dense == ("ep", "expert parallelism splits a mixture of experts: qwen3-8b has none")
    options = enumerate_options(train, MOE, H100x2, zero=True)
    assert {o.strategy.ep for o in options} == {1, 2, 4, 8, 16}


def test_the_search_splits_the_experts_of_qwen3_30b_a3b():
    """On 16 H100, a searched plan of GRPO on Qwen3-30B-A3B trains with its experts split (ep > 1), and is
    faster than the best symmetric plan."""
    from realbench.cost import Estimator
    from realbench.plan import get_builtin
    from realbench.search import run_search

    est = Estimator(get_builtin("grpo-qwen3-30b-a3b-16gpu"))
    result = run_search(est, "mcmc", 60, seed=0, max_evaluations=20_000)
    train = est.options_of(result.best_choice)["actor_train"]
    assert train.strategy.ep > 1, train
    assert result.best_time_s < result.baselines["symmetric"]


def test_a_generations_tp_beyond_the_kv_heads_replicates_them_as_vllm_does():
    """Qwen3-235B-A22B has 4 KV heads of 128 (kv_width 512, hidden 4096, 94 layers). Generating at tp 8,
    as verl's example serves it, each KV head sits on 2 GPUs: a GPU's KV cache is one head's, 2 x 128 x 2
    bytes = 512 bytes a token a layer, the same as at tp 4; its key and value projections are
    2 x 4096 x 512 = 4,194,304 parameters a layer, held / 4 instead of / 8: 524,288 more a layer,
    49,283,072 over the 94 (everything else halves from tp 4). Qwen3-Next-80B-A3B's 2 KV heads are in
    its 12 full-attention layers of 48 only: 2,097,152 x 12/48 x (1/2 - 1/8) = 196,608 a layer on
    average at tp 8. Training splits the KV heads (Megatron): tp 8 there is refused, and realbench's
    runtime refuses the replicas by name."""
    big = spec_from_config(catalogue.config("qwen3-235b-a22b-instruct-2507"), "qwen3-235b")
    assert (big.kv_shards(8), big.kv_shards(4), big.kv_shards(2)) == (4, 4, 2)
    assert big.sequence_cache_bytes(1000, 1, 8) == big.sequence_cache_bytes(1000, 1, 4) == 512_000
    assert (big.kv_replica_params(8), big.kv_replica_params(4)) == (524_288, 0)
    assert big.stage_params(1, 8) - big.stage_params(1, 4) / 2 == pytest.approx(49_283_072)
    # what the weight sync's price leaves out (docs/limits.md): the replicated half of each GPU's key and
    # value rows, 94 x 4,194,304 / 2 of 235B parameters
    assert big.n_layers * 4_194_304 / 2 / big.n_params < 0.002
    nxt = spec_from_config(catalogue.config("qwen3-next-80b-a3b"), "qwen3-next")
    assert nxt.kv_replica_params(8) == pytest.approx(196_608)
    gen = CallDef(name="g", model="m", kind="generate", seqs=64, seq_len=1024, gen_len=512)
    train = CallDef(name="t", model="m", kind="train", seqs=64, seq_len=1024)
    mesh = Mesh(0, 1, 0, 8)
    assert strategy_problem(gen, big, H100x2, mesh, Strategy(1, 8, 1)) is None
    # offered to the engines' plans (with their sharding), not to realbench's runtime's
    assert 8 in {o.strategy.tp for o in enumerate_options(gen, big, H100x2, zero=True)}
    assert max(o.strategy.tp for o in enumerate_options(gen, big, H100x2, zero=False)) == 4
    field, why = strategy_problem(train, big, H100x2, mesh, Strategy(1, 8, 1))
    assert field == "tp" and "tp 8 does not divide the 64 attention heads and 4 KV heads" in why
    # (a tp that neither divides the KV heads nor is a multiple of them: refused generating too)
    odd = get_model("qwen3-8b").model_copy(update={"n_heads": 24, "n_kv_heads": 6})
    field, why = strategy_problem(gen, odd, H100x2, Mesh(0, 1, 0, 4), Strategy(1, 4, 1))
    assert field == "tp" and "(or, generating, a multiple of the KV heads)" in why
