"""DeepSeek-V2 and V3 (and the models built on V3: Kimi K2, Moonlight): multi-head latent
attention and a mixture of experts with shared experts after the first `first_k_dense_replace`
dense layers. V3 routes by sigmoid scores with a bias correction, in n_group groups of which each
token's top_k come from the best topk_group (`noaux_tc`); V2 by softmax (`greedy`, or
`group_limited_greedy`). Priced; realbench's runtime does not compute them.

The multi-token-prediction layers a V3 checkpoint carries (num_nextn_predict_layers) are left out,
as transformers and the engines' RL trainers leave them (they are not trained or served in RL).
Defaults: transformers' DeepseekV2Config and DeepseekV3Config.
"""

from __future__ import annotations

from realbench.models.families import Config, Family

V2_DEFAULTS = {"rms_norm_eps": 1e-6, "rope_theta": 10000.0, "tie_word_embeddings": False, "hidden_act": "silu",
               "max_position_embeddings": 2048, "first_k_dense_replace": 0, "kv_lora_rank": 512, "q_lora_rank": 1536,
               "n_routed_experts": 64, "n_shared_experts": 2, "qk_nope_head_dim": 128, "qk_rope_head_dim": 64,
               "routed_scaling_factor": 1.0, "topk_method": "greedy", "norm_topk_prob": False, "v_head_dim": 128,
               "moe_intermediate_size": 1407, "output_router_logits": False, "aux_loss_alpha": 0.001,
               "scoring_func": "softmax", "moe_layer_freq": 1}
V3_DEFAULTS = {**V2_DEFAULTS, "max_position_embeddings": 4096, "n_routed_experts": 256, "n_shared_experts": 1,
               "routed_scaling_factor": 2.5, "n_group": 8, "topk_group": 4, "num_experts_per_tok": 8,
               "first_k_dense_replace": 3, "norm_topk_prob": True, "moe_intermediate_size": 2048,
               "topk_method": "noaux_tc", "scoring_func": "sigmoid"}
# (topk_method, scoring_func) pairs the families route by
ROUTING = {"deepseek_v2": (("greedy", "softmax"), ("group_limited_greedy", "softmax")),
           "deepseek_v3": (("noaux_tc", "sigmoid"),)}


def _read(cfg: Config, version: str) -> dict:
    cfg.refuse_true("attention_bias", "biases in the attention are not priced")
    if cfg.get("moe_layer_freq") != 1:
        raise cfg.error("moe_layer_freq", f"{cfg.get('moe_layer_freq')!r}: a mixture of experts on every layer past "
                                          "first_k_dense_replace is priced (1)")
    method = cfg.only("topk_method", tuple(m for m, _ in ROUTING[version]), "routing")
    scoring = cfg.only("scoring_func", tuple(s for m, s in ROUTING[version] if m == method), "router scoring")
    q_rank = cfg.get("q_lora_rank")
    nope, rope_dim = cfg.int("qk_nope_head_dim"), cfg.int("qk_rope_head_dim")
    n_group = cfg.get("n_group") or 1
    limited = method in ("noaux_tc", "group_limited_greedy")
    aux_key = "aux_loss_alpha" if version == "deepseek_v2" else "router_aux_loss_coef"
    aux = float(cfg.get(aux_key, 0.0) or 0.0) if cfg.flag("output_router_logits") else 0.0
    dense = tuple(range(min(cfg.int("first_k_dense_replace", minimum=0), cfg.int("num_hidden_layers"))))
    return {"head_dim": nope + rope_dim, "n_kv_heads": cfg.int("num_attention_heads"),
            "mla": {"q_lora_rank": q_rank, "kv_lora_rank": cfg.int("kv_lora_rank"), "qk_nope_head_dim": nope,
                    "qk_rope_head_dim": rope_dim, "v_head_dim": cfg.int("v_head_dim")},
            "moe": {"experts": cfg.int("n_routed_experts"), "top_k": cfg.int("num_experts_per_tok"),
                    "expert_ffn": cfg.int("moe_intermediate_size"),
                    "shared_ffn": cfg.int("n_shared_experts", minimum=0) * cfg.int("moe_intermediate_size"),
                    "scoring": scoring, "norm_topk_prob": cfg.flag("norm_topk_prob"),
                    "routed_scaling_factor": cfg.number("routed_scaling_factor"),
                    "n_group": n_group if limited else 1, "topk_group": (cfg.get("topk_group") or 1) if limited else 1,
                    "aux_loss_coef": aux, "dense_layers": dense}}


FAMILIES = (
    Family("deepseek_v2", ("DeepseekV2ForCausalLM", "DeepseekV2ForSequenceClassification"), V2_DEFAULTS,
           lambda cfg: _read(cfg, "deepseek_v2")),
    Family("deepseek_v3", ("DeepseekV3ForCausalLM", "DeepseekV3ForSequenceClassification"), V3_DEFAULTS,
           lambda cfg: _read(cfg, "deepseek_v3")),
    # Kimi K2's config names its own model_type over DeepSeek-V3's architecture and reading
    Family("kimi_k2", ("DeepseekV3ForCausalLM",), V3_DEFAULTS, lambda cfg: _read(cfg, "deepseek_v3")),
)
