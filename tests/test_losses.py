import torch

from realbench.runtime import losses


def test_gae_with_lambda_one_is_reward_to_go_minus_value():
    r = torch.tensor([[0.0, 0.0, 1.0]])
    v = torch.tensor([[0.2, 0.5, 0.1]])
    adv, ret = losses.gae(r, v, gamma=1.0, lam=1.0)
    assert torch.allclose(ret, torch.tensor([[1.0, 1.0, 1.0]]))
    assert torch.allclose(adv, ret - v)


def test_gae_with_lambda_zero_is_td_error():
    r = torch.tensor([[0.5, 1.0]])
    v = torch.tensor([[0.2, 0.3]])
    adv, _ = losses.gae(r, v, gamma=0.9, lam=0.0)
    assert torch.allclose(adv, torch.tensor([[0.5 + 0.9 * 0.3 - 0.2, 1.0 - 0.3]]))


def test_policy_loss_clips():
    old = torch.zeros(1, 1)
    adv = torch.ones(1, 1)
    # a big ratio gains nothing beyond 1 + clip for a positive advantage
    assert torch.isclose(losses.policy_loss(torch.full((1, 1), 2.0), old, adv), torch.tensor(-1.2))
    assert torch.isclose(losses.policy_loss(old, old, adv), torch.tensor(-1.0))


def test_group_baselines():
    s = torch.tensor([1.0, 3.0, 0.0, 0.0])
    assert torch.allclose(losses.rloo_advantages(s, 2), torch.tensor([-2.0, 2.0, 0.0, 0.0]))
    g = losses.grpo_advantages(s, 2)
    assert g[0] < 0 < g[1] and abs(float(g[2])) < 1e-6


def test_dpo_loss_prefers_chosen():
    z = torch.zeros(3)
    assert losses.dpo_loss(z + 1, z, z, z) < losses.dpo_loss(z, z, z, z) < losses.dpo_loss(z, z + 1, z, z)


def test_kl_shaping_adds_score_at_the_end():
    lp, ref = torch.zeros(2, 3), torch.zeros(2, 3)
    r = losses.kl_shaped_rewards(torch.tensor([1.0, -1.0]), lp, ref, 0.1)
    assert r[:, :2].abs().sum() == 0 and torch.equal(r[:, 2], torch.tensor([1.0, -1.0]))


def test_token_logprobs_picks_the_generated_tokens():
    logits = torch.zeros(1, 4, 5)
    logits[0, 2, 3] = 10.0
    seqs = torch.tensor([[0, 1, 2, 3]])
    lp = losses.token_logprobs(logits, seqs, gen_len=1)
    assert lp.shape == (1, 1) and float(lp) > -0.01
