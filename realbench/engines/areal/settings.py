"""AReaL 1.0.4's experiment configuration as realbench names it: the version and its entry point,
the settings table made from AReaL's own PPOConfig (`areal-1.0.4.json`, by `check.py defaults`,
which a test compares with the installed AReaL: `defaults`, `known_keys`, `resolve`), the keys
realbench reads and writes, and AReaL's allocation strings (`actor.backend: fsdp:d4t2`,
`rollout.backend: sglang:d2t4`), read and written (`allocation`, `allocation_string`).
"""

from __future__ import annotations

import json
import re
from functools import lru_cache
from pathlib import Path
from typing import Any

from realbench.engines.dotted import flatten, nest
from realbench.errors import ConfigError

VERSION = "1.0.4"
TABLE = Path(__file__).with_name(f"areal-{VERSION}.json")
# the user's train script (AReaL's examples/math/gsm8k_rl.py, say) reads the YAML: single controller
ENTRY = 'python3 "${AREAL_TRAIN_SCRIPT:-train.py}" --config'
REWARD = f"{Path(__file__).with_name('reward.py')}:workflow_reward"
MODEL_PATHS = {"actor": "actor.path", "ref": "ref.path", "critic": "critic.path"}
TRAINERS = ("fsdp", "megatron")
SERVERS = ("sglang", "vllm")
SERVER_SLOTS = {"sglang": "sglang.max_running_requests", "vllm": "vllm.max_num_seqs"}
SERVER_MODEL = {"sglang": "sglang.model_path", "vllm": "vllm.model"}  # the weights each server loads first
# the share of each GPU's memory a server takes (api/cli_args.py: SGLangConfig.mem_fraction_static,
# vLLMConfig.gpu_memory_utilization, both 0.9): the generation call's memory_fraction, AReaL's default
# where a scenario gives none
SERVER_MEMORY = {"sglang": "sglang.mem_fraction_static", "vllm": "vllm.gpu_memory_utilization"}
# the context a request to the servers may take (api/cli_args.py: SGLangConfig.context_length,
# vLLMConfig.max_model_len, both 32768; None: the checkpoint's positions), on each server's command
# line: both servers refuse one beyond the checkpoint's positions, and vLLM starts only where its KV
# cache holds one request of it (the generation call's max_model_len); SGLang starts with less
SERVER_CONTEXT = {"sglang": "sglang.context_length", "vllm": "vllm.max_model_len"}

OLD_LOGPROBS_KEYS = ("actor.recompute_logprob", "actor.use_decoupled_loss", "actor.prox_logp_method")
# the decoupled loss's proximal log-probabilities interpolated from the rollout's and the update's own
# (prox_logp_method loglinear: ProxLogpMethod.skips_forward_pass, api/cli_args.py:1598-1609; computed
# element-wise in the update, trainer/ppo/actor.py:695-760): no forward over the batch, priced as the
# rollout's log-probabilities are (old_logprobs rollout), the method carried and written back
PROX_LOGP, PROX_INTERPOLATED = "actor.prox_logp_method", "loglinear"

# the sections of roles AReaL builds only where the job runs them (the reference: with a KL term)
ROLE_SECTIONS = {"ref": "ref_inf", "critic": "critic_train"}
# the actor's LoRA (api/cli_args.py:1167-1182, engine/fsdp_engine.py:1089-1100: no target modules is
# all-linear), PEFT's name -> AReaL's; its update sends the servers the adapters alone
# (engine/fsdp_engine.py:1598-1604), its reference is an engine of its own (trainer/rl_trainer.py:179-181)
LORA_KEYS = {"r": "actor.lora_rank", "lora_alpha": "actor.lora_alpha", "target_modules": "actor.target_modules"}


@lru_cache(maxsize=1)
def _table() -> dict:
    return json.loads(TABLE.read_text())


def known_keys(engine: str = "fsdp") -> set[str]:
    """The settings of AReaL's experiment config (PPOConfig)."""
    return set(defaults())


def defaults() -> dict[str, Any]:
    """AReaL's PPOConfig, flat: dotted key -> default (interpolations unresolved, MISSING "???")."""
    return _table()["keys"]


def _sections() -> list[str]:
    """The settings that are None unless given (ref, critic, actor.reward_norm, ...)."""
    return _table()["sections"]


