"""A model placed on one layout, seen from one rank: forward and backward through the pipeline,
gradient averaging over data parallelism, and the weights as a dict of named shards.

Pipeline schedule: Megatron's 1F1B (realbench.plan.pipeline, whose docstring has the order and
the activations each stage holds; the cost model charges those). With v virtual stages (a train
layout of the interleaved schedule, realbench.models.shards) each rank runs its v chunks of
layers, and a micro-batch goes round the pipeline v times: chunk k of the last stage sends to
chunk k + 1 of the first. A stage's program (realbench.plan.pipeline.stage_program) places its
point-to-point messages in batches where Megatron places its send/receive calls, so that no two
ranks wait on each other's sends: tests replay the messages under NCCL's rules. Between stages, activations go forward and
their gradients backward with point-to-point messages to the rank of the same (dp, tp)
coordinates in the neighbouring stage. Every rank of the layout is given the token ids of its
data-parallel share (so each stage knows the shapes it will receive, and which positions are
padding: id -1, left of a prompt or after the end of a response); the last stage returns the
outputs (logits or values) and owns the loss.
"""

from __future__ import annotations

from typing import Callable, Optional, Sequence

import torch
import torch.distributed as dist

from realbench.models import ModelSpec
from realbench.runtime.layout import Coord, Groups, Layout
from realbench.runtime.model import LlamaStage
from realbench.models.shards import is_adapter, param_specs
from realbench.plan.pipeline import ACTIVATION, EXCHANGE, FORWARD, GRADIENT, stage_program


