"""What a decoder is, as far as pricing and running it go: `ModelSpec` and its parts.

A spec is read from a Hugging Face config.json (realbench.models.hf, one module per family under
realbench.models.families), from the built-in catalogue (realbench.models.catalogue), or written
by hand. It says the shapes the cost model needs and what changes the function the weights
compute; whether realbench's runtime computes it is `runtime_problem()` (None: it does).

A layer is an attention block and an MLP block, each after an RMSNorm:

    attention    full_attention     grouped-query attention over every earlier position
                 sliding_attention  the same over the last `sliding_window` positions
                 linear_attention   a gated delta rule (Qwen3-Next, Qwen3.5): a fixed state per
                                    sequence in place of a KV cache (`LinearAttentionSpec`)
                 with `mla`, DeepSeek's multi-head latent attention: keys and values from a
                 low-rank latent, which is what the serving engines cache (`MLASpec`)
    MLP          dense              SwiGLU of width `ffn`: W_down (silu(W_gate x) * W_up x)
                 mixture of experts `moe`: a router picks top_k of `experts` SwiGLUs of width
                                    `expert_ffn` for each token, weighted by their router
                                    probabilities; shared experts (always on) beside them;
                                    `moe.dense_layers` keep a dense MLP (DeepSeek's first layers)

Parameters of one layer (h hidden, d head_dim, H heads, K kv heads, E experts of width f_e):

    attention (GQA)   h H d (x2 with an output gate) + 2 h K d + H d h   (+ biases, q/k norms 2 d)
    attention (MLA)   [h q_r + q_r + q_r H (d_n + d_r)  or  h H (d_n + d_r)] + h (c + d_r) + c
                      + c H (d_n + d_v) + H d_v h                      (q_r, c: the low ranks)
    linear attention  h (2 K_l d_k + 2 V_l d_v) + 2 h V_l + conv (2 K_l d_k + V_l d_v) k + 2 V_l
                      + d_v + V_l d_v h
    MLP dense         3 h ffn
    MLP experts       E h (router) + E 3 h f_e + 3 h f_shared (+ h for a shared expert's gate)
    norms             2 h

A token's matmuls touch the router, top_k experts and the shared ones only: `active` counts.
"""

from __future__ import annotations

import math
from functools import lru_cache
from typing import Any, Literal, Optional

import numpy as np
from pydantic import ConfigDict, Field, field_validator, model_validator

from realbench.schema import FileModel

ATTENTION_KINDS = ("full_attention", "sliding_attention", "linear_attention")
AttentionKind = Literal["full_attention", "sliding_attention", "linear_attention"]
# the rotary scalings transformers knows (modeling_rope_utils.ROPE_INIT_FUNCTIONS); the runtime
# computes RUNTIME_ROPE of them
ROPE_TYPES = ("linear", "dynamic", "yarn", "longrope", "llama3")
RUNTIME_ROPE = ("linear", "llama3", "yarn")
DEFAULT_IMBALANCE = 1.25  # realbench.runtime.experts.tiny_model_spread(), measured

# The projections LoRA can adapt, by PEFT's (Hugging Face's) module name: realbench's module, and
# whether tensor parallelism splits its output (column-parallel) or its input (row-parallel).
LORA_MODULES = {"q_proj": ("wq", "column"), "k_proj": ("wk", "column"), "v_proj": ("wv", "column"),
                "o_proj": ("wo", "row"), "gate_proj": ("w_gate", "column"), "up_proj": ("w_up", "column"),
                "down_proj": ("w_down", "row")}
# PEFT's default targets for LLaMA-family models (peft.utils.constants,
# TRANSFORMERS_MODELS_TO_LORA_TARGET_MODULES_MAPPING["llama"]), used when none are given
LORA_DEFAULT_TARGETS = ("q_proj", "v_proj")


class LoraSpec(FileModel):
    """Low-rank adapters on a trained model, in PEFT's names (`peft.LoraConfig`): each targeted
    projection y = W x becomes

        y = W x + (lora_alpha / r) B A x        (lora_alpha / sqrt(r) with use_rslora)

    with A (r x in) and B (out x r) trained and W frozen. A starts as PEFT's (uniform in
    +-1/sqrt(in), Kaiming's with a = sqrt(5)), B at zero, so training starts from the base model.
    `target_modules`: module names of the Hugging Face LLaMA family, or "all-linear" (every
    projection of the decoder layers, as PEFT takes it: not the LM head). Dropout on the
    adapters' input is refused above 0: realbench does not draw it (PEFT's default is 0)."""

    r: int = Field(ge=1)
    lora_alpha: float = Field(default=8.0, gt=0)  # PEFT's default
    lora_dropout: float = 0.0
    target_modules: tuple[str, ...] = LORA_DEFAULT_TARGETS
    bias: Literal["none"] = "none"
    use_rslora: bool = False
    # the PEFT adapter folder the adapters start from (absolute; a checkpoint entry's `adapter:`),
    # None: fresh adapters
    path: Optional[str] = None

    @field_validator("target_modules", mode="before")
    @classmethod
    def _targets(cls, v: Any) -> Any:
        if v == "all-linear":
            return tuple(LORA_MODULES)
        if isinstance(v, str):
            v = [v]
        if not isinstance(v, (list, tuple)) or not v:
            raise ValueError('a list of module names or "all-linear"')
        unknown = [m for m in v if m not in LORA_MODULES]
        if unknown:
            raise ValueError(f"no module {unknown[0]!r} in a LLaMA-family decoder (its modules: "
                             f"{', '.join(LORA_MODULES)}, or all-linear)")
        return tuple(m for m in LORA_MODULES if m in v)  # the architecture's order, once each

    @field_validator("lora_dropout")
    @classmethod
    def _dropout(cls, v: float) -> float:
        if v != 0:
            raise ValueError(f"{v}: realbench trains adapters without dropout (0, PEFT's default); "
                             "it does not draw dropout masks that every layout would repeat")
        return v

    @property
    def scaling(self) -> float:
        return self.lora_alpha / (math.sqrt(self.r) if self.use_rslora else self.r)

    @property
    def modules(self) -> dict[str, str]:
        """{realbench module: "column" or "row"} of the targets."""
        return dict(LORA_MODULES[m] for m in self.target_modules)


