"""Model specs: the LLaMA family (real sizes) and tiny models that run on a CPU.

Parameter count of a LLaMA decoder with hidden size h, L layers, head dim d = h / heads,
kv heads k, FFN size f and vocabulary V:

    per layer   = h*h (q) + 2*h*k*d (k, v) + h*h (o) + 3*h*f (gate, up, down) + 2*h (two RMSNorms)
                  (+ h + 2*k*d with q/k/v biases, as Qwen2 has)
    total       = V*h (embedding) + L * per layer + h (final norm) + head

where the head is V*h for a language model (none of its own when it is tied to the embedding)
and h (one output) for a value/reward model.

Besides the shapes, a spec carries what changes the function a checkpoint computes: the rotary
base `rope_theta` (10^4 in LLaMA-1/2, 10^6 in CodeLLaMA, 5 x 10^5 in LLaMA-3) and the RMSNorm
epsilon `norm_eps` (10^-6 in LLaMA-1 and Qwen2, 10^-5 in LLaMA-2/3). The runtime's model and
the cost model read them from the same spec.

Forward FLOPs per token per layer: 2 * (matmul params of the layer) for the projections,
plus 2 * 2 * context * h for the attention scores and the weighted sum (causal masking
halves the average context, which the cost model applies).
"""

from __future__ import annotations

from typing import Any, Optional

from pydantic import ConfigDict, Field, model_validator

from realbench.errors import ConfigError
from realbench.models.spec import (LORA_DEFAULT_TARGETS, LORA_MODULES, LinearAttentionSpec, LoraSpec,  # noqa: F401
                                   MLASpec, ModelSpec, MoESpec, RopeScaling, VisionSpec, layer_param_prefix,
                                   stage_bounds, stage_start)
from realbench.schema import FileModel