def _flatten(node: Any, prefix: str = "") -> dict[str, Any]:
    """AReaL's settings by dotted key; a section holding only `_target_` (a class to build) stays whole."""
    return flatten(node, prefix, whole=lambda section: set(section) <= {"_target_"})


def _interpolation(value: Any) -> bool:
    return isinstance(value, str) and value.startswith("${") and value.endswith("}")


def resolve(given: dict[str, Any]) -> dict[str, Any]:
    """AReaL's settings with `given` (flat) over its defaults, interpolations resolved (OmegaConf,
    as AReaL resolves them): a section that is None by default (ref, critic, ...) only where a key
    under it is given."""
    from omegaconf import OmegaConf

    sections = _sections()
    named = {s for s in sections if any(k.startswith(s + ".") for k in given)}
    absent = [s for s in sections if s not in named]
    base = {k: v for k, v in defaults().items() if not any(k.startswith(s + ".") for s in absent)}
    given = {k: v for k, v in given.items() if k not in sections or _interpolation(v)}
    merged = OmegaConf.create(nest({**base, **given}))
    flat = _flatten(OmegaConf.to_container(merged, resolve=True))
    return flat


# -- allocations ----------------------------------------------------------------------------------
_ALLOCATION = re.compile(r"(?P<backend>[a-z]+)(\[[A-Za-z_][A-Za-z0-9_]*\])?:(?P<dims>(?:[a-z][1-9][0-9]*)+)")
# the attention/FFN form of a mixture of experts (api/alloc_mode.py:594-637: hybrid_moe_syntax, its
# parentheses each optional): attention c, d, t, p; FFN d (the experts' data parallelism), e, t (the
# experts' tensor parallelism), p (the attention's, or the same)
_HYBRID = re.compile(r"(?P<backend>[a-z]+):\(?attn:(?P<attn>(?:[a-z][1-9][0-9]*)+)"
                     r"\|ffn:(?P<ffn>(?:[a-z][1-9][0-9]*)+)\)?")


def _dims(text: Any, dims: str, letters: str, what: str, key: str, source: str) -> dict[str, int]:
    """A section's dimensions (a letter left out is absent, the last repeat wins: api/alloc_mode.py:797-804)."""
    out: dict[str, int] = {}
    for letter, number in re.findall(r"([a-z])([0-9]+)", dims):
        if letter not in letters:
            raise ConfigError(f"{text!r}: {letter!r} is not a dimension of {what} ({', '.join(letters)}; "
                              "api/alloc_mode.py:594-638)", key, source)
        out[letter] = int(number)
    return out