class PlacedModel:
    def __init__(self, spec: ModelSpec, layout: Layout, rank: int, groups: Groups,
                 device: torch.device | str = "cpu", dtype: torch.dtype = torch.float32):
        c = layout.coord(rank)
        if c is None:
            raise ValueError(f"rank {rank} is not in the layout")
        self.spec, self.layout, self.rank, self.coord = spec, layout, rank, c
        d = layout.dims
        self.tp_group = groups.get(layout.tp_group(c))
        self.dp_ranks = layout.dp_group(c)
        self.dp_group = groups.get(self.dp_ranks)
        # a mixture of experts split over ep replicas: the all-to-alls' group, and the replicas that
        # hold this rank's experts (their gradients' average)
        self.ep_group = groups.get(layout.ep_group(c)) if d.ep > 1 else None
        self.expert_dp_ranks = layout.expert_dp_group(c)
        self.expert_dp_group = groups.get(self.expert_dp_ranks) if d.ep > 1 else self.dp_group
        self.device = torch.device(device)
        self.stage = LlamaStage(spec, d.tp, c.tp, d.pp, c.pp, self.tp_group, self.device, dtype, d.v,
                                tp_ranks=layout.tp_group(c), ep=d.ep, ep_rank=layout.ep_rank(c),
                                ep_group=self.ep_group, ep_ranks=layout.ep_group(c))
        self.loop_group = groups.loop(layout.pp_group(c)) if d.pp > 1 else None
        self.pp_group = groups.get(layout.pp_group(c))
        self.prev = layout.rank_of(Coord(c.dp, c.tp, c.pp - 1)) if c.pp > 0 else None
        self.next = layout.rank_of(Coord(c.dp, c.tp, c.pp + 1)) if c.pp < d.pp - 1 else None
        # chunk k's neighbours: the stages around, and across the wrap from the last stage's
        # chunk k to the first stage's chunk k + 1 (interleaved schedule)
        self.sources = [self.prev if self.prev is not None or k == 0 else layout.rank_of(Coord(c.dp, c.tp, d.pp - 1))
                        for k in range(d.v)]
        self.targets = [self.next if self.next is not None or k == d.v - 1 else layout.rank_of(Coord(c.dp, c.tp, 0))
                        for k in range(d.v)]

    @property
    def is_last(self) -> bool:
        return self.next is None

    # -- weights ----------------------------------------------------------------------------------------
    def shards(self, aliases: bool = True) -> dict[str, torch.Tensor]:
        """This rank's shards by name (views of the stage's flat buffer); a tied head that shares
        the embedding's tensor is listed under both names unless `aliases` is false (files)."""
        return {k: v.detach() for k, v in self.stage.state_dict().items() if aliases or k not in self.stage.aliases}

    @torch.no_grad()
    def load_shards(self, shards: dict[str, torch.Tensor]) -> None:
        """Fill every shard from `shards`; LoRA adapters only where given (a base checkpoint has none)."""
        for k, v in self.shards(aliases=False).items():
            if k in shards or not is_adapter(k):
                v.copy_(shards[k])

    # -- compute ----------------------------------------------------------------------------------------
    def _width(self, tokens: torch.Tensor) -> int:
        """The columns of a micro-batch up to its last token: the ones after it (right padding of
        responses that ended early) are left out, since causal attention makes the positions
        before them compute what they would with them; every stage, holding the same ids, leaves
        out the same columns (and so knows the shape of what it receives)."""
        valid = tokens >= 0
        return int(valid.any(0).nonzero().max()) + 1 if bool(valid.any()) else tokens.shape[1]

    def _stage_forward(self, tokens: torch.Tensor, x: Optional[torch.Tensor], grad: bool,
                       checkpointing: bool = False, chunk: int = 0) -> torch.Tensor:
        """One micro-batch through one chunk of this stage, from its tokens (the first chunk of
        the first stage) or the hidden states `x` received; the last stage's output is padded
        back with zeros to the batch's width."""
        width, used = tokens.shape[1], self._width(tokens)
        tokens = tokens[:, :used]
        valid = tokens >= 0
        valid = None if bool(valid.all()) else valid
        with torch.set_grad_enabled(grad):
            y = self.stage(tokens if x is None else x, valid=valid, checkpointing=checkpointing, chunk=chunk)
        if self.targets[chunk] is None and used < width:  # zeros at the padding, as every consumer masks it
            y = torch.nn.functional.pad(y, (0, 0) * (y.dim() - 2) + (0, width - used))
        return y

    def _exchange(self, step, micro_batches: list[torch.Tensor], outbox: dict, inputs: dict, grads: dict) -> None:
        """One batch of the program's sends (from `outbox`) and receives (into `inputs`:
        activations by the item that uses them, `grads`: gradients of an item's output). An
        activation goes to the chunk's next virtual stage, a gradient to its previous one."""
        ops = []
        for kind, item in step.sends:
            peer = self.targets[item[1]] if kind == ACTIVATION else self.sources[item[1]]
            ops.append(dist.P2POp(dist.isend, outbox.pop((kind, item)), peer))
        for kind, item in step.recvs:
            tokens = micro_batches[item[0]]
            buf = torch.empty(len(tokens), self._width(tokens), self.spec.hidden, device=self.device,
                              dtype=self.stage.flat.dtype)
            if kind == ACTIVATION:
                inputs[item], peer = buf, self.sources[item[1]]
            else:
                grads[item], peer = buf, self.targets[item[1]]
            ops.append(dist.P2POp(dist.irecv, buf, peer))
        for request in dist.batch_isend_irecv(ops):
            request.wait()

    @torch.no_grad()
    def forward(self, micro_batches: list[torch.Tensor]) -> Optional[list[torch.Tensor]]:
        """Outputs per micro-batch on the last stage, None on the others."""
        d = self.layout.dims
        outbox, inputs, outs = {}, {}, {}
        for step in stage_program(len(micro_batches), d.pp, self.coord.pp, d.v, forward_only=True):
            if step.kind == EXCHANGE:
                self._exchange(step, micro_batches, outbox, inputs, {})
                continue
            i, k = step.item
            y = self._stage_forward(micro_batches[i], inputs.pop(step.item, None), grad=False, chunk=k)
            if self.targets[k] is not None:
                outbox[ACTIVATION, step.item] = y.contiguous()
            else:  # the model's output, on the last stage
                outs[i] = y
        return [outs[i] for i in range(len(micro_batches))] if self.is_last else None

    def forward_backward(self, micro_batches: list[torch.Tensor],
                         loss_fn: Callable[[int, torch.Tensor], torch.Tensor],
                         checkpointing: bool = False) -> Optional[float]:
        """Forward and backward of every micro-batch (and chunk, with virtual stages) in this
        stage's 1F1B program (realbench.plan.pipeline.stage_program): a micro-batch's
        activations are kept from its forward to its backward only. loss_fn(index, output) gives
        each micro-batch's loss on the last stage (already scaled: the gradients are summed over
        micro-batches and averaged over dp). Returns the summed loss on the last stage.
        `checkpointing`: activation checkpointing of every block (see LlamaStage.forward)."""
        d = self.layout.dims
        outbox, inputs, grads, saved, total = {}, {}, {}, {}, 0.0
        for step in stage_program(len(micro_batches), d.pp, self.coord.pp, d.v):
            if step.kind == EXCHANGE:
                self._exchange(step, micro_batches, outbox, inputs, grads)
                continue
            i, k = step.item
            if step.kind == FORWARD:
                x = inputs.pop(step.item, None)
                if x is not None:
                    x.requires_grad_(True)
                y = self._stage_forward(micro_batches[i], x, grad=True, checkpointing=checkpointing, chunk=k)
                if self.targets[k] is not None:
                    outbox[ACTIVATION, step.item] = y.detach().contiguous()
                saved[step.item] = (x, y, self._balancing_loss(micro_batches[i], len(micro_batches)))
                continue
            x, y, balancing = saved.pop(step.item)
            if self.targets[k] is None:
                loss = loss_fn(i, y)
                total += float(loss.detach())
                (loss if balancing is None else loss + balancing).backward()
            else:
                y.backward(grads.pop(step.item))
            del y  # its graph is freed: this micro-batch's activations go now
            if x is not None:
                outbox[GRADIENT, step.item] = x.grad.contiguous()
        assert not outbox and not saved, "the program left a message unsent or a backward undone"
        self.sum_tied_gradients()
        self.average_gradients()
        return total if self.next is None else None

    def _balancing_loss(self, tokens: torch.Tensor, micro_batches: int) -> Optional[torch.Tensor]:
        """A mixture of experts' load-balancing loss of the forward just run (realbench.runtime.experts),
        times the config's coefficient, over the step's micro-batches (as gradient accumulation
        scales a forward's loss), where the config turns it on: the whole model on this stage
        (the runtime refuses it over a pipeline); None otherwise."""
        moe = self.spec.moe
        if moe is None or not moe.aux_loss_coef:
            return None
        from realbench.runtime.experts import load_balancing_loss

        logits = [b.moe.router_logits for b in self.stage.layers.values() if hasattr(b, "moe")]
        valid = (tokens[:, :self._width(tokens)] >= 0).reshape(-1)
        return moe.aux_loss_coef * load_balancing_loss(logits, moe.experts, moe.top_k, valid) / micro_batches

    def sum_tied_gradients(self) -> None:
        """A head tied to the embedding but held on another stage than the embedding is a copy:
        the first and last stages sum the two gradients (as Megatron does), so both copies take
        the same optimizer steps and stay equal. (On one stage the head is the embedding's own
        parameter, and autograd sums the two uses.)"""
        if not self.spec.tie_embeddings or self.layout.dims.pp == 1 or not (self.prev is None or self.next is None):
            return
        p = self.stage.embed.weight if self.prev is None else self.stage.head.weight
        if p.grad is None:
            p.grad = torch.zeros_like(p)
        dist.all_reduce(p.grad, group=self.loop_group)

    @torch.no_grad()
    def grad_norm(self) -> float:
        """The global L2 norm of the model's gradients (after the data-parallel average): each
        tensor-parallel slice once, a tensor that tp replicates (norms, a value head) once, a
        head tied to an embedding on another stage once (its copy is left out). Every rank of
        the layout gets the same number (two small all-reduces, over tp and pp)."""
        c = self.coord
        specs = {p.name: p for p in param_specs(self.spec)}
        tied_copy = self.spec.tie_embeddings and self.layout.dims.pp > 1
        counted = [(specs[name].expert >= 0, p.grad) for name, p in self.stage.named_parameters()
                   if p.grad is not None and not (tied_copy and name == "head.weight")
                   and (specs[name].split is not None or c.tp == 0)]
        total = torch.zeros(1, dtype=torch.float64, device=self.device)
        for expert in (False, True):  # one norm per tensor (foreach, as torch's clip_grad_norm_), summed in fp64
            grads = [g for e, g in counted if e == expert]
            part = torch.stack(torch._foreach_norm(grads)).double().pow(2).sum() if grads else torch.zeros_like(total)
            if expert and self.ep_group is not None:  # each expert on one replica of the group
                dist.all_reduce(part, group=self.ep_group)
            total += part
        for group in (self.tp_group, self.pp_group):
            if group is not None:
                dist.all_reduce(total, group=group)
        return float(total.sqrt())

    def average_gradients(self) -> None:
        """Average the gradients over data parallelism with one all-reduce of all of them in a
        flat buffer (as DDP's buckets do): a collective per tensor pays its latency ~40 times. A
        mixture of experts' routed experts are summed over the replicas that hold them (one of each
        expert-parallel group), the rest over every replica, and both divided by dp: an expert's
        gradient on its replica already sums what the tokens of its group's ep replicas sent it."""
        if len(self.dp_ranks) == 1:
            return
        specs = {p.name: p for p in param_specs(self.spec)}
        named = [(specs[name].expert >= 0, p.grad) for name, p in self.stage.named_parameters() if p.grad is not None]
        for expert, group, ranks in ((False, self.dp_group, self.dp_ranks),
                                     (True, self.expert_dp_group, self.expert_dp_ranks)):
            grads = [g for e, g in named if e == expert]
            if not grads:
                continue
            flat = torch.cat([g.reshape(-1).float() for g in grads])  # summed in fp32 whatever the dtype
            if len(ranks) > 1:
                dist.all_reduce(flat, group=group)
            flat /= len(self.dp_ranks)
            offset = 0
            for g in grads:
                g.copy_(flat[offset:offset + g.numel()].view_as(g))
                offset += g.numel()


