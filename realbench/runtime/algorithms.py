"""What each algorithm trains on and how: one small object per algorithm (as TRL and verl keep
their core algorithms apart from the trainers), so the worker walks the plan without branching
on the algorithm.

An algorithm turns the data a train call received into per-row targets (`targets`, on the whole
batch: every rank of the call holds it), gives the loss of a micro-batch as a sum over its tokens
or sequences (`loss`) and the count that the optimizer step divides by (`normalizer`: the
step's response tokens, or pairs), so a step's gradient does not depend on the layout. Formulas
are in `realbench.runtime.losses`.

Metrics: `metrics(targets)` are means over the batch the call received (the sampling policy's KL
to the reference, the critic's error against its returns); `loss` also returns sums, over the
same tokens or pairs as the loss, of what the training forward shows (the clipped fraction, the
DPO reward margin and accuracy), which the trainer divides by the same normalizer.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch

from realbench.errors import ConfigError
from realbench.runtime import losses

Tensor = torch.Tensor


def _rows(t: dict[str, Tensor], idx: Tensor) -> dict[str, Tensor]:
    return {k: v[idx] for k, v in t.items()}


@dataclass(frozen=True)
class Algorithm:
    """The policy-gradient family's shared parts; subclasses say how advantages are made.

    The update's ratio compares the policy with the behaviour policy's log-probabilities
    (`old_logp`), which come from the training forward, not from generation: generation's
    KV-cached decode rounds differently (in bf16 by up to 0.08 per token), which would clip the
    first update of every batch. The first optimizer step of a batch takes the forward's own
    log-probabilities, detached (the ratio is exactly 1, as TRL does when it takes one step per
    batch); the trainer recomputes them for later steps (`recomputes_behaviour`) with a forward
    of the same layout before the first update. Log-probabilities are of the logits divided by
    the sampling `temperature` (the distribution generation sampled from), as TRL's."""

    name: str = "base"
    kl_coef: float = 0.05  # TRL's beta
    clip: float = 0.2  # TRL's epsilon
    clip_high: Optional[float] = None  # TRL's epsilon_high (DAPO); None: clip
    temperature: float = 1.0
    loss_type: str = "dapo"  # how a step's token losses aggregate (losses.loss_weights)
    rows_together: int = 1  # rows of one example that the trainer's splits keep together
    recomputes_behaviour: bool = True  # the policy's train call needs the behaviour log-probabilities
    # asynchronous RL: the samples come from older weights; AReaL's decoupled objective (see `loss`)
    decoupled: bool = False
    behav_weight_cap: Optional[float] = None

    def token_logprobs(self, logits: Tensor, seqs: Tensor, gen_len: int) -> Tensor:
        return losses.token_logprobs(logits, seqs, gen_len, self.temperature)

    def reference_logprobs(self, logits: Tensor, seqs: Tensor, gen_len: int) -> Tensor:
        """What a reference inference call outputs: per-token log-probabilities of the
        generated part."""
        return self.token_logprobs(logits, seqs, gen_len)

    def normalizer(self, t: dict[str, Tensor], rows: Tensor) -> float:
        """What the optimizer step's summed loss is divided by (all data-parallel ranks
        together): the response tokens of its rows; for dapo, as TRL divides (num_items_in_batch
        rescaled to one optimizer step), the response tokens of the whole batch over its optimizer
        steps (the same when the batch takes one step)."""
        mask = t.get("mask")
        tokens = mask if mask is not None else torch.ones_like(t["adv"])
        if self.loss_type == "dapo":
            return float(tokens.sum()) * len(rows) / len(t["seqs"])
        return float(tokens[rows].sum())

    def targets(self, data: dict[str, Tensor], value_model: bool, group_size: int) -> dict[str, Tensor]:
        raise NotImplementedError

    def step_weights(self, t: dict[str, Tensor], rows: Tensor, value_model: bool) -> Optional[Tensor]:
        """Per-token loss weights of an optimizer step's rows for the policy's `loss_type`
        (losses.loss_weights), or None where every token weighs 1."""
        if value_model or self.loss_type in ("dapo", "bnpo", "rloo") or "adv" not in t:
            return None
        mask = t.get("mask")
        return losses.loss_weights(mask[rows] if mask is not None else torch.ones_like(t["adv"][rows]), self.loss_type)

    def with_generation_log_probs(self, out: dict[str, Tensor], data: dict[str, Tensor]) -> dict[str, Tensor]:
        """Targets plus, for the decoupled objective, the log-probabilities of the policy that
        generated the samples (`behav_logp`: generation's, from weights up to S versions old)."""
        return {**out, "behav_logp": data["logprobs"]} if self.decoupled else out

    def loss(self, y: Tensor, t: dict[str, Tensor], value_model: bool) -> tuple[Tensor, dict[str, Tensor]]:
        """Policy loss summed over the micro-batch's response tokens, plus the KL penalty to the
        reference when the targets carry reference log-probabilities. Without `old_logp` the
        behaviour log-probabilities are this forward's own (detached): the ratio is 1.
        Decoupled (asynchronous RL): `old_logp` (or the forward's own) is the proximal policy,
        the weights before this call's first update, and the samples' generation log-probs
        (`behav_logp`) weight each token by exp(proximal - behaviour), capped
        (losses.decoupled_policy_loss)."""
        gen = t["adv"].shape[1]
        logp = self.token_logprobs(y, t["seqs"], gen)
        old = t["old_logp"] if "old_logp" in t else logp.detach()
        mask = t.get("mask")
        if "behav_logp" in t:
            per_token = losses.decoupled_policy_loss(logp, old, t["behav_logp"], t["adv"], self.clip, self.clip_high,
                                                     self.behav_weight_cap)
        else:
            per_token = losses.policy_loss(logp, old, t["adv"], self.clip, self.clip_high)
        sums = {"clipfrac": _sum(losses.clipped_fraction(logp, old, t["adv"], self.clip, self.clip_high), mask),
                "entropy": _sum(losses.entropy(y.detach(), gen, self.temperature), mask)}
        ref = t.get("ref_logp", t.get("kl_ref"))
        if ref is not None:  # the behaviour policy's KL to the reference (mean of logp - ref)
            sums["kl"] = _sum(old - ref, mask)
        if "ref_logp" in t:
            k3 = losses.k3_kl(logp, t["ref_logp"])
            if self.kl_coef:
                per_token = per_token + self.kl_coef * k3
            sums["k3_kl"] = _sum(k3, mask)
        return _sum(per_token, t.get("weight", mask)), sums

    def metrics(self, t: dict[str, Tensor], value_model: bool) -> dict[str, float]:
        """Means over the batch the call received, before any update."""
        return {}


