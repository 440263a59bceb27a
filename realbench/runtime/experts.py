"""A mixture of experts, on one rank: the router, top-k routing, and expert parallelism.

    p      = softmax(x W_r^T)                      (fp32; the router is replicated on every rank)
    top_k  = the k largest of p per token           (renormalized to sum to 1 where the config says)
    y      = sum over the token's k experts e of  p_e  W_down_e (silu(W_gate_e x) * W_up_e x)

as transformers' Qwen3MoeSparseMoeBlock and MixtralSparseMoeBlock compute it.

Expert parallelism (ep ranks): the E experts split into ep runs of E / ep, rank r of the group
holding experts r E/ep ... (r + 1) E/ep - 1. The group is ep consecutive data-parallel replicas of
the same tensor-parallel rank and pipeline stage (realbench.runtime.layout): each routes its own
tokens, sends each (token, expert) pair to the expert's rank (an all-to-all, the pairs in expert
order, preceded by one of their counts), computes what it received with its experts, and sends the
outputs back (the reverse all-to-all; autograd runs both the other way in the backward). Each
expert is split over the tensor-parallel group as a dense MLP is (gate and up by rows, down by
columns): every rank of the group routes the same tokens alike and computes its part, and the
block's one all-reduce sums the parts. The routing weights are replicated inputs of those parts,
so their gradient is summed over tp (`_CopyToTP`), as a column-parallel input's is.
"""

from __future__ import annotations

from typing import Optional

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F


class _AllToAll(torch.autograd.Function):
    """Rows of `x` in `send` runs to the group's ranks in order, `recv` rows back from each; the
    backward sends the gradients the other way."""

    @staticmethod
    def forward(ctx, x, send: list[int], recv: list[int], group):
        ctx.send, ctx.recv, ctx.group = send, recv, group
        out = x.new_empty((sum(recv),) + x.shape[1:])
        dist.all_to_all_single(out, x.contiguous(), output_split_sizes=recv, input_split_sizes=send, group=group)
        return out

    @staticmethod
    def backward(ctx, grad):
        out = grad.new_empty((sum(ctx.send),) + grad.shape[1:])
        dist.all_to_all_single(out, grad.contiguous(), output_split_sizes=ctx.send, input_split_sizes=ctx.recv,
                               group=ctx.group)
        return out, None, None, None


class Expert(nn.Module):
    """One expert's SwiGLU, split over tp (its rows of gate and up, its columns of down)."""

    def __init__(self, hidden: int, width: int):
        super().__init__()
        self.w_gate = nn.Linear(hidden, width, bias=False)
        self.w_up = nn.Linear(hidden, width, bias=False)
        self.w_down = nn.Linear(width, hidden, bias=False)

    def forward(self, x):
        return self.w_down(F.silu(self.w_gate(x)) * self.w_up(x))


