"""Vision-language models (Qwen2.5-VL, Qwen3-VL dense and MoE): read from config.json alone, their
parameters counted as transformers builds them, their vision tower priced from the image tokens
a prompt holds (a scenario's models.<role>.image_tokens, import's --image-tokens), planned and
exported for the engines, refused by run."""

from __future__ import annotations

import json
import os

import pytest
import yaml

from realbench.cost.calls import _vision_activation_bytes
from realbench.errors import ConfigError
from realbench.models import VisionSpec, catalogue
from realbench.models.hf import spec_from_config
from realbench.models.spec import vision_exclusion_problem
from test_engine_areal import GSM8K_GRPO

# The published checkpoints' parameter counts (their safetensors' totals: ModelScope's model_size
# and the checkpoints' own weight statistics, catalogue/index.yaml), exact
PUBLISHED = {"qwen2.5-vl-3b": 3_754_622_976, "qwen2.5-vl-7b": 8_292_166_656, "qwen3-vl-2b": 2_127_532_032,
             "qwen3-vl-8b": 8_767_123_696, "qwen3-vl-30b-a3b": 31_070_754_032, "qwen3-vl-32b": 33_357_390_064,
             # Qwen3.5's checkpoints hold a multi-token-prediction layer too (mtp.*), which transformers does
             # not build and realbench leaves out: the published totals less those (index.yaml's sources)
             "qwen3.5-0.8b": 873_438_784 - 20_452_864, "qwen3.5-2b": 2_274_069_824 - 60_828_160,
             "qwen3.5-4b": 4_659_865_088 - 120_599_552, "qwen3.5-9b": 9_653_104_368 - 243_290_624,
             "qwen3.5-27b": 27_781_427_952 - 424_699_392, "qwen3.5-35b-a3b": 35_951_822_704 - 844_640_768}


@pytest.mark.parametrize("name", sorted(PUBLISHED))
def test_catalogue_vlms_count_the_published_parameters(name):
    spec = spec_from_config(catalogue.config(name), name)
    assert spec.n_params == PUBLISHED[name]
    assert spec.vision is not None and spec.runtime_problem()


def test_qwen3_vl_2b_vision_tower_by_hand():
    # 24 blocks of h 1024, f 4096 (GELU MLP, LayerNorms, biases), 16x16x2 RGB patches with a bias, 2304
    # learnt positions, a merger 4096 -> 4096 -> 2048 (LayerNorm over 1024) and three deepstack ones
    # (LayerNorm over 4096): 406,957,056, as the checkpoint's vision tensors sum (catalogue/index.yaml)
    h, f, out, u = 1024, 4096, 2048, 4
    block = 4 * h * h + 4 * h + 2 * h * f + f + h + 4 * h
    merger = u * h * u * h + u * h + u * h * out + out
    tower = 3 * 2 * 16 * 16 * h + h + 2304 * h + 24 * block + (2 * h + merger) + 3 * (2 * u * h + merger)
    assert spec_from_config(catalogue.config("qwen3-vl-2b"), "x").vision.params == tower == 406_957_056