# A vision-language model's module names as PEFT matches them (transformers 5: the vision tower
# under model.visual, the decoder under model.language_model; transformers 4: model.layers): what
# an exclusion of the vision tower from LoRA must match, and what it must leave
VISION_MODULES = ("model.visual.blocks.0.attn.qkv", "model.visual.blocks.0.mlp.gate_proj",
                  "model.visual.blocks.0.mlp.linear_fc1", "model.visual.merger.mlp.0", "visual.blocks.0.attn.proj")
DECODER_MODULES = ("model.language_model.layers.0.self_attn.q_proj", "model.language_model.layers.0.mlp.down_proj",
                   "model.layers.0.self_attn.o_proj", "model.layers.0.mlp.up_proj")


def vision_exclusion_problem(exclude: Any) -> Optional[str]:
    """Why PEFT's `exclude_modules` does not keep LoRA off exactly a vision-language model's vision
    tower (realbench adapts the decoder's projections only), or None. A string is a pattern PEFT
    matches whole against each module's name (re.fullmatch); a list of names is refused."""
    import re

    if not isinstance(exclude, str):
        return f"{exclude!r}: realbench reads a pattern (a string, as '.*visual.*'), not a list of modules"
    try:
        pattern = re.compile(exclude)
    except re.error as e:
        return f"{exclude!r} is not a regular expression: {e}"
    kept = [m for m in VISION_MODULES if not pattern.fullmatch(m)]
    if kept:
        return f"{exclude!r} leaves the vision tower's {kept[0]} adapted: realbench prices LoRA on the decoder only"
    hit = [m for m in DECODER_MODULES if pattern.fullmatch(m)]
    if hit:
        return f"{exclude!r} keeps LoRA off the decoder's {hit[0]}, which realbench adapts"
    return None


class RopeScaling(FileModel):
    """A rotary embedding stretched past the positions it was trained on, in transformers' names
    (`rope_parameters` / `rope_scaling`). The runtime computes linear, llama3 (Llama 3.1+) and
    yarn (Qwen3's long context, DeepSeek); every kind prices alike (it changes no shape)."""

    rope_type: Literal["linear", "dynamic", "yarn", "longrope", "llama3"]
    factor: Optional[float] = Field(default=None, gt=0)
    original_max_position_embeddings: Optional[int] = Field(default=None, gt=0)
    low_freq_factor: Optional[float] = None  # llama3
    high_freq_factor: Optional[float] = None  # llama3
    beta_fast: Optional[float] = None  # yarn
    beta_slow: Optional[float] = None  # yarn
    mscale: Optional[float] = None  # yarn (DeepSeek)
    mscale_all_dim: Optional[float] = None  # yarn (DeepSeek)
    attention_factor: Optional[float] = None  # yarn
    truncate: bool = True  # yarn: round the correction range to whole dimensions
    # longrope's per-dimension factors (priced only)
    short_factor: Optional[tuple[float, ...]] = None
    long_factor: Optional[tuple[float, ...]] = None

    @model_validator(mode="after")
    def _complete(self) -> "RopeScaling":
        need = {"linear": ("factor",), "llama3": ("factor", "low_freq_factor", "high_freq_factor",
                                                    "original_max_position_embeddings"),
                "yarn": ("original_max_position_embeddings",), "dynamic": ("factor",), "longrope": ()}
        for key in need[self.rope_type]:
            if getattr(self, key) is None:
                raise ValueError(f"rope type {self.rope_type!r} needs {key}")
        if self.rope_type == "llama3" and not self.high_freq_factor > self.low_freq_factor:
            raise ValueError(f"llama3 rope: high_freq_factor {self.high_freq_factor} must exceed low_freq_factor "
                             f"{self.low_freq_factor}")
        return self


