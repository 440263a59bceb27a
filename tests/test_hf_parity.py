"""The unsharded model equals transformers' LlamaForCausalLM loaded from a safetensors folder:
logits and gradients, for several rotary bases and norm epsilons, tied and untied embeddings.
And a config the runtime would compute differently is refused by name."""

import json

import pytest
import torch
from safetensors.torch import load_file, save_file

from realbench.errors import ConfigError
from realbench.models.hf import spec_from_folder
from realbench.runtime.checkpoint import load_hf_checkpoint
from realbench.runtime.model import LlamaStage

transformers = pytest.importorskip("transformers")

HF_NAMES = {"embed.weight": "model.embed_tokens.weight", "norm.weight": "model.norm.weight",
            "head.weight": "lm_head.weight"}
LAYER = {"attn_norm": "input_layernorm", "wq": "self_attn.q_proj", "wk": "self_attn.k_proj",
         "wv": "self_attn.v_proj", "wo": "self_attn.o_proj", "ffn_norm": "post_attention_layernorm",
         "w_gate": "mlp.gate_proj", "w_up": "mlp.up_proj", "w_down": "mlp.down_proj"}


def hf_name(ours: str, score: bool = False) -> str:
    if ours in HF_NAMES:
        return "score.weight" if score and ours == "head.weight" else HF_NAMES[ours]
    _, i, part, w = ours.split(".")
    return f"model.layers.{i}.{LAYER[part]}.{w}"


def tiny_llama(path, rope_theta, eps, tied, seed=0):
    cfg = transformers.LlamaConfig(vocab_size=96, hidden_size=64, intermediate_size=160, num_hidden_layers=3,
                                   num_attention_heads=4, num_key_value_heads=2, rms_norm_eps=eps,
                                   rope_theta=rope_theta, max_position_embeddings=256, tie_word_embeddings=tied)
    torch.manual_seed(seed)
    hf = transformers.LlamaForCausalLM(cfg).eval()
    with torch.no_grad():  # norms away from 1, so that a wrong epsilon or a missing norm shows
        for name, p in hf.named_parameters():
            if "norm" in name:
                p.uniform_(0.5, 1.5)
    hf.save_pretrained(path, safe_serialization=True)
    return hf


# LLaMA-2 (10^4, 10^-5, untied), LLaMA-3 1B-like (5 x 10^5, 10^-5, tied), Qwen2-like (10^6,
# 10^-6, tied), LLaMA-1 (10^4, 10^-6, untied)
@pytest.mark.parametrize("rope_theta,eps,tied", [(1e4, 1e-5, False), (5e5, 1e-5, True), (1e6, 1e-6, True),
                                                 (1e4, 1e-6, False)])
def test_logits_and_gradients_match_llama_for_causal_lm(tmp_path, rope_theta, eps, tied):
    hf = tiny_llama(tmp_path, rope_theta, eps, tied)
    assert ("lm_head.weight" in load_file(tmp_path / "model.safetensors")) == (not tied)
    spec, weights = load_hf_checkpoint(tmp_path, name="hf-tiny")
    assert (spec.n_layers, spec.hidden, spec.n_heads, spec.n_kv_heads, spec.ffn, spec.vocab) == (3, 64, 4, 2, 160, 96)
    assert (spec.rope_theta, spec.norm_eps, spec.tie_embeddings) == (rope_theta, eps, tied)
    ours = LlamaStage(spec)
    ours.load_full(weights)
    assert (ours.head.weight is ours.embed.weight) == tied
    tokens = torch.randint(0, 96, (2, 40))  # long enough for the rotary base to matter
    targets = torch.randint(0, 96, (2, 40))
    expected, got = hf(tokens).logits, ours(tokens)
    assert torch.allclose(got, expected, atol=1e-5, rtol=1e-5), float((got - expected).abs().max())
    for model, logits in ((hf, expected), (ours, got)):
        torch.nn.functional.cross_entropy(logits.reshape(-1, 96), targets.reshape(-1)).backward()
    hf_grads = {k: p.grad for k, p in hf.named_parameters()}
    ours_grads = dict(ours.named_parameters())
    assert len(ours_grads) == len(hf_grads) == 3 * 9 + 2 + (not tied)
    for name, p in ours_grads.items():
        g = hf_grads[hf_name(name)]
        assert torch.allclose(p.grad, g, atol=1e-6, rtol=1e-4), (name, float((p.grad - g).abs().max()))


