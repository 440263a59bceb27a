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
    value_t  = max((V_t - R_t)^2, (clip(V_t, V_old - eps_v, V_old + eps_v) - R_t)^2) / 2
    advantages are whitened over the batch: (A - mean) / (std + 1e-6), std with Bessel's correction
GRPO (Shao et al. 2024): A = (score - mean of its group) / (std of its group + 1e-6) for every
    token; KL to the reference by the k3 estimator exp(ref - logp) - (ref - logp) - 1 (Schulman's
    "Approximating KL divergence"), added to the loss with kl_coef.
RLOO (Ahmadian et al. 2024): A = score - mean of the other samples of its group.
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


def whiten(x: torch.Tensor, mask: Optional[torch.Tensor] = None) -> torch.Tensor:
    """(x - mean) / (std + 1e-6) over the response tokens (std with Bessel's correction);
    positions outside the mask become 0."""
    m = torch.ones_like(x) if mask is None else mask
    n = m.sum()
    if n <= 1:
        return (x - masked_mean(x, m)) * m
    mean = (x * m).sum() / n
    std = (((x - mean) ** 2 * m).sum() / (n - 1)).sqrt()
    return (x - mean) / (std + 1e-6) * m


def policy_loss(logp: torch.Tensor, old_logp: torch.Tensor, adv: torch.Tensor, clip: float = 0.2) -> torch.Tensor:
    """The clipped surrogate per token."""
    ratio = torch.exp(logp - old_logp)
    return torch.max(-adv * ratio, -adv * ratio.clamp(1 - clip, 1 + clip))


def clipped_fraction(logp: torch.Tensor, old_logp: torch.Tensor, adv: torch.Tensor, clip: float = 0.2) -> torch.Tensor:
    """Per token, 1 where the clipped term is the one taken (its gradient is zero)."""
    ratio = torch.exp(logp - old_logp)
    return (-adv * ratio.clamp(1 - clip, 1 + clip) > -adv * ratio).float()


def value_loss(values: torch.Tensor, old_values: torch.Tensor, returns: torch.Tensor, clip: float = 0.2) -> torch.Tensor:
    """The clipped value loss per token."""
    clipped = old_values + (values - old_values).clamp(-clip, clip)
    return 0.5 * torch.max((values - returns) ** 2, (clipped - returns) ** 2)


def k3_kl(logp: torch.Tensor, ref_logp: torch.Tensor) -> torch.Tensor:
    """The k3 estimator of KL(policy || reference) per token (non-negative, unbiased)."""
    d = ref_logp - logp
    return torch.exp(d) - d - 1


def grpo_advantages(score: torch.Tensor, group: int) -> torch.Tensor:
    g = score.view(-1, group)
    return ((g - g.mean(1, keepdim=True)) / (g.std(1, keepdim=True) + 1e-6)).view(-1)


def rloo_advantages(score: torch.Tensor, group: int) -> torch.Tensor:
    g = score.view(-1, group)
    others = (g.sum(1, keepdim=True) - g) / (group - 1)
    return (g - others).view(-1)


def remax_advantages(score: torch.Tensor, greedy_score: torch.Tensor) -> torch.Tensor:
    return score - greedy_score


def dpo_margin(logp_chosen, logp_rejected, ref_chosen, ref_rejected, beta: float = 0.1) -> torch.Tensor:
    """The implicit reward margin of each pair."""
    return beta * ((logp_chosen - ref_chosen) - (logp_rejected - ref_rejected))


def dpo_loss(logp_chosen, logp_rejected, ref_chosen, ref_rejected, beta: float = 0.1) -> torch.Tensor:
    """Per pair."""
    return -F.logsigmoid(dpo_margin(logp_chosen, logp_rejected, ref_chosen, ref_rejected, beta))


def sft_loss(logits: torch.Tensor, seqs: torch.Tensor) -> torch.Tensor:
    """Next-token cross-entropy per position, (batch, seq - 1) (padding targets: a mask drops them)."""
    return F.cross_entropy(logits[:, :-1].float().transpose(1, 2), seqs[:, 1:].clamp(min=0), reduction="none")
