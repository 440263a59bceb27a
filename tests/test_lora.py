"""LoRA: adapters in PEFT's names, trained on every layout as PEFT's LoraModel trains them, the
base frozen, the optimizer over the adapters alone, and bad settings refused by name."""

import random

import pytest
import torch

from realbench.errors import ConfigError
from realbench.models import LoraSpec, get_model
from realbench.models.shards import adapter_specs, is_adapter, param_specs, trainable_start
from realbench.plan.training import OptimizerSettings
from realbench.runtime.layout import Groups, Layout
from realbench.runtime.local import spawn
from realbench.runtime.model import LlamaStage, init_full_weights

peft = pytest.importorskip("peft")
transformers = pytest.importorskip("transformers")

LORA = LoraSpec(r=4, lora_alpha=16, target_modules="all-linear")
SPEC = get_model("llama-tiny").model_copy(update={"lora": LORA})
# one update that clips (the gradient norm is far above 0.01) and decays
SETTINGS = OptimizerSettings(learning_rate=1e-4, lr_scheduler_type="constant", weight_decay=0.1, max_grad_norm=0.01)
ROWS, WIDTH = 8, 12


def start_weights(spec=SPEC, seed=1):
    """The base and adapters a test starts from: B random too (PEFT starts it at zero, where A's
    gradient would be zero and a wrong A update would not show)."""
    full = init_full_weights(spec, seed=seed)
    g = torch.Generator().manual_seed(seed + 100)
    for s in adapter_specs(spec):
        if s.name.endswith("lora_B"):
            full[s.name] = torch.randn(s.shape, generator=g) * 0.05
    return full


def batch():
    g = torch.Generator().manual_seed(0)
    return torch.randint(0, SPEC.vocab, (ROWS, WIDTH), generator=g), torch.randint(0, SPEC.vocab, (ROWS, WIDTH), generator=g)


def token_loss(logits, targets):
    """Mean negative log-likelihood of the targets (summed here; callers divide by the tokens)."""
    return -torch.log_softmax(logits.float(), -1).gather(-1, targets[..., None]).sum()


def peft_update(spec=SPEC, full=None):
    """One AdamW update of PEFT's LoraModel on transformers' LlamaForCausalLM, single process, as
    transformers' Trainer takes it (global norm clipped, decay on every adapter): the adapted
    weights after it, by realbench's names, and the norm before clipping."""
    from realbench.models.hf import hf_of
    from realbench.runtime.checkpoint import hf_config

    full = full if full is not None else start_weights(spec)
    base = {k: v for k, v in full.items() if not is_adapter(k)}
    cfg = transformers.LlamaConfig(**{k: v for k, v in hf_config(spec, "float32").items()
                                      if k not in ("architectures", "model_type", "torch_dtype", "dtype")})
    hf = transformers.LlamaForCausalLM(cfg)
    hf.load_state_dict({hf_of(k, spec): v for k, v in base.items()})
    lora = spec.lora
    model = peft.get_peft_model(hf, peft.LoraConfig(r=lora.r, lora_alpha=lora.lora_alpha, lora_dropout=0.0,
                                                    target_modules=list(lora.target_modules)))
    params = dict(model.named_parameters())

    def peft_name(ours):
        layer_module, part = ours.rsplit(".", 1)
        hf_name = hf_of(layer_module + ".weight", spec).removesuffix(".weight")
        return f"base_model.model.{hf_name}.{part}.default.weight"

    with torch.no_grad():
        for s in adapter_specs(spec):
            params[peft_name(s.name)].copy_(full[s.name])
    trained = [p for p in model.parameters() if p.requires_grad]
    assert len(trained) == len(adapter_specs(spec))  # PEFT trains the adapters and nothing else
    tokens, targets = batch()
    loss = token_loss(model(tokens).logits, targets) / targets.numel()
    loss.backward()
    norm = float(torch.nn.utils.clip_grad_norm_(trained, SETTINGS.max_grad_norm))
    opt = torch.optim.AdamW(trained, lr=SETTINGS.learning_rate, weight_decay=SETTINGS.weight_decay,
                            betas=(SETTINGS.adam_beta1, SETTINGS.adam_beta2), eps=SETTINGS.adam_epsilon)
    opt.step()
    return {s.name: params[peft_name(s.name)].detach().clone() for s in adapter_specs(spec)}, norm