def tiny_hf(path, family, seed=0, **kwargs):
    """A tiny `<family>ForCausalLM` (or any class given as `cls`) saved with save_pretrained."""
    cls = kwargs.pop("cls", f"{family}ForCausalLM")
    cfg = getattr(transformers, f"{family}Config")(vocab_size=96, hidden_size=64, intermediate_size=160,
                                                    num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=2,
                                                    max_position_embeddings=256, **kwargs)
    torch.manual_seed(seed)
    model = getattr(transformers, cls)(cfg).eval()
    with torch.no_grad():  # biases and norms away from their initial 0 and 1, so that each shows
        for name, p in model.named_parameters():
            if "norm" in name or name.endswith("bias"):
                p.uniform_(0.5, 1.5)
    model.save_pretrained(path, safe_serialization=True)
    return model


@pytest.mark.parametrize("family,kwargs", [
    ("Qwen2", dict(tie_word_embeddings=True, rope_theta=1e6, rms_norm_eps=1e-6)),  # q/k/v biases, tied head
    ("Qwen2", dict(tie_word_embeddings=False)),
    ("Mistral", dict(sliding_window=None, rope_theta=1e6)),
])
def test_qwen2_and_mistral_logits_and_gradients(tmp_path, family, kwargs):
    hf = tiny_hf(tmp_path, family, **kwargs)
    spec, weights = load_hf_checkpoint(tmp_path)
    assert spec.qkv_bias == (family == "Qwen2") and spec.tie_embeddings == kwargs.get("tie_word_embeddings", False)
    ours = LlamaStage(spec)
    ours.load_full(weights)
    tokens = torch.randint(0, 96, (2, 40))
    expected, got = hf(tokens).logits, ours(tokens)
    assert torch.allclose(got, expected, atol=1e-5, rtol=1e-5), float((got - expected).abs().max())
    for logits in (expected, got):
        logits.float().pow(2).mean().backward()
    hf_grads = {k: p.grad for k, p in hf.named_parameters()}
    names = dict(ours.named_parameters())
    assert len(names) == len(hf_grads)
    for name, p in names.items():
        assert torch.allclose(p.grad, hf_grads[hf_name(name)], atol=1e-6, rtol=1e-4), name


@pytest.mark.parametrize("family", ["Llama", "Qwen2"])
def test_a_sequence_classification_folder_is_a_value_model(tmp_path, family):
    hf = tiny_hf(tmp_path, family, cls=f"{family}ForSequenceClassification", num_labels=1, pad_token_id=0)
    spec, weights = load_hf_checkpoint(tmp_path)
    assert spec.value_head and not spec.tie_embeddings
    ours = LlamaStage(spec)
    ours.load_full(weights)
    tokens = torch.randint(1, 96, (2, 20))  # no padding: the score is read at the last token
    assert torch.allclose(ours(tokens)[:, -1], hf(tokens).logits[:, 0], atol=1e-5)


def test_a_transformers_4_config_reads_the_same(tmp_path):
    tiny_llama(tmp_path, 5e5, 1e-5, False)
    cfg = json.loads((tmp_path / "config.json").read_text())
    cfg["rope_theta"] = cfg.pop("rope_parameters")["rope_theta"]  # the older layout
    cfg["rope_scaling"] = None
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    spec, _ = load_hf_checkpoint(tmp_path)
    assert spec.rope_theta == 5e5 and spec.norm_eps == 1e-5


def test_not_a_checkpoint_folder(tmp_path):
    with pytest.raises(ConfigError, match="config.json"):
        load_hf_checkpoint(tmp_path)
    with pytest.raises(ConfigError, match="no such folder"):
        load_hf_checkpoint(tmp_path / "nope")


@pytest.mark.parametrize("change,needle", [
    # what realbench does not read at all
    ({"architectures": ["GPT2LMHeadModel"]}, "architecture 'GPT2LMHeadModel' is not supported"),
    ({"rope_parameters": {"rope_type": "llama3", "rope_theta": 5e5, "factor": 8.0}},
     "rope type 'llama3' needs low_freq_factor"),
    ({"rope_scaling": {"type": "su", "factor": 2.0}}, "rope type 'su' is not known"),
    ({"hidden_act": "gelu"}, "activation 'gelu'"),
    ({"mlp_bias": True}, "mlp_bias: True: biases in the MLP are not priced"),
    # another architecture's keys under LLaMA's name (transformers' Llama would ignore them)
    ({"num_local_experts": 8}, "num_local_experts: 8: a mixture-of-experts key"),
    ({"sliding_window": 4096}, "sliding_window: 4096: LLaMA attends to every earlier position"),
    ({"layer_types": ["full_attention", "sliding_attention", "full_attention"]}, "attention kind 'sliding_attention'"),
    # priced, but not computed by the runtime: refused when its weights are loaded
    ({"attention_bias": True}, "the runtime does not compute a bias on the attention output"),
    ({"rope_scaling": {"type": "dynamic", "factor": 2.0}}, "not 'dynamic'"),
    ({"partial_rotary_factor": 0.5}, "the runtime rotates whole heads"),
])
def test_configs_the_runtime_would_compute_differently_are_refused_by_name(tmp_path, change, needle):
    tiny_llama(tmp_path, 1e4, 1e-5, False)
    cfg = json.loads((tmp_path / "config.json").read_text())
    cfg.update(change)
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ConfigError, match=needle.replace("(", r"\(")) as e:
        load_hf_checkpoint(tmp_path)
    assert "config.json" in str(e.value) and "\n" not in str(e.value)


