"""RLHF losses and advantages. Pure functions on tensors of the generated part, (batch, gen_len),
with an optional `mask` of the same shape (1 for response tokens, 0 for padding and everything
after the end of sequence; responses are contiguous from the first generated position).
Losses are per token or per sequence, not reduced: the trainer sums them and divides by the
optimizer step's count of tokens or sequences, which keeps a step's gradient independent of how
the batch is split over data parallelism and micro-batches.

PPO (Schulman et al. 2017; Ouyang et al. 2022 for the KL-shaped reward):
    r_t      = -kl_coef * (logp_t - ref_logp_t),  plus the score at the last response token
    delta_t  = r_t + gamma * V_{t+1} - V_t,   A_t = sum_k (gamma * lam)^k delta_{t+k}   (GAE;
               no value and no reward after the last response token)
    R_t      = A_t + V_t   (the critic's target)
    policy_t = max(-A_t ratio_t, -A_t clip(ratio_t, 1 - eps, 1 + eps)),  ratio = exp(logp - logp_old)
    decoupled (AReaL, for samples from older weights): the same around the proximal policy,
    times the behaviour weight exp(logp_prox - logp_behaviour), capped (see decoupled_policy_loss)
    value_t  = max((V_t - R_t)^2, (clip(V_t, V_old - eps_v, V_old + eps_v) - R_t)^2) / 2
    advantages are whitened over the batch's response tokens, TRL's masked_whiten:
    (A - mean) / sqrt(var + 1e-8), var with Bessel's correction; `whiten_rewards` whitens the
    KL-shaped per-token rewards the same way before GAE, the mean kept (shift_mean=False)
GRPO (Shao et al. 2024): A = (score - mean of its group) / (std of its group + 1e-4) for every
    token (TRL's `scale_rewards`: the group's std, the batch's, or none); KL to the reference by the k3 estimator exp(ref - logp) - (ref - logp) - 1 (Schulman's
    "Approximating KL divergence"), added to the loss with kl_coef.
RLOO (Ahmadian et al. 2024), as TRL's RLOOTrainer: r = score - beta sum_t (logp_t - ref_t) (the k1
    KL of the sequence subtracted from its score), A = r - mean of the other samples of its group;
    one ratio per sequence, exp(sum_t logp_t - sum_t logp_old_t), clipped per sequence, the loss
    -min(ratio A, clip(ratio) A) averaged over the step's sequences (`loss_type` rloo). The
    token-level variant (any other loss_type) takes GRPO's per-token loss with these advantages.
ReMax (Li et al. 2023): A = score - score of the greedy response to the same prompt.
DPO (Rafailov et al. 2023): -log sigmoid(beta ((logp_c - ref_c) - (logp_r - ref_r))) on sequence
    log-probabilities; the implicit reward margin is beta ((logp_c - ref_c) - (logp_r - ref_r)).
SFT: cross-entropy of the next token.
"""

from __future__ import annotations

from typing import Optional

import torch
import torch.nn.functional as F


def token_logprobs(logits: torch.Tensor, seqs: torch.Tensor, gen_len: int, temperature: float = 1.0) -> torch.Tensor:
    """Log-probabilities (fp32) of the last `gen_len` tokens of `seqs` under `logits` (batch, seq,
    vocab) divided by `temperature` (what sampling at that temperature drew from); padding (-1)
    gets a value that a mask must drop."""
    logp = torch.log_softmax(_scaled(logits[:, -gen_len - 1:-1], temperature), dim=-1)
    return logp.gather(-1, seqs[:, -gen_len:, None].clamp(min=0)).squeeze(-1)


def response_mask(seqs: torch.Tensor, gen_len: int) -> Optional[torch.Tensor]:
    """1 for the tokens of the last `gen_len` positions that are not padding (-1); None when none
    is padding (the toy task), so that the unmasked formulas apply exactly."""
    mask = seqs[:, -gen_len:] >= 0
    return None if bool(mask.all()) else mask.float()


def entropy(logits: torch.Tensor, gen_len: int, temperature: float = 1.0) -> torch.Tensor:
    """Entropy (nats) of the distribution of each of the last `gen_len` tokens, (batch, gen_len)."""
    logp = torch.log_softmax(_scaled(logits[:, -gen_len - 1:-1], temperature), dim=-1)
    return -(logp.exp() * logp).sum(-1)


def _scaled(logits: torch.Tensor, temperature: float) -> torch.Tensor:
    logits = logits.float()
    return logits if temperature == 1.0 else logits / temperature


def masked_mean(x: torch.Tensor, mask: Optional[torch.Tensor] = None) -> torch.Tensor:
    return x.mean() if mask is None else (x * mask).sum() / mask.sum().clamp(min=1)


