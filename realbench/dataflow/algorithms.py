"""The algorithm library: PPO, GRPO, RLOO, ReMax, DPO and SFT as dataflows.

Each builder takes the batch (prompts, or pairs for DPO), the token lengths and model role
names, and returns a validated Dataflow. Keys follow one vocabulary: `prompts` (dataset),
`seqs` (prompt + response ids), `logprobs`, `ref_logprobs`, `values`, `rewards`.
"""

from __future__ import annotations

from typing import Callable

from realbench.dataflow.core import CallDef, CallKind, Dataflow
from realbench.errors import ConfigError

GEN, INF, TRAIN = CallKind.GENERATE, CallKind.INFERENCE, CallKind.TRAIN


def _call(name, model, kind, inputs, outputs, seqs, seq_len, gen_len=0, optimizer_steps=1, group_size=1,
          rows_together=1, served=False) -> CallDef:
    return CallDef(name=name, model=model, kind=kind, inputs=tuple(inputs), outputs=tuple(outputs),
                   seqs=seqs, seq_len=seq_len, gen_len=gen_len, optimizer_steps=optimizer_steps,
                   group_size=group_size, rows_together=rows_together, served=served)


def _reference(with_ref: bool, s: int, L: int) -> list[CallDef]:
    """The reference's call, or none: without a KL term (verl without use_kl_loss, OpenRLHF's
    init_kl_coef 0, AReaL's kl_ctl 0, TRL's GRPO beta 0) the engines load no reference at all."""
    return [_call("ref_inf", "ref", INF, ["seqs"], ["ref_logprobs"], s, L)] if with_ref else []


def ppo(prompts: int = 512, prompt_len: int = 256, gen_len: int = 768, minibatches: int = 4,
        with_ref: bool = True, group_size: int = 1) -> Dataflow:
    """Actor generates; reward, reference and critic score; actor and critic train (GAE,
    clipped policy and value losses, KL penalty to the reference; `with_ref: false`: no
    reference and no penalty). `group_size` responses a prompt (AReaL's n_samples), each its
    own episode."""
    if not isinstance(group_size, int) or group_size < 1:
        raise ConfigError(f"{group_size!r}: responses a prompt, 1 or more", "group_size")
    s, L = prompts * group_size, prompt_len + gen_len
    scored = ["seqs", "logprobs"] + (["ref_logprobs"] if with_ref else []) + ["rewards", "values"]
    return Dataflow(name="ppo", dataset_keys=("prompts",), calls=(
        _call("actor_gen", "actor", GEN, ["prompts"], ["seqs", "logprobs"], s, L, gen_len, group_size=group_size),
        _call("reward_inf", "reward", INF, ["seqs"], ["rewards"], s, L),
        *_reference(with_ref, s, L),
        _call("critic_inf", "critic", INF, ["seqs"], ["values"], s, L),
        _call("actor_train", "actor", TRAIN, scored, [], s, L, optimizer_steps=minibatches),
        _call("critic_train", "critic", TRAIN, scored, [], s, L, optimizer_steps=minibatches),
    ))


def _teacher(with_teacher: bool, s: int, L: int) -> list[CallDef]:
    """The teacher's call of on-policy distillation, or none: a frozen model of its own (`teacher`)
    scores every sampled sequence, prompt and response, with its log-probabilities, which the
    actor's loss takes (verl's distillation: a reverse-KL reward or loss against the teacher's),
    computed by a serving engine (its prompt log-probabilities: `served`)."""
    return [_call("teacher_inf", "teacher", INF, ["seqs"], ["teacher_logprobs"], s, L, served=True)] \
        if with_teacher else []


