"""Call times from a measured profile: the runtime's own schedule, composed from its measured
layer operations (realbench.hardware.profile). Pure functions; None where the profile is silent
(another model shape, a tp degree it did not measure), so that the caller falls back to the
analytic model.

Notation as in realbench.cost.calls; stage j of pp holds n_j layers, the first stage the
embedding, the last the head; a micro-batch is b sequences of S tokens; X(b, S) is the profiled
seconds of operation X; p2p(B) of B bytes.

  stage forward   F_j = [embed.fwd] + n_j block.fwd + [head.fwd] + [p2p(activations) to j+1]
  pipeline        sum_j F_j + (m - 1) max_j F_j              (the first micro-batch fills it: GPipe's
                  time, and 1F1B's, which only orders the same slots otherwise)
                  with v virtual stages (train layouts): sum_j F_j / v + (m - 1/v) max_j F_j, the
                  first micro-batch's chunks filling it, and F_j counting v sends a micro-batch
                  (v - 1 on the last stage: its last chunk ends the trip)
  inference       the pipeline, then logprobs.fwd over the data-parallel shard (language models)
  train, per optimizer step
                  the pipeline of fwd_bwd (plus loss.fwd_bwd on the last stage, two p2p per
                  boundary), then per stage: one all-reduce of all gradients (a flat buffer)
                  over dp and Adam (fixed + per tensor + per parameter); the slowest stage decides
  generate        without a pipeline, continuous batching as the runtime does it: the batched
                  prefills, then the expected decode steps of every slot (realbench.cost.calls);
                  on a pipeline, micro-batches pipelined as the runtime does (slots (token, micro-batch) in
                  order on every stage; the last stage samples and returns the token to the
                  first): the prefill pipeline sum_j P_j + (m - 1) max_j P_j, then per generated
                  token after the first max(m * max_j D_j, sum_j D_j + p2p(token)), with D_j the
                  stage's decode slot (block.decode against the growing cache; the last stage's
                  includes sampling): the stages are either all busy (m >= pp) or wait for the
                  token's loop (the bubbles); at the end the results go to the other stages.
"""

from __future__ import annotations

import math
from typing import Optional

import numpy as np

from realbench.dataflow import CallDef, CallKind
from realbench.hardware import ClusterSpec
from realbench.hardware.profile import Profile
from realbench.models import ModelSpec, stage_layers
from realbench.plan.mesh import Mesh, Option, Strategy
from realbench.cost.calls import behaviour_forwards, serving_slots
from realbench.plan.options import served_call

TENSORS_PER_BLOCK = 9  # two norms, q, k, v, o, gate, up, down


class _Silent(Exception):
    """The profile has no measurement for something the call needs."""


def profiled_call_time(call: CallDef, model: ModelSpec, option: Option, profile: Profile) -> Optional[float]:
    """Seconds of one call under one option from the profile, or None where it is silent (a
    reward function's time is its own: the analytic model's `seconds_per_sample`): the call
    composed from the profiled operations, times the layout's call_factor."""
    return profiled_call_times(call, model, [option], profile)[0]


def profiled_call_times(call: CallDef, model: ModelSpec, options, profile: Profile, alone: bool = False,
                        cluster: Optional[ClusterSpec] = None) -> list[Optional[float]]:
    """profiled_call_time of each option, each layout's call_factor worked out once; `alone`: as
    if the call's processes were the only busy ones (see call_factor). `cluster`: the plan's, whose
    devices' memory bounds an engine's serving engine's decode slots (calls.serving_slots)."""
    # the profile measures blocks without LoRA adapters (whose backward has no weight gradients
    # for the base): a LoRA model's calls are the analytic model's
    found = None if call.kind == CallKind.FUNCTION or getattr(model, "lora", None) else profile.model_for(model)
    if found is None:
        return [None] * len(options)
    factors: dict[tuple[int, int, int], float] = {}
    out = []
    for option in options:
        t = _composed(call, model, option, profile, found[0], cluster)
        if t is not None:
            s = option.strategy
            layout = (s.tp, s.pp, s.micro_batches)
            if layout not in factors:
                factors[layout] = call_factor(profile, found[0], model, call.kind, *layout, alone=alone)
            t *= factors[layout]
        out.append(t)
    return out


