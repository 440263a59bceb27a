"""The models of 2026 in the runtime: Qwen3 (q/k norms, its own head_dim), Llama 3.1's llama3 and
Qwen3's yarn rotary scaling, and mixtures of experts (Qwen3-MoE, Mixtral) computed as transformers
computes them; expert parallelism on CPU processes (logits and gradients equal the unsharded
model's on tp, pp, dp and ep layouts; reallocation between layouts of different ep bit-exact);
the load-balancing loss equal to transformers'."""

import json
import random

import pytest
import torch

from realbench.errors import ConfigError
from realbench.models import ModelSpec
from realbench.models.hf import config_of, spec_from_config
from realbench.models.shards import flat_offsets, param_specs
from realbench.runtime.checkpoint import load_hf_checkpoint, save_hf
from realbench.runtime.layout import Coord, Layout
from realbench.runtime.local import spawn
from realbench.runtime.model import LlamaStage, init_full_weights

transformers = pytest.importorskip("transformers")

# a tiny Qwen3-MoE: 4 experts, 2 a token, its second layer dense (mlp_only_layers)
MOE = ModelSpec(name="qwen3-moe-tiny", family="qwen3_moe", n_layers=4, hidden=64, n_heads=4, n_kv_heads=2, head_dim=16,
                ffn=96, vocab=128, qk_norm=True, norm_eps=1e-6, rope_theta=1e6,
                moe={"experts": 4, "top_k": 2, "expert_ffn": 32, "dense_layers": (1,)})


def tiny_hf(path, family, seed=0, **kwargs):
    """A tiny `<family>ForCausalLM` of transformers, norms away from 1, saved with save_pretrained."""
    cfg = getattr(transformers, f"{family}Config")(vocab_size=96, hidden_size=64, intermediate_size=160,
                                                    num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=2,
                                                    **kwargs)
    torch.manual_seed(seed)
    model = getattr(transformers, f"{family}ForCausalLM")(cfg).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.uniform_(0.5, 1.5)
    model.save_pretrained(path)
    return model


LLAMA3 = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
          "original_max_position_embeddings": 16}


@pytest.mark.parametrize("family,kwargs", [
    ("Qwen3", dict(head_dim=32)),  # heads x head_dim = 128, twice the hidden size
    ("Qwen3", dict(head_dim=16, tie_word_embeddings=True)),
    ("Llama", dict(rope_parameters={**LLAMA3, "rope_theta": 5e5})),  # Llama 3.1+: positions past 16 stretched
    ("Qwen3", dict(head_dim=16, rope_parameters={"rope_type": "yarn", "factor": 4.0, "rope_theta": 1e6,
                                                  "original_max_position_embeddings": 8})),
    ("Llama", dict(rope_parameters={"rope_type": "linear", "factor": 2.0, "rope_theta": 1e4})),
    ("Qwen3Moe", dict(head_dim=16, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=24, norm_topk_prob=True)),
    ("Qwen3Moe", dict(head_dim=16, num_experts=6, num_experts_per_tok=3, moe_intermediate_size=24,
                      norm_topk_prob=False, mlp_only_layers=[1])),
    ("Mixtral", dict(num_local_experts=4, num_experts_per_tok=2, rope_theta=1e6)),
])
def test_logits_and_gradients_equal_transformers(tmp_path, family, kwargs):
    hf = tiny_hf(tmp_path, family, max_position_embeddings=256, **kwargs)
    spec, weights = load_hf_checkpoint(tmp_path)
    assert spec.runtime_problem() is None
    ours = LlamaStage(spec)
    ours.load_full(weights)
    tokens = torch.randint(0, 96, (2, 40))  # past 16 positions: a scaled rotary embedding shows
    expected, got = hf(tokens).logits, ours(tokens)
    assert torch.allclose(got, expected, atol=1e-5, rtol=1e-5), float((got - expected).abs().max())
    for logits in (expected, got):
        logits.float().pow(2).mean().backward()
    theirs = {k: p.grad for k, p in hf.named_parameters()}
    from realbench.models.hf import hf_of

    names = dict(ours.named_parameters())
    for name, p in names.items():
        # (transformers 5 names Mixtral's block_sparse_moe `mlp` inside the model, as Qwen3-MoE's)
        g = theirs.get(hf_of(name, spec).replace("block_sparse_moe", "mlp"))
        if g is None:  # transformers 5 holds a mixture's experts as stacked tensors
            g = _stacked_grad(hf, name)
        assert torch.allclose(p.grad, g, atol=1e-6, rtol=1e-4), (name, float((p.grad - g).abs().max()))


