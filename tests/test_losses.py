"""Every loss piece against values worked out by hand (or by an independent formula), and the
algorithm objects' targets and losses on small hand-made batches."""

import math

import pytest
import torch

from realbench.runtime import losses
from realbench.runtime.algorithms import DPO, GRPO, PPO, RLOO, SFT, ReMax, make_algorithm

LN = math.log


def close(got, expected, tol=1e-5):
    got = torch.as_tensor(got, dtype=torch.float64)
    expected = torch.as_tensor(expected, dtype=torch.float64)
    assert got.shape == expected.shape and torch.allclose(got, expected, atol=tol, rtol=0), (got, expected)


def test_k3_kl_is_r_minus_1_minus_log_r():
    # r = p_ref / p: (0.5 -> 0.25) gives r = 0.5, (0.25 -> 0.5) gives r = 2
    got = losses.k3_kl(torch.tensor([LN(0.5), LN(0.25), LN(0.3)]), torch.tensor([LN(0.25), LN(0.5), LN(0.3)]))
    close(got, [0.5 - 1 - LN(0.5), 2 - 1 - LN(2), 0.0])
    close(got[:2], [0.193147, 0.306853])


def test_clipped_value_loss_takes_the_worse_of_clipped_and_unclipped():
    old = torch.tensor([0.0, 0.0, 1.4, 0.0])
    ret = torch.tensor([1.0, 1.0, 1.0, -1.0])
    v = torch.tensor([0.5, 0.1, 1.5, -0.5])
    # 0.5: (0.5-1)^2=0.25 vs clipped 0.2: 0.64 -> 0.32; 0.1 inside the clip: 0.81 -> 0.405;
    # 1.5 vs clipped 1.5 (1.4 + 0.1): 0.25 -> 0.125; -0.5: 0.25 vs clipped -0.2: 0.64 -> 0.32
    close(losses.value_loss(v, old, ret, clip=0.2), [0.32, 0.405, 0.125, 0.32])


def test_whitening_with_bessel_and_a_mask():
    close(losses.whiten(torch.tensor([1.0, 2.0, 3.0, 4.0])), [x / math.sqrt(5 / 3) for x in (-1.5, -0.5, 0.5, 1.5)])
    # the masked value takes no part and becomes 0: mean 2, std 1 over the first three
    close(losses.whiten(torch.tensor([[1.0, 2.0, 3.0, 100.0]]), torch.tensor([[1.0, 1.0, 1.0, 0.0]])),
          [[-1.0, 0.0, 1.0, 0.0]])


def test_gae_against_the_sum_of_discounted_td_errors():
    r = torch.tensor([[0.0, 0.0, 1.0]])
    v = torch.tensor([[0.5, 0.4, 0.3]])
    gamma, lam = 0.9, 0.8
    # independent form: A_t = sum_k (gamma lam)^k delta_{t+k}, V after the end = 0
    delta = [0 + gamma * 0.4 - 0.5, 0 + gamma * 0.3 - 0.4, 1 + 0 - 0.3]
    expected = [sum((gamma * lam) ** k * delta[t + k] for k in range(3 - t)) for t in range(3)]
    adv, ret = losses.gae(r, v, gamma=gamma, lam=lam)
    close(adv, [expected])
    close(adv, [[0.12928, 0.374, 0.7]])
    close(ret, [[0.62928, 0.774, 1.0]])
    # with the last position masked: no reward and no value there
    adv, ret = losses.gae(torch.tensor([[0.0, 1.0, 5.0]]), v, torch.tensor([[1.0, 1.0, 0.0]]), gamma, lam)
    close(adv, [[-0.14 + 0.72 * 0.6, 0.6, 0.0]])