def gae(rewards: torch.Tensor, values: torch.Tensor, mask: Optional[torch.Tensor] = None, gamma: float = 1.0,
        lam: float = 0.95) -> tuple[torch.Tensor, torch.Tensor]:
    """(advantages, returns) by generalized advantage estimation; the value after the last
    response token is 0, and positions after it get advantage 0."""
    if mask is not None:
        rewards, values = rewards * mask, values * mask
    T = rewards.shape[1]
    adv = torch.zeros_like(rewards)
    last = rewards.new_zeros(rewards.shape[0])
    for t in reversed(range(T)):
        next_v = values[:, t + 1] if t + 1 < T else torch.zeros_like(last)
        delta = rewards[:, t] + gamma * next_v - values[:, t]
        last = delta + gamma * lam * last
        adv[:, t] = last
    return adv, adv + values


def last_index(mask: Optional[torch.Tensor], rows: int, length: int, device=None) -> torch.Tensor:
    """Position of each row's last response token."""
    if mask is None:
        return torch.full((rows,), length - 1, dtype=torch.long, device=device)
    return (mask.sum(1).long() - 1).clamp(min=0)


def kl_shaped_rewards(score: torch.Tensor, logp: torch.Tensor, ref_logp: torch.Tensor, kl_coef: float,
                      mask: Optional[torch.Tensor] = None) -> torch.Tensor:
    """Per-token rewards: the KL penalty on every response token, the score on the last one."""
    r = -kl_coef * (logp - ref_logp)
    if mask is not None:
        r = r * mask
    rows = torch.arange(r.shape[0], device=r.device)
    r[rows, last_index(mask, r.shape[0], r.shape[1], r.device)] += score
    return r


def whiten(x: torch.Tensor, mask: Optional[torch.Tensor] = None, shift_mean: bool = True) -> torch.Tensor:
    """TRL's masked_whiten over the response tokens: (x - mean) / sqrt(var + 1e-8), var with
    Bessel's correction, the mean added back unless `shift_mean`; positions outside the mask
    become 0."""
    m = torch.ones_like(x) if mask is None else mask
    n = m.sum()
    mean = (x * m).sum() / n.clamp(min=1)
    if n <= 1:
        return ((x - mean) if shift_mean else x) * m
    var = ((x - mean) ** 2 * m).sum() / (n - 1)
    out = (x - mean) * torch.rsqrt(var + 1e-8)
    return (out if shift_mean else out + mean) * m


def sequence_sums(x: torch.Tensor, mask: Optional[torch.Tensor] = None) -> torch.Tensor:
    """Per row, the sum over its response tokens."""
    return (x if mask is None else x * mask).sum(-1)


def policy_loss(logp: torch.Tensor, old_logp: torch.Tensor, adv: torch.Tensor, clip: float = 0.2,
                clip_high: Optional[float] = None) -> torch.Tensor:
    """The clipped surrogate per token; the ratio is clipped to [1 - clip, 1 + clip_high]
    (clip_high = clip unless given: DAPO's asymmetric clipping)."""
    ratio = torch.exp(logp - old_logp)
    return torch.max(-adv * ratio, -adv * ratio.clamp(1 - clip, 1 + (clip if clip_high is None else clip_high)))


def decoupled_policy_loss(logp: torch.Tensor, prox_logp: torch.Tensor, behav_logp: torch.Tensor, adv: torch.Tensor,
                          clip: float = 0.2, clip_high: Optional[float] = None,
                          behav_weight_cap: Optional[float] = None) -> torch.Tensor:
    """AReaL's decoupled PPO objective (Fu et al. 2025) per token, for samples generated by older
    weights (asynchronous RL): the clipped surrogate around the proximal policy (the weights
    before this update), weighted by the behaviour importance weight of the policy that generated
    the token,
        w_t = exp(prox_logp_t - behav_logp_t),   policy_t = w_t max(-A_t ratio_t, -A_t clip(ratio_t)),
        ratio_t = exp(logp_t - prox_logp_t);
    tokens whose w exceeds `behav_weight_cap` (AReaL's behav_imp_weight_cap) are dropped (weight
    0). The weight is data (no gradient). With prox_logp == behav_logp (a synchronous step) it is
    `policy_loss` exactly."""
    w = torch.exp(prox_logp - behav_logp).detach()
    if behav_weight_cap is not None:
        w = torch.where(w <= behav_weight_cap, w, torch.zeros_like(w))
    return w * policy_loss(logp, prox_logp, adv, clip, clip_high)


def clipped_fraction(logp: torch.Tensor, old_logp: torch.Tensor, adv: torch.Tensor, clip: float = 0.2,
                     clip_high: Optional[float] = None) -> torch.Tensor:
    """Per token, 1 where the clipped term is the one taken (its gradient is zero)."""
    ratio = torch.exp(logp - old_logp)
    clipped = ratio.clamp(1 - clip, 1 + (clip if clip_high is None else clip_high))
    return (-adv * clipped > -adv * ratio).float()