class MoESpec(FileModel):
    """A mixture of experts in place of the dense MLP: a router (a linear map to `experts` scores,
    turned into probabilities by `scoring`) picks `top_k` experts per token, their outputs weighted
    by those probabilities (renormalized to sum to 1 over the picked ones with `norm_topk_prob`,
    then times `routed_scaling_factor`); `shared_ffn` is the width of the shared experts every token
    goes through as well (DeepSeek's n_shared_experts x moe_intermediate_size; Qwen2-MoE's and
    Qwen3-Next's shared_expert_intermediate_size, whose output a sigmoid `shared_gate` scales).
    `aux_loss_coef`: the load-balancing loss (Switch Transformer's, transformers'
    load_balancing_loss_func) added to the language-model loss, where the config turns it on
    (`output_router_logits`); 0 otherwise. `dense_layers`: the layers whose MLP stays dense."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    experts: int = Field(gt=0)
    top_k: int = Field(gt=0)
    expert_ffn: int = Field(gt=0)
    shared_ffn: int = Field(default=0, ge=0)
    shared_gate: bool = False
    scoring: Literal["softmax", "sigmoid"] = "softmax"
    norm_topk_prob: bool = True
    routed_scaling_factor: float = Field(default=1.0, gt=0)
    # DeepSeek-V3's group-limited routing: the experts in n_group groups, each token's top_k picked
    # from its best topk_group groups (priced as plain routing: the router is a sliver of a layer)
    n_group: int = Field(default=1, ge=1)
    topk_group: int = Field(default=1, ge=1)
    router_bias: bool = False  # a bias on the router's scores (gpt-oss; DeepSeek's is a correction, not trained)
    expert_bias: bool = False  # biases on the experts' projections (gpt-oss)
    aux_loss_coef: float = Field(default=0.0, ge=0)
    dense_layers: tuple[int, ...] = ()
    # how unevenly the router spreads tokens over expert-parallel devices: the busiest device's
    # tokens over the mean, which sets an expert-parallel layer's pace (a workload's, not the
    # checkpoint's: a scenario sets it, models.<role>.expert_imbalance). The default is the spread
    # measured on the runtime's tiny Qwen3-MoE, one expert a device (realbench.runtime.experts.
    # tiny_model_spread; a test measures it again)
    imbalance: float = Field(default=DEFAULT_IMBALANCE, ge=1)

    @model_validator(mode="after")
    def _check(self) -> "MoESpec":
        if self.top_k > self.experts:
            raise ValueError(f"top_k {self.top_k} exceeds the {self.experts} experts")
        if self.experts % self.n_group or self.topk_group > self.n_group:
            raise ValueError(f"{self.experts} experts in n_group {self.n_group} groups, topk_group {self.topk_group}")
        return self


class MLASpec(FileModel):
    """DeepSeek's multi-head latent attention (DeepSeek-V2/V3, Kimi K2, Moonlight): queries from
    a rank-`q_lora_rank` latent (None: straight from the hidden state), keys and values from a
    rank-`kv_lora_rank` latent plus a shared rotary key of `qk_rope_head_dim`; a head's query and
    key have qk_nope_head_dim + qk_rope_head_dim dimensions, its value v_head_dim. The serving
    engines cache the latent and the rotary key (kv_lora_rank + qk_rope_head_dim values a token
    and layer), whole on every tensor-parallel rank."""

    q_lora_rank: Optional[int] = Field(default=None, gt=0)
    kv_lora_rank: int = Field(gt=0)
    qk_nope_head_dim: int = Field(gt=0)
    qk_rope_head_dim: int = Field(gt=0)
    v_head_dim: int = Field(gt=0)


class LinearAttentionSpec(FileModel):
    """The gated delta rule of Qwen3-Next and Qwen3.5's linear-attention layers (Gated DeltaNet):
    `key_heads` query/key heads of `key_head_dim`, `value_heads` value heads of `value_head_dim`,
    a causal depthwise convolution of `conv_kernel` over the projected q, k, v. A sequence's state
    is a value_heads x key_head_dim x value_head_dim matrix per layer (and the convolution's last
    conv_kernel - 1 inputs), whatever its length: what the serving engines keep in place of a
    KV cache."""

    key_heads: int = Field(gt=0)
    value_heads: int = Field(gt=0)
    key_head_dim: int = Field(gt=0)
    value_head_dim: int = Field(gt=0)
    conv_kernel: int = Field(default=4, gt=0)

    @property
    def conv_dim(self) -> int:
        return 2 * self.key_heads * self.key_head_dim + self.value_heads * self.value_head_dim

    def params(self, hidden: int) -> int:
        kd, vd, vh = self.key_heads * self.key_head_dim, self.value_heads * self.value_head_dim, self.value_heads
        return (hidden * (2 * kd + 2 * vd) + hidden * 2 * vh + self.conv_dim * self.conv_kernel + 2 * vh
                + self.value_head_dim + vd * hidden)

    def matmul_params(self, hidden: int) -> int:
        kd, vd, vh = self.key_heads * self.key_head_dim, self.value_heads * self.value_head_dim, self.value_heads
        return hidden * (2 * kd + 2 * vd) + hidden * 2 * vh + vd * hidden

    def state_values(self) -> int:
        """Values a sequence's state holds in one layer: the recurrent state and the convolution's."""
        return self.value_heads * self.key_head_dim * self.value_head_dim + self.conv_dim * (self.conv_kernel - 1)


class VisionSpec(FileModel):
    """A vision-language model's vision tower (Qwen2.5-VL's, Qwen3-VL's): the image cut into
    patches of patch_size^2 pixels over temporal_patch_size frames (an image is repeated to fill
    them), each patch a token of a ViT of `depth` blocks (width h, MLP width f, `heads` heads:
    attention, then a SwiGLU (`gated`) or a GELU MLP, each after a norm), and a merger that folds
    `merge` x `merge` neighbouring patches into one token of the language model (an MLP
    4h -> 4h -> out_hidden); Qwen3-VL's `deepstack` mergers do the same for inner blocks' outputs,
    added to the first language-model layers' hidden states. Parameters (C channels, p patch, T
    frames, u = merge^2, g = 3 gated, 2 not):

        patch embedding   C T p^2 h (+ h with a bias)   (+ P h of learnt positions, Qwen3-VL's)
        a block           4 h^2 + 4 h (qkv and output with biases) + g h f + (g - 1) f + h (MLP,
                          biases) + 2 h (RMSNorms) or 4 h (LayerNorms)
        a merger          u h u h + u h + u h out + out, and its norm over h (the last) or u h
                          (a deepstack one): norm weights, and biases under LayerNorm

    Qwen2.5-VL's blocks but `full_blocks` attend within windows of `window` pixels ((window /
    patch)^2 patches); every other block attends over the whole image. `image_tokens` is the
    workload's, not the checkpoint's: the language-model tokens a prompt's images take (summed
    over them; patches: u each), set by a scenario (models.<role>.image_tokens) or an engine's
    import (--image-tokens), None until then (planning refuses a VLM without it)."""

    depth: int = Field(gt=0)
    hidden: int = Field(gt=0)
    ffn: int = Field(gt=0)
    heads: int = Field(gt=0)
    out_hidden: int = Field(gt=0)
    patch_size: int = Field(gt=0)
    temporal_patch_size: int = Field(default=2, gt=0)
    in_channels: int = Field(default=3, gt=0)
    merge: int = Field(default=2, gt=0)  # spatial_merge_size
    gated: bool = True  # SwiGLU (Qwen2.5-VL) or a GELU MLP (Qwen3-VL)
    layer_norm: bool = False  # LayerNorms with biases (Qwen3-VL) or RMSNorms (Qwen2.5-VL)
    patch_bias: bool = False
    position_embeddings: int = Field(default=0, ge=0)  # learnt positions (Qwen3-VL's num_position_embeddings)
    deepstack: int = Field(default=0, ge=0)  # extra mergers (len(deepstack_visual_indexes))
    window: Optional[int] = Field(default=None, gt=0)  # window attention's width in pixels (Qwen2.5-VL)
    full_blocks: int = Field(default=0, ge=0)  # blocks attending over the whole image where windowed
    image_tokens: Optional[int] = Field(default=None, ge=0)

    @property
    def patches_per_token(self) -> int:
        return self.merge * self.merge

    @property
    def block_params(self) -> int:
        h, f, g = self.hidden, self.ffn, 3 if self.gated else 2
        return 4 * h * h + 4 * h + g * h * f + (g - 1) * f + h + (4 if self.layer_norm else 2) * h

    def merger_params(self, deepstack: bool) -> int:
        uh = self.patches_per_token * self.hidden
        norm = (uh if deepstack else self.hidden) * (2 if self.layer_norm else 1)
        return norm + uh * uh + uh + uh * self.out_hidden + self.out_hidden

    @property
    def patches(self) -> int:
        """Patches of a prompt's images (0 without images, or before image_tokens is set)."""
        return (self.image_tokens or 0) * self.patches_per_token

    @property
    def embed_matmul_params(self) -> int:
        """The patch embedding's weight: C T p^2 h (a patch's pixels to the tower's width)."""
        return self.in_channels * self.temporal_patch_size * self.patch_size ** 2 * self.hidden

    @property
    def params(self) -> int:
        h = self.hidden
        return (self.embed_matmul_params + (h if self.patch_bias else 0) + self.position_embeddings * h
                + self.depth * self.block_params + self.merger_params(False) + self.deepstack * self.merger_params(True))

    def matmul_params_per_patch(self) -> float:
        """The matmul parameters a patch goes through: the embedding, every block's projections, its
        share (1/u) of the mergers'."""
        h, u = self.hidden, self.patches_per_token
        merger = (1 + self.deepstack) * (u * h * u * h + u * h * self.out_hidden)
        return self.embed_matmul_params + self.depth * (4 * h * h + (3 if self.gated else 2) * h * self.ffn) + merger / u

    def forward_flops(self, prompts):
        """The tower's forward FLOPs over `prompts` prompts of P patches each: prompts (2 P M + 4 P a h)
        (M: matmul_params_per_patch, a: the patches one attends to in a block, `attended`)."""
        P = self.patches
        return prompts * (2 * P * self.matmul_params_per_patch() + 4 * P * self.attended(P) * self.hidden)

    def attended(self, patches: float) -> float:
        """Patches a patch attends to in a block, on average over the blocks, in an image of `patches`
        patches (bidirectional: all of them; within its window in Qwen2.5-VL's windowed blocks)."""
        if self.window is None:
            return patches
        windowed = min(patches, (self.window / self.patch_size) ** 2)
        return (self.full_blocks * patches + (self.depth - self.full_blocks) * windowed) / self.depth