@pytest.fixture(scope="module")
def tiny_configs():
    """Tiny random configs of each family as transformers 5 writes them, and its parameter counts."""
    import torch
    from transformers import (Qwen2_5_VLConfig, Qwen2_5_VLForConditionalGeneration, Qwen3_5Config,
                              Qwen3_5ForConditionalGeneration, Qwen3_5MoeConfig, Qwen3_5MoeForConditionalGeneration,
                              Qwen3VLConfig, Qwen3VLForConditionalGeneration, Qwen3VLMoeConfig,
                              Qwen3VLMoeForConditionalGeneration)

    text = dict(hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                vocab_size=300, bos_token_id=1, eos_token_id=2)
    vision = dict(depth=3, hidden_size=32, intermediate_size=48, num_heads=2, out_hidden_size=64)
    hybrid = dict(num_hidden_layers=4, head_dim=16, linear_key_head_dim=8, linear_value_head_dim=8,
                  linear_num_key_heads=2, linear_num_value_heads=4)
    cases = {"qwen2_5_vl": (Qwen2_5_VLConfig, Qwen2_5_VLForConditionalGeneration,
                            dict(text_config=text, vision_config={**vision, "fullatt_block_indexes": [1]})),
             "qwen3_vl": (Qwen3VLConfig, Qwen3VLForConditionalGeneration,
                          dict(text_config={**text, "head_dim": 16},
                               vision_config={**vision, "deepstack_visual_indexes": [0, 2], "num_position_embeddings": 64})),
             "qwen3_vl_moe": (Qwen3VLMoeConfig, Qwen3VLMoeForConditionalGeneration,
                              dict(text_config={**text, "num_experts": 4, "num_experts_per_tok": 2,
                                                "moe_intermediate_size": 32},
                                   vision_config={**vision, "deepstack_visual_indexes": [1],
                                                  "num_position_embeddings": 64})),
             # Qwen3.5: Qwen3-Next's layers (three linear-attention ones to a gated full-attention one)
             "qwen3_5": (Qwen3_5Config, Qwen3_5ForConditionalGeneration,
                         dict(text_config={**text, **hybrid}, vision_config={**vision, "num_position_embeddings": 64})),
             "qwen3_5_moe": (Qwen3_5MoeConfig, Qwen3_5MoeForConditionalGeneration,
                             dict(text_config={**text, **hybrid, "num_experts": 4, "num_experts_per_tok": 2,
                                               "moe_intermediate_size": 32, "shared_expert_intermediate_size": 40},
                                  vision_config={**vision, "num_position_embeddings": 64}))}
    out = {}
    for name, (config_class, model_class, kwargs) in cases.items():
        config = config_class(**kwargs)
        with torch.device("meta"):
            model = model_class(config)
        raw = {**config.to_dict(), "architectures": [model_class.__name__]}
        out[name] = (raw, sum(p.numel() for p in model.parameters()))
    return out


@pytest.mark.parametrize("family", ["qwen2_5_vl", "qwen3_vl", "qwen3_vl_moe", "qwen3_5", "qwen3_5_moe"])
def test_parameters_equal_transformers_on_tiny_configs(tiny_configs, family):
    raw, count = tiny_configs[family]
    spec = spec_from_config(raw, family)
    assert spec.family == family and spec.n_params == count
    if family.startswith("qwen3_5"):  # (a quarter of each head rotates; every fourth layer attends to all)
        assert spec.layer_types == ("linear_attention",) * 3 + ("full_attention",)
        assert spec.partial_rotary_factor == 0.25 and spec.attn_output_gate and not spec.vision.deepstack


def test_qwen2_5_vl_file_of_transformers_4_reads_its_text_keys_at_the_top():
    raw = catalogue.config("qwen2.5-vl-7b")
    assert "text_config" not in raw and raw["rope_scaling"]["type"] == "mrope"
    spec = spec_from_config(raw, "x")
    assert (spec.n_layers, spec.hidden, spec.qkv_bias, spec.rope_scaling) == (28, 3584, True, None)
    assert (spec.vision.window, spec.vision.full_blocks, spec.vision.in_channels) == (112, 4, 3)


@pytest.mark.parametrize("edit, field", [
    (lambda c: c["vision_config"].update(hidden_act="relu"), "vision_config.hidden_act"),
    (lambda c: c["vision_config"].update(out_hidden_size=1024), "vision_config.out_hidden_size"),
    (lambda c: c.pop("vision_config"), "vision_config"),
    (lambda c: c.pop("tie_word_embeddings"), "text_config.tie_word_embeddings"),
])
def test_a_vl_config_it_cannot_price_is_refused_by_name(edit, field):
    raw = catalogue.config("qwen3-vl-2b")
    edit(raw)
    with pytest.raises(ConfigError) as e:
        spec_from_config(raw, "x", source="config.json")
    assert e.value.field == field