def _update_worker(rank, world, spec, layouts, micro_batches):
    """On each layout: one update of the adapters (realbench's optimizer, clipping as the run
    clips), then the whole model gathered on rank 0 (None elsewhere), with the norm."""
    from realbench.runtime.engine import PlacedModel
    from realbench.runtime.optim import MixedPrecisionAdam
    from realbench.runtime.realloc import reallocate

    full = start_weights(spec)
    tokens, targets = batch()
    groups = Groups()
    groups.prepare(layouts)
    out = []
    for lay, m in zip(layouts, micro_batches):
        placed, norm = None, None
        if lay.coord(rank) is not None:
            placed = PlacedModel(spec, lay, rank, groups)
            placed.stage.load_full(full)
            opt = MixedPrecisionAdam(placed, settings=SETTINGS, total_updates=1)
            c, dp = placed.coord, lay.dims.dp
            mine, goal = tokens.chunk(dp)[c.dp], targets.chunk(dp)[c.dp]
            pieces = list(goal.chunk(m))
            placed.forward_backward(list(mine.chunk(m)),
                                    lambda i, y: token_loss(y, pieces[i]) / targets.numel() * dp)
            norm = placed.grad_norm()
            opt.step(min(1.0, SETTINGS.max_grad_norm / (norm + 1e-6)))
            # the optimizer holds the adapters only: its master is the buffer's end, from the adapters' start
            assert opt.master.numel() == placed.stage.flat.numel() - trainable_start(spec, lay.dims.tp, lay.dims.pp,
                                                                                       c.pp, lay.dims.v)
            assert set(opt.state_views()["master"]) == {k for k in placed.shards() if is_adapter(k)}
        whole = reallocate(spec, lay, Layout.on([0], 1, 1, 1), placed.shards() if placed else {}, rank)
        # plain lists: tensors would travel through shared memory that a finished process takes away
        out.append((norm, {k: v.tolist() for k, v in whole.items()} if rank == 0 else None))
    return out


def random_layouts(seed, count):
    rng = random.Random(seed)
    shapes = [(dp, tp, pp) for dp in (1, 2, 4) for tp in (1, 2) for pp in (1, 2, 4) if dp * tp * pp in (2, 4)]
    cases = []
    for _ in range(count):
        dp, tp, pp = rng.choice(shapes)
        v = 2 if pp == 2 and rng.random() < 0.5 else 1  # the interleaved schedule: chunks of 1 layer
        ranks = list(range(4))
        rng.shuffle(ranks)
        cases.append((Layout.on(ranks[:dp * tp * pp], dp, tp, pp, v), rng.choice([1, 2]) * pp))
    return cases


def test_one_lora_update_on_random_layouts_is_peft_loramodels_update():
    """The adapters after one clipped AdamW update with weight decay equal PEFT's LoraModel's on
    transformers' LlamaForCausalLM (single process), to 1e-6, on random dp/tp/pp layouts of up to
    4 processes (interleaved pipelines too, tp splitting B's rows or A's columns); the norm is
    the adapters' alone, and the base does not move by a bit."""
    expected, peft_norm = peft_update()
    assert peft_norm > 10 * SETTINGS.max_grad_norm  # the update clips
    cases = random_layouts(3, 5)
    results = spawn(_update_worker, 4, SPEC, [lay for lay, _ in cases], [m for _, m in cases], timeout_s=300)
    full = start_weights()
    for k, (lay, m) in enumerate(cases):
        norms = {results[r][k][0] for r in lay.ranks}
        assert len(norms) == 1, (lay, norms)  # every rank clips by the same norm
        assert norms.pop() == pytest.approx(peft_norm, rel=1e-5), lay
        whole = {name: torch.tensor(v) for name, v in results[0][k][1].items()}
        for s in adapter_specs(SPEC):
            err = float((whole[s.name] - expected[s.name]).abs().max())
            assert err <= 1e-6, (lay, m, s.name, err)
            assert not torch.equal(whole[s.name], full[s.name]), s.name  # it did move
        for s in param_specs(SPEC, adapters=False):
            assert torch.equal(whole[s.name], full[s.name]), (lay, s.name)