def test_kl_shaped_rewards_penalise_every_token_and_add_the_score_at_the_end():
    lp = torch.tensor([[LN(0.5), LN(0.5), LN(0.25)]])
    ref = torch.tensor([[LN(0.25), LN(0.5), LN(0.5)]])
    r = losses.kl_shaped_rewards(torch.tensor([1.0]), lp, ref, 0.1)
    close(r, [[-0.1 * LN(2), 0.0, 1 + 0.1 * LN(2)]])
    # the score goes to the last response token, nothing after it
    r = losses.kl_shaped_rewards(torch.tensor([1.0]), lp, ref, 0.1, torch.tensor([[1.0, 1.0, 0.0]]))
    close(r, [[-0.1 * LN(2), 1.0, 0.0]])


def test_clipped_policy_loss_outside_the_clip_range():
    # (log-ratio, advantage): above the range with A > 0 and below it with A < 0 are clipped
    # (the pessimistic term is the clipped one, and its gradient is zero); the others are not
    d = torch.tensor([0.5, -0.5, 0.5, -0.5, 0.1], requires_grad=True)
    adv = torch.tensor([1.0, 1.0, -1.0, -1.0, 2.0])
    per_token = losses.policy_loss(d, torch.zeros(5), adv, clip=0.2)
    e = math.exp
    close(per_token.detach(), [-1.2, -e(-0.5), e(0.5), 0.8, -2 * e(0.1)])
    per_token.sum().backward()
    close(d.grad, [0.0, -e(-0.5), e(0.5), 0.0, -2 * e(0.1)])
    close(losses.clipped_fraction(d.detach(), torch.zeros(5), adv, 0.2), [1.0, 0.0, 0.0, 1.0, 0.0])


def test_decoupled_policy_loss_weights_the_surrogate_around_the_proximal_policy():
    """Token probabilities now 0.5, before this update (proximal) 0.4, when generated 0.2: the
    ratio to the proximal is 1.25, clipped to 1.2 for A = 1 (the pessimistic term), kept for
    A = -1; the behaviour weight 0.4 / 0.2 = 2 multiplies both; a cap of 1.5 drops the token."""
    logp = torch.tensor([LN(0.5), LN(0.5)], requires_grad=True)
    prox, behav = torch.tensor([LN(0.4)] * 2), torch.tensor([LN(0.2)] * 2)
    adv = torch.tensor([1.0, -1.0])
    per_token = losses.decoupled_policy_loss(logp, prox, behav, adv, clip=0.2)
    close(per_token.detach(), [2 * -1.2, 2 * 1.25])
    per_token.sum().backward()
    close(logp.grad, [0.0, 2 * 1.25])  # clipped: no gradient; else w (-A) ratio
    close(losses.decoupled_policy_loss(logp.detach(), prox, behav, adv, 0.2, behav_weight_cap=1.5), [0.0, 0.0])
    close(losses.decoupled_policy_loss(logp.detach(), prox, behav, adv, 0.2, behav_weight_cap=2.5), [-2.4, 2.5])
    # the generating policy no older than the proximal one: today's loss, bit for bit
    d, a = torch.randn(64), torch.randn(64)
    old = torch.randn(64)
    assert torch.equal(losses.decoupled_policy_loss(d, old, old, a, 0.2, 0.28, behav_weight_cap=5.0),
                       losses.policy_loss(d, old, a, 0.2, 0.28))