class ModelSpec(FileModel):
    """Architecture of one decoder. Frozen: specs are values. Everything but the shapes of a
    LLaMA decoder is optional and off by default, so a spec written by hand before the other
    families came still reads as it did."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str
    # the Hugging Face model_type whose computation this is (llama, qwen2, qwen3, qwen3_moe,
    # mixtral, deepseek_v3, qwen3_next, gpt_oss, ...): which tensors it has and what the runtime
    # does with them (realbench.models.families)
    family: str = "llama"
    n_layers: int = Field(gt=0)
    hidden: int = Field(gt=0)
    n_heads: int = Field(gt=0)
    n_kv_heads: int = Field(gt=0)
    # a query/key head's width; left out, hidden / n_heads (Qwen3 sets its own: 128 at any size)
    head_dim: int = Field(default=0, ge=0)
    ffn: int = Field(gt=0)  # the dense MLP's width
    vocab: int = Field(gt=0)
    value_head: bool = False  # critic / reward models end in a scalar head instead of the LM head
    rope_theta: float = Field(default=10000.0, gt=0)  # rotary base period
    rope_scaling: Optional[RopeScaling] = None
    # the share of a head's dimensions that rotate (Qwen3-Next 0.25; 1: all)
    partial_rotary_factor: float = Field(default=1.0, gt=0, le=1)
    norm_eps: float = Field(default=1e-5, gt=0)  # RMSNorm epsilon
    # the LM head is the embedding matrix (Qwen2 small models, Gemma): one tensor when both sit
    # on one pipeline stage, else a copy on the last stage whose gradient is summed with the
    # embedding's (as Megatron does)
    tie_embeddings: bool = False
    qkv_bias: bool = False  # the q, k and v projections have biases (Qwen2)
    o_bias: bool = False  # the attention output projection has a bias (gpt-oss, attention_bias)
    qk_norm: bool = False  # an RMSNorm over each query and key head before the rotary embedding (Qwen3)
    attn_output_gate: bool = False  # the attention output gated by a sigmoid of a second query projection (Qwen3-Next)
    attention_sinks: bool = False  # a learnt per-head logit every query attends to beside the keys (gpt-oss)
    # the kind of each layer's attention (transformers' layer_types); empty: full attention everywhere
    layer_types: tuple[AttentionKind, ...] = ()
    sliding_window: Optional[int] = Field(default=None, gt=0)  # of the sliding_attention layers
    mla: Optional[MLASpec] = None
    linear_attention: Optional[LinearAttentionSpec] = None
    moe: Optional[MoESpec] = None
    # the positions the checkpoint was made for (max_position_embeddings; None: not said), which
    # the serving engines take for a request's context where none is given
    max_positions: Optional[int] = Field(default=None, gt=0)
    # the Hugging Face checkpoint folder the weights come from (absolute), None for random weights
    # or a model read from its config alone (`config_source`: planned and exported, not run)
    path: Optional[str] = None
    # where a config read without its weights came from (a config.json file, a hub id in the
    # local cache, the built-in catalogue's entry), None otherwise: what `run` names refusing it
    config_source: Optional[str] = None
    # low-rank adapters trained on the frozen weights (None: every weight trains)
    lora: Optional[LoraSpec] = None
    # a vision-language model's vision tower, on the first pipeline stage with the embedding
    vision: Optional[VisionSpec] = None

    @model_validator(mode="before")
    @classmethod
    def _default_head_dim(cls, v: Any) -> Any:
        if isinstance(v, dict) and not v.get("head_dim") and isinstance(v.get("hidden"), int) \
                and isinstance(v.get("n_heads"), int) and v["n_heads"] > 0:
            if v["hidden"] % v["n_heads"]:
                raise ValueError(f"hidden {v['hidden']} is not a multiple of n_heads {v['n_heads']} (give head_dim)")
            v = {**v, "head_dim": v["hidden"] // v["n_heads"]}
        return v

    @model_validator(mode="after")
    def _check_shape(self) -> "ModelSpec":
        if self.n_heads % self.n_kv_heads:
            raise ValueError(f"n_heads {self.n_heads} is not a multiple of n_kv_heads {self.n_kv_heads}")
        if self.tie_embeddings and self.value_head:
            raise ValueError("a value head cannot be tied to the embedding")
        if self.layer_types and len(self.layer_types) != self.n_layers:
            raise ValueError(f"layer_types lists {len(self.layer_types)} layers, the model has {self.n_layers}")
        kinds = set(self.layer_types)
        if "sliding_attention" in kinds and self.sliding_window is None:
            raise ValueError("sliding_attention layers need a sliding_window")
        if "linear_attention" in kinds and self.linear_attention is None:
            raise ValueError("linear_attention layers need linear_attention's shapes")
        if self.mla is not None and self.mla.qk_nope_head_dim + self.mla.qk_rope_head_dim != self.head_dim:
            raise ValueError(f"head_dim {self.head_dim} is not MLA's qk_nope_head_dim + qk_rope_head_dim")
        if self.moe is not None and any(not 0 <= i < self.n_layers for i in self.moe.dense_layers):
            raise ValueError(f"moe.dense_layers names a layer outside the {self.n_layers}")
        return self

    def model_copy(self, *, update=None, deep: bool = False):
        """A copy with `update`; where it changes the hidden size or the heads and not head_dim, a
        head width that was derived (hidden / heads) is derived again, as a spec written with the new
        shapes would have it."""
        update = dict(update or {})
        if ({"hidden", "n_heads"} & set(update) and "head_dim" not in update
                and self.head_dim * self.n_heads == self.hidden):
            hidden, heads = update.get("hidden", self.hidden), update.get("n_heads", self.n_heads)
            if hidden % heads == 0:
                update["head_dim"] = hidden // heads
        return super().model_copy(update=update, deep=deep)

    # -- layers -----------------------------------------------------------------------------------
    def attention_kind(self, layer: int) -> str:
        return self.layer_types[layer] if self.layer_types else "full_attention"

    def is_moe_layer(self, layer: int) -> bool:
        return self.moe is not None and layer not in self.moe.dense_layers

    @property
    def v_head_dim(self) -> int:
        return self.mla.v_head_dim if self.mla else self.head_dim

    @property
    def q_width(self) -> int:
        """Query features of a layer: heads x head_dim."""
        return self.n_heads * self.head_dim

    @property
    def kv_width(self) -> int:
        return self.n_kv_heads * self.head_dim

    def attention_params(self, kind: str = "full_attention") -> int:
        h = self.hidden
        if kind == "linear_attention":
            return self.linear_attention.params(h)
        if self.mla is not None:
            m, H = self.mla, self.n_heads
            q = (h * m.q_lora_rank + m.q_lora_rank + m.q_lora_rank * H * self.head_dim) if m.q_lora_rank \
                else h * H * self.head_dim
            kv = h * (m.kv_lora_rank + m.qk_rope_head_dim) + m.kv_lora_rank \
                + m.kv_lora_rank * H * (m.qk_nope_head_dim + m.v_head_dim)
            return q + kv + H * m.v_head_dim * h
        q = self.q_width * (2 if self.attn_output_gate else 1)
        n = h * q + 2 * h * self.kv_width + self.q_width * h
        if self.qkv_bias:
            n += q + 2 * self.kv_width
        return (n + (h if self.o_bias else 0) + (2 * self.head_dim if self.qk_norm else 0)
                + (self.n_heads if self.attention_sinks else 0))

    def attention_matmul_params(self, kind: str = "full_attention") -> int:
        """The attention block's projections (what a token multiplies through)."""
        h = self.hidden
        if kind == "linear_attention":
            return self.linear_attention.matmul_params(h)
        if self.mla is not None:
            m, H = self.mla, self.n_heads
            q = (h * m.q_lora_rank + m.q_lora_rank * H * self.head_dim) if m.q_lora_rank else h * H * self.head_dim
            return q + h * (m.kv_lora_rank + m.qk_rope_head_dim) + m.kv_lora_rank * H * (m.qk_nope_head_dim
                                                                                          + m.v_head_dim) \
                + H * m.v_head_dim * h
        return h * self.q_width * (2 if self.attn_output_gate else 1) + 2 * h * self.kv_width + self.q_width * h

    @property
    def expert_params(self) -> int:
        """One routed expert's parameters: gate, up and down (and their biases, gpt-oss's)."""
        m = self.moe
        return 3 * self.hidden * m.expert_ffn + ((2 * m.expert_ffn + self.hidden) if m.expert_bias else 0)

    def mlp_params(self, moe: bool) -> int:
        """The MLP block's parameters: dense, or router, every routed expert and the shared ones."""
        h = self.hidden
        if not moe:
            return 3 * h * self.ffn
        m = self.moe
        return (h * m.experts + (m.experts if m.router_bias else 0) + m.experts * self.expert_params
                + 3 * h * m.shared_ffn + (h if m.shared_gate else 0))

    def mlp_active_params(self, moe: bool) -> int:
        """The MLP's matmul parameters one token goes through: the router, top_k experts, the shared."""
        h = self.hidden
        if not moe:
            return 3 * h * self.ffn
        m = self.moe
        return h * m.experts + m.top_k * 3 * h * m.expert_ffn + 3 * h * m.shared_ffn + (h if m.shared_gate else 0)

    def routed_params(self, layer: int) -> int:
        """The routed experts' parameters of a layer (what expert parallelism splits); 0 if dense."""
        return self.moe.experts * self.expert_params if self.is_moe_layer(layer) else 0

    def params_of_layer(self, layer: int) -> int:
        return (self.attention_params(self.attention_kind(layer)) + self.mlp_params(self.is_moe_layer(layer))
                + 2 * self.hidden)

    def active_matmul_params_of_layer(self, layer: int) -> int:
        return self.attention_matmul_params(self.attention_kind(layer)) + self.mlp_active_params(self.is_moe_layer(layer))

    # -- per-layer figures as the cost model takes them ---------------------------------------------
    @property
    def uniform(self) -> bool:
        """Every layer alike (full attention, one MLP kind): the per-layer figures are exact."""
        return not self.layer_types and (self.moe is None or not self.moe.dense_layers)

    @property
    def layer_params(self) -> int:
        """Parameters of the largest layer (every layer's, in a uniform model)."""
        return int(_layer_table(self)[0].max())

    @property
    def layer_bias_params(self) -> int:
        return (self.q_width * (2 if self.attn_output_gate else 1) + 2 * self.kv_width) if self.qkv_bias else 0

    @property
    def layer_matmul_params(self) -> float:
        """Matmul parameters a token goes through in a layer, on average over the layers (active
        ones: a mixture of experts' top_k)."""
        return float(_layer_table(self)[2].mean())

    @property
    def embedding_params(self) -> int:
        """The first stage's end: the token embedding, and a vision-language model's vision tower."""
        return self.vocab * self.hidden + (self.vision.params if self.vision else 0)

    @property
    def head_params(self) -> int:
        """The final norm and the output layer, as a last pipeline stage holds them (a tied
        head is a copy of the embedding there)."""
        return self.hidden + (self.hidden if self.value_head else self.vocab * self.hidden)

    def ends_params(self, pp: int) -> int:
        """Embedding, final norm and head on the device that holds both ends (pp == 1), or
        the larger of the two ends when they sit on different stages."""
        if pp > 1:
            return max(self.embedding_params, self.head_params)
        shared = self.vocab * self.hidden if self.tie_embeddings else 0
        return self.embedding_params + self.head_params - shared

    def stage_params(self, pp: int, tp: int = 1, ep: int = 1, etp: int = 0) -> float:
        """Parameters on the most loaded device of a layout: the heaviest pipeline stage's layers
        (their routed experts over ep x etp devices, the rest over tp; etp 0: tp) and the
        embedding and head as `ends_params` counts them, over tp."""
        return sum(self.stage_param_parts(pp, tp, ep, etp))

    def stage_param_parts(self, pp: int, tp: int = 1, ep: int = 1, etp: int = 0) -> tuple[float, float]:
        """`stage_params` in two: (the rest, the routed experts) on the most loaded device."""
        dense = layer_param_prefix(self, "dense")
        routed = layer_param_prefix(self, "routed")
        lo, hi = _stage_edges(self.n_layers, pp)
        on_dense = (dense[hi] - dense[lo]) / tp + (hi - lo) * self.kv_replica_params(tp)
        on_routed = (routed[hi] - routed[lo]) / (ep * (etp or tp))
        j = int(np.argmax(on_dense + on_routed))
        return float(on_dense[j]) + self.ends_params(pp) / tp, float(on_routed[j])

    def in_out(self, module: str) -> tuple[int, int]:
        """(in, out) features of a projection of a decoder layer, by realbench's module name."""
        h, q, kv = self.hidden, self.q_width, self.kv_width
        return {"wq": (h, q), "wk": (h, kv), "wv": (h, kv), "wo": (q, h), "w_gate": (h, self.ffn),
                "w_up": (h, self.ffn), "w_down": (self.ffn, h)}[module]

    @property
    def layer_adapter_params(self) -> int:
        """Adapter parameters of one decoder layer: r (in + out) per targeted projection."""
        if self.lora is None:
            return 0
        return sum(self.lora.r * sum(self.in_out(m)) for m in self.lora.modules)

    @property
    def adapter_params(self) -> int:
        """LoRA adapter parameters of the whole model (0 without LoRA)."""
        return self.n_layers * self.layer_adapter_params

    @property
    def head_out(self) -> int:
        """Width of the output layer (vocabulary, or 1 for a value head)."""
        return 1 if self.value_head else self.vocab

    @property
    def n_params(self) -> int:
        return int(_layer_table(self)[0].sum()) + self.ends_params(1)

    @property
    def active_params(self) -> int:
        """Parameters a token goes through: every layer's attention, norms and active MLP (a mixture
        of experts' router, top_k experts and shared ones), the embedding and the head."""
        idle = sum((self.moe.experts - self.moe.top_k) * self.expert_params
                   for i in range(self.n_layers) if self.is_moe_layer(i))
        return self.n_params - idle

    # -- attention over the context, and what generation caches --------------------------------------
    def attention_flops_per_position(self) -> float:
        """FLOPs a token spends per earlier position it attends to in a layer, on average over the
        layers that attend (scores q.k and the weighted sum of values: 2 H (d_qk + d_v)); linear
        attention layers attend to none (their per-token work is `state_flops`)."""
        return 2.0 * self.n_heads * (self.head_dim + self.v_head_dim)

    def attended(self, context):
        """Positions a token attends to in a layer, on average over the layers, when `context`
        positions are before it: all of them in full attention, at most the window in sliding
        attention, none in linear attention (a number or a numpy array)."""
        if not self.layer_types:
            return context
        n = self.n_layers
        full = sum(k == "full_attention" for k in self.layer_types)
        sliding = sum(k == "sliding_attention" for k in self.layer_types)
        windowed = np.minimum(context, self.sliding_window) if sliding else 0
        return (full * context + sliding * windowed) / n

    def state_flops(self) -> float:
        """FLOPs per token and layer of linear attention's state, on average over the layers: the delta
        rule reads the state with the key (S k) and the query (S q) and adds an outer product to it,
        2 d_k d_v each, a value head: 6 V_l d_k d_v."""
        if self.linear_attention is None:
            return 0.0
        la = self.linear_attention
        share = sum(k == "linear_attention" for k in self.layer_types) / self.n_layers
        return share * 6.0 * la.value_heads * la.key_head_dim * la.value_head_dim

    def kv_shards(self, tp: int) -> int:
        """The distinct slices of the KV heads over tp devices: tp where it divides the KV heads; the
        KV heads where tp is a multiple of them, each head replicated on tp / n_kv_heads devices (vLLM's
        and SGLang's tensor parallelism beyond the KV heads: Qwen3-235B-A22B's 4 over 8 GPUs; a
        generation's, or a served forward's, plan.options.heads_split)."""
        return min(tp, self.n_kv_heads)

    def kv_replica_params(self, tp: int) -> float:
        """Parameters a device holds beyond its 1/tp share of a layer, on average over the layers,
        where tp exceeds the KV heads: the key and value projections of its replicated head
        (2 h kv_width / kv_shards against / tp, in the full- and sliding-attention layers; MLA's
        latent has no KV heads to replicate)."""
        if self.mla is not None or tp <= self.n_kv_heads:
            return 0.0
        kv = 2 * self.hidden * self.kv_width + (2 * self.kv_width if self.qkv_bias else 0)
        share = 1 - sum(k == "linear_attention" for k in self.layer_types) / self.n_layers
        return share * kv * (1 / self.kv_shards(tp) - 1 / tp)

    @property
    def kv_split_by_tp(self) -> bool:
        """Whether tensor parallelism splits the KV cache: per KV head, yes; MLA's latent, cached
        whole on every rank, no."""
        return self.mla is None

    def kv_bytes_per_token_layer(self, bytes_per_value: int = 2) -> float:
        """KV-cache bytes one token adds in one layer, on average over the layers that cache by
        token (keys and values; MLA's latent and rotary key). Linear attention's fixed state is
        `state_bytes_per_layer`, a sliding window's cap is `cached_tokens`."""
        if self.mla is not None:
            return float((self.mla.kv_lora_rank + self.mla.qk_rope_head_dim) * bytes_per_value)
        return float(2 * self.n_kv_heads * self.head_dim * bytes_per_value)

    def cached_tokens(self, context):
        """Tokens a sequence of `context` tokens holds in the KV cache of a layer, on average over
        the layers (a sliding window holds its last `sliding_window`, linear attention none)."""
        return self.attended(context)

    def state_bytes_per_layer(self, bytes_per_value: int = 2) -> float:
        """A sequence's fixed state in a layer, on average over the layers (linear attention's)."""
        if self.linear_attention is None:
            return 0.0
        share = sum(k == "linear_attention" for k in self.layer_types) / self.n_layers
        return share * self.linear_attention.state_values() * bytes_per_value

    def sequence_cache_bytes(self, context, layers: float, tp: int, bytes_per_value: int = 2):
        """Bytes a sequence of `context` tokens holds in a device's cache over `layers` layers of a
        layout of tensor parallelism tp: its keys and values (a sliding window's last ones, MLA's
        latent whole on every rank) and linear attention's state."""
        div = self.kv_shards(tp) if self.kv_split_by_tp else 1
        per_layer = (self.cached_tokens(context) * self.kv_bytes_per_token_layer(bytes_per_value) / div
                     + self.state_bytes_per_layer(bytes_per_value) / tp)
        return layers * per_layer

    # -- variants ------------------------------------------------------------------------------------
    def with_value_head(self, value_head: bool = True) -> "ModelSpec":
        """The same decoder ending in a fresh scalar head (a critic or reward model started from
        a language model): a tied LM head does not carry over."""
        return self.model_copy(update={"value_head": value_head,
                                       "tie_embeddings": self.tie_embeddings and not value_head})

    def with_layers(self, n_layers: int) -> "ModelSpec":
        """The first `n_layers` layers of this decoder (a profile's one-layer model, say)."""
        update: dict[str, Any] = {"n_layers": n_layers}
        if self.layer_types:
            update["layer_types"] = self.layer_types[:n_layers] + self.layer_types[-1:] * max(0, n_layers
                                                                                              - self.n_layers)
        if self.moe is not None and self.moe.dense_layers:
            update["moe"] = self.moe.model_copy(update={"dense_layers": tuple(i for i in self.moe.dense_layers
                                                                              if i < n_layers)})
        return self.model_copy(update=update)

    # -- what realbench's runtime computes -----------------------------------------------------------
    def runtime_problem(self) -> Optional[str]:
        """Why realbench's runtime does not compute this model (it is still priced, searched and
        exported for the engines), or None. Named by what it lacks."""
        from realbench.models.families import runtime_problem

        return runtime_problem(self)