def test_the_adapted_model_computes_the_base_plus_the_scaled_low_rank_product():
    """y = W x + (alpha / r) B A x on one projection, by hand: with every adapter zero but one
    q_proj's, the logits move exactly as adding (alpha / r) B A to that W does."""
    spec = get_model("llama-tiny").model_copy(update={"lora": LoraSpec(r=2, lora_alpha=6, target_modules=["q_proj"])})
    full = init_full_weights(spec, seed=2)
    g = torch.Generator().manual_seed(5)
    full["layers.1.wq.lora_B"] = torch.randn(full["layers.1.wq.lora_B"].shape, generator=g)
    adapted = LlamaStage(spec)
    adapted.load_full(full)
    merged = {k: v for k, v in full.items() if not is_adapter(k)}
    merged["layers.1.wq.weight"] = merged["layers.1.wq.weight"] + 3.0 * full["layers.1.wq.lora_B"] @ full["layers.1.wq.lora_A"]
    plain = LlamaStage(get_model("llama-tiny"))
    plain.load_full(merged)
    tokens = batch()[0]
    assert float((adapted(tokens) - plain(tokens)).abs().max()) < 1e-5
    # fresh adapters (B zero) compute the base exactly
    fresh = LlamaStage(spec)
    fresh.load_full(init_full_weights(spec, seed=2))
    base = LlamaStage(get_model("llama-tiny"))
    base.load_full({k: v for k, v in init_full_weights(spec, seed=2).items() if not is_adapter(k)})
    assert torch.equal(fresh(tokens), base(tokens))
    assert {n for n, p in fresh.named_parameters() if p.requires_grad} == {s.name for s in adapter_specs(spec)}


def test_lora_settings_take_peft_names_and_refuse_what_realbench_would_not_do():
    assert LoraSpec(r=8).target_modules == ("q_proj", "v_proj")  # PEFT's default for LLaMA
    assert LoraSpec(r=8, target_modules=["down_proj", "q_proj"]).target_modules == ("q_proj", "down_proj")
    assert LoraSpec(r=16, lora_alpha=32).scaling == 2.0 and LoraSpec(r=16, lora_alpha=32, use_rslora=True).scaling == 8.0
    assert LORA.modules == {"wq": "column", "wk": "column", "wv": "column", "wo": "row", "w_gate": "column",
                            "w_up": "column", "w_down": "row"}
    # r (in + out) per targeted projection and layer: hand-worked for llama-tiny (h 64, kv 32, ffn 176)
    assert SPEC.layer_adapter_params == 4 * ((64 + 64) + 2 * (64 + 32) + (64 + 64) + 2 * (64 + 176) + (176 + 64))
    for bad, field in [({"r": 0}, "r"), ({"r": 4, "target_modules": ["q_proj", "lm_head"]}, "target_modules"),
                       ({"r": 4, "lora_dropout": 0.1}, "lora_dropout"), ({"r": 4, "bias": "all"}, "bias")]:
        from realbench.schema import validate_model

        with pytest.raises(ConfigError) as e:
            validate_model(LoraSpec, bad)
        assert e.value.field == field, (bad, str(e.value))
    with pytest.raises(ConfigError, match="lm_head.*q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj, down_proj"):
        validate_model(LoraSpec, {"r": 4, "target_modules": ["lm_head"]})
    # in a scenario: on a model no call trains, by its field
    from realbench.plan import get_builtin
    from realbench.plan.scenario import scenario_from_document

    doc = get_builtin("grpo-tiny-cpu").to_document()
    doc["models"]["reward"]["lora"] = {"r": 2}
    with pytest.raises(ConfigError) as e:
        scenario_from_document(doc, "my job.yaml")
    assert e.value.field == "models.reward.lora" and "no call trains 'reward'" in str(e.value)


def lora_job(folder, with_ref: bool):
    """grpo-tiny-cpu with the actor trained by LoRA, as a user's file (a name of their own), with or
    without a reference model of its own; the symmetric plan and one that generates on the last
    two processes with tp = 2 and keeps the reference on the first alone, and that one with the
    generation receiving merged weights."""
    import yaml

    from realbench.cost import Estimator
    from realbench.cost.baselines import symmetric_plan
    from dataclasses import replace

    from realbench.plan import Option, get_builtin, plan_from_options
    from realbench.plan.scenario import load_scenario

    doc = get_builtin("grpo-tiny-cpu").to_document()
    path = folder / ("my lora job.yaml" if with_ref else "my lora job, base reference.yaml")
    doc["models"]["actor"]["lora"] = {"r": 4, "lora_alpha": 8, "target_modules": "all-linear"}
    if not with_ref:
        del doc["models"]["ref"]
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    scenario = load_scenario(str(path))
    est = Estimator(scenario)
    sym = est.options_of(symmetric_plan(est))

    def pick(call, label):
        return next(o for o in est.options[est.call_names.index(call)] if o.label(4) == label)

    moving = {**sym, "actor_gen": pick("actor_gen", "n0:2-3/dp1tp2pp1m1"), "ref_inf": pick("ref_inf", "n0:0/dp1tp1pp1m1"),
              "actor_train": pick("actor_train", "n0:0-1/dp2tp1pp1m1")}
    # the same, generation receiving the adapters merged into the base every step
    merged = {**moving, "actor_gen": Option(moving["actor_gen"].mesh, replace(moving["actor_gen"].strategy, merge_lora=True))}
    plans = []
    for name, options in (("symmetric", sym), ("moving", moving), ("merged", merged)):
        plans.append(folder / f"{path.stem} {name}.yaml")
        plan_from_options(scenario, options).save(plans[-1])
    return scenario, path, plans