def call_factor(profile: Profile, name: str, model: ModelSpec, kind: CallKind, tp: int, pp: int,
                micro_batches: int = 1, alone: bool = False) -> float:
    """Measured / composed seconds of the profile's whole call of this kind on a (tp, pp) layout
    at CALL_REFERENCE (realbench.hardware.profile), or 1 where the profile has none: what the
    composition of operations misses (the runtime's per-slot work, stages waiting on each other,
    processes sharing cores) as a ratio, carried to the call's own shape. The reference is
    measured split into a few micro-batch counts (the runtime's work per slot grows with them);
    between two counts the ratio is interpolated linearly in log(count), beyond the measured
    ones it holds the nearest. The measurement with every process busy (copies of the layout
    filling them), or `alone` (one copy; the crowded one where the profile has no such)."""
    if kind == CallKind.GENERATE and profile.device.kind == "cuda" and tp == pp == 1:
        # the engine replays its decode steps as CUDA graphs, as the profile times them: the
        # reference call's few steps are mostly the graphs' capture, which a call pays once
        return 1.0
    points = profile.call_points(name, kind.value, tp, pp, alone=alone) or profile.call_points(name, kind.value, tp, pp)
    if not points:
        return 1.0
    spec = model.model_copy(update={"n_layers": points[0].layers, "value_head": False})
    counts, ratios = [], []
    for point in points:
        R, P, G = point.rows, point.prompt_len, point.gen_len
        reference = CallDef(name="reference", model="reference", kind=kind, seqs=R, seq_len=P + G,
                            gen_len=G if kind == CallKind.GENERATE else 0)
        option = Option(Mesh(0, 1, 0, tp * pp), Strategy(1, tp, pp, micro_batches=point.micro_batches))
        composed = _composed(reference, spec, option, profile, name)
        if composed:
            counts.append(math.log(point.micro_batches))
            ratios.append(point.median_s / composed)
    if not ratios:
        return 1.0
    return float(np.interp(math.log(micro_batches), counts, ratios))


