"""realbench's numbers against the reference's formula on the same tensors: TRL's and
transformers' own functions where they can be imported (RLOOTrainer's loss, the top-k and top-p
warpers, the schedulers), TRL's code transcribed where it cannot (RLOOTrainer's advantages,
GRPOTrainer's dapo normalizer, the PPO trainer's whitening: TRL 1.16 has no PPO trainer; its
formula is the one of the trainer the README's PPO settings are named after)."""

import math
from collections import defaultdict

import pytest
import torch

from realbench.runtime import losses
from realbench.runtime.algorithms import GRPO, PPO, RLOO

trl = pytest.importorskip("trl")  # a dev dependency: always there under `make test`


# -- sampling ---------------------------------------------------------------------------------------
def transformers_keeps(probs: torch.Tensor, top_k: int, top_p: float) -> torch.Tensor:
    """The tokens transformers' generate samples from: its top-k warper, then its top-p warper."""
    from transformers.generation.logits_process import TopKLogitsWarper, TopPLogitsWarper

    scores = probs.log()
    if top_k:
        scores = TopKLogitsWarper(top_k)(None, scores)
    if top_p < 1.0:
        scores = TopPLogitsWarper(top_p)(None, scores)
    return scores > -math.inf


def test_top_k_then_top_p_keep_what_transformers_keeps():
    from realbench.runtime.engine import truncated

    p = torch.tensor([[0.5, 0.2, 0.1, 0.08, 0.07, 0.05]])
    # the top-p mass is measured over what top-k kept: 0.5 of the 0.7 kept reaches 0.6 alone
    assert (truncated(p, 2, 0.6) > 0).tolist() == transformers_keeps(p, 2, 0.6).tolist() == [[1, 0, 0, 0, 0, 0]]
    assert (truncated(p, 3, 0.75) > 0).tolist() == transformers_keeps(p, 3, 0.75).tolist() == [[1, 1, 0, 0, 0, 0]]
    g = torch.Generator().manual_seed(0)
    for _ in range(300):
        probs = torch.softmax(torch.randn(3, 12, generator=g) * 2, -1)
        k = int(torch.randint(0, 13, (1,), generator=g))
        top_p = float(torch.rand(1, generator=g)) if torch.rand(1, generator=g) < 0.8 else 1.0
        assert torch.equal(truncated(probs, k, top_p) > 0, transformers_keeps(probs, k, top_p)), (k, top_p)


# -- PPO's whiten_rewards -----------------------------------------------------------------------------
def trl_masked_whiten(values, mask, shift_mean=True):
    """TRL's masked_whiten (trl/core.py, kept by its PPO trainer): unbiased masked variance."""
    mean = (values * mask).sum() / mask.sum()
    var = (((values - mean) ** 2) * mask).sum() / mask.sum() * (mask.sum() / (mask.sum() - 1))
    whitened = (values - mean) * torch.rsqrt(var + 1e-8)
    return whitened + mean if not shift_mean else whitened


def trl_ppo_advantages(score, logprobs, ref_logprobs, values, mask, kl_coef, gamma, lam, whiten_rewards):
    """TRL's PPOTrainer, steps 4 to 6 (the KL-shaped rewards, whiten_rewards, GAE, whitened
    advantages), with the score at each response's last token (see the README)."""
    rewards = -kl_coef * (logprobs - ref_logprobs) * mask
    last = mask.sum(1).long() - 1
    rewards[torch.arange(len(score)), last] += score
    if whiten_rewards:
        rewards = trl_masked_whiten(rewards, mask, shift_mean=False).masked_fill(mask == 0, 0)
    values = values * mask
    lastgaelam, reversed_adv = 0, []
    for t in reversed(range(rewards.shape[1])):
        nextvalues = values[:, t + 1] if t < rewards.shape[1] - 1 else 0.0
        delta = rewards[:, t] + gamma * nextvalues - values[:, t]
        lastgaelam = delta + gamma * lam * lastgaelam
        reversed_adv.append(lastgaelam)
    advantages = torch.stack(reversed_adv[::-1], 1) * mask
    returns = advantages + values
    return trl_masked_whiten(advantages, mask).masked_fill(mask == 0, 0), returns