@pytest.fixture(scope="module")
def lora_runs(cli_once, tmp_path_factory):
    """Three steps of the LoRA job with its own reference (symmetric plan) and with the base as
    reference (the moving plan, checkpoints after step 2, the adapters saved as PEFT's; and the
    moving plan with generation receiving merged weights)."""
    import json

    tmp_path = tmp_path_factory.mktemp("lora job")
    own, own_path, own_plans = lora_job(tmp_path, with_ref=True)
    base, base_path, base_plans = lora_job(tmp_path, with_ref=False)
    ck, saved = tmp_path / "checkpoints", tmp_path / "trained"
    runs = {}
    for key, path, plan, extra in [("own", own_path, own_plans[0], ()),
                                   ("base", base_path, base_plans[1], ("--save-every", 2, "--checkpoint-dir", ck,
                                                                       "--save-hf", saved)),
                                   ("merged", base_path, base_plans[2], ())]:
        code, out, err = cli_once("run", "--scenario", path, "--plan", plan, "--nproc", 4, "--steps", 3, "--json", *extra)
        assert code == 0, err
        runs[key] = json.loads(out)
    return dict(own=own, base=base, base_path=base_path, base_plans=base_plans, runs=runs, ck=ck, saved=saved,
                folder=tmp_path)


def test_a_lora_run_moves_only_the_adapters_and_its_reference_is_the_base(cli, lora_runs):
    """A GRPO run training the actor's adapters: without a reference model, the reference
    log-probabilities come from the actor with its adapters off (no reference weights), and the
    run equals, step for step, the one whose reference is a separate copy of the base, under
    another plan; once a layout holds the frozen base only the adapters move (bytes worked out
    by hand), or, merged into the base, the base's bytes every step, for the same run; a
    checkpoint resumes under the other plan."""
    import json

    own, base, runs, ck = lora_runs["own"], lora_runs["base"], lora_runs["runs"], lora_runs["ck"]
    base_path, base_plans = lora_runs["base_path"], lora_runs["base_plans"]
    assert "ref" not in base.models and "ref" in own.models
    ref = base.dataflow.call("ref_inf")
    assert ref.model == "actor" and not ref.adapters and own.dataflow.call("ref_inf").adapters
    for key in ("reward", "loss", "actor_train/kl"):
        a, b = [[m[key] for m in runs[k]["metrics"]] for k in ("own", "base")]
        assert a == pytest.approx(b, rel=1e-5, abs=1e-7), key
    assert any(m["actor_train/kl"] != 0 for m in runs["base"]["metrics"][1:])  # the adapters moved the policy off its base
    # the generation layout (tp 2 on processes 2, 3) gets every adapter from the trainer (processes 0, 1): a
    # column-parallel projection's A (r x 64) on both tp ranks and B once, a row-parallel one's A once and
    # B (64 x r) on both; r = 4, 4 layers, fp32
    r, per_layer = 4, 0
    for n_in, n_out, column in [(64, 64, 1), (64, 32, 1), (64, 32, 1), (64, 64, 0), (64, 176, 1), (64, 176, 1), (176, 64, 0)]:
        per_layer += (2 * r * n_in + n_out * r) if column else (r * n_in + 2 * n_out * r)
    adapters = 4 * per_layer * 4
    by_step = runs["base"]["realloc_bytes_by_step"]
    assert by_step[1:] == [adapters, adapters] and runs["base"]["realloc_bytes"] == adapters
    actor = base.models["actor"]
    weights = actor.n_params + 4 * actor.layer_adapter_params
    assert by_step[0] > weights * 4 > 8 * adapters  # the first step fills the generation and reference layouts
    # generation receiving W + s B A every step instead (merge_lora): the same samples and updates; every step
    # moves the base's bytes, what the first step of the other run filled beside the adapters
    for key in ("reward", "loss", "actor_train/kl"):
        a, b = [[m[key] for m in runs[k]["metrics"]] for k in ("base", "merged")]
        assert a == pytest.approx(b, rel=1e-5, abs=1e-7), key
    assert runs["merged"]["realloc_bytes_by_step"] == [by_step[0] - adapters] * 3 == [807_424] * 3  # (the README's)
    # resumed under the symmetric plan from the checkpoint after step 2: the third step as it ran
    code, out, err = cli("run", "--scenario", base_path, "--plan", base_plans[0], "--nproc", 4, "--steps", 3, "--json",
                         "--checkpoint-dir", ck, "--resume")
    assert code == 0, err
    resumed = json.loads(out)["metrics"]
    assert [m["step"] for m in resumed] == [2]
    for key in ("reward", "loss", "actor_train/kl"):
        assert resumed[0][key] == pytest.approx(runs["base"]["metrics"][2][key], rel=1e-5, abs=1e-7), key