def _sum(per_token: Tensor, mask: Optional[Tensor]) -> Tensor:
    return per_token.sum() if mask is None else (per_token * mask).sum()


def _sequence_advantages(adv: Tensor, like: Tensor) -> Tensor:
    return adv[:, None].expand_as(like).contiguous()


@dataclass(frozen=True)
class PPO(Algorithm):
    """Actor: clipped policy loss on whitened GAE advantages of KL-shaped rewards. Critic:
    clipped value loss against the GAE returns. The rewards are shaped with the generation's
    log-probabilities (both train calls compute the same returns from the data they receive);
    the ratio's behaviour log-probabilities are the training forward's (see Algorithm)."""

    name: str = "ppo"
    gamma: float = 1.0
    lam: float = 0.95
    value_clip: float = 0.2  # TRL's cliprange_value
    whiten_rewards: bool = False

    def targets(self, data, value_model, group_size):
        lp, values = data["logprobs"], data["values"]
        mask = losses.response_mask(data["seqs"], lp.shape[1])
        score = torch.nan_to_num(data["rewards"], nan=0.0)  # no scorer gave a reward: 0
        # without a reference (dataflow with_ref: false) no KL shaping: the score alone
        ref = data.get("ref_logprobs")
        rewards = losses.kl_shaped_rewards(score, lp, lp if ref is None else ref, self.kl_coef, mask)
        if self.whiten_rewards:  # TRL's: the per-token rewards after the KL shaping, mean kept
            rewards = losses.whiten(rewards, mask, shift_mean=False)
        adv, ret = losses.gae(rewards, values, mask, self.gamma, self.lam)
        out = {"seqs": data["seqs"], "adv": losses.whiten(adv, mask), "ret": ret, "old_values": values}
        if ref is not None:
            out["kl_ref"] = ref
        out = out if mask is None else {**out, "mask": mask}
        return out if value_model else self.with_generation_log_probs(out, data)

    def loss(self, y, t, value_model):
        if not value_model:
            return super().loss(y, t, value_model)
        gen = t["old_values"].shape[1]
        v = y[:, -gen - 1:-1].float()
        return _sum(losses.value_loss(v, t["old_values"], t["ret"], self.value_clip), t.get("mask")), {}

    def metrics(self, t, value_model):
        if value_model:  # how far the critic that scored this batch is from its returns
            return {"value_error": float(losses.masked_mean((t["old_values"] - t["ret"]) ** 2, t.get("mask")))}
        return {}