def test_tensors_that_do_not_map_are_refused_by_name(tmp_path):
    tiny_llama(tmp_path, 1e4, 1e-5, False)
    path = tmp_path / "model.safetensors"
    tensors = load_file(path)
    save_file({**tensors, "model.layers.0.self_attn.q_norm.weight": torch.ones(16)}, path)
    with pytest.raises(ConfigError, match="'model.layers.0.self_attn.q_norm.weight' has no counterpart"):
        load_hf_checkpoint(tmp_path)
    save_file({k: v for k, v in tensors.items() if k != "model.layers.2.mlp.up_proj.weight"}, path)
    with pytest.raises(ConfigError, match="1 parameter.s. missing, the first 'layers.2.w_up.weight'"):
        load_hf_checkpoint(tmp_path)
    save_file({**tensors, "model.norm.weight": torch.ones(63)}, path)
    with pytest.raises(ConfigError, match="'model.norm.weight' has shape \\(63,\\)"):
        load_hf_checkpoint(tmp_path)


def test_qwen2_sliding_window_only_when_used(tmp_path):
    """Qwen2's window counts only where layers use it: transformers 4's use_sliding_window from
    max_window_layers on, transformers 5's layer_types (which win where both are written, as
    transformers reads them). Priced either way; the runtime refuses a sliding layer by name."""
    tiny_hf(tmp_path, "Qwen2", use_sliding_window=False, sliding_window=32)  # kept, but unused: fine
    assert load_hf_checkpoint(tmp_path)[0].qkv_bias
    cfg = json.loads((tmp_path / "config.json").read_text())
    cfg.update(use_sliding_window=True, sliding_window=32)  # layer_types (all full) still decide
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    assert not load_hf_checkpoint(tmp_path)[0].layer_types
    for change in ({"layer_types": None, "max_window_layers": 1},  # transformers 4: layers 1 and 2 slide
                   {"layer_types": ["full_attention", "sliding_attention", "sliding_attention"]}):
        (tmp_path / "config.json").write_text(json.dumps({k: v for k, v in {**cfg, **change}.items() if v is not None}))
        spec = spec_from_folder(tmp_path)
        assert spec.layer_types == ("full_attention", "sliding_attention", "sliding_attention")
        assert spec.sliding_window == 32 and spec.attended(100) == (100 + 2 * 32) / 3
        with pytest.raises(ConfigError, match="the runtime computes full attention only, not sliding_attention layers"):
            load_hf_checkpoint(tmp_path)


def test_left_padded_rows_compute_what_they_compute_alone(tmp_path):
    """Padding (id -1) on the left of a row changes nothing at its tokens: the logits equal the
    row's own, unpadded, and transformers' with the attention mask and its position ids."""
    hf = tiny_hf(tmp_path, "Qwen2", tie_word_embeddings=True)
    spec, weights = load_hf_checkpoint(tmp_path)
    ours = LlamaStage(spec)
    ours.load_full(weights)
    torch.manual_seed(1)
    lengths = [12, 7, 3]
    rows = [torch.randint(0, 96, (n,)) for n in lengths]
    batch = torch.full((3, 12), -1)
    for i, r in enumerate(rows):
        batch[i, 12 - len(r):] = r
    valid = batch >= 0
    with torch.no_grad():
        got = ours(batch, valid=valid)
        for i, r in enumerate(rows):
            alone = ours(r[None])[0]
            assert torch.allclose(got[i, 12 - len(r):], alone, atol=1e-5), i
        position_ids = (valid.long().cumsum(1) - 1).clamp(min=0)
        expected = hf(batch.clamp(min=0), attention_mask=valid.long(), position_ids=position_ids).logits
    assert torch.allclose(got[valid], expected[valid], atol=1e-5)