def greedy(stage, prompts, n):
    """n tokens by argmax after each prompt, the whole sequence recomputed each time."""
    seqs = prompts
    for _ in range(n):
        seqs = torch.cat([seqs, stage(seqs)[:, -1].argmax(-1, keepdim=True)], dim=1)
    return seqs[:, prompts.shape[1]:]


def test_trained_adapters_go_out_as_peft_writes_them_and_come_back_in(cli, lora_runs, tmp_path):
    """`run --save-hf` writes the adapters as a PEFT folder (with the random base beside them):
    peft.PeftModel.from_pretrained loads it on that base and generates greedily what realbench's
    model does with those weights; `checkpoint convert --merge-lora` writes one model that
    transformers loads and that computes PEFT's logits; a scenario starts from the folder
    (`adapter:`), its first step already off the base; an adapter folder for another base, a
    setting realbench would compute otherwise, and LoRA on an untrained model are refused."""
    import json
    import yaml

    from realbench.models.hf import spec_from_checkpoint_entry
    from realbench.runtime.checkpoint import load_adapters, load_hf_checkpoint, save_hf

    folder = lora_runs["saved"] / "actor"
    assert {p.name for p in folder.iterdir()} >= {"adapter_config.json", "adapter_model.safetensors", "base"}
    config = json.loads((folder / "adapter_config.json").read_text())
    assert (config["peft_type"], config["r"], config["lora_alpha"]) == ("LORA", 4, 8.0)
    hf_base = transformers.AutoModelForCausalLM.from_pretrained(folder / "base")
    tuned = peft.PeftModel.from_pretrained(hf_base, folder).eval()
    spec = spec_from_checkpoint_entry({"path": str(folder / "base"), "adapter": str(folder)}, tmp_path)
    assert spec.lora.r == 4 and spec.lora.target_modules == LORA.target_modules and spec.lora.path == str(folder)
    ours = LlamaStage(spec)
    _, weights = load_hf_checkpoint(folder / "base")
    ours.load_full({**weights, **load_adapters(spec)})
    assert float(ours.layers["0"].wq.lora_B.abs().max()) > 0  # trained: B left zero
    prompts = batch()[0][:4, :6]
    with torch.no_grad():
        expected = tuned.generate(prompts, max_new_tokens=8, do_sample=False, min_new_tokens=8)[:, 6:]
        assert torch.equal(greedy(ours, prompts, 8), expected)
        # merged: the checkpoint after step 2, as adapters and as one model, compute the same logits
        for merge, out in ((False, tmp_path / "adapters"), (True, tmp_path / "merged")):
            code, _, err = cli("checkpoint", "convert", lora_runs["ck"], "--to-hf", out, *(["--merge-lora"] if merge else []))
            assert code == 0, err
        merged = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "merged" / "actor").eval()
        unmerged = peft.PeftModel.from_pretrained(
            transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "adapters" / "actor" / "base"),
            tmp_path / "adapters" / "actor").eval()
        tokens = batch()[0]
        assert float((merged(tokens).logits - unmerged(tokens).logits).abs().max()) < 1e-4
    # a run from the folder: its first step's policy is the trained one, off the base (KL > 0)
    doc = yaml.safe_load(lora_runs["base_path"].read_text())
    doc["name"] = "from my adapters"
    doc["models"]["actor"] = {"path": str(folder / "base"), "adapter": str(folder)}
    started = tmp_path / "from adapters.yaml"
    started.write_text(yaml.safe_dump(doc, sort_keys=False))
    code, _, err = cli("estimate", "--scenario", started, "--baseline", "symmetric", "--out", tmp_path / "plan.yaml")
    assert code == 0, err
    code, out, err = cli("run", "--scenario", started, "--plan", tmp_path / "plan.yaml", "--nproc", 4, "--steps", 1,
                         "--json")
    assert code == 0, err
    assert json.loads(out)["metrics"][0]["actor_train/kl"] != 0
    # refused, one line each, exit 2
    small = save_hf(tmp_path / "small", get_model("llama-small"), init_full_weights(get_model("llama-small")))
    bad = {"for another base?": {"path": str(small), "adapter": str(folder)},
           "not both": {"path": str(folder / "base"), "adapter": str(folder), "lora": {"r": 2}}}
    for what, entry in bad.items():
        doc["models"]["actor"] = entry
        started.write_text(yaml.safe_dump(doc, sort_keys=False))
        code, _, err = cli("estimate", "--scenario", started, "--baseline", "symmetric")
        assert code == 2 and err.count("\n") == 1 and what in err, (what, err)
    dora = json.loads((folder / "adapter_config.json").read_text())
    (tmp_path / "dora").mkdir()
    for f in ("adapter_model.safetensors",):
        (tmp_path / "dora" / f).write_bytes((folder / f).read_bytes())
    (tmp_path / "dora" / "adapter_config.json").write_text(json.dumps({**dora, "use_dora": True}))
    doc["models"]["actor"] = {"path": str(folder / "base"), "adapter": str(tmp_path / "dora")}
    started.write_text(yaml.safe_dump(doc, sort_keys=False))
    code, _, err = cli("estimate", "--scenario", started, "--baseline", "symmetric")
    assert code == 2 and "use_dora" in err and err.count("\n") == 1, err