class FunctionSpec(FileModel):
    """Rewards computed by Python functions instead of a model, called as TRL calls them (see
    realbench.models.rewards). They run on the CPU of the processes their call is placed on;
    the cost model charges `seconds_per_sample` per response and function (the run measures
    the real time). With several functions, or a reward model's score beside them
    (`model_score`: the scores arrive as the call's second input), a response's reward is the
    weighted sum of the scores it got (`weights`: the model's first, then the functions', in
    order; a function's None is left out, as TRL's nansum does)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str
    functions: tuple[str, ...] = Field(min_length=1)  # "<absolute path of the file>:<function name>"
    seconds_per_sample: float = Field(default=1e-4, ge=0)
    model_score: bool = False
    weights: Optional[tuple[float, ...]] = None  # None: 1 for each score

    @model_validator(mode="before")
    @classmethod
    def _one(cls, v: Any) -> Any:  # a scenario written before several functions: `function: FILE:NAME`
        if isinstance(v, dict) and "function" in v and "functions" not in v:
            v = {**{k: x for k, x in v.items() if k != "function"}, "functions": (v["function"],)}
        return v

    @property
    def scorers(self) -> int:
        return len(self.functions) + self.model_score

    def weight_list(self) -> tuple[float, ...]:
        return self.weights if self.weights is not None else (1.0,) * self.scorers

    @staticmethod
    def parts(function: str) -> tuple[str, str]:
        """(file, function name) of one "<file>:<name>"."""
        file, name = function.rsplit(":", 1)
        return file, name

    @staticmethod
    def short(function: str) -> str:
        file, name = function.rsplit(":", 1)
        return f"{file.replace(chr(92), '/').rsplit('/', 1)[-1]}:{name}"


def stage_layers(n_layers: int, pp: int, stage: int) -> tuple[int, int]:
    """Layer range [lo, hi) of pipeline stage `stage` of `pp` (see `stage_start`)."""
    return stage_bounds(n_layers, pp, stage)


def _llama(name, n_layers, hidden, n_heads, n_kv_heads, ffn, vocab=32000, rope_theta=10000.0,
           norm_eps=1e-5) -> ModelSpec:
    return ModelSpec(name=name, n_layers=n_layers, hidden=hidden, n_heads=n_heads,
                     n_kv_heads=n_kv_heads, ffn=ffn, vocab=vocab, rope_theta=rope_theta, norm_eps=norm_eps)


# Published configurations: LLaMA-2 7B/13B/70B (rope_theta 10^4, rms_norm_eps 10^-5, as in
# their config.json) and CodeLLaMA 34B (the LLaMA-2 34B shape; Roziere et al. 2023, section 2.4,
# raised the rotary base to 10^6).
PRESETS: dict[str, ModelSpec] = {
    m.name: m
    for m in [
        _llama("llama-7b", 32, 4096, 32, 32, 11008),
        _llama("llama-13b", 40, 5120, 40, 40, 13824),
        _llama("llama-34b", 48, 8192, 64, 8, 22016, rope_theta=1e6),
        _llama("llama-70b", 80, 8192, 64, 8, 28672),
        # LLaMA-3 (Meta, "The Llama 3 Herd of Models", 2024, Table 3; the config.json files of
        # Meta-Llama-3-8B/70B and Llama-3.1-405B): grouped-query attention with 8 KV heads, a
        # vocabulary of 128,256, rope_theta 5 x 10^5, rms_norm_eps 10^-5
        _llama("llama3-8b", 32, 4096, 32, 8, 14336, vocab=128256, rope_theta=5e5),
        _llama("llama3-70b", 80, 8192, 64, 8, 28672, vocab=128256, rope_theta=5e5),
        _llama("llama3-405b", 126, 16384, 128, 8, 53248, vocab=128256, rope_theta=5e5),
        # A 500M LLaMA shape (not a published checkpoint) that one GPU generates with and trains
        # in seconds: the scenario that checks the CUDA path.
        _llama("llama-500m", 16, 1536, 12, 4, 4096),
        # Tiny models: small enough to train on a laptop CPU in seconds.
        _llama("llama-tiny", 4, 64, 4, 2, 176, vocab=128),
        _llama("llama-small", 8, 128, 8, 4, 344, vocab=256),
        # Qwen3's computation (q/k norms, a head width of its own) and a Qwen3-MoE (8 experts, 2 a
        # token) at the tiny size: what the runtime's tests and tiny scenarios run
        ModelSpec(name="qwen3-tiny", family="qwen3", n_layers=4, hidden=64, n_heads=4, n_kv_heads=2, head_dim=32,
                  ffn=176, vocab=128, qk_norm=True, rope_theta=1e6, norm_eps=1e-6),
        ModelSpec(name="qwen3-moe-tiny", family="qwen3_moe", n_layers=4, hidden=64, n_heads=4, n_kv_heads=2,
                  head_dim=16, ffn=176, vocab=128, qk_norm=True, rope_theta=1e6, norm_eps=1e-6,
                  moe=MoESpec(experts=8, top_k=2, expert_ffn=32)),
    ]
}

# Parameter counts published with the checkpoints (for the tests).
PUBLISHED_PARAMS = {
    "llama-7b": 6_738_415_616,
    "llama-13b": 13_015_864_320,
    "llama-34b": 33_743_970_304,
    "llama-70b": 68_976_648_192,
    "llama3-8b": 8_030_261_248,
}


def get_model(name: str) -> ModelSpec:
    """A preset, or a catalogue entry read from its config (realbench.models.catalogue)."""
    if name in PRESETS:
        return PRESETS[name]
    from realbench.models import catalogue

    entry = catalogue.find(name)
    if entry is None:
        raise unknown_model(name)
    from realbench.models.hf import spec_from_config

    return spec_from_config(catalogue.config(entry), entry, f"catalogue:{entry}",
                            config_source=f"catalogue entry {entry} (a copy of {catalogue.hub_id(entry)}'s config.json)")


def unknown_model(name: str) -> ConfigError:
    """The error for a model name that is neither a preset nor a catalogue entry (nor a folder,
    config file or cached hub id), naming the closest known one."""
    import difflib

    from realbench.models import catalogue

    known = [*PRESETS, *catalogue.names()]
    close = difflib.get_close_matches(name, known, n=1, cutoff=0.6)
    hint = f"did you mean {close[0]!r}? " if close else ""
    return ConfigError(f"unknown model {name!r} ({hint}known: {', '.join(known)}; or a checkpoint folder, a config.json "
                       "file or a hub id in the local Hugging Face cache)")