def test_group_advantages():
    # TRL's: (score - group mean) / (group std + 1e-4), std with Bessel's correction
    r2 = math.sqrt(2) + 1e-4
    close(losses.grpo_advantages(torch.tensor([1.0, 3.0, 0.0, 0.0]), 2), [-1 / r2, 1 / r2, 0.0, 0.0])
    close(losses.grpo_advantages(torch.tensor([0.0, 3.0, 6.0]), 3), [-3 / 3.0001, 0.0, 3 / 3.0001])  # std 3
    # scale_rewards: the batch's std (sqrt(2): values 1, 3, 0, 0 of mean 1), or none
    batch = math.sqrt(((1 - 1) ** 2 + (3 - 1) ** 2 + 1 + 1) / 3) + 1e-4
    close(losses.grpo_advantages(torch.tensor([1.0, 3.0, 0.0, 0.0]), 2, "batch"), [-1 / batch, 1 / batch, 0, 0])
    close(losses.grpo_advantages(torch.tensor([1.0, 3.0, 0.0, 0.0]), 2, "none"), [-1.0, 1.0, 0.0, 0.0])
    # a sample no scorer rewarded (NaN) leaves its group's statistics and gets advantage 0
    close(losses.grpo_advantages(torch.tensor([1.0, math.nan, 3.0]), 3), [-1 / r2, 0.0, 1 / r2])
    close(losses.remax_advantages(torch.tensor([0.5, -1.0]), torch.tensor([0.2, -1.5])), [0.3, 0.5])
    close(losses.remax_advantages(torch.tensor([math.nan]), torch.tensor([0.2])), [0.0])


def test_asymmetric_clipping_and_loss_type_weights():
    # ratio e^0.3 = 1.35: clipped at 1.2 with epsilon 0.2, not with epsilon_high 0.4 (DAPO)
    d, adv = torch.tensor([0.3]), torch.ones(1)
    close(losses.policy_loss(d, torch.zeros(1), adv, 0.2), [-1.2])
    close(losses.policy_loss(d, torch.zeros(1), adv, 0.2, 0.4), [-math.exp(0.3)])
    close(losses.clipped_fraction(d, torch.zeros(1), adv, 0.2, 0.4), [0.0])
    close(losses.policy_loss(-d, torch.zeros(1), -adv, 0.2, 0.4), [0.8])  # the low side keeps epsilon
    # rows of 1 and 3 response tokens, generated length 4; the trainer divides by N = 4 tokens
    mask = torch.tensor([[1.0, 0, 0, 0], [1, 1, 1, 0]])
    x = torch.tensor([[2.0, 0, 0, 0], [1, 1, 1, 0]])
    mean_of = {"dapo": 5 / 4, "bnpo": 5 / 4, "grpo": (2 / 1 + 3 / 3) / 2, "dr_grpo": 5 / (2 * 4)}
    for loss_type, want in mean_of.items():
        assert float((x * losses.loss_weights(mask, loss_type)).sum() / mask.sum()) == pytest.approx(want)


def test_whitening_keeps_the_mean_when_asked():
    # TRL's whiten_rewards (shift_mean=False): mean 3, unbiased variance (4 + 1 + 9) / 2 = 7
    x = torch.tensor([[1.0, 2.0, 6.0, 9.0]])
    mask = torch.tensor([[1.0, 1.0, 1.0, 0.0]])
    close(losses.whiten(x, mask, shift_mean=False), [[3 + (v - 3) / math.sqrt(7 + 1e-8) for v in (1.0, 2.0, 6.0)] + [0.0]])


def test_rloo_leaves_one_out_among_the_scored_samples():
    nan = math.nan
    close(losses.rloo_advantages(torch.tensor([1.0, 3.0, 5.0]), 3), [1 - 4, 3 - 3, 5 - 2])
    close(losses.rloo_advantages(torch.tensor([1.0, nan, 5.0]), 3), [1 - 5, 0.0, 5 - 1])
    close(losses.rloo_advantages(torch.tensor([2.0, nan, nan, nan]), 4), [0.0] * 4)  # no sibling scored
    # normalized: advantages -3, 0, 3 have mean 0 and std 3 (Bessel)
    close(losses.rloo_advantages(torch.tensor([1.0, 3.0, 5.0]), 3, normalize=True), [-3 / 3.0001, 0.0, 3 / 3.0001])