def test_lora_training_and_its_reallocations_are_priced_by_hand():
    """The cost model under LoRA, against numbers worked out by hand for the built-in 7B job
    (r 16 on every projection of llama-7b, one node of 8 H100s): the adapters' parameters; a train
    call keeps bf16 base weights (2 bytes) and 16 bytes per adapter parameter, updates and
    all-reduces the adapters alone, and its backward costs one forward (not two) plus the
    adapters' share; the generation layout receives the adapters only, the base reference nothing;
    or, merged, the base every step, holding it for its call only."""
    from dataclasses import replace

    from realbench.cost import Estimator, call_cost
    from realbench.cost.calls import ADAM_BYTES_MOVED_PER_PARAM, memory_time
    from realbench.cost.realloc import Layouts, realloc_times
    from realbench.dataflow import CallDef, CallKind
    from realbench.plan import Mesh, Option, Strategy, get_builtin

    scenario = get_builtin("grpo-7b-lora-8gpu")
    actor = scenario.models["actor"]
    # per layer r (in + out): q, k, v, o 4096 + 4096 each, gate, up, down 4096 + 11008 each
    assert actor.layer_adapter_params == 16 * (4 * 8192 + 3 * 15104) == 1_249_280
    full = actor.model_copy(update={"lora": None})
    train = CallDef(name="t", model="actor", kind=CallKind.TRAIN, seqs=64, seq_len=1024)
    option = Option(Mesh(0, 1, 0, 8), Strategy(dp=8, tp=1, pp=1, micro_batches=2))
    lora, whole = call_cost(train, actor, scenario.cluster, option), call_cost(train, full, scenario.cluster, option)
    adapters = 32 * 1_249_280
    assert lora.master_bytes == int(full.n_params * 2 + adapters * 16)
    assert whole.master_bytes == int(full.n_params * 16)
    assert lora.optimizer_s == pytest.approx(memory_time(scenario.cluster, adapters * ADAM_BYTES_MOVED_PER_PARAM))
    share = 1_249_280 / full.layer_matmul_params
    assert lora.compute_s == pytest.approx(whole.compute_s * 2 * (1 + share) / 3, rel=1e-9)
    assert lora.dp_comm_s < whole.dp_comm_s / 100  # 40M adapter gradients against 6.7B
    # the adapters of a stage, over tp, to a layout on the same node: bytes / intra bandwidth + latency
    # (from a trainer of two pipeline stages: no device holds the layers of the other stage)
    src = Layouts.of([Option(Mesh(0, 1, 0, 8), Strategy(dp=4, tp=1, pp=2))], 8)
    gen = Layouts.of([Option(Mesh(0, 1, 0, 8), Strategy(dp=4, tp=2, pp=1))], 8)
    seconds = realloc_times(actor, scenario.cluster, src, gen, adapters_only=True)[0]
    c = scenario.cluster
    assert seconds == pytest.approx(adapters * 2 / 2 / c.intra_bw + c.intra_latency_s)
    # in the estimator: generation on another layout gets the adapters; the base reference nothing
    est = Estimator(scenario)
    choice = list(est.choice_of({n: next(o for o in est.options[i] if o.label(8).startswith(label))
                                 for i, (n, label) in enumerate(zip(est.call_names, ["n0/dp4tp2pp1m", "n0/dp8tp1pp1m",
                                                                                    "n0/dp8tp1pp1m", "n0/dp4tp1pp2m"]))}))
    e = est.estimate(tuple(choice))
    assert e.calls["actor_gen"].realloc_s == pytest.approx(seconds)
    assert e.calls["ref_inf"].realloc_s == 0.0  # another layout, holding the frozen base since the first step
    # or the adapters merged into the base every step: the base's bytes of a stage over tp (2) each step, and
    # the generation layout's copy is held during its call only, so the peak (training's) drops by it
    options = est.options_of(tuple(choice))
    gen = options["actor_gen"]
    merged = est.choice_of({**options, "actor_gen": Option(gen.mesh, replace(gen.strategy, merge_lora=True))})
    m = est.estimate(merged)
    base_bytes = (32 * actor.layer_params + actor.ends_params(1)) * 2 / 2
    assert m.calls["actor_gen"].realloc_s == pytest.approx(base_bytes / c.intra_bw + c.intra_latency_s)
    assert e.peak_mem_bytes - m.peak_mem_bytes == est.weights[0][merged[0]]
    # (the README's numbers)
    assert (round(base_bytes / 1e9, 1), round(m.calls["actor_gen"].realloc_s, 4), round(seconds, 5)) == (6.7, 0.0148, 0.00009)
    assert round((e.peak_mem_bytes - m.peak_mem_bytes) / 2**30, 1) == 6.3
    assert realloc_times(full, scenario.cluster, src, Layouts.of([est.options_of(tuple(choice))["ref_inf"]], 8))[0] > 0