def loss_weights(mask: torch.Tensor, loss_type: str) -> torch.Tensor:
    """Per-token weights that turn "sum over tokens / response tokens of the step" (how the
    trainer normalizes) into TRL's aggregation of a step's per-token losses:
      dapo, bnpo  the token mean over the step: weight 1 (realbench's step gradient does not
                  depend on the layout, so TRL's local-batch bnpo is the step's dapo here);
      grpo        the mean over rows of each row's token mean: N / (R n_row);
      dr_grpo     sum / (R x gen_len) (Dr. GRPO's constant, TRL's max_completion_length): N / (R G);
    with N the step's response tokens, R its rows, G the generated length."""
    if loss_type in ("dapo", "bnpo"):
        return mask
    n, rows = mask.sum(), mask.shape[0]
    if loss_type == "grpo":
        return mask * n / (rows * mask.sum(1, keepdim=True).clamp(min=1))
    if loss_type == "dr_grpo":
        return mask * n / (rows * mask.shape[1])
    raise ValueError(f"unknown loss_type {loss_type!r}")


def value_loss(values: torch.Tensor, old_values: torch.Tensor, returns: torch.Tensor, clip: float = 0.2) -> torch.Tensor:
    """The clipped value loss per token."""
    clipped = old_values + (values - old_values).clamp(-clip, clip)
    return 0.5 * torch.max((values - returns) ** 2, (clipped - returns) ** 2)


def k3_kl(logp: torch.Tensor, ref_logp: torch.Tensor) -> torch.Tensor:
    """The k3 estimator of KL(policy || reference) per token (non-negative, unbiased)."""
    d = ref_logp - logp
    return torch.exp(d) - d - 1


def _nanstd(x: torch.Tensor, dim=None, keepdim: bool = False) -> torch.Tensor:
    """Standard deviation with Bessel's correction over the values that are not NaN."""
    mean = x.nanmean(dim=dim, keepdim=True) if dim is not None else x.nanmean()
    n = (~x.isnan()).sum(dim=dim, keepdim=True) if dim is not None else (~x.isnan()).sum()
    var = ((x - mean) ** 2).nansum(dim=dim, keepdim=True if dim is not None else False) / (n - 1).clamp(min=1)
    out = var.sqrt()
    return out if keepdim or dim is None else out.squeeze(dim)


def grpo_advantages(score: torch.Tensor, group: int, scale: str = "group") -> torch.Tensor:
    """(score - mean of its group) / (std + 1e-4), TRL's: the std of the group (`scale` group),
    of the batch (batch) or none (none, Dr. GRPO's). A NaN score (no scorer gave a reward) is
    left out of the means and deviations and gets advantage 0, as TRL's. A group of one (TRL asks
    for two or more) has no others: its score is its advantage (verl's compute_grpo_outcome_advantage:
    mean 0 and std 1 for a prompt of one sample)."""
    if group == 1:
        return torch.nan_to_num(score.reshape(-1), nan=0.0)
    g = score.view(-1, group)
    adv = g - g.nanmean(1, keepdim=True)
    if scale == "group":
        adv = adv / (_nanstd(g, 1, keepdim=True) + 1e-4)
    elif scale == "batch":
        adv = adv / (_nanstd(score) + 1e-4)
    elif scale != "none":
        raise ValueError(f"unknown scale_rewards {scale!r}")
    return torch.nan_to_num(adv.reshape(-1), nan=0.0)


def rloo_advantages(score: torch.Tensor, group: int, normalize: bool = False) -> torch.Tensor:
    """TRL's RLOOTrainer: score - the mean of the other scored samples of its group, (sum - r_i) /
    (n - 1) over the n samples that have a score (NaN: none); a sample without a score, or the
    only one of its group with one, gets 0. `normalize` (TRL's normalize_advantages): then
    (A - mean) / (std + 1e-4) over the scored samples, std with Bessel's correction. A group of one
    has no others: its score is its advantage (verl's compute_rloo_outcome_advantage: mean 0), then
    normalized as the others are."""
    if group == 1:
        adv = score.reshape(-1)
    else:
        g = score.view(-1, group)
        scored = (~g.isnan()).sum(1, keepdim=True)
        adv = (g - (g.nansum(1, keepdim=True) - g) / (scored - 1)).reshape(-1)  # 0 / 0 alone: NaN, then 0
    if normalize:
        adv = (adv - adv.nanmean()) / (_nanstd(adv) + 1e-4)
    return torch.nan_to_num(adv, nan=0.0)


def remax_advantages(score: torch.Tensor, greedy_score: torch.Tensor) -> torch.Tensor:
    return torch.nan_to_num(score - greedy_score, nan=0.0)


def dpo_margin(logp_chosen, logp_rejected, ref_chosen, ref_rejected, beta: float = 0.1) -> torch.Tensor:
    """The implicit reward margin of each pair."""
    return beta * ((logp_chosen - ref_chosen) - (logp_rejected - ref_rejected))


def dpo_loss(logp_chosen, logp_rejected, ref_chosen, ref_rejected, beta: float = 0.1) -> torch.Tensor:
    """Per pair."""
    return -F.logsigmoid(dpo_margin(logp_chosen, logp_rejected, ref_chosen, ref_rejected, beta))


def sft_loss(logits: torch.Tensor, seqs: torch.Tensor) -> torch.Tensor:
    """Next-token cross-entropy per position, (batch, seq - 1) (padding targets: a mask drops them)."""
    return F.cross_entropy(logits[:, :-1].float().transpose(1, 2), seqs[:, 1:].clamp(min=0), reduction="none")