def test_rloo_subtracts_the_sequences_kl_from_its_score_and_clips_one_ratio_per_sequence():
    # two samples of one prompt, one response token each: KL ln 2 and 0, beta 0.5
    data = {"seqs": torch.tensor([[0, 1], [0, 1]]), "logprobs": torch.tensor([[LN(0.5)], [LN(0.5)]]),
            "ref_logprobs": torch.tensor([[LN(0.25)], [LN(0.5)]]), "rewards": torch.tensor([1.0, 1.0])}
    algo = RLOO(kl_coef=0.5)
    t = algo.targets(data, value_model=False, group_size=2)
    r0, r1 = 1 - 0.5 * LN(2), 1.0
    close(t["adv"][:, 0], [r0 - r1, r1 - r0])
    assert "ref_logp" not in t  # no penalty in the loss
    # a later update: the policy gives token 1 probability 0.75 where the behaviour policy gave
    # 0.5: ratio 1.5, clipped to 1.2 for the positive advantage, not for the negative one
    t["old_logp"] = torch.tensor([[LN(0.5)], [LN(0.5)]])
    loss, parts = algo.loss(logits_for([0.75, 0.75]), t, value_model=False)
    a = r1 - r0
    close(loss, -min(1.5 * -a, 1.2 * -a) - min(1.5 * a, 1.2 * a))
    close(parts["clipfrac"], 1.0)
    assert algo.normalizer(t, torch.arange(2)) == 2  # the step's sequences


def test_dpo_loss_and_margin():
    one = torch.ones(1)
    # margin = 0.1 ((-1 + 1.5) - (-2 + 1.5)) = 0.1; loss = log(1 + e^-0.1)
    close(losses.dpo_margin(-one, -2 * one, -1.5 * one, -1.5 * one, 0.1), [0.1])
    close(losses.dpo_loss(-one, -2 * one, -1.5 * one, -1.5 * one, 0.1), [math.log1p(math.exp(-0.1))])
    close(losses.dpo_loss(-2 * one, -one, -1.5 * one, -1.5 * one, 0.1), [math.log1p(math.exp(0.1))])


def test_sft_loss_is_next_token_cross_entropy():
    logits = torch.tensor([[[0.0, LN(3)], [0.0, 0.0], [5.0, -5.0]]])
    close(losses.sft_loss(logits, torch.tensor([[0, 1, 0]])), [[-LN(0.75), LN(2)]])


def test_token_logprobs_picks_the_generated_tokens():
    logits = torch.zeros(1, 4, 5)
    logits[0, 2, 3] = LN(6)  # p(3) = 6 / (6 + 4)
    lp = losses.token_logprobs(logits, torch.tensor([[0, 1, 2, 3]]), gen_len=2)
    close(lp, [[LN(0.2), LN(0.6)]])


# -- the algorithm objects ---------------------------------------------------------------------------
def logits_for(probs_of_next):
    """(rows, 2, 2) logits over a vocabulary of 2 whose position 0 gives token 1 probability p."""
    return torch.stack([torch.tensor([[0.0, LN(p / (1 - p))], [0.0, 0.0]]) for p in probs_of_next])


def test_ppo_targets_shape_the_rewards_with_the_kl_to_the_reference():
    data = {"seqs": torch.zeros(1, 4, dtype=torch.long), "logprobs": torch.tensor([[LN(0.5), LN(0.5)]]),
            "ref_logprobs": torch.tensor([[LN(0.25), LN(0.5)]]), "rewards": torch.tensor([1.0]),
            "values": torch.zeros(1, 2)}
    t = PPO(kl_coef=0.05, gamma=1.0, lam=1.0).targets(data, value_model=False, group_size=1)
    # rewards: -0.05 ln 2 on the first token, the score 1 on the last; V = 0, so the returns are
    # the rewards to go
    close(t["ret"], [[1 - 0.05 * LN(2), 1.0]])
    close(t["adv"], [[-1 / math.sqrt(2), 1 / math.sqrt(2)]], tol=1e-4)  # whitened
    # the behaviour policy's KL to the reference, summed over the tokens (the trainer divides by
    # their count): uniform logits give ln 0.5 for each token, so (ln 0.5 - ln 0.25) + 0
    _, parts = PPO().loss(torch.zeros(1, 4, 2), t, value_model=False)
    close(parts["kl"], LN(2))
    close(PPO().metrics(t, value_model=True)["value_error"], ((1 - 0.05 * LN(2)) ** 2 + 1) / 2)