def _composed(call: CallDef, model: ModelSpec, option: Option, profile: Profile, name: str,
              cluster: Optional[ClusterSpec] = None) -> Optional[float]:
    """The call composed from the profile's operations (see the module's docstring)."""
    s = option.strategy
    if s.sp > 1:  # Ulysses or ring groups: realbench's runtime runs none, the profile times none (the analytic model's)
        return None
    dp, tp, pp, m = s.dp, s.tp, s.pp, s.micro_batches
    value = bool(model.value_head)
    head = "value_head" if value else "head"
    act_value = profile.bytes_per_value

    def op(what: str, b: float, length: float) -> float:
        t = profile.op_time(name, tp, what, b, length)
        if t is None:
            raise _Silent(what)
        return t

    def p2p(nbytes: float) -> float:
        t = profile.collective_time("p2p", 2, nbytes)
        if t is None:
            raise _Silent("p2p")
        return t

    def all_reduce(n: int, nbytes: float) -> float:
        t = profile.collective_time("all_reduce", n, nbytes)
        if t is None:
            raise _Silent("all_reduce")
        return t

    layers = [hi - lo for lo, hi in (stage_layers(model.n_layers, pp, j) for j in range(pp))]
    v = s.virtual_stages

    def pipeline(stage_time) -> float:
        per = [stage_time(j) for j in range(pp)]
        return sum(per) / v + (m - 1 / v) * max(per)

    def sends(j: int) -> int:
        """Activations a micro-batch sends from stage j (round the pipeline v times)."""
        return v - (j == pp - 1)

    try:
        if call.kind == CallKind.GENERATE:
            b = call.seqs / dp / m
            P, G = call.prompt_len, call.gen_len
            hidden_bytes = model.hidden * act_value

            def prefill(j):
                return ((op("embed.fwd", b, P) if j == 0 else 0.0) + layers[j] * op("block.fwd", b, P)
                        + (op(f"{head}.fwd", b, 1) if j == pp - 1 else 0.0)  # the last position's logits only
                        + (p2p(b * P * hidden_bytes) if j < pp - 1 else 0.0))

            def decode(j, ctx, rows=b):
                return ((op("embed.fwd", rows, 1) if j == 0 else 0.0) + layers[j] * op("block.decode", rows, ctx)
                        + (op(f"{head}.fwd", rows, 1) if j == pp - 1 else 0.0)
                        + (p2p(rows * hidden_bytes) if j < pp - 1 else 0.0))

            def step(t, rows=b, running=1.0, any_running=1.0) -> float:
                """Decode step t: the stages on the rows alive, each micro-batch still decoding
                once (`running` of them), or one trip through the pipeline while any decodes."""
                sample = op("sample", rows, 1)
                per = [decode(j, P + t, rows) + (sample if j == pp - 1 else 0.0) for j in range(pp)]
                loop_back = p2p(rows * 8) if pp > 1 else 0.0  # the sampled tokens, back to the first stage
                return max(running * m * max(per), any_running * (sum(per) + loop_back))

            if pp == 1:  # continuous batching (realbench.cost.calls._continuous_generate)
                from realbench.dataflow.lengths import continuous_schedule

                if served_call(call, option.strategy).memory_fraction is not None and cluster is None:
                    raise ValueError(f"call {call.name!r}: a serving engine's decode slots need the cluster's memory")
                plan = continuous_schedule(None if call.lengths is None else call.lengths.cdf(), call.seqs / dp,
                                           serving_slots(call, model, cluster, option),
                                           call.sync_steps, G)
                g = plan.prefill_rows
                pre = op("embed.fwd", g, P) + layers[0] * op("block.fwd", g, P) + op(f"{head}.fwd", g, 1) \
                    + op("sample", g, 1)
                if call.lengths is None:  # each wave decodes from the prompt to the cap
                    steps = plan.steps / max(G - 1, 1) * sum(decode(0, P + t, plan.rows) for t in range(1, G))
                else:
                    steps = plan.steps * decode(0, P + plan.age, plan.rows)
                return plan.prefills * pre + steps + plan.steps * op("sample", plan.rows, 1)
            total = pipeline(prefill) + m * op("sample", b, 1)
            if call.lengths is None:
                total += sum(step(t) for t in range(1, G))
            else:  # finished rows leave the batch (see realbench.cost.calls._decode_for_lengths)
                from realbench.dataflow.lengths import alive_rows, still_decoding

                cdf = call.lengths.cdf()
                # the call waits for its longest row, on its slowest replica
                running, any_running, alive = still_decoding(cdf, b), still_decoding(cdf, call.seqs), alive_rows(cdf, b)
                total += sum(step(t, alive[t] / running[t], running[t], any_running[t])
                             for t in range(1, G) if running[t] > 1e-12)
            if pp > 1:  # sequences and log-probabilities of the whole shard to the other stages
                total += (pp - 1) * p2p(m * b * (P + G) * 8 + m * b * G * 4)
            return total

        steps = call.optimizer_steps if call.kind == CallKind.TRAIN else 1
        b = call.seqs / steps / dp / m
        steps *= call.iterations  # optimizer updates
        S = call.width(b)  # a micro-batch is as wide as its longest row (the padding trimmed)
        act = b * S * model.hidden * act_value

        def forward(j):
            return ((op("embed.fwd", b, S) if j == 0 else 0.0) + layers[j] * op("block.fwd", b, S)
                    + (op(f"{head}.fwd", b, S) if j == pp - 1 else 0.0) + (sends(j) * p2p(act) if sends(j) else 0.0))

        if call.kind == CallKind.INFERENCE:
            post = 0.0 if value else op("logprobs.fwd", call.seqs / dp, S)
            return pipeline(forward) + post

        recompute = s.checkpointing  # each block's forward again in the backward

        def forward_backward(j):
            block = op("block.fwd_bwd", b, S) + (op("block.fwd", b, S) if recompute else 0.0)
            return ((op("embed.fwd_bwd", b, S) if j == 0 else 0.0) + layers[j] * block
                    + (op(f"{head}.fwd_bwd", b, S) if j == pp - 1 else 0.0)
                    + (op("loss.fwd_bwd", b, S) if j == pp - 1 and not value else 0.0)
                    + (2 * sends(j) * p2p(act) if sends(j) else 0.0))

        fit = profile.models[name].optimizer.get(str(tp))
        if fit is None:
            raise _Silent("optimizer")
        value_bytes = profile.bytes_per_value

        def update(j):
            h, kvd, f = model.hidden, model.n_kv_heads * model.head_dim, model.ffn
            block = [h, h, h * h // tp, h * kvd // tp, h * kvd // tp, h * h // tp, h * f // tp, h * f // tp,
                     h * f // tp]
            tensors = block * layers[j]
            if j == 0:
                tensors.append(model.vocab * h // tp)
            if j == pp - 1:
                tensors += [h, h * model.head_out // (1 if value else tp)]
            reduce = all_reduce(dp, sum(tensors) * value_bytes) if dp > 1 else 0.0  # one flat buffer
            return reduce + fit.time(len(tensors), sum(tensors))

        behaviour = behaviour_forwards(call, model)  # forwards for the old log-probabilities
        before = behaviour * (pipeline(forward) + op("logprobs.fwd", b * m, S)) if behaviour else 0.0
        return before + steps * (pipeline(forward_backward) + max(update(j) for j in range(pp)))
    except _Silent:
        return None


def profiled_links(cluster, profile: Profile):
    """The cluster with its links replaced by the profile's measured point-to-point bandwidth and
    latency (in the cost model's bf16 bytes: the runtime moves values of `bytes_per_value`)."""
    small = profile.collective_time("p2p", 2, 1)
    sizes = [p.nbytes for p in profile.collectives.get("p2p", {}).get("2", [])]
    if small is None or not sizes:
        return cluster
    big = max(sizes)
    bw = big / max(profile.collective_time("p2p", 2, big) - small, 1e-9) * 2 / profile.bytes_per_value
    return cluster.model_copy(update={"intra_bw": bw, "inter_bw": bw, "intra_latency_s": small,
                                      "inter_latency_s": small})


HEADER_BYTES = 64  # the runtime's message of a tensor's shape before the tensor


def profiled_exchange(profile: Optional[Profile]):
    """exchange(processes, nbytes, rounds=2) -> seconds (numpy arrays in, arrays out) of the
    runtime moving `nbytes` among `processes` processes as it moves a call's inputs: a round of
    shapes (HEADER_BYTES a message), then one of data (nbytes / processes a message), each the
    profile's measured exchange (every process to every other at once). On a machine whose
    processes outnumber its cores a round costs milliseconds, far more than its bytes over the
    links say (each message waits for a process to be scheduled). None where the profile has no
    exchange measurements (profiles from before them, GPU presets)."""
    if profile is None or "exchange" not in profile.collectives:
        return None

    def exchange(processes, nbytes, rounds: int = 2):
        processes = np.atleast_1d(np.asarray(processes))
        out = np.zeros(processes.shape)
        for p in np.unique(processes):
            if p < 2:
                continue
            data = profile.collective_time("exchange", int(p), max(float(nbytes) / p, 1.0))
            header = profile.collective_time("exchange", int(p), HEADER_BYTES)
            out[processes == p] = data + (rounds - 1) * header
        return out

    return exchange
