"""AReaL's space: the plans it can run (`space_problem`: what the writer can write), listed whole
for a search (`plan_table`: the rollout's and the trainer's GPUs apart, each with the allocations
AReaL offers), the plans of its default configuration and of its examples (`default_plan`,
`example_of`), and a job as AReaL runs it (`job_of`: its workflow's reward function in place of a
reward model).
"""

from __future__ import annotations

import math
from typing import Any, Iterator, Optional

from realbench.dataflow import CallKind
from realbench.engines import listing
from realbench.engines.areal.packer import StepRows
from realbench.engines.areal.pricing import _micro_batches, space_problem_of_scenario
from realbench.engines.areal.reader import to_plan
from realbench.engines.areal.settings import REWARD, allocation_string, resolve
from realbench.engines.areal.writer import _SCHEDULING_SPEC, _settings
from realbench.engines.batches import ceil_at_least_one
from realbench.engines.listing import PlanTable, group_sizes, served_shares, the_jobs_share
from realbench.engines.placement import place
from realbench.errors import ConfigError
from realbench.models import FunctionSpec
from realbench.plan.mesh import Option, Strategy
from realbench.plan.options import divisors, expert_layouts, heads_split, sequence_parallel_problem
from realbench.plan.plan import plan_from_document, resolve_plan
from realbench.plan.scenario import Scenario


def space_problem(scenario: Scenario, options: dict[str, Option]) -> Optional[tuple[str, str]]:
    """(plan key, what AReaL cannot do) for the first part of a plan outside its space, or None."""
    return listing.problem_of(_settings, scenario, options)