def allocation(text: Any, key: str, source: str, servers: bool) -> dict[str, Any]:
    """A `backend` string as AReaL's grammar reads it (api/alloc_mode.py:594-638, 797-804):
    {"backend", "d", "t", "p", "c", "e", "etp", "hybrid"}: e the experts' parallelism and etp their
    tensor parallelism (a mixture of experts' routed experts: Megatron's expert_model_parallel_size
    and expert_tensor_parallel_size), in the flat form (`megatron:d4t2e2`) e folded into the world
    (d x c x t x p) and etp 1 (ParallelStrategy's default: each expert whole), in the attention/FFN
    form (`megatron:(attn:d4p4t2|ffn:d2p4e4)`) the FFN's e and t, its d the experts' data parallelism
    (derived where left out), its world the attention's (:940-1040); what realbench does not
    price refused by name."""
    s = re.sub(r"\s+", "", str(text or ""))
    hybrid = _HYBRID.fullmatch(s) if not servers else None
    if hybrid:
        backend = hybrid["backend"]
        if backend != "megatron":
            raise ConfigError(f"{text!r}: realbench reads the attention/FFN (MoE) form for Megatron, whose parallel "
                              "folding lays the experts out so (api/alloc_mode.py:943-1040)", key, source)
        attn = {"d": 1, "t": 1, "p": 1, "c": 1, **_dims(text, hybrid["attn"], "cdtp", "an attention section", key,
                                                         source)}
        ffn = _dims(text, hybrid["ffn"], "detp", "an FFN section", key, source)
        if ffn.get("p", attn["p"]) != attn["p"]:
            raise ConfigError(f"{text!r}: the FFN's pipeline must be the attention's (p{attn['p']}; "
                              "api/alloc_mode.py:982-990)", key, source)
        world_ = attn["d"] * attn["t"] * attn["p"] * attn["c"]
        e, etp = ffn.get("e", 1), ffn.get("t", 1)
        if "d" not in ffn and world_ % (e * etp * attn["p"]):
            raise ConfigError(f"{text!r}: the experts' data parallelism is derived from the attention's world "
                              f"({world_}), which e x t x p = {e * etp * attn['p']} does not divide "
                              "(api/alloc_mode.py:1002-1014)", key, source)
        if ffn.get("d", world_ // (e * etp * attn["p"])) * e * etp * attn["p"] != world_:
            raise ConfigError(f"{text!r}: the FFN's world (d x p x t x e) must be the attention's ({world_}; "
                              "api/alloc_mode.py:1016-1031)", key, source)
        return {"backend": backend, **attn, "e": e, "etp": etp, "hybrid": True}
    if "(" in s or "attn:" in s or "ffn:" in s:
        raise ConfigError(f"{text!r} is not an allocation AReaL parses (a training backend's attention/FFN form: "
                          "megatron:(attn:d4p4t2|ffn:d2p4e4); api/alloc_mode.py:594-638)", key, source)
    m = _ALLOCATION.fullmatch(s)
    if not m:
        raise ConfigError(f"{text!r} is not an allocation AReaL parses (BACKEND:d..t..p.., e.g. "
                          f"{'sglang:d4t2' if servers else 'fsdp:d8'}; api/alloc_mode.py:594-638)", key, source)
    backend = m["backend"]
    kinds = SERVERS if servers else TRAINERS
    if backend not in kinds:
        extra = " (archon: AReaL's experimental torchtitan engine is not priced)" if backend == "archon" else ""
        raise ConfigError(f"{backend!r}: realbench prices {' and '.join(kinds)} here{extra}", key, source)
    dims = {"d": 1, "t": 1, "p": 1, "c": 1, "e": 1,
            **_dims(text, m["dims"], "dtp" if servers else "dtpce", f"a {backend} allocation", key, source)}
    if backend == "fsdp" and (dims["p"] > 1 or dims["e"] > 1):
        raise ConfigError(f"{text!r}: FSDP has no pipeline or expert parallelism (api/alloc_mode.py:274-283)", key,
                          source)
    if dims["c"] > 1 and dims["t"] > 1 and backend == "fsdp":
        raise ConfigError(f"{text!r}: realbench prices FSDP's context parallelism (Ulysses groups) without tensor "
                          "parallelism (t1)", key, source)
    world_ = dims["d"] * dims["c"] * dims["t"] * dims["p"]
    if dims["e"] > 1 and world_ % (dims["p"] * dims["e"]):  # (ParallelStrategy.__post_init__, etp 1)
        raise ConfigError(f"{text!r}: expert model parallel size p x e = {dims['p'] * dims['e']} does not divide the "
                          f"world {world_} (api/alloc_mode.py:93-108)", key, source)
    return {"backend": backend, **dims, "etp": 1, "hybrid": False}


def allocation_string(backend: str, dp: int, tp: int, pp: int, cp: int = 1, ep: int = 1, etp: int = 0,
                      experts: bool = False) -> str:
    """An allocation AReaL parses back to the layout (allocation): a model `experts` Megatron lays
    out with each expert whole (etp 1) in the flat form (its e the experts' parallelism), other
    expert layouts (etp tp's, 0, or another) in the attention/FFN form."""
    attn = f"d{dp}" + (f"p{pp}" if pp > 1 else "") + (f"t{tp}" if tp > 1 else "") + (f"c{cp}" if cp > 1 else "")
    width = etp or tp
    if not experts or width == 1:
        return f"{backend}:{attn}" + (f"e{ep}" if ep > 1 else "")
    ffn = f"d{dp * cp * tp // (ep * width)}" + (f"p{pp}" if pp > 1 else "") + f"t{width}" + (f"e{ep}" if ep > 1 else "")
    return f"{backend}:(attn:{attn}|ffn:{ffn})"


def world(a: dict[str, Any]) -> int:
    """The GPUs of an allocation: d x c x t x p (api/alloc_mode.py:150-158)."""
    return a["d"] * a["c"] * a["t"] * a["p"]