def _stacked_grad(hf, name):
    """An expert's gradient out of transformers' stacked gate_up_proj / down_proj."""
    _, i, _, _, j, part, _ = name.split(".")
    layer = hf.model.layers[int(i)]
    experts = layer.mlp.experts
    if part == "w_down":
        return experts.down_proj.grad[int(j)]
    gate, up = experts.gate_up_proj.grad[int(j)].chunk(2, dim=0)
    return gate if part == "w_gate" else up


def test_saved_folders_load_in_transformers_with_equal_logits(tmp_path):
    """A model without a source checkpoint is saved with its family's config (config_of), which
    reads back to the same spec, and transformers computes its logits."""
    llama31 = ModelSpec(name="l", n_layers=2, hidden=32, n_heads=4, n_kv_heads=2, ffn=48, vocab=64, rope_theta=5e5,
                        rope_scaling=LLAMA3)
    mixtral = ModelSpec(name="m", family="mixtral", n_layers=2, hidden=32, n_heads=4, n_kv_heads=2, ffn=16, vocab=64,
                        moe={"experts": 4, "top_k": 2, "expert_ffn": 16})
    for spec in (MOE, llama31, mixtral, MOE.model_copy(update={"name": "critic"}).with_value_head()):
        back = spec_from_config(config_of(spec), spec.name)
        assert back.model_copy(update={"max_positions": None}) == spec, spec.name
        full = init_full_weights(spec, seed=4)
        save_hf(tmp_path / spec.name, spec, full)
        ours = LlamaStage(spec)
        ours.load_full(full)
        tokens = torch.randint(0, spec.vocab, (2, 24))
        if spec.value_head:
            hf = transformers.AutoModelForSequenceClassification.from_pretrained(tmp_path / spec.name)
            assert (tmp_path / spec.name / "config.json").read_text().count("ForSequenceClassification") == 1
            continue
        hf = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / spec.name)
        assert torch.allclose(ours(tokens), hf(tokens).logits, atol=1e-5)


def test_the_load_balancing_loss_is_transformers(tmp_path):
    """With output_router_logits the config adds router_aux_loss_coef x the Switch loss over every
    layer's router logits: ours equals transformers' load_balancing_loss_func, with and without
    padding, and the spec carries the coefficient only where the config turns it on."""
    from transformers.models.qwen3_moe.modeling_qwen3_moe import load_balancing_loss_func

    from realbench.runtime.experts import load_balancing_loss

    torch.manual_seed(0)
    logits = [torch.randn(10, 6) for _ in range(3)]
    mask = torch.tensor([[1] * 5, [0, 0, 1, 1, 1]])
    assert torch.allclose(load_balancing_loss(logits, 6, 2), load_balancing_loss_func(tuple(logits), 6, 2))
    assert torch.allclose(load_balancing_loss(logits, 6, 2, mask.reshape(-1).bool()),
                          load_balancing_loss_func(tuple(logits), 6, 2, mask))
    # by hand: 2 tokens, 2 experts, top-1, one layer: f = (1/2, 1/2), P = mean of the softmaxes
    two = [torch.tensor([[2.0, 0.0], [0.0, 1.0]])]
    p = torch.tensor([[2.0, 0.0], [0.0, 1.0]]).softmax(-1).mean(0)
    assert torch.allclose(load_balancing_loss(two, 2, 1), 2 * (0.5 * p[0] + 0.5 * p[1]))
    cfg = config_of(MOE)
    assert spec_from_config(cfg, "x").moe.aux_loss_coef == 0.0
    cfg.update(output_router_logits=True, router_aux_loss_coef=0.01)
    assert spec_from_config(cfg, "x").moe.aux_loss_coef == 0.01