def test_ppo_critic_loss_is_the_clipped_value_loss():
    # values are read at the positions before each generated token: y[:, -gen - 1:-1]
    y = torch.tensor([[0.5, 0.1, 7.0]], requires_grad=True)
    t = {"old_values": torch.zeros(1, 2), "ret": torch.ones(1, 2), "seqs": torch.zeros(1, 3, dtype=torch.long)}
    loss, _ = PPO().loss(y, t, value_model=True)
    close(loss.detach(), 0.32 + 0.405)
    loss.backward()
    close(y.grad, [[0.0, 0.1 - 1.0, 0.0]])  # the clipped term of 0.5 has no gradient


def test_grpo_loss_adds_the_k3_penalty_and_the_advantages_come_from_the_group():
    y = logits_for([0.75])
    t = {"seqs": torch.tensor([[0, 1]]), "old_logp": torch.tensor([[LN(0.75)]]), "adv": torch.ones(1, 1),
         "ref_logp": torch.tensor([[LN(0.5)]])}
    loss, parts = GRPO(kl_coef=0.05).loss(y, t, value_model=False)
    k3 = (0.5 / 0.75) - 1 - LN(0.5 / 0.75)
    close(loss, -1.0 + 0.05 * k3)
    close(parts["k3_kl"], k3)
    close(parts["kl"], LN(0.75) - LN(0.5))
    # without behaviour log-probabilities the update takes the forward's own: the ratio is
    # exactly 1 and its gradient is the plain policy gradient, -adv d(logp)
    y = y.clone().requires_grad_(True)
    t.pop("old_logp")
    loss, parts = GRPO(kl_coef=0.0).loss(y, t, value_model=False)
    assert float(loss.detach()) == -1.0 and float(parts["clipfrac"]) == 0.0
    loss.backward()
    close(y.grad[0, 0], [0.25, -0.25])  # -d ln softmax(y)_1 / dy = p - onehot(1), p = (0.25, 0.75)
    close(parts["kl"], LN(0.75) - LN(0.5))
    data = {"seqs": torch.zeros(4, 3, dtype=torch.long), "logprobs": torch.zeros(4, 2),
            "rewards": torch.tensor([1.0, 3.0, 5.0, 5.0]), "greedy_rewards": torch.tensor([0.0, 1.0, 2.0, 6.0])}
    close(RLOO().targets(data, False, 2)["adv"], [[-2.0] * 2, [2.0] * 2, [0.0] * 2, [0.0] * 2])
    close(ReMax().targets(data, False, 1)["adv"], [[1.0] * 2, [2.0] * 2, [3.0] * 2, [-1.0] * 2])
    close(GRPO().targets(data, False, 4)["adv"][:, 0], [(x - 3.5) / math.sqrt(11 / 3) for x in (1, 3, 5, 5)],
          tol=1e-4)


def test_dpo_loss_prefers_the_chosen_rows_and_reports_the_margin():
    # rows: chosen (token 1 with p 0.75), rejected (token 0 with p 0.25); the reference gives 0.5
    y = logits_for([0.75, 0.75])
    t = {"seqs": torch.tensor([[0, 1], [0, 0]]), "ref": torch.tensor([LN(0.5), LN(0.5)])}
    loss, parts = DPO(beta=0.1).loss(y, t, value_model=False)
    margin = 0.1 * ((LN(0.75) - LN(0.5)) - (LN(0.25) - LN(0.5)))
    close(parts["margin"], margin)
    close(parts["accuracy"], 1.0)
    close(loss, math.log1p(math.exp(-margin)))
    assert DPO().normalizer(t, torch.arange(2)) == 1  # one pair


