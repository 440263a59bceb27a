"""Qwen2.5-VL, Qwen3-VL (dense and MoE) and Qwen3.5 (dense and MoE): a vision tower
(realbench.models.spec.VisionSpec) whose merged patches take the place of a prompt's image tokens
in a Qwen2.5 (biases on q, k, v), Qwen3 (q/k norms, head_dim of its own), Qwen3-MoE or Qwen3.5
decoder (Qwen3-Next's: linear-attention layers between gated full-attention ones; a dense MLP, or
experts with a gated shared one). Priced; realbench's runtime does not compute them.

The language model's keys sit at the top of a Qwen2.5-VL file as the hub publishes it
(transformers 4), in `text_config` in Qwen3-VL's and in what transformers 5 writes: both are
read, the text_config's over the top's. Multimodal rotary positions (MRoPE: `mrope_section`,
`mrope_interleaved`, Qwen2.5-VL's `rope_scaling: {type: mrope}`) split a head's rotary dimensions
over time, height and width: positions only, no shape, so they price as plain rotary embeddings.

Defaults: transformers' Qwen2_5_VLTextConfig / Qwen2_5_VLVisionConfig, Qwen3VLTextConfig /
Qwen3VLVisionConfig, Qwen3VLMoeTextConfig (head_dim hidden / heads where left out) /
Qwen3VLMoeVisionConfig, Qwen3_5TextConfig / Qwen3_5MoeTextConfig (head_dim 256, a quarter of each
head rotating, every fourth layer full attention) / Qwen3_5VisionConfig (Qwen3-VL's tower without
DeepStack mergers).
"""

from __future__ import annotations

from functools import partial

from realbench.errors import ConfigError
from realbench.models.families import Config, Family, refuse_foreign_keys
from realbench.models.families.qwen2 import QWEN2_DEFAULTS, qwen_moe
from realbench.models.families.qwen3 import QWEN3_MOE_DEFAULTS, read_qwen3
from realbench.models.families.qwen3_next import DEFAULTS as QWEN3_NEXT_DEFAULTS
from realbench.models.families.qwen3_next import hybrid_attention

QWEN2_5_VL_TEXT = {**QWEN2_DEFAULTS, "rms_norm_eps": 1e-5, "max_position_embeddings": 32768}
QWEN2_5_VL_VISION = {"depth": 32, "hidden_size": 3584, "hidden_act": "silu", "intermediate_size": 3420,
                     "num_heads": 16, "in_channels": 3, "patch_size": 14, "spatial_merge_size": 2,
                     "temporal_patch_size": 2, "window_size": 112, "out_hidden_size": 3584,
                     "fullatt_block_indexes": [7, 15, 23, 31]}
QWEN3_VL_TEXT = {**QWEN2_DEFAULTS, "head_dim": 128, "max_position_embeddings": 128000, "attention_bias": False}
QWEN3_VL_MOE_TEXT = {**QWEN3_MOE_DEFAULTS, "num_experts": 60, "num_experts_per_tok": 4, "moe_intermediate_size": 1408,
                     "max_position_embeddings": 128000, "attention_bias": False, "head_dim": None,
                     "norm_topk_prob": True}  # (transformers' Qwen3VLMoeTextTopKRouter renormalizes always)
QWEN3_5_TEXT = {**QWEN3_NEXT_DEFAULTS, "max_position_embeddings": 32768, "attention_bias": False}
QWEN3_5_MOE_TEXT = {**QWEN3_5_TEXT, "num_experts": 256, "num_experts_per_tok": 8, "moe_intermediate_size": 512,
                    "shared_expert_intermediate_size": 512, "decoder_sparse_step": 1,
                    "norm_topk_prob": True}  # (transformers' Qwen3_5MoeTopKRouter renormalizes always)
QWEN3_VL_VISION = {"depth": 27, "hidden_size": 1152, "hidden_act": "gelu_pytorch_tanh", "intermediate_size": 4304,
                   "num_heads": 16, "in_channels": 3, "patch_size": 16, "spatial_merge_size": 2,
                   "temporal_patch_size": 2, "out_hidden_size": 3584, "num_position_embeddings": 2304,
                   "deepstack_visual_indexes": [8, 16, 24]}
QWEN3_5_VISION = {**QWEN3_VL_VISION, "deepstack_visual_indexes": []}  # (Qwen3_5VisionConfig has none)


def text_view(raw: dict, forward_tie: bool) -> dict:
    """A VL config as its language model's: text_config's keys over the top ones (architectures,
    model_type, vision_config and tie_word_embeddings kept from the top), MRoPE's rope_scaling
    read as the plain rotary embedding. The head is tied as transformers 5 ties it: by the top
    level's tie_word_embeddings (default false), or, `forward_tie` (Qwen2.5-VL's files of
    transformers 4), by either level's."""
    text = raw.get("text_config") or {}
    if not isinstance(text, dict):
        raise ConfigError(f"{text!r} is not a mapping", "text_config")
    view = {**raw, **text}
    for key in ("architectures", "model_type", "vision_config", "tie_word_embeddings"):
        view.pop(key, None)
        if key in raw:
            view[key] = raw[key]
    inner, outer = bool(text.get("tie_word_embeddings")), bool(raw.get("tie_word_embeddings"))
    if forward_tie:
        view["tie_word_embeddings"] = inner or outer
    elif inner and "tie_word_embeddings" not in raw:
        # (transformers 4 tied this file's head by text_config's setting, transformers 5 unties it)
        raise ConfigError("true under text_config, not at the top: transformers 4 ties this model's head and "
                          "transformers 5 does not; give tie_word_embeddings at the top level too",
                          "text_config.tie_word_embeddings")
    for key in ("rope_scaling", "rope_parameters"):
        section = view.get(key)
        if isinstance(section, dict) and section.get("rope_type", section.get("type")) == "mrope":
            view[key] = {k: v for k, v in section.items() if k not in ("type", "rope_type")} or None
    return view