def test_the_search_chooses_between_a_kept_base_copy_and_merged_weights():
    """The same plan with generation either keeping its base copy (adapters only, every step) or
    receiving merged weights (the base's bytes, held for the call only): the search takes the
    kept copy where it fits (less to move), the merged weights where only they fit (the copy
    held through training is what breaks the device's memory)."""
    from dataclasses import replace

    from realbench.cost import Estimator
    from realbench.plan import Option, get_builtin
    from realbench.search import run_search

    scenario = get_builtin("grpo-7b-lora-8gpu")
    est = Estimator(scenario)
    labels = {"actor_gen": "n0/dp4tp2pp1m1", "reward_inf": "n0/dp8tp1pp1m1", "ref_inf": "n0/dp8tp1pp1m1",
              "actor_train": "n0/dp4tp1pp2m1"}
    only = {n: [next(o for o in est.options[i] if o.label(8) == labels[n])] for i, n in enumerate(est.call_names)}
    gen = only["actor_gen"][0]
    only["actor_gen"].append(Option(gen.mesh, replace(gen.strategy, merge_lora=True)))
    peaks = [Estimator(scenario, only=only).estimate((0, 0, 0, 0) if not merge else (1, 0, 0, 0)).peak_mem_bytes
             for merge in (False, True)]
    assert peaks[1] < peaks[0]
    c = scenario.cluster
    for usable, merged in ((peaks[0] + 2**30, False), ((peaks[0] + peaks[1]) / 2, True)):
        device = c.device.model_copy(update={"memory_bytes": int(usable / c.memory_fraction)})
        est = Estimator(scenario.model_copy(update={"cluster": c.model_copy(update={"device": device})}), only=only)
        found = run_search(est, "exhaustive", 30)
        assert est.options_of(found.best_choice)["actor_gen"].strategy.merge_lora is merged