def _batch(rows=6, gen=5, prompt=3, vocab=7, seed=0):
    """Sequences with responses of different lengths (padding -1 after the end), generation
    log-probabilities, the reference's, values and scores."""
    g = torch.Generator().manual_seed(seed)
    seqs = torch.randint(0, vocab, (rows, prompt + gen), generator=g)
    for r in range(rows):
        seqs[r, prompt + 1 + r % gen:] = -1
    mask = (seqs[:, -gen:] >= 0).float()
    return {"seqs": seqs, "logprobs": -torch.rand(rows, gen, generator=g) * 3 * mask,
            "ref_logprobs": -torch.rand(rows, gen, generator=g) * 3 * mask,
            "values": torch.randn(rows, gen, generator=g), "rewards": torch.randn(rows, generator=g) * 2}, mask


@pytest.mark.parametrize("whiten_rewards", [False, True])
def test_ppo_returns_and_advantages_are_trls(whiten_rewards):
    data, mask = _batch()
    algo = PPO(kl_coef=0.05, gamma=0.99, lam=0.95, whiten_rewards=whiten_rewards)
    t = algo.targets(data, value_model=False, group_size=1)
    adv, ret = trl_ppo_advantages(data["rewards"], data["logprobs"], data["ref_logprobs"], data["values"], mask,
                                  0.05, 0.99, 0.95, whiten_rewards)
    assert torch.allclose(t["adv"], adv, atol=1e-6) and torch.allclose(t["ret"] * mask, ret * mask, atol=1e-6)


# -- RLOO ---------------------------------------------------------------------------------------------
def trl_rloo_advantages(rewards, old_logps, ref_logps, mask, beta, group, normalize=False):
    """TRL 1.16 RLOOTrainer._generate_and_score_completions (rloo_trainer.py, lines 1645-1699):
    the sequence's k1 KL subtracted from its reward, the leave-one-out baseline over the scorable
    siblings, normalize_advantages, NaN to 0."""
    from trl.trainer.utils import nanstd

    rewards = rewards.clone()
    if beta != 0.0:
        rewards = rewards - beta * ((old_logps - ref_logps) * mask).sum(-1)
    grouped = rewards.view(-1, group)
    scorable = (~torch.isnan(grouped)).sum(dim=1, keepdim=True)
    baselines = ((torch.nansum(grouped, dim=1, keepdim=True) - grouped) / (scorable - 1)).view(-1)
    advantages = rewards - baselines
    if normalize:
        advantages = (advantages - torch.nanmean(advantages)) / (nanstd(advantages) + 1e-4)
    return torch.nan_to_num(advantages, nan=0.0)


def trl_rloo_loss(per_token_logps, old_logps, advantages, mask, epsilon=0.2):
    """TRL's own RLOOTrainer._compute_loss, its model forward replaced by these log-probabilities."""

    class Accelerator:
        gather = gather_for_metrics = staticmethod(lambda x: x)
        reduce = staticmethod(lambda x, reduction="sum": x)

    class Trainer:
        epsilon_low = epsilon_high = epsilon
        aux_loss_enabled = False
        model = type("Model", (), {"training": True})()
        accelerator = Accelerator()
        _metrics = {"train": defaultdict(list)}

        def _get_per_token_logps_and_entropies(self, *args, **kwargs):
            return per_token_logps, per_token_logps.detach() * 0, None

    ids = torch.zeros(len(mask), 1, dtype=torch.long)
    inputs = {"prompt_ids": ids, "prompt_mask": torch.ones_like(ids), "completion_ids": mask.long(),
              "completion_mask": mask, "old_logps": old_logps, "advantages": advantages}
    return trl.RLOOTrainer._compute_loss(Trainer(), None, inputs)


@pytest.mark.parametrize("normalize", [False, True])
def test_rloo_is_trls_rlootrainer_advantages_loss_and_gradient(normalize):
    """Groups of 3, one reward missing; a later update (the policy moved: ratios not 1, some
    clipped): realbench's advantages, its loss over the step and the gradient of the logits equal
    TRL's (its own _compute_loss on the same log-probabilities)."""
    from trl.trainer.utils import selective_log_softmax

    data, mask = _batch(rows=6)
    data["rewards"][4] = math.nan
    algo = RLOO(kl_coef=0.05, temperature=0.7, normalize_advantages=normalize)
    t = algo.targets(data, value_model=False, group_size=3)
    want = trl_rloo_advantages(data["rewards"], data["logprobs"], data["ref_logprobs"], mask, 0.05, 3, normalize)
    assert torch.allclose(t["adv"][:, 0], want, atol=1e-6)
    assert float(want.abs().max()) > 0.1 and float(want[4]) == 0.0

    g = torch.Generator().manual_seed(3)
    logits = torch.randn(6, data["seqs"].shape[1], 7, generator=g, requires_grad=True)
    old = (torch.randn(6, 5, generator=g) * 0.3 - 2.0) * mask  # the behaviour policy's log-probs
    t["old_logp"] = old
    loss, parts = algo.loss(logits, t, value_model=False)
    rows = torch.arange(6)
    ours = loss / algo.normalizer(t, rows)
    ours.backward()
    grad, logits.grad = logits.grad.clone(), None
    gen = 5
    per_token = selective_log_softmax(logits[:, -gen - 1:-1] / 0.7, data["seqs"][:, -gen:].clamp(min=0))
    theirs = trl_rloo_loss(per_token, (old * mask).sum(1), want, mask)
    theirs.backward()
    assert float(ours.detach()) == pytest.approx(float(theirs.detach()), abs=1e-6)
    assert torch.allclose(grad, logits.grad, atol=1e-6)
    # some sequences are clipped; the clipped fraction counts sequences
    assert 0 < float(parts["clipfrac"]) < 6