_M32 = 0xFFFFFFFF


def _pcg(x: torch.Tensor) -> torch.Tensor:
    """PCG's output permutation (O'Neill, the RXS-M-XS hash of a 32-bit state) on int64 tensors
    holding 32-bit values: every product stays below 2^62, so nothing overflows."""
    state = (x * 747796405 + 2891336453) & _M32
    word = (((state >> ((state >> 28) + 4)) ^ state) * 277803737) & _M32
    return (word >> 22) ^ word


def row_uniforms(key: int, rows: torch.Tensor, t: int) -> torch.Tensor:
    """One number in (0, 1) per row for token t, a hash of (key, row, t): a row's draws do not
    depend on which rank, micro-batch or data-parallel shard samples it, so the same seed gives
    the same samples under every plan (and a run that switches plans samples what it would have)."""
    x = _pcg(_pcg(torch.full_like(rows, key & _M32)) ^ rows)
    x = _pcg(x ^ t)
    return (x.double() + 0.5) / 2.0 ** 32


def truncated(probs: torch.Tensor, top_k: int = 0, top_p: float = 1.0) -> torch.Tensor:
    """The probabilities with all but the `top_k` most likely tokens (0: all) set to 0, then all
    but the smallest set of the most likely tokens left whose mass reaches `top_p` of what top-k
    kept (transformers' TopKLogitsWarper, then TopPLogitsWarper on the renormalized
    distribution; at least one token is kept). Not renormalized: sampling inverts the
    cumulative sum up to its own total."""
    if not top_k and top_p >= 1.0:
        return probs
    ordered, order = probs.sort(-1, descending=True)
    keep = torch.ones_like(ordered, dtype=torch.bool)
    if top_k:
        keep[:, top_k:] = False
    if top_p < 1.0:
        kept = ordered * keep
        before = kept.cumsum(-1) - kept  # mass of the more likely tokens top-k kept
        keep &= before < top_p * kept.sum(-1, keepdim=True)
    keep[:, 0] = True
    return probs * torch.zeros_like(keep).scatter(-1, order, keep)