def test_vision_flops_by_hand():
    # 3 RGB frames-of-2 patches of 2x2 pixels into h 4: 96 a patch; two blocks of 4 h^2 + 3 h f (SwiGLU,
    # f 6): 272; the merger's (16 x 16 + 16 x 8) / 4 patches: 96. Three image tokens: 12 patches, each
    # attending to all 12: 2 x 12 x 464 + 4 x 12 x 12 x 4 = 13,440 FLOPs a prompt
    v = VisionSpec(depth=2, hidden=4, ffn=6, heads=1, out_hidden=8, patch_size=2, image_tokens=3)
    assert v.matmul_params_per_patch() == 464
    assert v.patches == 12 and v.forward_flops(1) == 13_440 and v.forward_flops(5) == 5 * 13_440
    # Qwen2.5-VL's windows: 112 px over 14 px patches hold 64; 4 of 32 blocks attend to the whole image
    windowed = VisionSpec(depth=32, hidden=4, ffn=6, heads=1, out_hidden=8, patch_size=14, window=112, full_blocks=4)
    assert windowed.attended(1024) == (4 * 1024 + 28 * 64) / 32
    assert windowed.attended(16) == 16  # (a small image: one window)


def test_vision_activations_by_hand():
    # 2 prompts of 12 patches, h 4, f 6 gated, tp 2: a block keeps 24 (10 x 4 + (8 x 4 + 6 x 6) / 2) bytes
    v = VisionSpec(depth=2, hidden=4, ffn=6, heads=1, out_hidden=8, patch_size=2, image_tokens=3)
    model = spec_from_config(catalogue.config("qwen3-vl-2b"), "x").model_copy(update={"vision": v})
    block = 24 * (40 + 68 / 2)
    assert _vision_activation_bytes(model, 2, 2, recompute=False) == 2 * block
    assert _vision_activation_bytes(model, 2, 2, recompute=True) == 24 * 4 * 2 * 2 + block


@pytest.mark.parametrize("exclude, problem", [
    (".*visual.*", None), ("model\\.visual\\..*", "leaves"), (".*", "decoder"), (".*merger.*", "leaves"),
    (["visual"], "not a list"), ("(", "regular expression")])
def test_lora_exclusion_of_the_vision_tower(exclude, problem):
    found = vision_exclusion_problem(exclude)
    assert (found is None) if problem is None else (problem in found)


def scenario_text(actor: str) -> str:
    return f"""schema: realbench.scenario/1
name: my vl job
cluster: {{nodes: 1, gpus_per_node: 8, device: h100}}
models:
  actor: {actor}
  ref: {actor}
  reward: {{arch: qwen3-1.7b, value_head: true}}
dataflow: {{algorithm: grpo, prompts: 64, prompt_len: 1024, gen_len: 2048, group_size: 8}}
"""


def test_image_tokens_price_the_vision_tower_and_are_checked(cli, tmp_path):
    times = {}
    for tokens in (0, 1000):
        (tmp_path / f"vl {tokens}.yaml").write_text(scenario_text(f"{{path: qwen3-vl-8b, image_tokens: {tokens}}}"))
        code, out, err = cli("estimate", "--scenario", tmp_path / f"vl {tokens}.yaml", "--baseline", "heuristic",
                             "--json")
        assert code == 0, err
        times[tokens] = json.loads(out)["calls"]
    # generation encodes every prompt's images; the reference and the actor's training may sit on pipeline
    # stages whose busiest is the head's, not the vision tower's first one (then as without images)
    assert times[1000]["actor_gen"]["time_s"] > times[0]["actor_gen"]["time_s"]
    for call in ("ref_inf", "actor_train"):
        assert times[1000][call]["time_s"] >= times[0][call]["time_s"], call
    assert times[1000]["reward_inf"]["time_s"] == times[0]["reward_inf"]["time_s"]  # (the reward model reads no images)
    for actor, words in [("qwen3-vl-8b", "say how many image tokens"),
                         ("{path: qwen3-vl-8b, image_tokens: 2000}", "do not fit a prompt of 1024"),
                         ("{path: qwen3-8b, image_tokens: 10}", "no vision tower"),
                         ("{path: qwen3-vl-8b, image_tokens: -1}", "a whole number")]:
        (tmp_path / "bad.yaml").write_text(scenario_text(actor))
        code, out, err = cli("estimate", "--scenario", tmp_path / "bad.yaml", "--baseline", "heuristic")
        assert code == 2 and words in err and len(err.strip().splitlines()) == 1, err