def test_sft_and_normalizers():
    y = logits_for([0.75])
    loss, _ = SFT().loss(y, SFT().targets({"sequences": torch.tensor([[0, 1]])}, False, 1), value_model=False)
    close(loss, -LN(0.75))
    # prompt (2 tokens) and completion: targets at positions 2 and 3 of row 0, 2 of row 1 (the
    # prompt's and the padding's are not trained on)
    t = SFT(prompt_len=2).targets({"sequences": torch.tensor([[5, 6, 7, 8, -1], [-1, 6, 7, -1, -1]])}, False, 1)
    close(t["mask"], [[0.0, 1, 1, 0], [0, 1, 0, 0]])
    assert SFT(prompt_len=2).normalizer(t, torch.arange(2)) == 3
    t = {"seqs": torch.zeros(4, 5, dtype=torch.long), "adv": torch.zeros(4, 3),
         "mask": torch.tensor([[1.0, 1, 0], [1, 1, 1], [1, 0, 0], [0, 0, 0]])}
    assert GRPO().normalizer(t, torch.tensor([0, 2])) == 3  # response tokens of the step's rows
    assert GRPO().normalizer({k: v for k, v in t.items() if k != "mask"}, torch.tensor([0, 2])) == 6


def test_masks_come_from_the_padding_of_the_responses():
    seqs = torch.tensor([[3, 4, 5, 6], [-1, 4, 5, -1]])
    close(losses.response_mask(seqs, 2), [[1.0, 1.0], [1.0, 0.0]])
    assert losses.response_mask(seqs[:1], 2) is None  # no padding: the exact unmasked formulas
    data = {"seqs": seqs, "logprobs": torch.zeros(2, 2), "rewards": torch.tensor([1.0, 3.0])}
    t = GRPO().targets(data, False, 2)
    close(t["mask"], [[1.0, 1.0], [1.0, 0.0]])
    # DPO sums the log-probabilities of the response's tokens only
    y = torch.zeros(2, 4, 2)
    lp = DPO(prompt_len=2).reference_logprobs(y, torch.tensor([[0, 1, 1, 0], [0, 1, 1, -1]]), 0)
    close(lp, [2 * LN(0.5), LN(0.5)])


def test_a_custom_dataflow_is_refused_by_the_runtime():
    from realbench.errors import ConfigError

    with pytest.raises(ConfigError, match="'custom' dataflow can be planned"):
        make_algorithm("custom")


def test_ppo_without_a_reference_shapes_no_kl_into_the_rewards():
    """PPO's targets without reference log-probabilities (dataflow with_ref: false): the rewards
    are the score at the last response token alone, as with a reference equal to the policy
    (zero KL), whatever kl_coef; no KL metric."""
    from realbench.runtime.algorithms import PPO

    g = torch.Generator().manual_seed(0)
    data = {"seqs": torch.randint(1, 9, (3, 6), generator=g), "logprobs": -torch.rand(3, 4, generator=g),
            "values": torch.rand(3, 4, generator=g), "rewards": torch.tensor([1.0, -0.5, 0.25])}
    ppo = PPO(kl_coef=0.3, lam=1.0)
    alone = ppo.targets(data, value_model=True, group_size=1)
    zero_kl = ppo.targets({**data, "ref_logprobs": data["logprobs"]}, value_model=True, group_size=1)
    assert "kl_ref" not in alone and "kl_ref" in zero_kl
    for key in ("adv", "ret"):
        assert torch.equal(alone[key], zero_kl[key]), key
    # hand-worked: gamma 1, lam 1, the score on the last token only: the deltas telescope, the return at
    # each token is the score
    assert torch.allclose(alone["ret"], data["rewards"][:, None].expand(3, 4), atol=1e-6)