def sample_rows(probs: torch.Tensor, uniforms: torch.Tensor) -> torch.Tensor:
    """Inverse-CDF sampling: per row, the first token whose cumulative probability exceeds u."""
    cdf = probs.double().cumsum(-1)
    token = torch.searchsorted(cdf, (uniforms * cdf[:, -1])[:, None]).squeeze(-1)
    return token.clamp(max=probs.shape[-1] - 1)


def sample_tokens(logits: torch.Tensor, rows: torch.Tensor, t, key: int, greedy: bool, temperature: float,
                  top_k: int, top_p: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Token t of each row from its last logits (rows, vocab): the argmax, or a draw from the
    tempered, truncated distribution with the row's own uniform (`row_uniforms` of its global
    index `rows`, on the logits' device; t a number or one per row). Returns (tokens, their
    log-probabilities under the whole tempered distribution)."""
    logp = torch.log_softmax(logits.float() / (1.0 if greedy else temperature), dim=-1)
    if greedy:
        token = logp.argmax(-1)
    else:
        token = sample_rows(truncated(logp.exp(), top_k, top_p), row_uniforms(key, rows, t))
    return token, logp.gather(-1, token[:, None]).squeeze(-1)


@torch.no_grad()
def generate(model: PlacedModel, prompts: torch.Tensor, gen_len: int, key: int = 0,
             greedy: bool = False, temperature: float = 1.0, top_k: int = 0, top_p: float = 1.0, micro_batches: int = 1,
             eos: Optional[int | Sequence[int]] = None, rows: Optional[torch.Tensor] = None,
             drop_finished: bool = True, limits: Optional[torch.Tensor] = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Sample up to `gen_len` tokens after `prompts` (batch, prompt_len) with a KV cache per
    micro-batch, from the logits divided by `temperature`, among the `top_k` / `top_p` most likely
    tokens (`truncated`; the log-probabilities returned are of the whole tempered distribution,
    as the training forward computes them).
    Prompts may be left-padded (id -1): each row's positions start at its first token. With `eos`
    (an id or several), a row ends with an end-of-sequence token: the positions after it hold -1
    and its log-probabilities there are 0. `limits` (batch,): each row's own most tokens (a
    serving engine's per-request max_tokens), at most gen_len.

    Finished rows leave the decode batch (`drop_finished`; False keeps every row to the last
    step, the reference the tests compare with): each decode step computes the rows still
    alive, their KV-cache rows are compacted when some end, and a micro-batch whose rows all
    ended stops. The result has the full width (prompt_len + gen_len) whatever the lengths.

    Pipelined over micro-batches: every rank handles the slots (token t, micro-batch j) in
    lexicographic order. A stage sends its hidden states on without waiting; the last stage
    samples (every tp rank draws the same token: the draws are `row_uniforms(key, rows, t)`, a
    function of the row's global index `rows` (default 0..B-1), and the logits are gathered)
    and sends the tokens back to the first stage (on a group of its own, see `Groups.loop`),
    which needs them only for the same micro-batch's next slot. So while micro-batch j's tokens
    travel the loop, the stages work on the other micro-batches: a decode step costs max(m, pp)
    stage slots (no bubble once m >= pp), the schedule that realbench.cost assumes. With `eos`,
    each stage tells the next, before the hidden states of a slot, which of the micro-batch's
    rows are still alive (a mask of the rows alive at the previous slot: its size is known to
    both): the first stage reads it from the tokens, the others pass it on, so every stage drops
    the same rows at the same slot, and a micro-batch whose mask is all false ends on every
    stage at that slot. Every slot depends only on slots earlier in that order, so it cannot
    deadlock, however differently the micro-batches end.
    Returns (sequences, log-probabilities of the sampled tokens) on every rank of the pipeline."""
    B, P = prompts.shape
    row_ids = torch.arange(B) if rows is None else rows.cpu()
    dev = model.device
    sizes = [len(c) for c in prompts.chunk(micro_batches)]
    starts = [sum(sizes[:j]) for j in range(len(sizes))]
    live = [torch.arange(s, s + n, device=dev) for s, n in zip(starts, sizes)]  # rows each micro-batch decodes
    ended = [False] * len(sizes)
    caches = [model.stage.new_caches() for _ in sizes]
    seqs = torch.full((B, P + gen_len), -1, dtype=torch.long, device=dev)
    seqs[:, :P] = prompts
    logprobs = torch.zeros(B, gen_len, device=dev)
    valid = prompts >= 0
    padded = not bool(valid.all())
    first_free = valid.sum(1)  # each row's position after its prompt
    stops = None if eos is None else torch.tensor([eos] if isinstance(eos, int) else list(eos), device=dev)
    finished = torch.zeros(B, dtype=torch.bool, device=dev)  # (last stage, drop_finished off) rows past their end
    limits = None if limits is None else limits.to(dev)
    ends = stops is not None or limits is not None
    dropping = ends and drop_finished
    pipeline = model.layout.pp_group(model.coord)
    first, last = pipeline[0], pipeline[-1]
    pending = []  # (request, tensor): a tensor must live until its send completes
    dtype = model.stage.flat.dtype
    for t in range(gen_len):
        if all(ended):
            break
        new = P if t == 0 else 1
        for j in range(len(sizes)):
            if ended[j]:
                continue
            if t > 0 and model.prev is None and not model.is_last:  # the tokens of this micro-batch's previous slot
                token = torch.empty(len(live[j]), dtype=torch.long, device=dev)
                dist.recv(token, last, group=model.loop_group)
                seqs[live[j], P + t - 1] = token
            if t > 0 and dropping:
                if model.prev is None:
                    alive = torch.ones(len(live[j]), dtype=torch.bool, device=dev)
                    if stops is not None:
                        alive &= ~torch.isin(seqs[live[j], P + t - 1], stops)
                    if limits is not None:
                        alive &= t < limits[live[j]]
                else:
                    alive = torch.empty(len(live[j]), dtype=torch.uint8, device=dev)
                    dist.recv(alive, model.prev)
                    alive = alive.bool()
                if model.next is not None:
                    mask = alive.to(torch.uint8)
                    pending.append((dist.isend(mask, model.next), mask))
                if not bool(alive.all()):
                    live[j] = live[j][alive]
                    if not len(live[j]):
                        ended[j] = True
                        continue
                    keep_cache_rows(caches[j], alive.nonzero().squeeze(1))
            rows = live[j]
            if not padded:
                positions, keys = torch.arange(P + t - new, P + t, device=dev), None
            elif t == 0:  # every stage knows the prompts, so each derives the same positions
                positions, keys = None, valid[rows]
            else:  # generated tokens count as valid on every stage (a finished row's are unused)
                positions, keys = (first_free[rows] + t - 1)[:, None], None
            if model.prev is not None:
                x = torch.empty(len(rows), new, model.spec.hidden, device=dev, dtype=dtype)
                dist.recv(x, model.prev)
            else:
                x = seqs[rows, :P] if t == 0 else seqs[rows, P + t - 1:P + t]
            y = model.stage(x, positions, caches[j], valid=keys, last_only=True)
            if model.next is not None:
                y = y.contiguous()
                pending.append((dist.isend(y, model.next), y))
            if model.is_last:
                token, chosen = sample_tokens(y[:, -1], row_ids[rows.cpu()].to(dev), t, key, greedy, temperature,
                                              top_k, top_p)
                if ends and not dropping:
                    done = finished[rows] | (t >= limits[rows]) if limits is not None else finished[rows]
                    token, chosen = token.masked_fill(done, -1), chosen.masked_fill(done, 0.0)
                    finished[rows] = done | torch.isin(token, stops) if stops is not None else done
                logprobs[rows, t], seqs[rows, P + t] = chosen, token
                if first != model.rank and t + 1 < gen_len:
                    pending.append((dist.isend(token, first, group=model.loop_group), token))
    for req, _ in pending:
        req.wait()
    _share_from_last(model, seqs, logprobs)
    return seqs, logprobs


def keep_cache_rows(caches: dict, index: torch.Tensor) -> None:
    """Keep the rows `index` of a micro-batch's KV caches (every layer's keys and values, and
    which keys are padding), dropping the others' memory."""
    if caches["valid"] is not None:
        caches["valid"] = caches["valid"][index]
    for cache in caches["layers"].values():
        if "k" in cache:
            cache["k"], cache["v"] = cache["k"][index], cache["v"][index]


def _share_from_last(model: PlacedModel, *tensors: torch.Tensor) -> None:
    """Send tensors from the last stage to every other stage of this pipeline."""
    pipeline = model.layout.pp_group(model.coord)
    if len(pipeline) == 1:
        return
    last = pipeline[-1]
    for t in tensors:
        if model.is_last:
            for r in pipeline[:-1]:
                dist.send(t, r)
        else:
            dist.recv(t, last)
