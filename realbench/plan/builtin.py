"""Built-in scenarios: paper-like PPO runs on H100 nodes of 8, one per algorithm at 7B, a
long-context variant, and tiny CPU scenarios that `realbench run` executes on local processes."""

from __future__ import annotations

from functools import lru_cache

from realbench.errors import ConfigError
from realbench.plan.scenario import Scenario

_TINY_LENGTHS = dict(prompt_len=8, gen_len=8)
# Tiny random models learn something in a few dozen steps at a rate far above what a real
# checkpoint takes (TRL's default is 1e-6, decayed linearly): the tiny scenarios say so.
TINY_TRAINING = {"learning_rate": 1e-3, "lr_scheduler_type": "constant"}


def _spec(name, algorithm, nodes, gpus, device, models, dataflow, description) -> dict:
    out = dict(name=name, algorithm=algorithm, description=description,
               cluster=dict(nodes=nodes, gpus_per_node=gpus, device=device),
               models=models, dataflow={"algorithm": algorithm, **dataflow})
    return {**out, "training": TINY_TRAINING} if device == "cpu" else out


def _ppo_models(actor: str, critic: str) -> dict:
    return {"actor": actor, "ref": actor, "critic": {"arch": critic, "value_head": True},
            "reward": {"arch": critic, "value_head": True}}


_PG_MODELS = {"actor": "llama-7b", "ref": "llama-7b", "reward": {"arch": "llama-7b", "value_head": True}}
_TINY_PG = {"actor": "llama-tiny", "ref": "llama-tiny", "reward": {"arch": "llama-tiny", "value_head": True}}