# -- on CPU processes ------------------------------------------------------------------------------
def test_logits_and_gradients_on_tp_pp_dp_and_ep_layouts_equal_the_unsharded_model():
    """Every layout of a tiny Qwen3-MoE on 4 processes, experts split over data-parallel replicas
    (ep 2 and 4, beside tp and pp), computes the unsharded model's logits and gradients: the
    routed tokens go to their experts' ranks and back (all-to-alls), the experts' gradients are
    summed over their holders and divided by dp, and activation checkpointing recomputes the same."""
    from test_runtime_core import _parity_worker

    layouts = [Layout.on(range(4), 4, 1, 1, ep=4), Layout.on(range(4), 4, 1, 1, ep=2),
               Layout.on(range(4), 2, 2, 1, ep=2), Layout.on(range(4), 2, 1, 2, ep=2),
               Layout.on(range(4), 1, 2, 2), Layout.on([3, 1], 2, 1, 1, ep=2)]
    results = spawn(_parity_worker, 4, MOE, layouts, 8, 2)
    for li, lay in enumerate(layouts):
        for rank in lay.ranks:
            err, gerr, names, ckpt_err = results[rank][li]
            c = lay.coord(rank)
            if err is not None:
                assert err < 1e-5, (lay, rank, err)
            assert gerr < 1e-4 and ckpt_err < 1e-6, (lay, rank, gerr, ckpt_err)
            experts = {int(n.split(".")[4]) for n in names if ".moe.experts." in n}
            local = 4 // lay.dims.ep
            assert experts == set(range(lay.ep_rank(c) * local, (lay.ep_rank(c) + 1) * local)), (lay, rank)


def test_expert_parallel_groups():
    lay = Layout.on(range(8), 4, 2, 1, ep=2)
    c = Coord(3, 1, 0)
    assert lay.ep_rank(c) == 1 and lay.ep_group(c) == (5, 7) and lay.expert_dp_group(c) == (3, 7)
    with pytest.raises(ValueError, match="ep 3 does not divide dp 4"):
        Layout.on(range(8), 4, 2, 1, ep=3)
    # each stage's flat buffer holds its own experts only: 2 of 4 under ep 2
    whole, _ = flat_offsets(MOE, 1, 1, 0)
    half, _ = flat_offsets(MOE, 1, 1, 0, ep=2, ep_rank=1)
    assert {n for n in whole if ".experts." in n} - set(half) == {
        n for n in whole if ".experts.0." in n or ".experts.1." in n}


def _moe_realloc_worker(rank, world, pairs):
    from realbench.runtime.layout import Groups
    from realbench.runtime.realloc import reallocate

    Groups()
    out = []
    full = init_full_weights(MOE, seed=2)
    for a, b in pairs:
        def shards_of(lay):
            c = lay.coord(rank)
            if c is None:
                return {}
            st = LlamaStage(MOE, lay.dims.tp, c.tp, lay.dims.pp, c.pp, v=lay.dims.v, ep=lay.dims.ep,
                            ep_rank=lay.ep_rank(c))
            st.load_full(full)
            return dict(st.state_dict())

        start = shards_of(a)
        moved = reallocate(MOE, a, b, start, rank)
        expect = shards_of(b)
        ok = moved.keys() == expect.keys() and all(torch.equal(moved[k], expect[k]) for k in expect)
        back = reallocate(MOE, b, a, moved, rank)
        out.append(ok and back.keys() == start.keys() and all(torch.equal(back[k], start[k]) for k in start))
    return out