@dataclass(frozen=True)
class GRPO(Algorithm):
    name: str = "grpo"
    scale_rewards: str = "group"

    def advantages(self, data: dict[str, Tensor], group_size: int) -> Tensor:
        return losses.grpo_advantages(data["rewards"], group_size, self.scale_rewards)

    def targets(self, data, value_model, group_size):
        lp = data["logprobs"]
        out = {"seqs": data["seqs"], "adv": _sequence_advantages(self.advantages(data, group_size), lp)}
        if "ref_logprobs" in data:
            out["ref_logp"] = data["ref_logprobs"]
        mask = losses.response_mask(data["seqs"], lp.shape[1])
        if mask is not None:
            out["mask"] = mask
        return self.with_generation_log_probs(out, data)


@dataclass(frozen=True)
class RLOO(GRPO):
    """TRL's RLOOTrainer (loss_type rloo, the default): the sequence's k1 KL to the reference,
    summed over its tokens, subtracted from its score (`kl_coef`: TRL's beta), the leave-one-out
    baseline over the group's scored samples, then one clipped ratio per sequence, averaged over
    the step's sequences (losses.rloo_advantages; the loss's first step has ratio 1, as TRL's).
    The KL is of the log-probabilities generation sampled with (TRL recomputes them with a
    forward of the policy before training; equal in fp32). With another loss_type, the same
    advantages in GRPO's per-token loss, with its k3 penalty (verl's RLOO estimator)."""

    name: str = "rloo"
    loss_type: str = "rloo"
    normalize_advantages: bool = False

    def targets(self, data, value_model, group_size):
        if self.loss_type != "rloo":
            return super().targets(data, value_model, group_size)
        lp = data["logprobs"]
        mask = losses.response_mask(data["seqs"], lp.shape[1])
        score = data["rewards"]  # NaN: no scorer gave a reward (left out of the baselines)
        out = {"seqs": data["seqs"]}
        if "ref_logprobs" in data:
            score = score - self.kl_coef * losses.sequence_sums(lp - data["ref_logprobs"], mask)
            out["kl_ref"] = data["ref_logprobs"]  # the KL metric; no penalty in the loss
        adv = losses.rloo_advantages(score, group_size, self.normalize_advantages)
        out["adv"] = _sequence_advantages(adv, lp)
        if mask is not None:
            out["mask"] = mask
        return self.with_generation_log_probs(out, data)

    def advantages(self, data, group_size):
        return losses.rloo_advantages(data["rewards"], group_size, self.normalize_advantages)

    def normalizer(self, t, rows):
        return float(len(rows)) if self.loss_type == "rloo" else super().normalizer(t, rows)

    def loss(self, y, t, value_model):
        """Per sequence, summed over the micro-batch's: TRL's -min(ratio A, clip(ratio) A) with
        ratio = exp(sum of the response's log-probabilities - the behaviour policy's); decoupled
        (asynchronous RL), weighted by the sequence's capped behaviour weight. The metrics are
        per sequence (its clipping, its token-mean entropy and KL), as the loss."""
        if self.loss_type != "rloo":
            return super().loss(y, t, value_model)
        gen = t["adv"].shape[1]
        mask = t.get("mask")
        logp = self.token_logprobs(y, t["seqs"], gen)
        old = t["old_logp"] if "old_logp" in t else logp.detach()
        seq, old_seq, adv = losses.sequence_sums(logp, mask), losses.sequence_sums(old, mask), t["adv"][:, 0]
        if "behav_logp" in t:
            per_seq = losses.decoupled_policy_loss(seq, old_seq, losses.sequence_sums(t["behav_logp"], mask), adv,
                                                   self.clip, self.clip_high, self.behav_weight_cap)
        else:
            per_seq = losses.policy_loss(seq, old_seq, adv, self.clip, self.clip_high)
        tokens = (mask.sum(-1) if mask is not None else torch.full_like(seq, gen)).clamp(min=1)
        sums = {"clipfrac": losses.clipped_fraction(seq.detach(), old_seq, adv, self.clip, self.clip_high).sum(),
                "entropy": (losses.sequence_sums(losses.entropy(y.detach(), gen, self.temperature), mask)
                            / tokens).sum()}
        if "kl_ref" in t:
            sums["kl"] = (losses.sequence_sums(old - t["kl_ref"], mask) / tokens).sum()
        return per_seq.sum(), sums