def test_rloo_with_one_scored_sample_in_a_group_gives_no_advantage():
    nan = math.nan
    got = losses.rloo_advantages(torch.tensor([2.0, nan, nan, nan, 1.0, 3.0, nan, 5.0]), 4)
    zero = torch.zeros(2, 4)
    want = trl_rloo_advantages(torch.tensor([2.0, nan, nan, nan, 1.0, 3.0, nan, 5.0]), zero, zero,
                               torch.ones(2, 4), 0.0, 4)
    assert got.tolist() == want.tolist() == [0.0, 0.0, 0.0, 0.0, 1 - 4, 3 - 3, 0.0, 5 - 2]


def test_rloo_keeps_the_token_level_variant_under_another_loss_type():
    """loss_type dapo: GRPO's per-token loss and k3 penalty on RLOO's advantages (no KL in the
    reward), normalized by tokens."""
    data, mask = _batch(rows=4)
    algo = RLOO(kl_coef=0.05, loss_type="dapo")
    t = algo.targets(data, value_model=False, group_size=2)
    assert torch.allclose(t["adv"][:, 0], losses.rloo_advantages(data["rewards"], 2))
    assert "ref_logp" in t and algo.normalizer(t, torch.arange(4)) == float(mask.sum())


# -- how a step's token losses are normalized ---------------------------------------------------------
def test_dapo_divides_every_step_by_the_batchs_tokens_per_step_as_trl():
    """TRL's GRPOTrainer (grpo_trainer.py, loss_type dapo): num_items_in_batch spans the
    generation batch and is rescaled to one accumulation window, normalizer =
    num_items_in_batch / num_processes * gradient_accumulation_steps / steps_per_generation.
    A batch of two optimizer steps with 3 and 5 response tokens: both divide by 4."""
    seqs = torch.tensor([[0, 1, -1, -1], [0, 1, 2, -1], [0, 1, 2, 3], [0, 1, 2, -1]])
    t = {"seqs": seqs, "adv": torch.zeros(4, 3), "mask": (seqs[:, 1:] >= 0).float()}
    items, processes, accumulation, steps_per_generation = float(t["mask"].sum()), 1, 1, 2
    trl_normalizer = items / processes * accumulation / steps_per_generation
    first, second = torch.tensor([0, 1]), torch.tensor([2, 3])
    assert float(t["mask"][first].sum()) == 3 and float(t["mask"][second].sum()) == 5
    dapo = GRPO(loss_type="dapo")
    assert dapo.normalizer(t, first) == dapo.normalizer(t, second) == trl_normalizer == 4
    # bnpo keeps each step's own tokens (TRL's is a micro-batch's; see the README)
    assert GRPO(loss_type="bnpo").normalizer(t, first) == 3


# -- learning-rate schedules --------------------------------------------------------------------------
@pytest.mark.parametrize("name", ["constant", "constant_with_warmup", "linear", "cosine"])
def test_the_schedules_are_transformers_of_the_same_name(name):
    from transformers import get_scheduler

    from realbench.plan.training import OptimizerSettings

    warmup = 0 if name == "constant" else 3
    ours = OptimizerSettings(learning_rate=1.0, lr_scheduler_type=name, warmup_steps=warmup)
    opt = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=1.0)
    theirs = get_scheduler(name, opt, num_warmup_steps=warmup, num_training_steps=12)
    rates = []
    for _ in range(12):
        rates.append(opt.param_groups[0]["lr"])
        opt.step()
        theirs.step()
    assert [ours.learning_rate_at(k, 12) for k in range(12)] == pytest.approx(rates, abs=1e-12)
