"""A LLaMA decoder in plain torch, one pipeline stage and one tensor-parallel shard at a time.

    x = embed(tokens)                                   # stage 0; vocabulary split over tp, summed
    for each layer of the stage:
        x = x + Wo . attention(rope(Wq . rms(x)), rope(Wk . rms(x)), Wv . rms(x))   # GQA, causal
        x = x + W_down . (silu(W_gate . rms(x)) * (W_up . rms(x)))                  # SwiGLU
    out = head(rms(x))                                   # last stage: LM logits or a value

Tensor parallelism (Megatron): q/k/v/gate/up are column-parallel (each rank holds a block of
heads or FFN units and computes its part from the full input), wo and w_down row-parallel (each
rank multiplies its slice of the input, then an all-reduce sums the parts). Autograd needs the
conjugate collectives: `_copy_to_tp` is the identity forward and an all-reduce of the gradient
backward; `_reduce_from_tp` the reverse. With tp = 1 and one stage this is the plain model.
The embedding is vocabulary-parallel: a rank looks up the tokens of its vocabulary range (zero
for the others) and an all-reduce sums the parts. RMSNorm's epsilon and the rotary base come
from the spec (`norm_eps`, `rope_theta`), as a checkpoint's config gives them.
RoPE follows the rotate-half convention of Hugging Face's LLaMA, so its checkpoints load as they are.
A head tied to the embedding (`spec.tie_embeddings`) is the embedding's own parameter when one
stage holds both.

LoRA (`spec.lora`): a targeted projection adds s B A x (s = lora_alpha / r) to its frozen W x.
Column-parallel: A is replicated and computes from the normed input before `_copy_to_tp`, and
its output u = A x goes through `_copy_to_tp` itself, so that the all-reduce of u's gradient
sums the parts each rank's rows of B give, and every rank's A gets the whole gradient.
Row-parallel: each rank's columns of A multiply its slice of the input, an all-reduce sums the
parts (r values per token), and the replicated B maps them out.
"""

from __future__ import annotations

import contextlib
import math
from typing import Optional

import torch
import torch.distributed as dist
import torch.utils.checkpoint
import torch.nn as nn
import torch.nn.functional as F

from realbench.models import ModelSpec
from realbench.models.shards import (chunk_of, flat_offsets, flat_views, is_adapter, param_specs, shard_shape, stage_layers,
                                      tied_aliases, tp_range)


class _CopyToTP(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        return x

    @staticmethod
    def backward(ctx, grad):
        grad = grad.contiguous()
        dist.all_reduce(grad, group=ctx.group)
        return grad, None


class _ReduceFromTP(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, group):
        x = x.contiguous()
        dist.all_reduce(x, group=group)
        return x

    @staticmethod
    def backward(ctx, grad):
        return grad, None


class _GatherFromTP(torch.autograd.Function):
    """Concatenate the tp ranks' slices along the last dimension, in tp order; backward keeps
    this rank's slice. `order`: the group rank of each tp rank (torch numbers a group's members
    in increasing global rank, which a mesh listing its ranks in another order does not follow)."""

    @staticmethod
    def forward(ctx, x, group, tp_rank, order):
        ctx.rank, ctx.width = tp_rank, x.shape[-1]
        parts = [torch.empty_like(x) for _ in order]
        dist.all_gather(parts, x.contiguous(), group=group)
        return torch.cat([parts[g] for g in order], dim=-1)

    @staticmethod
    def backward(ctx, grad):
        return grad[..., ctx.rank * ctx.width:(ctx.rank + 1) * ctx.width].contiguous(), None, None, None


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x, enter=None):
        """`enter`: what the weight passes through first (a tensor-parallel copy whose backward sums
        its gradient over the group, where each rank normalizes part of the heads)."""
        x32 = x.float()
        weight = self.weight if enter is None else enter(self.weight)
        return (x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)).type_as(x) * weight