@dataclass(frozen=True)
class ReMax(GRPO):
    name: str = "remax"

    def advantages(self, data, group_size):
        return losses.remax_advantages(data["rewards"], data["greedy_rewards"])


@dataclass(frozen=True)
class DPO(Algorithm):
    """Pairs are consecutive rows (chosen, rejected); the response is what follows the first
    `prompt_len` positions (half of the sequence when not given: the toy task), its padding
    excluded."""

    name: str = "dpo"
    beta: float = 0.1
    prompt_len: Optional[int] = None
    rows_together: int = 2  # a pair: its two rows stay on one rank and in one micro-batch
    recomputes_behaviour: bool = False

    def reference_logprobs(self, logits, seqs, gen_len):
        gen = seqs.shape[1] - (seqs.shape[1] // 2 if self.prompt_len is None else self.prompt_len)
        lp = losses.token_logprobs(logits, seqs, gen)
        mask = losses.response_mask(seqs, gen)
        return (lp if mask is None else lp * mask).sum(-1)

    def targets(self, data, value_model, group_size):
        return {"seqs": data["pairs"], "ref": data["ref_logprobs"]}

    def normalizer(self, t, rows):
        return len(rows) / 2  # pairs

    def loss(self, y, t, value_model):
        """Rows 0, 2, 4, ... are the chosen responses, 1, 3, 5, ... the rejected ones."""
        lp = self.reference_logprobs(y, t["seqs"], 0)
        chosen, rejected = (lp[0::2], t["ref"][0::2]), (lp[1::2], t["ref"][1::2])
        margin = losses.dpo_margin(chosen[0], rejected[0], chosen[1], rejected[1], self.beta)
        loss = losses.dpo_loss(chosen[0], rejected[0], chosen[1], rejected[1], self.beta).sum()
        return loss, {"margin": margin.sum(), "accuracy": (margin > 0).float().sum()}

    def metrics(self, t, value_model):
        return {}


@dataclass(frozen=True)
class SFT(Algorithm):
    """Next-token cross-entropy on the tokens after the first `prompt_len` positions (0: every
    token of a text; a prompt/completion pair trains on the completion only, as TRL does), padding
    excluded."""

    name: str = "sft"
    prompt_len: int = 0
    recomputes_behaviour: bool = False

    def targets(self, data, value_model, group_size):
        seqs = data["sequences"]
        target = seqs[:, 1:]
        mask = (target >= 0) & (torch.arange(1, seqs.shape[1], device=seqs.device) >= self.prompt_len)
        return {"seqs": seqs, "mask": mask.float()}

    def normalizer(self, t, rows):
        return float(t["mask"][rows].sum())

    def loss(self, y, t, value_model):
        return (losses.sft_loss(y, t["seqs"]) * t["mask"]).sum(), {}

    def metrics(self, t, value_model):
        return {}


ALGORITHMS: dict[str, type[Algorithm]] = {"ppo": PPO, "grpo": GRPO, "rloo": RLOO, "remax": ReMax, "dpo": DPO,
                                          "sft": SFT}


def make_algorithm(name: str, scenario=None) -> Algorithm:
    """The algorithm of a scenario (DPO and SFT learn where their responses start from the
    scenario's data). A custom dataflow can be planned and estimated, but the runtime would not
    know what its keys mean: it is refused by name."""
    data = getattr(scenario, "data", None)
    try:
        cls = ALGORITHMS[name]
    except KeyError:
        raise ConfigError(f"the runtime trains {', '.join(ALGORITHMS)}; a {name!r} dataflow can be planned "
                          "and estimated but not run", "algorithm") from None
    training = getattr(scenario, "training", None)
    if cls in (DPO, SFT):
        args = {"prompt_len": data.prompt_len} if data is not None else {}
        if cls is DPO and training is not None:
            args["beta"] = training.beta_for("dpo")
        return cls(**args)
    if training is None:
        return cls()
    args = dict(kl_coef=training.beta_for(name), clip=training.epsilon, clip_high=training.epsilon_high,
                temperature=training.temperature, loss_type=training.loss_type_for(name),
                decoupled=scenario.dataflow.max_staleness > 0, behav_weight_cap=training.behav_imp_weight_cap)
    if cls is GRPO:
        args["scale_rewards"] = training.scale_rewards
    if cls is RLOO:
        args["normalize_advantages"] = training.normalize_advantages
    if cls is PPO:
        args.update(gamma=training.gamma, lam=training.lam, value_clip=training.cliprange_value,
                    whiten_rewards=training.whiten_rewards)
    return cls(**args)