@lru_cache(maxsize=256)
def _layer_table(model: ModelSpec) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per layer: (parameters, routed experts' parameters, active matmul parameters)."""
    n = model.n_layers
    params = np.array([model.params_of_layer(i) for i in range(n)], dtype=np.float64)
    routed = np.array([model.routed_params(i) for i in range(n)], dtype=np.float64)
    active = np.array([model.active_matmul_params_of_layer(i) for i in range(n)], dtype=np.float64)
    return params, routed, active


def stage_start(n_layers: int, pp: int, stage: int) -> int:
    """The first layer of pipeline stage `stage` of `pp` (stage pp: n_layers): the first
    n_layers % pp stages take one layer more, so stage s starts at s * (n_layers // pp) +
    min(s, n_layers % pp). The one split that the cost model and the runtime share. `pp` and
    `stage` may also be numpy arrays (the simulator splits thousands of layouts at once)."""
    per, extra = n_layers // pp, n_layers % pp
    if isinstance(stage, int) and isinstance(extra, int):
        return stage * per + min(stage, extra)
    return stage * per + np.minimum(stage, extra)


def stage_bounds(n_layers: int, pp: int, stage: int) -> tuple[int, int]:
    """Layer range [lo, hi) of pipeline stage `stage` of `pp` (see `stage_start`)."""
    return stage_start(n_layers, pp, stage), stage_start(n_layers, pp, stage + 1)


@lru_cache(maxsize=1024)
def _stage_edges(n_layers: int, pp: int) -> tuple[np.ndarray, np.ndarray]:
    """([lo], [hi]) layer bounds of every stage of pp."""
    bounds = np.array([stage_bounds(n_layers, pp, j) for j in range(pp)], dtype=np.int64)
    return bounds[:, 0], bounds[:, 1]


def layer_param_prefix(model: ModelSpec, part: str = "params") -> np.ndarray:
    """Running sums over the layers (length n_layers + 1) of their parameters (`params`), their
    routed experts' (`routed`) or the rest (`dense`): a stage's [lo, hi) is prefix[hi] - prefix[lo]."""
    params, routed, _ = _layer_table(model)
    values = {"params": params, "routed": routed, "dense": params - routed}[part]
    return np.concatenate([[0.0], np.cumsum(values)])