def test_run_refuses_a_vlm_by_name(cli, tmp_path):
    (tmp_path / "vl.yaml").write_text(scenario_text("{path: qwen3-vl-2b, image_tokens: 64}"))
    code, _, err = cli("estimate", "--scenario", tmp_path / "vl.yaml", "--baseline", "heuristic",
                       "--out", tmp_path / "plan.yaml")
    assert code == 0, err
    code, _, err = cli("run", "--scenario", tmp_path / "vl.yaml", "--plan", tmp_path / "plan.yaml", "--nproc", "8",
                       "--steps", "1")
    assert code == 2 and "does not compute qwen3_vl models" in err and len(err.strip().splitlines()) == 1, err


@pytest.fixture
def vl_job(tmp_path):
    """A user's AReaL job of geometry3k's shape: Qwen2.5-VL-3B (its hub id, the catalogue's config),
    SGLang taking images."""
    folder = tmp_path / "my vl job"
    folder.mkdir()
    text = GSM8K_GRPO.replace("  path: ckpt\n", "  path: Qwen/Qwen2.5-VL-3B-Instruct\n") \
        .replace("sglang:\n", "sglang:\n  enable_multimodal: true\n")
    (folder / "geo3k grpo.yaml").write_text(text)
    return folder


def test_areal_import_of_a_vlm_takes_the_image_tokens(cli, vl_job):
    config = vl_job / "geo3k grpo.yaml"
    code, _, err = cli("import", "areal", config, "--out", vl_job / "out")
    assert code == 2 and "--image-tokens N" in err and not (vl_job / "out").exists(), err
    code, out, err = cli("import", "areal", config, "--out", vl_job / "out", "--image-tokens", "300", "--json")
    assert code == 0, err
    scenario = yaml.safe_load((vl_job / "out" / "geo3k grpo.yaml").read_text())
    assert scenario["models"]["actor"]["image_tokens"] == 300
    assert scenario["engine_settings"]["sglang.enable_multimodal"] is True
    code, _, err = cli("export", "--format", "areal", "--plan", vl_job / "out" / "geo3k grpo-plan.yaml",
                       "--out", vl_job / "written.yaml", "--model-path", "actor=Qwen/Qwen2.5-VL-3B-Instruct")
    assert code == 0, err
    written = yaml.safe_load((vl_job / "written.yaml").read_text())
    assert written["sglang"]["enable_multimodal"] is True


def test_image_tokens_for_a_language_model_job_are_refused(cli, tmp_path):
    from realbench.examples import save_model

    save_model(tmp_path / "ckpt", max_position_embeddings=32_768)
    (tmp_path / "job.yaml").write_text(GSM8K_GRPO)
    import os

    os.chdir(tmp_path)
    code, _, err = cli("import", "areal", "job.yaml", "--out", "out", "--image-tokens", "64")
    assert code == 2 and "no model of this job is a vision-language model" in err, err


