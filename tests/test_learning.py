"""The trained models learn what they are trained for, measured independently of the code that
trains them: the PPO critic approaches returns computed here, and the DPO policy comes to
prefer the chosen answers on pairs it never trained on. One process, every call on device 0
(single-device layouts need no process group)."""

import torch

from realbench.cost import Estimator
from realbench.plan import get_builtin
from realbench.runtime.model import LlamaStage, init_full_weights
from realbench.runtime.worker import StepRecord, Worker, make_dataset


def one_device_worker(name, **kwargs):
    est = Estimator(get_builtin(name))
    options = {n: next(o for o in est.options[i] if o.mesh.size == 1 and o.mesh.gpu == 0
                       and o.strategy.micro_batches == 1) for i, n in enumerate(est.call_names)}
    return Worker(0, est.scenario, options, seed=0, **kwargs)


def test_the_ppo_critic_learns_the_returns_of_its_batch():
    """A batch from a real PPO step; the critic's train call runs on it again and again (its
    values refreshed each time, as critic_inf would), and its error against the Monte Carlo
    returns of the KL-shaped rewards, computed here, falls."""
    w = one_device_worker("ppo-tiny-2cpu")
    w.step(0)
    ci = next(i for i, c in enumerate(w.calls) if c.name == "critic_train")
    data, critic = dict(w.data[ci]), w.masters[ci]
    gen = data["logprobs"].shape[1]
    kl_coef = w.algorithm.kl_coef
    rewards = -kl_coef * (data["logprobs"] - data["ref_logprobs"])
    rewards[:, -1] += data["rewards"]
    returns = rewards.flip(1).cumsum(1).flip(1)  # gamma = 1: rewards to go
    errors = []
    for _ in range(12):
        with torch.no_grad():
            values = critic.forward([data["seqs"]])[0][:, -gen - 1:-1]
        errors.append(float(((values - returns) ** 2).mean()))
        data["values"] = values
        w._train(ci, critic, data, critic.coord, StepRecord())
    assert errors[-1] < 0.75 * errors[0], errors
    assert all(b < a for a, b in zip(errors, errors[1:])), errors  # every train call brings it closer


def _sequence_logprob(stage, seqs):
    """Sum of log p(token) over the second half of each sequence, in float64, from the logits."""
    with torch.no_grad():
        logp = torch.log_softmax(stage(seqs)[:, :-1].double(), -1).gather(-1, seqs[:, 1:, None]).squeeze(-1)
    return logp[:, seqs.shape[1] // 2 - 1:].sum(-1)


def test_dpo_comes_to_prefer_the_chosen_answers():
    """On pairs it never trained on (chosen: rows 0, 2, ...), the trained policy's log-ratio to
    the reference is higher for the chosen answer, by a margin that grows with training; and
    the run's own margin metric grows too."""
    w = one_device_worker("dpo-tiny-cpu")
    ti = next(i for i, c in enumerate(w.calls) if c.name == "actor_train")
    spec = w.scenario.models["ref"]
    ref = LlamaStage(spec)
    ref.load_full(init_full_weights(spec, seed=0))  # the reference is the initial actor
    held_out = make_dataset(w.calls[ti], "pairs", spec.vocab, seed=0, step=10_000)
    ref_lp = _sequence_logprob(ref, held_out)

    def margin():
        lp = _sequence_logprob(w.masters[ti].stage, held_out)
        d = lp - ref_lp
        return d[0::2] - d[1::2]

    assert margin().abs().max() < 1e-9  # the policy starts as the reference
    reported, held = [], []
    for s in range(8):
        reported.append(w.step(s).metrics["actor_train/margin"])
        held.append(float(margin().mean()))
    assert all(b > a for a, b in zip(held, held[1:])), held
    assert held[-1] > 1.0 and bool((margin() > 0).all()), held
    assert reported[-1] > reported[0] + 0.1, reported  # beta * the log-ratio margin, on the training pairs
