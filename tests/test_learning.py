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
        w._train(ci, critic, data, critic.coord, StepRecord(), step=0)
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


def test_bf16_computes_in_bf16_and_keeps_fp32_master_weights_and_adam_state():
    """The stages hold bf16 weights; the optimizer's master weights and moments are fp32, the
    stage's weights are the master's rounded to bf16 after every step, and an update too small
    for bf16 still accumulates in the master."""
    w = one_device_worker("ppo-tiny-2cpu", dtype=torch.bfloat16)
    assert all(m.stage.flat.dtype == torch.bfloat16 for m in w.masters.values())
    ti = next(i for i, c in enumerate(w.calls) if c.name == "actor_train")
    opt = w.optimizers[ti]
    start = opt.master.detach().clone()
    assert start.dtype == torch.float32
    records = [w.step(k) for k in range(2)]
    assert all(r.loss == r.loss and r.reward == r.reward for r in records)  # finite
    assert torch.equal(w.masters[ti].stage.flat, opt.master.detach().to(torch.bfloat16))
    tensors, step = opt.tensors()
    assert step == 2 * w.calls[ti].optimizer_steps and all(v.dtype == torch.float32 for v in tensors.values())
    moved = (opt.master.detach() - start).abs()
    # Adam's first steps move every weight by about lr = 1e-3: below bf16's resolution for weights
    # of size >= 0.25, so the bf16 copy alone would have lost them
    big = start.abs() > 0.5
    assert big.any() and (moved[big] > 1e-4).float().mean() > 0.5


def test_bf16_logits_are_close_to_fp32():
    from realbench.models import get_model

    spec = get_model("llama-tiny")
    full = init_full_weights(spec, seed=4)
    out = {}
    for dtype in (torch.float32, torch.bfloat16):
        stage = LlamaStage(spec, dtype=dtype)
        stage.load_full(full)
        with torch.no_grad():
            out[dtype] = stage(torch.arange(12)[None] % spec.vocab).float()
    err = (out[torch.bfloat16] - out[torch.float32]).abs().max() / out[torch.float32].abs().max()
    assert 0 < err < 0.05, err