def test_a_lora_job_goes_to_each_engine_under_its_names_or_is_refused_naming_what_it_lacks(cli, tmp_path):
    """The built-in LoRA job's plan in each engine's space is written with the adapters' settings
    under the engine's names (each engine's own checks: tests/test_engine*.py); what an engine's
    LoRA settings cannot carry is refused by name: rsLoRA, an alpha that is not a whole number."""
    import yaml

    from realbench.engines import ENGINES
    from realbench.plan import get_builtin

    scenario = get_builtin("grpo-7b-lora-8gpu")
    written = {}
    for engine, module in ENGINES.items():
        job = module.job_of(scenario) if engine == "areal" else scenario  # (AReaL scores with a function)
        _, settings = module.to_config(job, module.default_plan(job), {"actor": "ckpt", "reward": "rm"})
        flat = settings if engine == "openrlhf" else {k: v for k, v in _leaves(settings)}
        written[engine] = {k: v for k, v in flat.items() if "lora" in k or "target_modules" in k}
    # verl's space for a LoRA actor: FSDP only (realbench writes its FSDP LoRA), generation merged or not
    groups = list(ENGINES["verl"].plan_groups(scenario))
    assert groups and {o.strategy.zero for g in groups for o in g["actor_train"]} <= {2, 3}
    assert {o.strategy.merge_lora for g in groups for o in g["actor_gen"]} == {False, True}
    targets = list(scenario.models["actor"].lora.target_modules)
    assert written["verl"] == {"actor_rollout_ref.model.lora_rank": 16, "actor_rollout_ref.model.lora_alpha": 32,
                               "actor_rollout_ref.model.target_modules": targets,
                               "actor_rollout_ref.model.lora.merge": False}
    assert written["openrlhf"] == {"ds.lora.rank": 16, "ds.lora.alpha": 32, "ds.lora.target_modules": targets}
    assert written["areal"] == {"actor.use_lora": True, "actor.lora_rank": 16, "actor.lora_alpha": 32,
                                "actor.target_modules": targets, "rollout.use_lora": True,
                                "sglang.enable_lora": True, "sglang.max_lora_rank": 16}
    doc = scenario.to_document()
    for field, value, key in [("use_rslora", True, "models.actor.lora.use_rslora")]:
        bad = yaml.safe_load(yaml.safe_dump(doc))
        bad["models"]["actor"]["lora"][field] = value
        path = tmp_path / f"my lora job ({key}).yaml"
        path.write_text(yaml.safe_dump(bad))
        code, _, err = cli("estimate", "--scenario", path, "--baseline", "symmetric", "--out", tmp_path / "plan.yaml",
                           "--force")
        assert code == 0, err
        code, _, err = cli("export", "--plan", tmp_path / "plan.yaml", "--scenario", path, "--format", "verl", "--out",
                           tmp_path / "verl.yaml")
        assert code == 2 and err.count("\n") == 1 and key in err, err
        assert not (tmp_path / "verl.yaml").exists()
    from realbench.errors import ConfigError
    from realbench.plan.scenario import scenario_from_document

    doc["models"]["actor"]["lora"]["lora_alpha"] = 12.5  # the engines' alpha is an int
    halves = scenario_from_document(doc, "my lora job.yaml")
    with pytest.raises(ConfigError) as e:
        ENGINES["verl"].to_config(halves, ENGINES["verl"].default_plan(halves), {"actor": "ckpt", "reward": "rm"})
    assert e.value.field == "models.actor.lora.lora_alpha" and "12.5: verl takes a whole number" in str(e.value)


def _leaves(node, prefix=""):
    if isinstance(node, dict):
        for k, v in node.items():
            yield from _leaves(v, f"{prefix}{k}.")
    else:
        yield prefix[:-1], node


def test_merged_weights_on_a_call_that_has_none_to_merge_are_refused_by_name(cli, tmp_path):
    """`merge_lora: true` in a plan file: on a train call, on the base-only reference call, and on
    a model without LoRA, one line naming the placement's key (exit 2)."""
    import yaml

    code, _, err = cli("estimate", "--scenario", "grpo-7b-lora-8gpu", "--baseline", "symmetric", "--out",
                       tmp_path / "my plan.yaml")
    assert code == 0, err
    plan = yaml.safe_load((tmp_path / "my plan.yaml").read_text())
    for call, says in (("actor_train", "a train call holds the frozen base"),
                       ("ref_inf", "runs the base alone"), ("reward_inf", "has no LoRA adapters to merge")):
        bad = yaml.safe_load(yaml.safe_dump(plan))
        bad["calls"][call]["merge_lora"] = True
        (tmp_path / "bad plan.yaml").write_text(yaml.safe_dump(bad))
        code, _, err = cli("estimate", "--scenario", "grpo-7b-lora-8gpu", "--plan", tmp_path / "bad plan.yaml")
        assert code == 2 and err.count("\n") == 1 and f"calls.{call}.merge_lora" in err and says in err, (call, err)
    good = yaml.safe_load(yaml.safe_dump(plan))
    good["calls"]["actor_gen"]["merge_lora"] = True
    (tmp_path / "merged plan.yaml").write_text(yaml.safe_dump(good))
    code, _, err = cli("estimate", "--scenario", "grpo-7b-lora-8gpu", "--plan", tmp_path / "merged plan.yaml")
    assert code == 0, err
