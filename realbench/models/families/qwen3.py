"""Qwen3 and Qwen3-MoE: LLaMA's computation with an RMSNorm over each query and key head before the
rotary embedding (q_norm, k_norm), a head_dim of its own (128 at every size), no biases; Qwen3-MoE
puts a mixture of experts in every layer's MLP (softmax routing, top-k renormalized where
norm_topk_prob, which every Qwen3-MoE checkpoint sets).

Defaults: transformers' Qwen3Config (head_dim 128) and Qwen3MoeConfig (norm_topk_prob false,
router_aux_loss_coef 0.001 applied only with output_router_logits, decoder_sparse_step 1).
"""

from __future__ import annotations

from realbench.models.families import DENSE_LAYER, QK_NORMS, Config, Family, qwen_window_layers, refuse_foreign_keys
from realbench.models.families.qwen2 import QWEN2_DEFAULTS, qwen_moe

QWEN3_DEFAULTS = {**QWEN2_DEFAULTS, "head_dim": 128}
QWEN3_MOE_DEFAULTS = {**QWEN2_DEFAULTS, "decoder_sparse_step": 1, "num_experts": 128, "norm_topk_prob": False,
                      "output_router_logits": False, "router_aux_loss_coef": 0.001}
# an expert's tensors as the hub's checkpoints list them (model.layers.<i>.mlp.experts.<j>.*)
QWEN_EXPERT = {"gate_proj.weight": "w_gate.weight", "up_proj.weight": "w_up.weight", "down_proj.weight": "w_down.weight"}
QWEN_MOE_LAYER = {**{k: v for k, v in DENSE_LAYER.items() if "bias" not in k}, **QK_NORMS,
                  "mlp.gate.weight": "moe.router.weight"}


def read_qwen3(cfg: Config) -> dict:
    bias = cfg.flag("attention_bias")
    return {"qk_norm": True, "qkv_bias": bias, "o_bias": bias, **qwen_window_layers(cfg)}


def read_qwen3_dense(cfg: Config) -> dict:
    refuse_foreign_keys(cfg, "Qwen3", window=True)
    return read_qwen3(cfg)


def read_qwen3_moe(cfg: Config) -> dict:
    return {**read_qwen3(cfg), "moe": qwen_moe(cfg, shared=False)}


FAMILIES = (
    Family("qwen3", ("Qwen3ForCausalLM", "Qwen3ForSequenceClassification"), QWEN3_DEFAULTS, read_qwen3_dense, runs=True,
           layer_tensors={**{k: v for k, v in DENSE_LAYER.items() if "bias" not in k}, **QK_NORMS}),
    Family("qwen3_moe", ("Qwen3MoeForCausalLM", "Qwen3MoeForSequenceClassification"), QWEN3_MOE_DEFAULTS,
           read_qwen3_moe, runs=True, layer_tensors=QWEN_MOE_LAYER, expert_prefix="mlp.experts",
           expert_tensors=QWEN_EXPERT),
)