def moe_text_view(raw: dict) -> dict:
    """Qwen3.5-MoE's language model (text_view): its config has no dense MLP width (every layer's MLP
    is experts), which the spec's dense `ffn` takes from the experts' width (read by no layer)."""
    view = text_view(raw, forward_tie=False)
    view.setdefault("intermediate_size", view.get("moe_intermediate_size", QWEN3_5_MOE_TEXT["moe_intermediate_size"]))
    return view


def read_vision(cfg: Config, defaults: dict, qwen3: bool) -> dict:
    """The vision tower of a VL config's `vision_config` (its family's defaults for keys left out)."""
    raw = cfg.raw.get("vision_config")
    if not isinstance(raw, dict):
        raise cfg.error("vision_config", "missing: a vision-language model's config holds its vision tower's")
    vision = Config({**raw, **({"in_channels": raw["in_chans"]} if "in_chans" in raw and "in_channels" not in raw
                               else {})}, defaults, cfg.source)
    act = vision.get("hidden_act")
    if act != defaults["hidden_act"]:
        raise cfg.error("vision_config.hidden_act", f"activation {act!r} is not priced (this family's vision tower: "
                                                    f"{defaults['hidden_act']})")
    for key in ("patch_size", "temporal_patch_size"):
        if not isinstance(vision.get(key), int):
            raise cfg.error(f"vision_config.{key}", f"{vision.get(key)!r}: realbench prices square patches of one size")
    depth = vision.int("depth")
    fields = {"depth": depth, "hidden": vision.int("hidden_size"), "ffn": vision.int("intermediate_size"),
              "heads": vision.int("num_heads"), "out_hidden": vision.int("out_hidden_size"),
              "patch_size": vision.int("patch_size"), "temporal_patch_size": vision.int("temporal_patch_size"),
              "in_channels": vision.int("in_channels"), "merge": vision.int("spatial_merge_size")}
    if fields["out_hidden"] != cfg.int("hidden_size"):
        raise cfg.error("vision_config.out_hidden_size", f"{fields['out_hidden']}: the merger must give the language "
                                                         f"model's hidden_size {cfg.int('hidden_size')}")
    if qwen3:
        deep = vision.get("deepstack_visual_indexes") or []
        if not isinstance(deep, list) or any(not isinstance(i, int) or not 0 <= i < depth for i in deep):
            raise cfg.error("vision_config.deepstack_visual_indexes", f"{deep!r} is not a list of the {depth} blocks")
        return {**fields, "gated": False, "layer_norm": True, "patch_bias": True,
                "position_embeddings": vision.int("num_position_embeddings"), "deepstack": len(deep)}
    full = vision.get("fullatt_block_indexes") or []
    if not isinstance(full, list) or any(not isinstance(i, int) or not 0 <= i < depth for i in full):
        raise cfg.error("vision_config.fullatt_block_indexes", f"{full!r} is not a list of the {depth} blocks")
    return {**fields, "window": vision.int("window_size"), "full_blocks": len(set(full))}


def read_qwen2_5_vl(cfg: Config) -> dict:
    refuse_foreign_keys(cfg, "Qwen2.5-VL", window=True)
    return {"qkv_bias": True, "vision": read_vision(cfg, QWEN2_5_VL_VISION, qwen3=False)}


def read_qwen3_vl(cfg: Config) -> dict:
    refuse_foreign_keys(cfg, "Qwen3-VL", window=True)
    return {**read_qwen3(cfg), "vision": read_vision(cfg, QWEN3_VL_VISION, qwen3=True)}


def read_qwen3_vl_moe(cfg: Config) -> dict:
    return {**read_qwen3(cfg), "moe": qwen_moe(cfg, shared=False), "vision": read_vision(cfg, QWEN3_VL_VISION, True)}


def read_qwen3_5(cfg: Config) -> dict:
    refuse_foreign_keys(cfg, "Qwen3.5", window=True)
    return {**hybrid_attention(cfg), "vision": read_vision(cfg, QWEN3_5_VISION, qwen3=True)}


def read_qwen3_5_moe(cfg: Config) -> dict:
    return {**hybrid_attention(cfg), "moe": qwen_moe(cfg, shared=True),
            "vision": read_vision(cfg, QWEN3_5_VISION, qwen3=True)}


FAMILIES = (
    Family("qwen2_5_vl", ("Qwen2_5_VLForConditionalGeneration",), QWEN2_5_VL_TEXT, read_qwen2_5_vl,
           view=partial(text_view, forward_tie=True)),
    Family("qwen3_vl", ("Qwen3VLForConditionalGeneration",), QWEN3_VL_TEXT, read_qwen3_vl,
           view=partial(text_view, forward_tie=False)),
    Family("qwen3_vl_moe", ("Qwen3VLMoeForConditionalGeneration",), QWEN3_VL_MOE_TEXT, read_qwen3_vl_moe,
           view=partial(text_view, forward_tie=False)),
    Family("qwen3_5", ("Qwen3_5ForConditionalGeneration",), QWEN3_5_TEXT, read_qwen3_5,
           view=partial(text_view, forward_tie=False)),
    Family("qwen3_5_moe", ("Qwen3_5MoeForConditionalGeneration",), QWEN3_5_MOE_TEXT, read_qwen3_5_moe,
           view=moe_text_view),
)