def test_reallocation_between_expert_layouts_is_bit_exact():
    """A -> B -> A between random layouts of different ep, tp and pp (experts moving from the
    replicas that hold them to those that will) gives back every shard bit for bit, and B holds
    exactly what a fresh B would."""
    rng = random.Random(7)

    def layout():
        size = rng.choice([2, 4])
        start = rng.randrange(0, 4 - size + 1)
        dp, tp, pp = rng.choice([d for d in [(size, 1, 1), (size // 2, 2, 1), (size // 2, 1, 2), (1, 2, size // 2)]
                                 if d[2] <= MOE.n_layers and d[0] * d[1] * d[2] == size])
        ep = rng.choice([e for e in (1, 2, 4) if dp % e == 0])
        return Layout.on(range(start, start + size), dp, tp, pp, ep=ep)

    pairs = [(layout(), layout()) for _ in range(16)]
    pairs.append((Layout.on(range(4), 4, 1, 1, ep=4), Layout.on(range(4), 1, 2, 2)))
    results = spawn(_moe_realloc_worker, 4, pairs)
    for rank in range(4):
        assert all(results[rank]), [p for p, ok in zip(pairs, results[rank]) if not ok]


def test_the_runtime_refuses_what_it_does_not_compute_by_name():
    from realbench.models import catalogue
    from realbench.models.hf import check_weights

    moonlight = spec_from_config(catalogue.config("moonlight-16b-a3b"), "m")
    assert "does not compute deepseek_v3 models" in moonlight.runtime_problem()
    shared = MOE.model_copy(update={"moe": MOE.moe.model_copy(update={"shared_ffn": 32})})
    assert shared.runtime_problem() == "the runtime's mixture of experts has no shared experts"
    lora = MOE.model_copy(update={"lora": {"r": 2}})
    assert lora.runtime_problem() == "the runtime trains LoRA adapters on dense models only, not on a mixture of experts"
    assert MOE.runtime_problem() is None
    assert {p.name for p in param_specs(MOE) if ".moe.router." in p.name} == {
        f"layers.{i}.moe.router.weight" for i in (0, 2, 3)}
    check_weights(MOE)  # random weights: nothing to read, nothing refused
    with pytest.raises(ConfigError, match="read from its config alone .catalogue entry qwen3-8b.*no weights to run"):
        check_weights(__import__("realbench.models", fromlist=["get_model"]).get_model("qwen3-8b"), "actor")


def test_a_qwen3_moe_checkpoint_trains_with_its_experts_split_and_comes_back_as_transformers_loads_it(cli, tmp_path):
    """The three files of a job with a tiny Qwen3-MoE checkpoint (transformers' own save): validated
    from its config, trained 2 GRPO steps on 4 processes with the actor's experts split over 2
    replicas and the reference's over 4, generated with every expert on every replica; the trained
    actor saved as a Hugging Face folder that transformers loads with equal logits."""
    from test_real_runs import hf_logits_equal

    from realbench.examples import tiny_grpo_job

    scenario = tiny_grpo_job(tmp_path, devices=4, family="Qwen3Moe")
    code, out, err = cli("validate", scenario)
    assert code == 0, err
    plan = tmp_path / "plan.yaml"
    plan.write_text("schema: realbench.plan/1\nscenario: grpo-arithmetic.yaml\ncalls:\n"
                    "  actor_gen: {mesh: n0, dp: 4, tp: 1, pp: 1}\n"
                    "  reward_inf: {mesh: n0, dp: 4, tp: 1, pp: 1}\n"
                    "  ref_inf: {mesh: n0, dp: 4, tp: 1, pp: 1, ep: 4}\n"
                    "  actor_train: {mesh: n0, dp: 2, tp: 2, pp: 1, ep: 2}\n")
    code, out, err = cli("validate", plan)
    assert code == 0, err
    # (the run's estimates beside its measurements on the analytic model: a profile of this checkpoint's
    # shapes would take minutes to measure, and what is checked here is the run)
    code, out, err = cli("run", "--scenario", scenario, "--plan", plan, "--nproc", 4, "--steps", 2, "--json",
                         "--save-hf", tmp_path / "hf", "--profile", "none")
    assert code == 0, err
    r = json.loads(out)
    assert len(r["metrics"]) == 2 and all(m["loss"] == m["loss"] for m in r["metrics"])  # finite
    assert r["realloc_bytes"] > 0  # the experts moved between the layouts of different ep
    hf_logits_equal(tmp_path / "hf" / "actor", "AutoModelForCausalLM")
    config = json.loads((tmp_path / "hf" / "actor" / "config.json").read_text())
    assert config["architectures"] == ["Qwen3MoeForCausalLM"]
    assert config.get("num_experts", config.get("num_local_experts")) == 8  # (transformers 5 writes the latter)
    # expert-parallel generation is the serving engines': refused by name here
    plan.write_text(plan.read_text().replace("actor_gen: {mesh: n0, dp: 4, tp: 1, pp: 1}",
                                             "actor_gen: {mesh: n0, dp: 4, tp: 1, pp: 1, ep: 4}"))
    code, out, err = cli("run", "--scenario", scenario, "--plan", plan, "--nproc", 4, "--steps", 1, "--profile", "none")
    assert code == 2 and "calls.actor_gen.ep: realbench's runtime generates with every expert on every replica" in err
    # a generation's tp beyond the KV heads (2 here) replicates them, as vLLM does: priced, not run here
    plan.write_text(plan.read_text().replace("actor_gen: {mesh: n0, dp: 4, tp: 1, pp: 1, ep: 4}",
                                             "actor_gen: {mesh: n0, dp: 1, tp: 4, pp: 1}"))
    code, out, err = cli("estimate", "--scenario", scenario, "--plan", plan, "--profile", "none")
    assert code == 0, err
    code, out, err = cli("run", "--scenario", scenario, "--plan", plan, "--nproc", 4, "--steps", 1, "--profile", "none")
    assert code == 2 and "calls.actor_gen.tp: tp 4 beyond the 2 KV heads" in err, err

