"""The unsharded model equals transformers' LlamaForCausalLM, loaded from a safetensors folder."""

import pytest
import torch

from realbench.runtime.checkpoint import load_hf_llama
from realbench.runtime.model import LlamaStage

transformers = pytest.importorskip("transformers")


def test_logits_match_llama_for_causal_lm(tmp_path):
    cfg = transformers.LlamaConfig(vocab_size=96, hidden_size=64, intermediate_size=160, num_hidden_layers=3,
                                   num_attention_heads=4, num_key_value_heads=2, rms_norm_eps=1e-5,
                                   rope_theta=10000.0, max_position_embeddings=64, tie_word_embeddings=False)
    torch.manual_seed(0)
    hf = transformers.LlamaForCausalLM(cfg).eval()
    hf.save_pretrained(tmp_path, safe_serialization=True)
    assert (tmp_path / "model.safetensors").is_file()
    spec, weights = load_hf_llama(tmp_path, name="hf-tiny")
    assert (spec.n_layers, spec.hidden, spec.n_heads, spec.n_kv_heads, spec.ffn, spec.vocab) == (3, 64, 4, 2, 160, 96)
    ours = LlamaStage(spec)
    ours.load_full(weights)
    tokens = torch.randint(0, 96, (2, 17))
    with torch.no_grad():
        expected = hf(tokens).logits
        got = ours(tokens)
    assert torch.allclose(got, expected, atol=1e-5, rtol=1e-5), float((got - expected).abs().max())


def test_not_a_checkpoint_folder(tmp_path):
    from realbench.errors import ConfigError

    with pytest.raises(ConfigError, match="config.json"):
        load_hf_llama(tmp_path)