_SPECS = [
    _spec("ppo-7b-7b-16gpu", "ppo", 2, 8, "h100", _ppo_models("llama-7b", "llama-7b"),
          dict(prompts=512, prompt_len=256, gen_len=768), "PPO, 7B actor/ref, 7B critic/reward, 2x8 H100"),
    _spec("ppo-13b-7b-32gpu", "ppo", 4, 8, "h100", _ppo_models("llama-13b", "llama-7b"),
          dict(prompts=512, prompt_len=256, gen_len=768), "PPO, 13B actor/ref, 7B critic/reward, 4x8 H100"),
    _spec("ppo-34b-7b-64gpu", "ppo", 8, 8, "h100", _ppo_models("llama-34b", "llama-7b"),
          dict(prompts=512, prompt_len=256, gen_len=768), "PPO, 34B actor/ref, 7B critic/reward, 8x8 H100"),
    _spec("ppo-70b-7b-128gpu", "ppo", 16, 8, "h100", _ppo_models("llama-70b", "llama-7b"),
          dict(prompts=512, prompt_len=256, gen_len=768), "PPO, 70B actor/ref, 7B critic/reward, 16x8 H100"),
    # At scale: LLaMA-3 models on 128 and 512 nodes of 8 H100s.
    _spec("ppo-70b-8b-1024gpu", "ppo", 128, 8, "h100", _ppo_models("llama3-70b", "llama3-8b"),
          dict(prompts=1024, prompt_len=512, gen_len=1024), "PPO, LLaMA-3 70B actor/ref, 8B critic/reward, 128x8 H100"),
    _spec("ppo-405b-70b-4096gpu", "ppo", 512, 8, "h100", _ppo_models("llama3-405b", "llama3-70b"),
          dict(prompts=2048, prompt_len=512, gen_len=1024), "PPO, LLaMA-3 405B actor/ref, 70B critic/reward, 512x8 H100"),
    _spec("ppo-7b-7b-16gpu-long", "ppo", 2, 8, "h100", _ppo_models("llama-7b", "llama-7b"),
          dict(prompts=128, prompt_len=2048, gen_len=6144), "PPO with 8k-token sequences, 2x8 H100"),
    _spec("grpo-7b-16gpu", "grpo", 2, 8, "h100", _PG_MODELS,
          dict(prompts=64, prompt_len=256, gen_len=768, group_size=8), "GRPO, 8 samples per prompt, 2x8 H100"),
    # LoRA (r 16, alpha 32, every projection), as one node runs it: the reference is the actor's
    # base (no reference model), the trained adapters the only weights that change
    _spec("grpo-7b-lora-8gpu", "grpo", 1, 8, "h100",
          {"actor": {"arch": "llama-7b", "lora": {"r": 16, "lora_alpha": 32, "target_modules": "all-linear"}},
           "reward": {"arch": "llama-7b", "value_head": True}},
          dict(prompts=64, prompt_len=256, gen_len=768, group_size=8),
          "GRPO, 7B actor trained with LoRA (reference: its base), 7B reward, 1x8 H100"),
    _spec("remax-7b-16gpu", "remax", 2, 8, "h100", _PG_MODELS,
          dict(prompts=512, prompt_len=256, gen_len=768), "ReMax, sampled + greedy responses, 2x8 H100"),
    _spec("dpo-7b-8gpu", "dpo", 1, 8, "h100", {"actor": "llama-7b", "ref": "llama-7b"},
          dict(pairs=256, seq_len=1024), "DPO on 256 preference pairs, 1x8 H100"),
    _spec("sft-7b-8gpu", "sft", 1, 8, "h100", {"actor": "llama-7b"},
          dict(seqs=512, seq_len=1024), "SFT, 1x8 H100"),
    # Long-tailed response lengths (log-normal, cv 1; the cap 8 times the mean), as reasoning
    # RL runs have them: a synchronous step waits for each call's longest response.
    _spec("grpo-8b-32gpu-longtail", "grpo", 4, 8, "h100",
          {"actor": "llama3-8b", "ref": "llama3-8b", "reward": {"arch": "llama3-8b", "value_head": True}},
          dict(prompts=64, prompt_len=512, group_size=8,
               gen_len={"dist": "lognormal", "mean": 2000, "cv": 1.0, "max": 16384}),
          "GRPO, LLaMA-3 8B, 8 samples per prompt, log-normal lengths (mean 2000, cap 16384), 4x8 H100"),
    _spec("ppo-8b-16gpu-longtail", "ppo", 2, 8, "h100", _ppo_models("llama3-8b", "llama3-8b"),
          dict(prompts=512, prompt_len=512, gen_len={"dist": "lognormal", "mean": 1000, "cv": 1.0, "max": 4096}),
          "PPO, LLaMA-3 8B actor/ref/critic/reward, log-normal lengths (mean 1000, cap 4096), 2x8 H100"),
    # The models of 2026 (the catalogue's configs): Qwen3 dense and a mixture of experts whose experts
    # the search may split over devices (expert parallelism), and a MoE at the scale of the dense
    # 1,024-GPU job (the estimator's speed on experts)
    _spec("grpo-qwen3-8b-8gpu", "grpo", 1, 8, "h100",
          {"actor": "qwen3-8b", "ref": "qwen3-8b", "reward": {"arch": "qwen3-1.7b", "value_head": True}},
          dict(prompts=64, prompt_len=512, gen_len=2048, group_size=8),
          "GRPO, Qwen3-8B actor/ref, a Qwen3-1.7B reward model, 8 samples per prompt, 1x8 H100"),
    _spec("grpo-qwen3-30b-a3b-16gpu", "grpo", 2, 8, "h100",
          {"actor": "qwen3-30b-a3b", "ref": "qwen3-30b-a3b", "reward": {"arch": "qwen3-1.7b", "value_head": True}},
          dict(prompts=64, prompt_len=512, gen_len=2048, group_size=8),
          "GRPO, Qwen3-30B-A3B (128 experts, 8 a token) actor/ref, a Qwen3-1.7B reward model, 2x8 H100"),
    # A vision-language model: each prompt's image, 256 image tokens (a 448 x 448 image in Qwen2.5-VL's
    # 28-pixel merged patches), encoded by the vision tower when generation prefills it and in every
    # forward of the actor and the reference
    _spec("grpo-qwen2.5-vl-7b-8gpu", "grpo", 1, 8, "h100",
          {"actor": {"path": "qwen2.5-vl-7b", "image_tokens": 256}, "ref": {"path": "qwen2.5-vl-7b", "image_tokens": 256},
           "reward": {"arch": "qwen3-1.7b", "value_head": True}},
          dict(prompts=64, prompt_len=1024, gen_len=2048, group_size=8),
          "GRPO, Qwen2.5-VL-7B actor/ref on prompts of an image (256 image tokens), a Qwen3-1.7B reward model, "
          "1x8 H100"),
    _spec("ppo-qwen3-235b-a22b-1024gpu", "ppo", 128, 8, "h100",
          _ppo_models("qwen3-235b-a22b-instruct-2507", "qwen3-8b"),
          dict(prompts=1024, prompt_len=512, gen_len=1024),
          "PPO, Qwen3-235B-A22B actor/ref, Qwen3-8B critic/reward, 128x8 H100"),
    # One GPU, models small enough to run the whole step in seconds: the CUDA check (README).
    _spec("grpo-500m-1gpu", "grpo", 1, 1, "h100",
          {"actor": "llama-500m", "ref": "llama-500m", "reward": {"arch": "llama-500m", "value_head": True}},
          dict(prompts=8, prompt_len=128, gen_len=256, group_size=8),
          "GRPO, a 500M LLaMA-shaped actor, ref and reward on one H100 (the CUDA check)"),
    # Tiny scenarios: 4 CPU processes on one "node"; runnable with `realbench run`.
    _spec("ppo-tiny-cpu", "ppo", 1, 4, "cpu", _ppo_models("llama-tiny", "llama-tiny"),
          dict(prompts=8, minibatches=2, **_TINY_LENGTHS), "PPO with tiny models on 4 CPU processes"),
    _spec("grpo-tiny-cpu", "grpo", 1, 4, "cpu", _TINY_PG,
          dict(prompts=4, group_size=4, minibatches=2, **_TINY_LENGTHS), "GRPO with tiny models on 4 CPU processes"),
    _spec("rloo-tiny-cpu", "rloo", 1, 4, "cpu", _TINY_PG,
          dict(prompts=4, group_size=4, minibatches=2, **_TINY_LENGTHS), "RLOO with tiny models on 4 CPU processes"),
    _spec("remax-tiny-cpu", "remax", 1, 4, "cpu", _TINY_PG,
          dict(prompts=8, **_TINY_LENGTHS), "ReMax with tiny models on 4 CPU processes"),
    _spec("dpo-tiny-cpu", "dpo", 1, 4, "cpu", {"actor": "llama-tiny", "ref": "llama-tiny"},
          dict(pairs=8, seq_len=16), "DPO with tiny models on 4 CPU processes"),
    _spec("sft-tiny-cpu", "sft", 1, 4, "cpu", {"actor": "llama-tiny"},
          dict(seqs=16, seq_len=16), "SFT with a tiny model on 4 CPU processes"),
    _spec("grpo-moe-tiny-cpu", "grpo", 1, 4, "cpu",
          {"actor": "qwen3-moe-tiny", "ref": "qwen3-moe-tiny", "reward": {"arch": "llama-tiny", "value_head": True}},
          dict(prompts=4, group_size=4, minibatches=2, **_TINY_LENGTHS),
          "GRPO with a tiny Qwen3-MoE (8 experts, 2 a token) on 4 CPU processes"),
    # Two "nodes" of 2 CPU processes: multi-node launch (torchrun, Slurm) on one machine.
    _spec("ppo-tiny-2x2cpu", "ppo", 2, 2, "cpu", _ppo_models("llama-tiny", "llama-tiny"),
          dict(prompts=8, minibatches=2, **_TINY_LENGTHS), "PPO with tiny models on 2 nodes of 2 CPU processes"),
    # Small enough to enumerate every plan: the ground truth for the search tests.
    _spec("ppo-tiny-2cpu", "ppo", 1, 2, "cpu", _ppo_models("llama-tiny", "llama-tiny"),
          dict(prompts=8, minibatches=2, **_TINY_LENGTHS), "PPO with tiny models on 2 CPU processes"),
]

BUILTIN: dict[str, dict] = {s["name"]: s for s in _SPECS}
PAPER_LIKE = ("ppo-7b-7b-16gpu", "ppo-13b-7b-32gpu", "ppo-34b-7b-64gpu", "ppo-70b-7b-128gpu")


@lru_cache(maxsize=None)
def get_builtin(name: str) -> Scenario:
    try:
        spec = BUILTIN[name]
    except KeyError:
        raise ConfigError(f"unknown scenario {name!r} (built-in: {', '.join(BUILTIN)})") from None
    return Scenario.model_validate(spec)