def _group_policy_gradient(name: str, prompts, prompt_len, gen_len, group_size, minibatches, with_ref,
                           with_teacher=False) -> Dataflow:
    if not isinstance(group_size, int) or group_size < 1:
        # (a group of one has no others to compare with: its reward is its advantage, as verl takes it;
        # realbench.runtime.losses)
        raise ConfigError(f"{group_size!r}: samples a prompt, 1 or more ({name.upper()} compares a prompt's samples "
                          "with each other; a group of one takes its reward as its advantage)", "group_size")
    s, L = prompts * group_size, prompt_len + gen_len
    return Dataflow(name=name, dataset_keys=("prompts",), calls=(
        _call("actor_gen", "actor", GEN, ["prompts"], ["seqs", "logprobs"], s, L, gen_len, group_size=group_size),
        _call("reward_inf", "reward", INF, ["seqs"], ["rewards"], s, L),
        *_reference(with_ref, s, L),
        *_teacher(with_teacher, s, L),
        _call("actor_train", "actor", TRAIN, ["seqs", "logprobs"] + (["ref_logprobs"] if with_ref else []) + ["rewards"]
              + (["teacher_logprobs"] if with_teacher else []), [], s, L, optimizer_steps=minibatches),
    ))


def grpo(prompts: int = 64, prompt_len: int = 256, gen_len: int = 768, group_size: int = 8,
         minibatches: int = 4, with_ref: bool = True, with_teacher: bool = False) -> Dataflow:
    """`group_size` samples per prompt; advantages normalized within each group (no critic).
    `with_teacher`: on-policy distillation, a teacher's log-probabilities of every sequence in the
    actor's loss (the call `teacher_inf` of the model `teacher`)."""
    return _group_policy_gradient("grpo", prompts, prompt_len, gen_len, group_size, minibatches, with_ref,
                                  with_teacher)


def rloo(prompts: int = 64, prompt_len: int = 256, gen_len: int = 768, group_size: int = 8,
         minibatches: int = 4, with_ref: bool = True, with_teacher: bool = False) -> Dataflow:
    """Like GRPO, with the leave-one-out mean of the group as the baseline."""
    return _group_policy_gradient("rloo", prompts, prompt_len, gen_len, group_size, minibatches, with_ref,
                                  with_teacher)


def remax(prompts: int = 512, prompt_len: int = 256, gen_len: int = 768, with_ref: bool = True,
          minibatches: int = 1) -> Dataflow:
    """A sampled and a greedy response per prompt; the greedy reward is the baseline."""
    s, L = prompts, prompt_len + gen_len
    train_in = ["seqs", "logprobs", "rewards", "greedy_rewards"] + (["ref_logprobs"] if with_ref else [])
    calls = [
        _call("sample_gen", "actor", GEN, ["prompts"], ["seqs", "logprobs"], s, L, gen_len),
        _call("greedy_gen", "actor", GEN, ["prompts"], ["greedy_seqs"], s, L, gen_len),
        _call("sample_reward", "reward", INF, ["seqs"], ["rewards"], s, L),
        _call("greedy_reward", "reward", INF, ["greedy_seqs"], ["greedy_rewards"], s, L),
    ]
    calls += _reference(with_ref, s, L)
    calls.append(_call("actor_train", "actor", TRAIN, train_in, [], s, L, optimizer_steps=minibatches))
    return Dataflow(name="remax", dataset_keys=("prompts",), calls=tuple(calls))


def dpo(pairs: int = 256, seq_len: int = 1024) -> Dataflow:
    """The reference scores chosen and rejected responses; the actor trains on the pairs, which
    its splits keep whole (the loss compares a pair's two responses). The reference scores each
    response on its own, so its split is free."""
    s = 2 * pairs
    return Dataflow(name="dpo", dataset_keys=("pairs",), calls=(
        _call("ref_inf", "ref", INF, ["pairs"], ["ref_logprobs"], s, seq_len),
        _call("actor_train", "actor", TRAIN, ["pairs", "ref_logprobs"], [], s, seq_len, rows_together=2),
    ))


def sft(seqs: int = 512, seq_len: int = 1024) -> Dataflow:
    return Dataflow(name="sft", dataset_keys=("sequences",), calls=(
        _call("actor_train", "actor", TRAIN, ["sequences"], [], seqs, seq_len),
    ))


ALGORITHMS: dict[str, Callable[..., Dataflow]] = {
    "ppo": ppo, "grpo": grpo, "rloo": rloo, "remax": remax, "dpo": dpo, "sft": sft,
}


def build_algorithm(name: str, **kwargs) -> Dataflow:
    try:
        builder = ALGORITHMS[name]
    except KeyError:
        raise ConfigError(f"unknown algorithm {name!r} (known: {', '.join(ALGORITHMS)})") from None
    return builder(**kwargs)