def rope_frequencies(spec: ModelSpec) -> tuple[torch.Tensor, float]:
    """(inverse frequencies, attention factor) of the spec's rotary embedding, as transformers'
    ROPE_INIT_FUNCTIONS compute them: theta^(-2i/d) (d the head's rotating dimensions); linear
    scaling divides them by the factor; llama3 (Llama 3.1+) divides the low frequencies (wavelength
    past original/low_freq_factor) by the factor and blends the middle band smoothly; yarn
    interpolates the low frequencies, extrapolates the high ones over a ramp between beta_fast and
    beta_slow rotations, and scales cos and sin by its attention factor (0.1 ln(factor) + 1, or
    DeepSeek's mscale ratio). Computed once per stage."""
    dim = int(spec.head_dim * spec.partial_rotary_factor)
    base = spec.rope_theta
    inv = 1.0 / (base ** (torch.arange(0, dim, 2, dtype=torch.int64).to(torch.float32) / dim))
    sc = spec.rope_scaling
    if sc is None:
        return inv, 1.0
    if sc.rope_type == "linear":
        return inv / sc.factor, 1.0
    if sc.rope_type == "llama3":
        old = sc.original_max_position_embeddings
        low_wavelen, high_wavelen = old / sc.low_freq_factor, old / sc.high_freq_factor
        wavelen = 2 * math.pi / inv
        scaled = torch.where(wavelen > low_wavelen, inv / sc.factor, inv)
        smooth = (old / wavelen - sc.low_freq_factor) / (sc.high_freq_factor - sc.low_freq_factor)
        smoothed = (1 - smooth) * scaled / sc.factor + smooth * scaled
        medium = ~(wavelen < high_wavelen) * ~(wavelen > low_wavelen)
        return torch.where(medium, smoothed, scaled), 1.0
    if sc.rope_type == "yarn":
        factor = sc.factor

        def mscale(scale, m=1.0):
            return 1.0 if scale <= 1 else 0.1 * m * math.log(scale) + 1.0

        attention = sc.attention_factor
        if attention is None:
            attention = (mscale(factor, sc.mscale) / mscale(factor, sc.mscale_all_dim)
                         if sc.mscale and sc.mscale_all_dim else mscale(factor))

        def correction(rotations):
            return dim * math.log(sc.original_max_position_embeddings / (rotations * 2 * math.pi)) / (2 * math.log(base))

        low, high = correction(sc.beta_fast or 32), correction(sc.beta_slow or 1)
        if sc.truncate:
            low, high = math.floor(low), math.ceil(high)
        low, high = max(low, 0), min(high, dim - 1)
        if low == high:
            high += 0.001  # (transformers': no singularity)
        ramp = ((torch.arange(dim // 2, dtype=torch.float32) - low) / (high - low)).clamp(0, 1)
        pos = base ** (torch.arange(0, dim, 2).to(dtype=torch.float32) / dim)
        extrapolated = 1 - ramp
        return (1.0 / (factor * pos)) * (1 - extrapolated) + (1.0 / pos) * extrapolated, float(attention)
    raise ValueError(f"the runtime does not compute rotary scaling {sc.rope_type!r}")


def rotary_tables(positions: torch.Tensor, frequencies: tuple[torch.Tensor, float], dtype: torch.dtype
                  ) -> tuple[torch.Tensor, torch.Tensor]:
    """(cos, sin) of the rotary embedding at `positions`: (seq,) gives (seq, head_dim), (batch,
    seq) (rows starting at different offsets: left padding) gives (batch, 1, seq, head_dim).
    `frequencies`: rope_frequencies'. Computed once per stage forward and shared by its layers."""
    inv, scale = frequencies
    angles = positions.to(torch.float32)[..., None] * inv.to(positions.device)
    cos, sin = angles.cos(), angles.sin()
    if scale != 1.0:
        cos, sin = cos * scale, sin * scale
    cos = torch.cat([cos, cos], dim=-1).to(dtype)
    sin = torch.cat([sin, sin], dim=-1).to(dtype)
    if positions.dim() == 2:  # the same for every head
        cos, sin = cos[:, None], sin[:, None]
    return cos, sin


def rope(x: torch.Tensor, tables: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
    """Rotary embedding, rotate-half form. x: (batch, heads, seq, head_dim)."""
    cos, sin = tables
    half = x.shape[-1] // 2
    rotated = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
    return x * cos + rotated * sin


def attention_mask(valid: Optional[torch.Tensor], S: int, T: int, device) -> torch.Tensor:
    """Which of T keys each of the last S queries sees: causally, over absolute positions (query i
    sees keys 0..T - S + i), and none of the padding keys (`valid`: (batch, T), None when there
    are none). A query always sees itself, so a padding query's output stays finite (it is
    never used): a row of keys all masked would make NaN, which attention would then spread."""
    causal = torch.ones(S, T, dtype=torch.bool, device=device).tril(diagonal=T - S)
    if valid is None:
        return causal
    own = torch.zeros(S, T, dtype=torch.bool, device=device)
    own[torch.arange(S, device=device), torch.arange(T - S, T, device=device)] = True
    return causal & (valid[:, None, None, :] | own)


def decode_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """One query per row against its keys, grouped-query: q (B, H, 1, D), k and v (B, KV, T, D),
    mask (B, 1, 1, T). Query head h reads key head h // (H / KV), as SDPA's enable_gqa does, but
    without its copy of the keys and values per query head: SDPA takes a mask with grouped heads
    only on its math path, which copies them (and a decode step reads little else), while here
    the heads of a group are rows of one product. Scores and softmax in fp32, as a fused kernel keeps
    them (a bf16 product's fp32 output on a GPU); the probabilities times the values in the
    values' dtype."""
    B, H, _, D = q.shape
    KV, T = k.shape[1], k.shape[2]
    grouped = q.reshape(B * KV, H // KV, D)
    keys = k.reshape(B * KV, T, D).transpose(1, 2)
    if q.dtype == torch.float32:
        scores = torch.bmm(grouped, keys)
    elif q.is_cuda:
        scores = torch.bmm(grouped, keys, out_dtype=torch.float32)
    else:
        scores = torch.bmm(grouped.float(), keys.float())
    scores = scores.view(B, KV, H // KV, T) * D ** -0.5
    probs = scores.masked_fill(~mask.view(B, 1, 1, T), float("-inf")).softmax(-1).to(v.dtype)
    return torch.bmm(probs.view(B * KV, H // KV, T), v.reshape(B * KV, T, D)).view(B, H, 1, D)


def positions_of(valid: torch.Tensor) -> torch.Tensor:
    """Positions of the tokens of rows with padding: 0 at each row's first real token (as
    Hugging Face counts them), so a left-padded prompt computes what the unpadded one does."""
    return (valid.long().cumsum(1) - 1).clamp(min=0)


class Block(nn.Module):
    """One decoder layer: attention (with Qwen3's q/k norms where the spec has them) and the MLP,
    dense or a mixture of experts (`moe`: realbench.runtime.experts, its experts split over the
    expert-parallel group `ep_group`, ep of them, this rank's `ep_rank`)."""

    def __init__(self, spec: ModelSpec, tp: int, group, moe: bool = False, ep: int = 1, ep_rank: int = 0,
                 ep_group=None, ep_ranks: Optional[tuple[int, ...]] = None):
        super().__init__()
        h, hd = spec.hidden, spec.head_dim
        self.heads, self.kv_heads, self.head_dim = spec.n_heads // tp, spec.n_kv_heads // tp, hd
        self.group, self.tp = group, tp
        self.frequencies = rope_frequencies(spec)
        self.attn_norm, self.ffn_norm = RMSNorm(h, spec.norm_eps), RMSNorm(h, spec.norm_eps)
        self.wq = nn.Linear(h, self.heads * hd, bias=spec.qkv_bias)
        self.wk = nn.Linear(h, self.kv_heads * hd, bias=spec.qkv_bias)
        self.wv = nn.Linear(h, self.kv_heads * hd, bias=spec.qkv_bias)
        if spec.qk_norm:  # over each head's width, shared by every head (replicated over tp)
            self.q_norm, self.k_norm = RMSNorm(hd, spec.norm_eps), RMSNorm(hd, spec.norm_eps)
        self.wo = nn.Linear(self.heads * hd, h, bias=False)
        if moe:
            from realbench.runtime.experts import Experts

            self.moe = Experts(spec, tp, self._enter, ep, ep_rank, ep_group, ep_ranks)
        else:
            self.w_gate = nn.Linear(h, spec.ffn // tp, bias=False)
            self.w_up = nn.Linear(h, spec.ffn // tp, bias=False)
            self.w_down = nn.Linear(spec.ffn // tp, h, bias=False)
        self.lora_scale = spec.lora.scaling if spec.lora else 0.0
        self.adapters_on = True  # false: the frozen base alone (LlamaStage.adapters)
        for module in (spec.lora.modules if spec.lora else ()):
            # the shard's own part, shaped by its projection's: B's rows of a column-parallel
            # projection (the input, h, is whole), A's columns of a row-parallel one (the output is)
            linear = getattr(self, module)
            n_out, n_in = linear.weight.shape
            linear.lora_A = nn.Parameter(torch.zeros(spec.lora.r, n_in))
            linear.lora_B = nn.Parameter(torch.zeros(n_out, spec.lora.r))

    def _column(self, linear: nn.Linear, normed, entered):
        """A column-parallel projection of the normed input (`entered`: after `_enter`), with its
        adapter when it has one."""
        y = linear(entered)
        if self.adapters_on and hasattr(linear, "lora_A"):
            y = y + self.lora_scale * F.linear(self._enter(F.linear(normed, linear.lora_A)), linear.lora_B)
        return y

    def _row(self, linear: nn.Linear, x):
        """A row-parallel projection of this rank's slice `x`, summed over tp, with its adapter."""
        y = self._leave(linear(x))
        if self.adapters_on and hasattr(linear, "lora_A"):
            y = y + self.lora_scale * F.linear(self._leave(F.linear(x, linear.lora_A)), linear.lora_B)
        return y

    def _enter(self, x):
        return _CopyToTP.apply(x, self.group) if self.tp > 1 else x

    def _leave(self, x):
        return _ReduceFromTP.apply(x, self.group) if self.tp > 1 else x

    def forward(self, x, positions, cache: Optional[dict] = None, mask: Optional[torch.Tensor] = None,
                rotary: Optional[tuple[torch.Tensor, torch.Tensor]] = None):
        """`mask`: which keys each query sees, (S, T) or (B, 1, S, T); None: causal. `rotary`: the
        (cos, sin) tables of `positions`, when the stage computed them already."""
        B, S, _ = x.shape
        n = self.attn_norm(x)
        a = self._enter(n)
        q = self._column(self.wq, n, a).view(B, S, self.heads, self.head_dim)
        k = self._column(self.wk, n, a).view(B, S, self.kv_heads, self.head_dim)
        if hasattr(self, "q_norm"):  # (each rank normalizes its heads: the weights' gradients summed over tp)
            q, k = self.q_norm(q, self._enter), self.k_norm(k, self._enter)
        q, k = q.transpose(1, 2), k.transpose(1, 2)
        v = self._column(self.wv, n, a).view(B, S, self.kv_heads, self.head_dim).transpose(1, 2)
        tables = rotary or rotary_tables(positions, self.frequencies, x.dtype)
        q, k = rope(q, tables), rope(k, tables)
        if isinstance(cache, dict):  # decoding: attend to the cached keys and values too
            if "k" in cache:
                k, v = torch.cat([cache["k"], k], dim=2), torch.cat([cache["v"], v], dim=2)
            cache["k"], cache["v"] = k, v
        elif cache is not None:  # a preallocated cache (realbench.runtime.rollout) writes in place
            k, v, slot_mask = cache.attend(k, v)
            mask = slot_mask if slot_mask is not None else mask
        # grouped-query attention without copying the keys and values per head (enable_gqa);
        # causal by SDPA's own path where no padding needs a mask, and no mask for one query
        gqa = self.heads != self.kv_heads
        if S == 1 and mask is not None and mask.dim() == 4:  # a decode step of the slots
            y = decode_attention(q, k, v, mask)
        elif mask is not None:
            y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=gqa)
        elif S == 1 or S == k.shape[2]:
            y = F.scaled_dot_product_attention(q, k, v, is_causal=S > 1, enable_gqa=gqa)
        else:
            y = F.scaled_dot_product_attention(q, k, v, attn_mask=attention_mask(None, S, k.shape[2], x.device),
                                               enable_gqa=gqa)
        x = x + self._row(self.wo, y.transpose(1, 2).reshape(B, S, self.heads * self.head_dim))
        n = self.ffn_norm(x)
        f = self._enter(n)
        if hasattr(self, "moe"):  # each rank its part of its experts' outputs, summed over tp
            return x + self._leave(self.moe(n, f))
        return x + self._row(self.w_down, F.silu(self._column(self.w_gate, n, f)) * self._column(self.w_up, n, f))


class LlamaStage(nn.Module):
    """Pipeline stage `stage` of `pp`, tensor-parallel shard `tp_rank` of `tp`.

    forward(tokens or hidden, positions, caches) -> hidden states, or on the last stage the
    logits (batch, seq, vocab) or values (batch, seq). The parameters are views of one flat
    buffer on `device` (`self.flat`, laid out by `flat_offsets`), which reallocation reads and
    writes in place; moving the module with `.to()` would give each parameter its own storage
    again, so the device is given here, and the dtype the stage computes in (bf16 or fp32; norms,
    softmax and log-probabilities are computed in fp32 whatever it is)."""

    def __init__(self, spec: ModelSpec, tp: int = 1, tp_rank: int = 0, pp: int = 1, stage: int = 0,
                 tp_group=None, device: torch.device | str = "cpu", dtype: torch.dtype = torch.float32, v: int = 1,
                 tp_ranks: Optional[tuple[int, ...]] = None, ep: int = 1, ep_rank: int = 0, ep_group=None,
                 ep_ranks: Optional[tuple[int, ...]] = None):
        """`tp_ranks`: the global ranks of the tp group in tp order (None: in increasing order).
        A mixture of experts' experts are split over `ep` ranks (`ep_group`, whose global ranks in
        expert-parallel order are `ep_ranks`), this one `ep_rank`."""
        super().__init__()
        width = spec.moe.expert_ffn if spec.moe is not None else spec.ffn
        if spec.n_kv_heads % tp or spec.ffn % tp or width % tp or spec.vocab % tp or spec.hidden % tp:
            raise ValueError(f"tp={tp} does not split {spec.name} (kv heads {spec.n_kv_heads}, ffn {spec.ffn})")
        if ep > 1 and (spec.moe is None or spec.moe.experts % ep):
            raise ValueError(f"ep={ep} does not split the experts of {spec.name}")
        self.ep, self.ep_rank = ep, ep_rank
        if not 0 <= stage < pp <= spec.n_layers:
            raise ValueError(f"stage {stage} of pp={pp} for {spec.n_layers} layers")
        self.spec, self.tp, self.tp_rank, self.pp, self.stage, self.group = spec, tp, tp_rank, pp, stage, tp_group
        self.first, self.last, self.v = stage == 0, stage == pp - 1, v
        self.tp_order = list(range(tp)) if tp_ranks is None or tp == 1 else \
            [dist.get_group_rank(tp_group, r) for r in tp_ranks]
        if v > 1:  # chunks stage, stage + pp, ... of the interleaved schedule (realbench.models.shards)
            self.chunks = [[str(i) for i in range(spec.n_layers) if chunk_of(i, spec.n_layers, pp, v) == stage + k * pp]
                           for k in range(v)]
        else:
            lo, hi = stage_layers(spec.n_layers, pp, stage)
            self.chunks = [[str(i) for i in range(lo, hi)]]
        self.aliases = tied_aliases(spec, pp)  # {"head.weight": "embed.weight"} for a tied head on one stage
        if self.first:
            self.embed = nn.Embedding(spec.vocab // tp, spec.hidden)
        self.layers = nn.ModuleDict({i: Block(spec, tp, tp_group, spec.is_moe_layer(int(i)), ep, ep_rank, ep_group,
                                              ep_ranks) for chunk in self.chunks for i in chunk})
        self.frequencies = rope_frequencies(spec)
        if self.last:
            self.norm = RMSNorm(spec.hidden, spec.norm_eps)
            out = 1 if spec.value_head else spec.vocab // tp
            self.head = nn.Linear(spec.hidden, out, bias=False)
            if self.aliases:
                self.head.weight = self.embed.weight
        self.flat = self._flatten(torch.device(device), dtype)
        if spec.lora is not None:  # only the adapters train: the base gets no gradients
            for name, p in self.named_parameters():
                p.requires_grad_(is_adapter(name))

    @torch.no_grad()
    def _flatten(self, device: torch.device, dtype: torch.dtype) -> torch.Tensor:
        where = (self.spec, self.tp, self.pp, self.stage, self.v, self.ep, self.ep_rank)
        flat = torch.empty(flat_offsets(*where)[1], device=device, dtype=dtype)
        views = flat_views(flat, *where)
        params = dict(self.named_parameters())  # an alias is listed once, under its target's name
        stored = {k: v for k, v in views.items() if k not in self.aliases}
        assert params.keys() == stored.keys(), sorted(set(params) ^ set(stored))
        for name, view in stored.items():
            view.copy_(params[name])
            params[name].data = view
        return flat

    @contextlib.contextmanager
    def adapters(self, on: bool):
        """The LoRA adapters switched on or off inside the block (off: the base model, as
        PEFT's `disable_adapter()`)."""
        blocks = list(self.layers.values())
        before = [b.adapters_on for b in blocks]
        for b in blocks:
            b.adapters_on = on
        try:
            yield self
        finally:
            for b, was in zip(blocks, before):
                b.adapters_on = was

    @contextlib.contextmanager
    def merged(self):
        """The LoRA adapters merged into the frozen base weights, W + s B A, on this rank's
        shards (a column-parallel projection's W rows go with B's rows, a row-parallel one's W
        columns with A's columns, so each rank merges its own), restored exactly on exit: what
        a layout receiving merged weights is sent (Strategy.merge_lora)."""
        saved = []
        with torch.no_grad():
            for b in self.layers.values():
                for linear in (getattr(b, m) for m in ("wq", "wk", "wv", "wo", "w_gate", "w_up", "w_down")
                               if hasattr(b, m)):
                    if hasattr(linear, "lora_A"):
                        saved.append((linear.weight, linear.weight.clone()))
                        linear.weight.add_(b.lora_scale * (linear.lora_B @ linear.lora_A))
        try:
            yield self
        finally:
            with torch.no_grad():
                for weight, was in saved:
                    weight.copy_(was)

    def new_caches(self) -> dict:
        """KV caches for generation: each layer's keys and values, and which keys are padding."""
        return {"valid": None, "layers": {name: {} for name in self.layers}}

    def forward(self, x, positions=None, caches: Optional[dict] = None, valid: Optional[torch.Tensor] = None,
                checkpointing: bool = False, last_only=False, chunk: int = 0):
        """x: token ids (first stage; -1 marks padding) or hidden states. `valid` (batch, seq):
        which positions are tokens rather than padding (None: all). Positions default to the
        count of valid tokens before each one. `checkpointing`: keep only each block's input for
        the backward pass, which runs the block again (activation checkpointing). `last_only`:
        the last stage's output at the last position only (what generation samples from), or with a
        tensor of one position per row, at those. `caches`: new_caches()' dict, or a preallocated
        slot cache (realbench.runtime.rollout.SlotCache, which masks the keys itself). `chunk`:
        which of the stage's chunks of layers to run (interleaved schedule); the embedding runs
        before the first stage's first chunk, the head after the last stage's last one."""
        B, S = x.shape[:2]
        first, last = self.first and chunk == 0, self.last and chunk == self.v - 1
        if first:
            x = self.embed_tokens(x.clamp(min=0))  # padding ids are never attended to
        if positions is None:
            positions = torch.arange(S, device=x.device) if valid is None else positions_of(valid)
        mask = None
        slotted = caches is not None and not isinstance(caches, dict)  # realbench.runtime.rollout.SlotCache
        if caches is not None and not slotted:
            if valid is not None or caches["valid"] is not None:
                new = valid if valid is not None else torch.ones(B, S, dtype=torch.bool, device=x.device)
                keys = new if caches["valid"] is None else torch.cat([caches["valid"], new], dim=1)
                caches["valid"] = keys
                mask = attention_mask(keys, S, keys.shape[1], x.device)
        elif valid is not None:
            mask = attention_mask(valid, S, S, x.device)
        tables = rotary_tables(positions, self.frequencies, x.dtype)
        for name in self.chunks[chunk]:
            block = self.layers[name]
            if checkpointing and torch.is_grad_enabled():
                x = torch.utils.checkpoint.checkpoint(block, x, positions, None, mask, tables, use_reentrant=False)
            else:
                layer_cache = None if caches is None else caches.layer(name) if slotted else caches["layers"][name]
                x = block(x, positions, layer_cache, mask, tables)
        if not last:
            return x
        if isinstance(last_only, torch.Tensor):  # each row's own last position (right-padded prompts)
            return self.output(x[torch.arange(B, device=x.device), last_only][:, None])
        return self.output(x[:, -1:] if last_only else x)

    def embed_tokens(self, tokens):
        """First stage: token ids -> hidden states. Each tp rank holds the rows of its slice of
        the vocabulary: it looks up the tokens that fall there, zeros elsewhere, and an
        all-reduce sums the parts (the gradient reaches only the rows each rank holds)."""
        if self.tp == 1:
            return self.embed(tokens)
        rows = self.embed.weight.shape[0]
        local = tokens - self.tp_rank * rows
        outside = (local < 0) | (local >= rows)
        x = self.embed(local.masked_fill(outside, 0)) * ~outside[..., None]
        return _ReduceFromTP.apply(x, self.group)

    def output(self, x):
        """Last stage: hidden states -> logits (split over the vocabulary) or values."""
        h = self.norm(x)
        if self.spec.value_head:
            return self.head(h).squeeze(-1)
        logits = self.head(_CopyToTP.apply(h, self.group) if self.tp > 1 else h)
        return _GatherFromTP.apply(logits, self.group, self.tp_rank, self.tp_order) if self.tp > 1 else logits

    # -- weights --------------------------------------------------------------------------------------
    @torch.no_grad()
    def load_full(self, full: dict[str, torch.Tensor], only: Optional[set] = None) -> None:
        """Take this shard's slices of full (unsharded) tensors (an alias is filled through its
        target and need not be given); `only`: of these names alone."""
        specs = {s.name: s for s in param_specs(self.spec)}
        own = self.state_dict()
        for name, target in own.items():
            if name in self.aliases or (only is not None and name not in only):
                continue
            s = specs[name]
            src = full[name]
            if s.split is not None:
                a, b = tp_range(s, self.tp, self.tp_rank)
                src = src.narrow(s.split, a, b - a)
            target.copy_(src)


def init_full_weights(spec: ModelSpec, seed: int = 0, std: float = 0.02) -> dict[str, torch.Tensor]:
    """Deterministic full weights (fp32): normal(0, std) matrices, unit norms. Every rank can
    build the same tensors from the seed."""
    g = torch.Generator().manual_seed(seed)
    out = {}
    for s in param_specs(spec, adapters=False):
        if s.name.endswith("norm.weight"):
            out[s.name] = torch.ones(s.shape)
        elif s.name.endswith(".bias"):
            out[s.name] = torch.zeros(s.shape)
        else:
            scale = std / math.sqrt(2 * spec.n_layers) if s.name.endswith(("wo.weight", "w_down.weight")) else std
            out[s.name] = torch.randn(s.shape, generator=g) * scale
    if spec.tie_embeddings:
        out["head.weight"] = out["embed.weight"]
    return {**out, **init_adapters(spec, seed)}


def init_adapters(spec: ModelSpec, seed: int = 0) -> dict[str, torch.Tensor]:
    """Fresh LoRA adapters as PEFT starts them: A uniform in +-1/sqrt(in) (torch's Kaiming
    uniform with a = sqrt(5), what PEFT calls), B zeros, so the adapted model starts as the
    base. Drawn from their own generator: adding adapters leaves the base's draws as they were."""
    from realbench.models.shards import adapter_specs

    g = torch.Generator().manual_seed(seed * 7919 + 17)
    out = {}
    for s in adapter_specs(spec):
        if s.name.endswith("lora_A"):
            bound = 1.0 / math.sqrt(s.shape[1])
            out[s.name] = (torch.rand(s.shape, generator=g) * 2 - 1) * bound
        else:
            out[s.name] = torch.zeros(s.shape)
    return out


__all__ = ["LlamaStage", "init_full_weights", "rope", "shard_shape"]
