"""RLHF losses and advantages. Pure functions on per-token tensors of the generated part
(batch, gen_len) unless stated otherwise.

PPO (Schulman et al.; Ouyang et al. for the KL-shaped reward):
    r_t      = -kl_coef * (logp_t - ref_logp_t)  (+ the reward model's score at the last token)
    delta_t  = r_t + gamma * V_{t+1} - V_t,   A_t = sum_k (gamma * lam)^k delta_{t+k}   (GAE)
    policy   = mean( max(-A ratio, -A clip(ratio, 1-eps, 1+eps)) ),  ratio = exp(logp - logp_old)
    value    = mean( max((V - R)^2, (clip(V, V_old - eps_v, V_old + eps_v) - R)^2) ) / 2,  R = A + V_old
GRPO: A = (score - mean of its group) / (std of its group + 1e-6), for every token; KL to the
reference with the unbiased k3 estimator exp(ref - logp) - (ref - logp) - 1.
RLOO: A = score - mean of the other samples of its group. ReMax: A = score - greedy score.
DPO:  -log sigmoid(beta ((logp_c - ref_c) - (logp_r - ref_r))) on sequence log-probabilities.
SFT:  cross-entropy of the next token.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def token_logprobs(logits: torch.Tensor, seqs: torch.Tensor, gen_len: int) -> torch.Tensor:
    """Log-probabilities of the last `gen_len` tokens of `seqs` under `logits` (batch, seq, vocab)."""
    logp = torch.log_softmax(logits[:, -gen_len - 1:-1].float(), dim=-1)
    return logp.gather(-1, seqs[:, -gen_len:, None]).squeeze(-1)


def gae(rewards: torch.Tensor, values: torch.Tensor, gamma: float = 1.0, lam: float = 0.95
        ) -> tuple[torch.Tensor, torch.Tensor]:
    """(advantages, returns) by generalized advantage estimation; V after the last token is 0."""
    T = rewards.shape[1]
    adv = torch.zeros_like(rewards)
    last = rewards.new_zeros(rewards.shape[0])
    for t in reversed(range(T)):
        next_v = values[:, t + 1] if t + 1 < T else torch.zeros_like(last)
        delta = rewards[:, t] + gamma * next_v - values[:, t]
        last = delta + gamma * lam * last
        adv[:, t] = last
    return adv, adv + values


def kl_shaped_rewards(score: torch.Tensor, logp: torch.Tensor, ref_logp: torch.Tensor, kl_coef: float
                      ) -> torch.Tensor:
    r = -kl_coef * (logp - ref_logp)
    r[:, -1] += score
    return r


def policy_loss(logp: torch.Tensor, old_logp: torch.Tensor, adv: torch.Tensor, clip: float = 0.2) -> torch.Tensor:
    ratio = torch.exp(logp - old_logp)
    return torch.max(-adv * ratio, -adv * ratio.clamp(1 - clip, 1 + clip)).mean()


def value_loss(values: torch.Tensor, old_values: torch.Tensor, returns: torch.Tensor, clip: float = 0.2) -> torch.Tensor:
    clipped = old_values + (values - old_values).clamp(-clip, clip)
    return 0.5 * torch.max((values - returns) ** 2, (clipped - returns) ** 2).mean()


def whiten(x: torch.Tensor) -> torch.Tensor:
    return (x - x.mean()) / (x.std() + 1e-6) if x.numel() > 1 else x - x.mean()


def grpo_advantages(score: torch.Tensor, group: int) -> torch.Tensor:
    g = score.view(-1, group)
    return ((g - g.mean(1, keepdim=True)) / (g.std(1, keepdim=True) + 1e-6)).view(-1)


def rloo_advantages(score: torch.Tensor, group: int) -> torch.Tensor:
    g = score.view(-1, group)
    others = (g.sum(1, keepdim=True) - g) / (group - 1)
    return (g - others).view(-1)


def k3_kl(logp: torch.Tensor, ref_logp: torch.Tensor) -> torch.Tensor:
    d = ref_logp - logp
    return (torch.exp(d) - d - 1).mean()


def dpo_loss(logp_chosen, logp_rejected, ref_chosen, ref_rejected, beta: float = 0.1) -> torch.Tensor:
    return -F.logsigmoid(beta * ((logp_chosen - ref_chosen) - (logp_rejected - ref_rejected))).mean()


def sft_loss(logits: torch.Tensor, seqs: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]).float(), seqs[:, 1:].reshape(-1))
