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

import math
from typing import Any, Literal, Optional

import numpy as np
from pydantic import ConfigDict, Field, field_validator, model_validator

from realbench.errors import ConfigError
from realbench.schema import FileModel


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


class ModelSpec(FileModel):
    """Architecture of one LLaMA-family decoder. Frozen: specs are values."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str
    n_layers: int = Field(gt=0)
    hidden: int = Field(gt=0)
    n_heads: int = Field(gt=0)
    n_kv_heads: int = Field(gt=0)
    ffn: int = Field(gt=0)
    vocab: int = Field(gt=0)
    value_head: bool = False  # critic / reward models end in a scalar head instead of the LM head
    rope_theta: float = Field(default=10000.0, gt=0)  # rotary base period
    norm_eps: float = Field(default=1e-5, gt=0)  # RMSNorm epsilon
    # the LM head is the embedding matrix (Qwen2 small models, Gemma): one tensor when both sit
    # on one pipeline stage, else a copy on the last stage whose gradient is summed with the
    # embedding's (as Megatron does)
    tie_embeddings: bool = False
    qkv_bias: bool = False  # the q, k and v projections have biases (Qwen2)
    # the Hugging Face checkpoint folder the weights come from (absolute), None for random weights
    path: Optional[str] = None
    # low-rank adapters trained on the frozen weights (None: every weight trains)
    lora: Optional[LoraSpec] = None

    @model_validator(mode="after")
    def _check_shape(self) -> "ModelSpec":
        if self.hidden % self.n_heads:
            raise ValueError(f"hidden {self.hidden} is not a multiple of n_heads {self.n_heads}")
        if self.n_heads % self.n_kv_heads:
            raise ValueError(f"n_heads {self.n_heads} is not a multiple of n_kv_heads {self.n_kv_heads}")
        if self.tie_embeddings and self.value_head:
            raise ValueError("a value head cannot be tied to the embedding")
        return self

    @property
    def head_dim(self) -> int:
        return self.hidden // self.n_heads

    @property
    def layer_params(self) -> int:
        h, kvd = self.hidden, self.n_kv_heads * self.head_dim
        return 2 * h * h + 2 * h * kvd + 3 * h * self.ffn + 2 * h + self.layer_bias_params

    @property
    def layer_bias_params(self) -> int:
        return self.hidden + 2 * self.n_kv_heads * self.head_dim if self.qkv_bias else 0

    @property
    def layer_matmul_params(self) -> int:
        return self.layer_params - 2 * self.hidden - self.layer_bias_params

    @property
    def embedding_params(self) -> int:
        return self.vocab * self.hidden

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

    def in_out(self, module: str) -> tuple[int, int]:
        """(in, out) features of a projection of a decoder layer, by realbench's module name."""
        h, q, kv = self.hidden, self.n_heads * self.head_dim, self.n_kv_heads * self.head_dim
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
        return self.n_layers * self.layer_params + self.ends_params(1)

    def kv_bytes_per_token_layer(self, bytes_per_value: int = 2) -> int:
        """KV-cache bytes one token adds in one layer (keys and values)."""
        return 2 * self.n_kv_heads * self.head_dim * bytes_per_value

    def with_value_head(self, value_head: bool = True) -> "ModelSpec":
        """The same decoder ending in a fresh scalar head (a critic or reward model started from
        a language model): a tied LM head does not carry over."""
        return self.model_copy(update={"value_head": value_head,
                                       "tie_embeddings": self.tie_embeddings and not value_head})


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


def stage_start(n_layers: int, pp: int, stage: int) -> int:
    """The first layer of pipeline stage `stage` of `pp` (stage pp: n_layers): the first
    n_layers % pp stages take one layer more, so stage s starts at s * (n_layers // pp) +
    min(s, n_layers % pp). The one split that the cost model and the runtime share. `pp` and
    `stage` may also be numpy arrays (the simulator splits thousands of layouts at once)."""
    per, extra = n_layers // pp, n_layers % pp
    if isinstance(stage, int) and isinstance(extra, int):
        return stage * per + min(stage, extra)
    return stage * per + np.minimum(stage, extra)


def stage_layers(n_layers: int, pp: int, stage: int) -> tuple[int, int]:
    """Layer range [lo, hi) of pipeline stage `stage` of `pp` (see `stage_start`)."""
    return stage_start(n_layers, pp, stage), stage_start(n_layers, pp, stage + 1)


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
    try:
        return PRESETS[name]
    except KeyError:
        raise ConfigError(f"unknown model {name!r} (known: {', '.join(PRESETS)})") from None