# -- AReaL's space, for a search ------------------------------------------------------------------------
def _trainer_strategies(scenario: Scenario, size: int, calls: list[str]
                        ) -> Iterator[tuple[str, int, int, int, int, int, int]]:
    """(backend, dp, tp, pp, cp, ep, etp) of the actor (and the roles colocated with it, as AReaL's
    examples write them: `${actor.backend}`) running `calls` on `size` GPUs: FSDP dp x tp, or dp x cp
    (Ulysses groups inside a node, the heads split as sequence_parallel_problem checks them), Megatron
    dp x cp x tp x pp (its context-parallel rings of any size whose tp x cp GPUs divide a node or
    span whole ones, as sequence_parallel_problem checks them). A mixture of experts: FSDP without
    tensor parallelism (_experts), Megatron without a pipeline or rings too, each with the expert
    layouts Megatron's folding offers (options.expert_layouts: ep and etp, tp's or 1; (1, 0) for the
    rest)."""
    c, df = scenario.cluster, scenario.dataflow
    models = [scenario.model_of(df.call(n)) for n in calls]
    heads = lambda t: all(heads_split(m, t) for m in models)  # noqa: E731
    splits = lambda groups: all(sequence_parallel_problem(df.call(n), m, c, groups) is None  # noqa: E731
                                for n, m in zip(calls, models))
    moe = next((m for m in models if m.moe is not None), None)

    def experts(dp: int, cp: int, tp: int) -> tuple[tuple[int, int], ...]:
        if moe is None:
            return ((1, 0),)
        return tuple((ep, 0 if etp == tp else etp)
                     for ep, etp in expert_layouts(df.call(calls[0]), moe, dp, cp, tp, True))

    for t in (t for t in divisors(c.gpus_per_node) if size % t == 0 and heads(t)):
        if moe is None or t == 1:
            yield "fsdp", size // t, t, 1, 1, 1, 0
        # Megatron with a pipeline or context-parallel rings (of any size its layout leaves; without
        # either, FSDP's layout, but for a mixture of experts, whose experts only Megatron folds)
        for p in (p for p in divisors(size // t) if all(m.n_layers % p == 0 for m in models)):
            for cp in (cp for cp in divisors(size // t // p) if p > 1 or cp > 1 or moe is not None):
                if cp == 1 or splits(Strategy(size // t // p // cp, t, p, zero=1, sp=cp, ring="p2p")):
                    for ep, etp in experts(size // t // p // cp, cp, t):
                        yield "megatron", size // t // p // cp, t, p, cp, ep, etp
    for cp in divisors(math.gcd(size, c.gpus_per_node))[1:]:
        if splits(Strategy(size // cp, 1, 1, zero=3, sp=cp)):
            yield "fsdp", size // cp, 1, 1, cp, 1, 0


def plan_table(scenario: Scenario) -> tuple[dict[str, list[Option]], list[tuple[int, ...]]]:
    """Every plan AReaL can run of a scenario on its whole cluster: the rollout's GPUs (the rest
    the actor's, the reference and critic colocated with it) x the trainer's backend and layout
    (`${actor.backend}` for the colocated roles, as AReaL's examples) x checkpointing x micro-batch
    counts x the servers' tensor parallel size, concurrent sequences and share of each GPU's memory
    (listing.served_shares); as per call the options
    used and per plan a row of their indices (in the order of the dict)."""
    problem = space_problem_of_scenario(scenario)
    if problem:
        raise ConfigError(problem[1], problem[0])
    c, df = scenario.cluster, scenario.dataflow
    N, G = c.n_devices, c.gpus_per_node
    gen = df.call("actor_gen")
    rows, prompts = gen.seqs, gen.seqs // gen.group_size
    steps = df.call("actor_train").optimizer_steps
    names = list(df.call_names)
    trainer_calls = [n for n in names if n not in ("actor_gen", "reward_inf")]
    listed = PlanTable(names)
    intern, options = listed.intern, listed.options

    actor_model = scenario.models["actor"]
    step = StepRows(gen.prompt_len, gen.gen_len, df.call("actor_train").lengths)
    for R in group_sizes(c):
        if R >= N:
            continue
        try:
            meshes, nodes = place([("actor", N - R), ("rollout", R)], G)
        except ConfigError:
            continue
        if nodes > c.nodes:
            continue
        A, V = meshes["actor"], meshes["rollout"]
        gens = []
        for t in (t for t in divisors(min(R, G)) if R % t == 0 and heads_split(actor_model, t, generating=True)):
            d = R // t
            if rows % d:
                continue
            share = rows // d
            # (each server at the least share of each GPU's memory that gives it each count of slots:
            # listing.served_shares)
            gens += [shared for m in divisors(share) if m == 1 or m & (m - 1) == 0
                     for shared in served_shares(scenario, Option(V, Strategy(d, t, 1, m)))]
        if not gens:
            continue
        scorer = intern("reward_inf", Option(V, Strategy(V.size, 1, 1)))
        gen_k = [intern("actor_gen", g) for g in gens]
        for backend, dp, tp, pp, cp, ep, etp in _trainer_strategies(scenario, A.size, trainer_calls):
            if prompts % dp or (rows // steps) % dp:
                continue
            per_step = rows // steps // dp
            micros = [m for m in divisors(per_step) if (m & (m - 1) == 0 or m == per_step)
                      and (pp == 1 or (m >= 2 * pp and m % pp == 0))]
            zero = 3 if backend == "fsdp" and dp * cp > 1 else 0
            ring = "p2p" if backend == "megatron" and cp > 1 else ""
            # (the layout's experts, for the calls of a model with experts)
            moe_layout = {name: {"ep": ep, "etp": etp} if scenario.model_of(df.call(name)).moe is not None else {}
                          for name in trainer_calls}
            trained_zero = 1 if backend == "megatron" and dp * cp > 1 else zero
            # a forward-only call: micro-batches of the training's size over the whole batch; the
            # critic's values, what AReaL's packer forms under the critic's training budget
            counts = {m: {name: m if df.call(name).kind.value == "train" else m * steps for name in trainer_calls}
                      for m in micros}
            # each call's budget, as _settings writes it: the training's for the critic's values (below)
            budgets = {m: {name: step.budget(per_step if df.call(name).kind.value == "train" else rows // dp, dp,
                                             counts[m][name]) for name in trainer_calls if name != "critic_inf"}
                       for m in micros}
            if "critic_inf" in trainer_calls:
                for m in micros:
                    budgets[m]["critic_inf"] = budgets[m]["critic_train"]
                    counts[m]["critic_inf"] = _micro_batches(step, rows // dp, dp, m, budgets[m]["critic_inf"], pp)
            # (a rank's budget is its Ulysses group's: a GPU's share, to_plan)
            budgets = {m: {name: ceil_at_least_one(b, cp) for name, b in per_call.items()} for m, per_call in budgets.items()}
            for ckpt in (False, True):
                for m in micros:
                    row = {"reward_inf": scorer}
                    for name in trainer_calls:
                        trained = df.call(name).kind.value == "train"
                        count = counts[m][name]
                        row[name] = intern(name, Option(A, Strategy(dp, tp, pp, count, ckpt and trained, 1,
                                                                    trained_zero if trained else zero,
                                                                    max_tokens=budgets[m][name], sp=cp,
                                                                    ring=ring, **moe_layout[name])))
                    first = {n: options[n][row[n]] for n in row}
                    first["actor_gen"] = gens[0]
                    if space_problem(scenario, first) is not None:
                        continue
                    for g in gen_k:
                        row["actor_gen"] = g
                        listed.add(row)
    return listed.result()


def configurations(scenario: Scenario) -> Iterator[dict[str, Option]]:
    """The plans of `plan_table`, one dict of options each."""
    return listing.configurations(plan_table, scenario)


# AReaL's example for a comparable job: examples/math/gsm8k_grpo.yaml (commit a0f3dca2, the 1.0.4 wheel's
# code): half the GPUs SGLang servers of one GPU, half the actor under FSDP, the reference and critic
# colocated with it (`${actor.backend}`), micro-batches packed to 10,240 tokens, gradient checkpointing
# (a model larger than the example's 1.5B: servers of the fewest GPUs that hold it, see default_plan), at
# the scenario's staleness (the example generates two versions ahead); the default: the same on the paper's split
# (arXiv 2505.24298 §5: three quarters of the GPUs generate)
EXAMPLE = {"source": "AReaL examples/math/gsm8k_grpo.yaml (v1.0.4)", "settings": {"rollout_share": 0.5},
           "memory_fraction": 0.8}  # (its sglang.mem_fraction_static)


# AReaL's example for a mixture of experts: examples/tau2/config_30b_moe_airline.yaml (Qwen3-30B-A3B,
# main@497e5e2): half the GPUs SGLang servers of 4 GPUs (sglang:d8t4 of 64), half the actor under
# Megatron `(attn:d4p4t2|ffn:d2p4e4)` (pp 4, the attention's tp 2, the experts over ep 4 GPUs of a
# stage, each whole), the distributed optimizer, every layer recomputed, micro-batches packed to
# 32,768 tokens, its servers at 0.8 of each GPU; on another cluster the same shape on the actor's
# GPUs (the experts over up to 4 GPUs of a stage, tau2_backend)
MOE_EXAMPLE = {"source": "AReaL examples/tau2/config_30b_moe_airline.yaml (main@497e5e2)",
               "settings": {"rollout_share": 0.5, "layout": "tau2"}, "memory_fraction": 0.8}
TAU2 = {"pp": 4, "tp": 2, "ep": 4, "server_tp": 4, "max_tokens_per_mb": 32768}


def tau2_backend(gpus: int) -> str:
    """The tau2 MoE example's actor allocation on `gpus` GPUs: pp 4 and attention tp 2 (d the rest),
    the experts over min(4, a stage's GPUs) GPUs, each whole (the FFN's d the rest): on 32 GPUs its own
    `(attn:d4p4t2|ffn:d2p4e4)`, written in AReaL's flat form (etp 1: allocation_string)."""
    pp, tp = TAU2["pp"], TAU2["tp"]
    if gpus % (pp * tp):
        raise ConfigError(f"AReaL's tau2 MoE example lays its actor out in pipelines of {pp} stages of {tp} GPUs: "
                          f"{gpus} GPUs do not hold whole ones")
    ep = min(TAU2["ep"], gpus // pp)
    return allocation_string("megatron", gpus // (pp * tp), tp, pp, 1, ep, 1, experts=True)


def example_of(scenario: Scenario) -> dict[str, Any]:
    """AReaL's example configuration for the scenario's job: EXAMPLE, or MOE_EXAMPLE for an actor with
    experts."""
    return MOE_EXAMPLE if getattr(scenario.models["actor"], "moe", None) is not None else EXAMPLE


def default_plan(scenario: Scenario, settings: Optional[dict[str, Any]] = None) -> dict[str, Option]:
    """The plan of AReaL's GSM8K example layout for the scenario's job on its whole cluster: the
    rollout's share of the GPUs (`settings` {"rollout_share": x}; default three quarters, the
    paper's split), at the scenario's own staleness. Its micro-batches of 10,240 tokens hold at least a
    whole row (AReaL's packer refuses a longer one: a job of longer rows raises the budget to one).
    With {"layout": "tau2"} (MOE_EXAMPLE) the tau2 MoE example's: servers of 4 GPUs, the actor's
    Megatron layout (tau2_backend), micro-batches of 32,768 tokens."""
    c, df = scenario.cluster, scenario.dataflow
    N, G = c.n_devices, c.gpus_per_node
    gen, train = df.call("actor_gen"), df.call("actor_train")
    share = (settings or {}).get("rollout_share", 0.75)

    def placeable(r: int) -> bool:
        try:
            return place([("actor", N - r), ("rollout", r)], G)[1] <= c.nodes
        except ConfigError:
            return False

    # servers of one GPU, as the example's 1.5B model; a larger model on the fewest GPUs that hold
    # its bf16 weights in half their memory (the rest for the KV cache)
    weights = 2 * scenario.models["actor"].n_params
    t_min = next((t for t in divisors(G) if weights / t <= c.usable_memory_bytes / 2), G)
    tau2 = (settings or {}).get("layout") == "tau2"
    if tau2:  # (the example's servers of 4 GPUs)
        t_min = TAU2["server_tp"]
    # the share, or the largest rollout under it that realbench places (whole nodes, power-of-two
    # blocks) and whose servers split the batch evenly
    fits = [(r, t) for r in sorted(group_sizes(c), reverse=True) if r <= N * share and r < N and placeable(r)
            for t in divisors(G) if t >= t_min and r % t == 0 and gen.seqs % (r // t) == 0]
    if not fits:
        raise ConfigError(f"no rollout of AReaL's example layout splits this job's {gen.seqs} samples evenly")
    R, t = fits[0]
    critic, ref = "critic" in scenario.models, "ref_inf" in df.call_names
    budget = max(TAU2["max_tokens_per_mb"] if tau2 else 10240, gen.prompt_len + gen.gen_len)
    backend = tau2_backend(N - R) if tau2 else f"fsdp:d{N - R}"
    given: dict[str, Any] = {
        "cluster.n_nodes": c.nodes, "cluster.n_gpus_per_node": G, "actor.backend": backend,
        "rollout.backend": f"sglang:d{R // t}t{t}", "actor.scheduling_spec": _SCHEDULING_SPEC, "actor.path": "actor",
        "actor.gradient_checkpointing": True, "actor.mb_spec.max_tokens_per_mb": budget,
        "train_dataset.batch_size": gen.seqs // gen.group_size, "train_dataset.max_length": gen.prompt_len,
        "gconfig.n_samples": gen.group_size, "gconfig.max_new_tokens": gen.gen_len,
        "gconfig.max_tokens": gen.prompt_len + gen.gen_len, "actor.ppo_n_minibatches": train.optimizer_steps,
        "rollout.max_head_offpolicyness": df.max_staleness, "actor.kl_ctl": 0.1 if ref else 0.0,
        "actor.reward_norm.mean_leave1out": scenario.algorithm == "rloo"}
    for role, present in (("ref", ref), ("critic", critic)):
        if present:
            given.update({f"{role}.backend": backend, f"{role}.path": role,
                          f"{role}.scheduling_strategy.type": "colocation", f"{role}.scheduling_strategy.target": "actor",
                          f"{role}.mb_spec.max_tokens_per_mb": budget, f"{role}.gradient_checkpointing": True})
    settings_ = resolve(given)
    _, plan = to_plan(backend.split(":")[0], settings_, set(), scenario.name, "h100", lengths=train.lengths,
                      models=dict(scenario.models))
    # (checked as AReaL runs the job, its rows packed: the plan's token budgets are its packer's)
    return the_jobs_share(resolve_plan(plan_from_document({**plan, "scenario": scenario.name}),
                                       scenario.with_padding_free(True)))


def job_of(scenario: Scenario) -> Scenario:
    """The scenario's job as AReaL runs it: a reward model's score comes from the rollout workflow's
    reward function instead (AReaL's trainer runs no reward model); otherwise the scenario."""
    if isinstance(scenario.models.get("reward"), FunctionSpec):
        return scenario
    models = {**scenario.models, "reward": FunctionSpec(name="workflow_reward", functions=(REWARD,))}
    calls = [c.model_copy(update={"kind": CallKind.FUNCTION, "lengths": None})
             if c.model == "reward" and c.kind == CallKind.INFERENCE else c for c in scenario.dataflow.calls]
    fields = {k: getattr(scenario, k) for k in Scenario.model_fields}
    return Scenario.model_validate({**fields, "models": models, "dataflow": scenario.dataflow.with_calls(calls),
                                    "engine": "areal"})