class Experts(nn.Module):
    """A layer's router and this rank's experts (`first` ... `first + len(experts) - 1` of E, each
    its tp share). forward(normed, entered) gives the rank's part of the layer's output, which the
    caller sums over tp; `router_logits` keeps the last forward's (for the load-balancing loss)."""

    def __init__(self, spec, tp: int, copy_to_tp, ep: int = 1, ep_rank: int = 0, ep_group=None,
                 ep_ranks: Optional[tuple[int, ...]] = None):
        """`ep_ranks`: the group's global ranks in expert-parallel order (None: increasing), since
        torch numbers a group's members by global rank, which a mesh need not follow."""
        super().__init__()
        m = spec.moe
        self.top_k, self.n_experts, self.normalize = m.top_k, m.experts, m.norm_topk_prob
        self.router = nn.Linear(spec.hidden, m.experts, bias=False)
        local = m.experts // ep
        self.first, self.ep, self.ep_group, self._copy_to_tp = ep_rank * local, ep, ep_group, copy_to_tp
        self.experts = nn.ModuleDict({str(self.first + j): Expert(spec.hidden, m.expert_ffn // tp) for j in range(local)})
        self.router_logits: Optional[torch.Tensor] = None
        # the group rank of each expert-parallel rank (the all-to-alls' splits go in group-rank order)
        self.group_rank = torch.arange(ep) if ep == 1 or ep_ranks is None else \
            torch.tensor([dist.get_group_rank(ep_group, r) for r in ep_ranks])

    def route(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(router logits, top-k weights, top-k expert indices) of tokens x (T, h): softmax in fp32,
        renormalized over the picked experts where the config says, in x's dtype."""
        logits = F.linear(x, self.router.weight)
        probs = logits.softmax(-1, dtype=torch.float32)
        weights, index = torch.topk(probs, self.top_k, dim=-1)
        if self.normalize:
            weights = weights / weights.sum(-1, keepdim=True)
        return logits, weights.to(x.dtype), index

    def forward(self, normed: torch.Tensor, entered: torch.Tensor) -> torch.Tensor:
        shape = normed.shape
        x, xe = normed.reshape(-1, shape[-1]), entered.reshape(-1, shape[-1])
        logits, weights, index = self.route(x)
        self.router_logits = logits
        weights = self._copy_to_tp(weights)
        picks = index.reshape(-1)  # (T k): token t's i-th pick at t k + i
        order = torch.argsort(picks, stable=True)  # the pairs in expert order (then token order)
        token = torch.div(order, self.top_k, rounding_mode="floor")
        rows, experts = xe[token], picks[order]
        if self.ep > 1:
            rows, experts, back, send, recv, by_group = self._dispatch(rows, experts)
        counts = torch.bincount(experts - self.first, minlength=len(self.experts)).tolist()
        parts = [self.experts[str(self.first + j)](part)  # each local expert on its run of rows
                 for j, part in enumerate(torch.split(rows, counts)) if counts[j]]
        out = torch.cat(parts) if parts else rows[:0]
        if self.ep > 1:  # back to their senders, in the order they came, then in expert order again
            returned = _AllToAll.apply(out[back], recv, send, self.ep_group)
            out = returned if by_group is None else returned[torch.argsort(by_group)]
        y = torch.zeros(x.shape[0], shape[-1], dtype=out.dtype, device=out.device)
        return y.index_add(0, token, out * weights.reshape(-1)[order, None]).view(shape)

    def _dispatch(self, rows: torch.Tensor, experts: torch.Tensor):
        """Send each (token, expert) row to its expert's rank of the group, in expert order: (the
        rows received in expert order, their experts, where each came in the order of arrival, the
        rows sent to each rank, received from each)."""
        local = self.n_experts // self.ep
        dest = self.group_rank.to(experts.device)[torch.div(experts, local, rounding_mode="floor")]
        by_group = None
        if not bool((dest[1:] >= dest[:-1]).all()):  # the group numbers its ranks otherwise: send in its order
            by_group = torch.argsort(dest, stable=True)
            rows, experts, dest = rows[by_group], experts[by_group], dest[by_group]
        send = torch.bincount(dest, minlength=self.ep)
        recv = torch.empty_like(send)
        dist.all_to_all_single(recv, send, group=self.ep_group)
        send, recv = send.tolist(), recv.tolist()
        received = _AllToAll.apply(rows, send, recv, self.ep_group)
        ids = experts.new_empty(sum(recv))
        dist.all_to_all_single(ids, experts, output_split_sizes=recv, input_split_sizes=send, group=self.ep_group)
        # the rows came by sender, each sender's in expert order: put them in expert order
        order = torch.argsort(ids, stable=True)
        back = torch.empty_like(order)
        back[order] = torch.arange(len(order), device=order.device)
        return received[order], ids[order], back, send, recv, by_group


def load_balancing_loss(logits: list[torch.Tensor], n_experts: int, top_k: int,
                        valid: Optional[torch.Tensor] = None) -> torch.Tensor:
    """The Switch Transformer's load-balancing loss over every layer's router logits of one forward,
    as transformers' load_balancing_loss_func computes it: E sum_e f_e P_e, with f_e the share of
    the (token, pick) pairs routed to expert e per pick rank and P_e the mean router probability of
    e, both over the layers' valid tokens (`valid`: (T,), None: all)."""
    probs = torch.cat([x.float().softmax(-1) for x in logits])  # (L T, E)
    picks = torch.topk(probs, top_k, dim=-1).indices
    mask = F.one_hot(picks, n_experts).float()  # (L T, k, E)
    if valid is None:
        tokens_per_expert, prob_per_expert = mask.mean(0), probs.mean(0)
    else:
        w = valid.float().repeat(len(logits))
        tokens_per_expert = (mask * w[:, None, None]).sum(0) / w.sum()
        prob_per_expert = (probs * w[:, None]).sum(0) / w.sum()
    return n_experts * (tokens_per_expert * prob_per_expert[None]).sum()


def router_spread(stage, tokens: torch.Tensor, ep: Optional[int] = None) -> float:
    """How unevenly a model's routers spread tokens over expert-parallel devices: per mixture-of-experts
    layer, the (token, pick) pairs the busiest of ep devices (E / ep experts each; ep None: one expert
    a device) receives over the mean, averaged over the layers, for `tokens` through `stage` (a whole
    model on one process)."""
    with torch.no_grad():
        stage(tokens)
    spreads = []
    for block in stage.layers.values():
        if not hasattr(block, "moe"):
            continue
        m = block.moe
        picks = torch.topk(m.router_logits.float().softmax(-1), m.top_k, dim=-1).indices.reshape(-1)
        counts = torch.bincount(picks, minlength=m.n_experts).float()
        per_device = counts.view(ep or m.n_experts, -1).sum(1)
        spreads.append(float(per_device.max() / per_device.mean()))
    return sum(spreads) / len(spreads)


def tiny_model_spread() -> float:
    """The default of MoESpec.imbalance: `router_spread` of the runtime's tiny Qwen3-MoE (the
    qwen3-moe-tiny preset, its random weights of seed 0) over 16 rows of 64 random tokens (seed 0),
    one expert a device. A workload's own spread is the scenario's to set (expert_imbalance)."""
    from realbench.models import get_model
    from realbench.runtime.model import LlamaStage, init_full_weights

    spec = get_model("qwen3-moe-tiny")
    stage = LlamaStage(spec)
    stage.load_full(init_full_weights(spec, seed=0))
    tokens = torch.randint(0, spec.vocab, (16, 64), generator=torch.Generator().manual_seed(0))
    return router_spread(stage, tokens)