def test_verl_lora_on_a_vlm_keeps_the_vision_tower_off(cli, tmp_path):
    """verl's LoRA on Qwen2.5-VL (its tuning/lora example's shape): PEFT's all-linear would adapt the
    vision tower too, which realbench does not price, so exclude_modules must keep it off; with
    '.*visual.*' the job prices and the written configuration keeps it off again."""
    from test_engines import BUILTIN_SCORER, GRPO, LORA

    os.chdir(tmp_path)
    (tmp_path / "vl lora.yaml").write_text(GRPO)
    model = ("actor_rollout_ref.model.path=Qwen/Qwen2.5-VL-7B-Instruct", BUILTIN_SCORER)
    code, _, err = cli("import", "verl", "vl lora.yaml", *model, *LORA, "--out", "refused", "--image-tokens", "32")
    assert code == 2 and "exclude_modules: None: PEFT then adapts the vision tower" in err, err
    assert not (tmp_path / "refused").exists()
    keep_off = "actor_rollout_ref.model.exclude_modules=.*visual.*"
    code, _, err = cli("import", "verl", "vl lora.yaml", *model, "--out", "refused", "--image-tokens", "32")
    assert code == 0, err  # (a whole actor: nothing to keep off)
    code, _, err = cli("import", "verl", "vl lora.yaml", *model, keep_off, "--out", "refused2", "--image-tokens", "32")
    assert code == 2 and "without LoRA" in err, err
    code, out, err = cli("import", "verl", "vl lora.yaml", *model, *LORA, keep_off, "--out", "plans",
                         "--image-tokens", "32", "--json")
    assert code == 0, err
    plan = json.loads(out)["plan"]
    code, _, err = cli("export", "--plan", plan, "--format", "verl", "--out", tmp_path / "written.yaml",
                       "--model-path", "actor=Qwen/Qwen2.5-VL-7B-Instruct")
    assert code == 0, err
    assert "exclude_modules: .*visual.*" in (tmp_path / "written.yaml").read_text()


def test_the_workbench_opens_a_vlm_job_with_its_image_tokens(vl_job):
    """The Engine tab takes the image tokens as import does: without them a vision-language job is
    refused inline, with them it opens; a value that is not a whole number is refused inline."""
    from realbench.widgets import Workbench

    os.chdir(vl_job)
    wb = Workbench("ppo-tiny-cpu", budget_s=1)
    e = wb.engine
    e.engine_box.value, e.file_box.value, e.out_box.value = "areal", "geo3k grpo.yaml", "from the lab"
    assert not e.open() and "--image-tokens N" in e.status.value
    e.images_box.value = "many"
    assert not e.open() and "image tokens: &#x27;many&#x27;: a whole number" in e.status.value
    e.images_box.value = "300"
    assert e.open(), e.status.value
    assert wb.editor.scenario.models["actor"].vision.image_tokens == 300


def test_the_built_in_vlm_scenario_says_its_image_tokens():
    from realbench.plan.builtin import get_builtin

    scenario = get_builtin("grpo-qwen2.5-vl-7b-8gpu")
    assert scenario.summary()["models"]["actor"] == "qwen2.5-vl-7b (256 image tokens a prompt)"
    assert scenario.models["ref"].vision.image_tokens == 256 and scenario.models["reward"].vision is None


def test_a_ulysses_group_encodes_its_micro_batchs_images_whole_on_every_device():
    """dp 4 x sp 2 against dp 8, 8 micro-batches of 512 rows (tests/test_cost.py's Ulysses case, on
    Qwen2.5-VL-7B): a device of a Ulysses group runs half of its 16-row micro-batch's tokens through
    the decoder, as dp 8's device runs its 8 rows, but the vision tower over all 16 rows' images
    (verl slices the sequence after the tower): twice dp 8's vision seconds (within the matmul
    efficiency's gain on twice the rows), the rest alike."""
    from realbench.cost import call_cost
    from realbench.dataflow import CallDef
    from realbench.hardware import cluster
    from realbench.plan import Mesh, Option, Strategy

    h100, mesh = cluster(1, 8, "h100"), Mesh(0, 1, 0, 8)
    base = spec_from_config(catalogue.config("qwen2.5-vl-7b"), "vl")
    ref = CallDef(name="r", model="m", kind="inference", seqs=512, seq_len=1024)

    def seconds(tokens: int, strategy) -> float:
        model = base.model_copy(update={"vision": base.vision.model_copy(update={"image_tokens": tokens})})
        return call_cost(ref, model, h100, Option(mesh, strategy)).compute_s

    flat, split = Strategy(8, 1, 1, 8, zero=3), Strategy(4, 1, 1, 8, zero=3, sp=2)
    assert seconds(0, split) == pytest.approx(seconds(0, flat), rel=1e-12)
    vision_flat, vision_split = seconds(256, flat) - seconds(0, flat), seconds(256, split) - seconds(0, split)
    assert vision_flat > 0 and vision_split == pytest.approx(2 * vision_flat, rel=0.05)
