"""verl's space: the plans it can run (`space_problem`: one pool of all the GPUs for every
role but a reward model on its own, one training engine and layout, replicas of the rollout that
fit a node or span whole ones), listed for a search by what its calls must share (`plan_groups`),
and the plans of its default configuration and of its examples (`default_plan`, `example_of`).
"""

from __future__ import annotations

import math
from dataclasses import replace
from typing import Any, Iterator, Optional

from realbench.dataflow import CallKind
from realbench.engines.documents import packs
from realbench.engines.listing import served_shares, the_jobs_share
from realbench.engines.verl.pricing import (FORWARD_OFFLOAD, PADDING_FREE, _critic_counts, _divided_by, _mean_budget,
                                            _remove_padding, space_problem_of_scenario, rollout_problem)
from realbench.engines.verl.reader import _function_mesh, to_plan
from realbench.engines.verl.settings import (A, ESTIMATORS, EXPERT_KEYS, FSDP_SIZE, FSDP_VERSIONS, FUSED, HYBRID,
                                             ONE_STEP_OFF, POOL, R, REF_MEGATRON_OFFLOAD, REMOVE_PADDING, RM,
                                             ROLLOUT_POOL, SEQUENCE_PARALLEL, STRATEGY, TEACHER, TEACHER_POOL, DISTILL,
                                             defaults, resolve)
from realbench.errors import ConfigError
from realbench.models import FunctionSpec
from realbench.plan.mesh import Mesh, Option, Strategy
from realbench.plan.options import divisors, expert_layouts, heads_split, served_by_an_engine
from realbench.plan.plan import plan_from_document, resolve_plan
from realbench.plan.scenario import Scenario


def space_problem(scenario: Scenario, options: dict[str, Option]) -> Optional[tuple[str, str]]:
    """(plan key, what verl cannot do) for the first part of a plan outside verl's space, or None."""
    c = scenario.cluster
    problem = space_problem_of_scenario(scenario) or rollout_problem(scenario, options)
    if problem:
        return problem
    trainer, pool = pools(scenario, options)
    if scenario.dataflow.max_staleness:
        problem = _one_step_off_problem(scenario, trainer, options["actor_gen"].mesh)
        if problem:
            return problem
    elif pool is None and "teacher_inf" not in options and trainer != Mesh(0, c.nodes, 0, c.gpus_per_node):
        return "calls.actor_train.mesh", ("verl places every role on one pool of all the GPUs "
                                          "(verl/trainer/ppo/v1/trainer_base.py:805-820)")
    if pool is not None and not _after_the_trainer(trainer, pool, c.nodes, c.gpus_per_node):
        return "calls.reward_inf.mesh", ("verl runs a reward model on the trainer's pool or on its own "
                                         f"(reward.reward_model.enable_resource_pool, {POOL}): realbench writes the "
                                         "trainer's whole nodes from node 0 and the reward model's after them, to the "
                                         "cluster's last node")
    teacher = options["teacher_inf"].mesh if "teacher_inf" in options else None
    if teacher is not None and (pool is not None
                                or not _after_the_trainer(trainer, teacher, c.nodes, c.gpus_per_node)):
        return "calls.teacher_inf.mesh", (f"verl runs a distillation teacher on a pool of its own ({TEACHER_POOL}): "
                                          "realbench writes the trainer's whole nodes from node 0, every other role "
                                          "on them, and the teacher's after them, to the cluster's last node (whole "
                                          "nodes, or the first GPUs of one)")
    for name, o in options.items():  # (a reward function runs on verl's CPU workers: placed anywhere)
        if (o.mesh != trainer and scenario.dataflow.call(name).kind != CallKind.FUNCTION
                and not (name == "reward_inf" and pool is not None) and name != "teacher_inf"
                and not (name == "actor_gen" and scenario.dataflow.max_staleness)):
            return f"calls.{name}.mesh", ("verl places every role on one pool of all the GPUs" if pool is None else
                                          "verl places every role but a reward model on the trainer's pool") + \
                " (verl/trainer/ppo/v1/trainer_base.py:805-820)"
    actor = options["actor_train"].strategy
    fsdp = actor.zero >= 2
    if scenario.models["actor"].lora is not None and not fsdp:
        return "calls.actor_train.zero", ("realbench writes verl's FSDP LoRA (lora_rank): train the LoRA actor with "
                                          "FSDP (zero 2 or 3)")
    if scenario.training.logits and not fsdp:
        return "calls.actor_train.zero", (f"realbench writes verl's fused kernels ({FUSED}) for its FSDP engine, as it "
                                          "prices them: train the actor with FSDP (zero 2 or 3)")
    for role, call in (("actor", "actor_train"), ("critic", "critic_train")):
        version = fsdp_version(scenario, role)
        if version is None or call not in options:
            continue
        key = f"engine_settings.{STRATEGY[role]}"
        if version not in FSDP_VERSIONS:
            return key, f"{version!r}: realbench writes verl's FSDP1 and FSDP2 (fsdp, fsdp2)"
        if not fsdp:
            return key, (f"{version!r}, the FSDP version of the configuration read: this plan trains with Megatron; "
                         "remove it from the scenario's engine_settings to write it")
    trained = [n for n in ("actor_train", "ref_inf", "critic_train", "critic_inf") if n in options]
    for name in trained:
        s = options[name].strategy
        if s.host_adam:
            return f"calls.{name}.host_adam", ("verl runs Adam on the GPUs (its optimizer_offload brings the states in "
                                               "for each update): Adam on the host is DeepSpeed's ZeRO-Offload")
        if fsdp and (s.tp, s.pp) != (1, 1):
            return f"calls.{name}.tp", "verl's FSDP engine has no tensor or pipeline parallelism (verl/workers/config/engine.py)"
        if fsdp and s.zero != 3 and not (s.zero == 2 and "train" in name):
            return f"calls.{name}.zero", ("verl trains actor, reference and critic with one engine (model_engine): "
                                          "FSDP shards every model (zero 3; zero 2 for training)")
        if not fsdp and ((s.tp, s.pp, s.virtual_stages if "train" in name else actor.virtual_stages)
                         != (actor.tp, actor.pp, actor.virtual_stages)):
            return f"calls.{name}.tp", ("verl's Megatron layout is process-global: actor, reference and critic share "
                                        "tp, pp and virtual stages (verl/workers/engine/megatron/transformer_impl.py)")
        if not fsdp and s.sp != actor.sp:
            return f"calls.{name}.sp", (f"verl's Megatron layout is process-global: actor, reference and critic share "
                                        f"one context_parallel_size (the actor's, {actor.sp})")
        if fsdp and (s.ep > 1 or s.etp):
            return f"calls.{name}.ep", ("verl's FSDP engine has no expert parallelism (a mixture of experts is sharded "
                                        "as any weight: ep 1, etp tp's); Megatron's is its engine's "
                                        "expert_model_parallel_size")
        if (not fsdp and getattr(scenario.model_of(scenario.dataflow.call(name)), "moe", None) is not None
                and (s.ep, s.expert_tp) != (actor.ep, actor.expert_tp)):
            return f"calls.{name}.ep", ("verl's Megatron layout is process-global: the models with experts share the "
                                        f"actor's expert_model_parallel_size and expert_tensor_parallel_size (ep "
                                        f"{actor.ep}, etp {actor.expert_tp})")
        if not fsdp and s.zero > (1 if "train" in name else 0):
            return f"calls.{name}.zero", "verl's Megatron engine shards optimizer states only (the distributed optimizer)"
        if (name == "critic_inf" and s.offload_params) or (name == "ref_inf" and fsdp
                                                           and s.offload_params != (s.shards > 1)):
            return f"calls.{name}.offload_params", FORWARD_OFFLOAD
        if s.ring == "allgather" or (s.ring == "p2p" and fsdp):
            return f"calls.{name}.ring", ("verl splits sequences by Ulysses' head exchanges under FSDP (ulysses_"
                                          "sequence_parallel_size) and by Megatron's p2p ring (context_parallel_size, "
                                          "ring: p2p), not by ring attention's all-gathers (OpenRLHF's)")
        if s.sp > 1 and not s.ring and not _remove_padding(scenario)["critic" in name]:
            return f"calls.{name}.sp", ("verl runs Ulysses sequence parallelism on packed rows only "
                                        "(use_remove_padding, verl/workers/engine/fsdp/transformer_impl.py:148-152): "
                                        "the scenario pads this model's rows (training.padding_free, padded_models)")
    if "critic_inf" in options and options["critic_inf"].strategy.shard_group != options["critic_train"].strategy.shard_group:
        return "calls.critic_inf.shard_group", ("verl's critic runs both its calls on one engine: one hybrid shard "
                                                f"group ({FSDP_SIZE['critic']})")
    if "critic_inf" in options and options["critic_inf"].strategy.sp != options["critic_train"].strategy.sp:
        return "calls.critic_inf.sp", ("verl's critic runs both its calls on one engine: one Ulysses sequence parallel "
                                       f"size ({SEQUENCE_PARALLEL['critic'][1]})")
    gen = options["actor_gen"].strategy
    if gen.pp > 1:
        return "calls.actor_gen.pp", "verl's rollout engines run no pipeline parallelism (verl/workers/config/rollout.py)"
    if c.gpus_per_node % gen.tp and gen.tp % c.gpus_per_node:
        return "calls.actor_gen.tp", "a verl rollout replica fits a node or spans whole nodes"
    # (expert parallelism: replicas of tp x data_parallel_size GPUs, ep = tp x dp: ROLLOUT_EP)
    if gen.ep > 1 and (gen.ep % gen.tp or gen.expert_tp != 1):
        return "calls.actor_gen.ep", ("verl's rollout splits the experts over whole replicas, each expert whole: "
                                      "expert_parallel_size = tensor_model_parallel_size x data_parallel_size, etp 1 "
                                      "(verl/workers/config/rollout.py:294-297)")
    if gen.ep > 1 and (c.gpus_per_node % gen.ep and gen.ep % c.gpus_per_node):
        return "calls.actor_gen.ep", (f"a verl rollout replica (tp x data_parallel_size = ep {gen.ep} GPUs) fits a "
                                      "node or spans whole nodes (verl/workers/rollout/replica.py:107-117)")
    if gen.ep > gen.tp and (scenario.rollout_server or "vllm") == "sglang":
        return "calls.actor_gen.ep", ("realbench writes SGLang's expert parallelism over a replica's tp GPUs (ep = tp, "
                                      "data_parallel_size 1): verl hands SGLang tp_size = tp x dp, whose data-parallel "
                                      "attention is an engine argument it does not read")
    reward = options["reward_inf"].strategy
    if not isinstance(scenario.models.get("reward"), FunctionSpec):
        if reward.ep > 1:
            return "calls.reward_inf.ep", ("realbench writes verl's reward model served without expert parallelism "
                                           "(reward.reward_model.rollout.expert_parallel_size 1)")
        if (reward.pp, reward.zero) != (1, 0):
            return "calls.reward_inf.pp", "verl serves a reward model with vLLM or SGLang replicas: no pipeline, no sharding"
        if c.gpus_per_node % reward.tp and reward.tp % c.gpus_per_node:
            return "calls.reward_inf.tp", "a verl reward model replica fits a node or spans whole nodes"
    return None


def _one_step_off_problem(scenario: Scenario, trainer: Mesh, rollout: Mesh) -> Optional[tuple[str, str]]:
    """What verl's one-step-off entry point cannot run of a plan's two pools (the trainer's, every
    training call's mesh; the rollout's, generation's), as its config writes them and reads back
    (_one_step_off_pools): the trainer's GPUs from the first, the rollout's after them on the same
    node, or on whole nodes (or part of one) after the trainer's whole nodes."""
    G = scenario.cluster.gpus_per_node
    same_node = trainer.nodes == 1 and rollout == Mesh(0, 1, trainer.gpus, rollout.gpus) and trainer.gpu == 0
    after = trainer == Mesh(0, trainer.nodes, 0, G) and rollout.node == trainer.nodes and rollout.gpu == 0
    if trainer.node or trainer.gpu or not (same_node or after):
        return "calls.actor_gen.mesh", ("verl's one-step-off trainer runs generation on a pool of its own "
                                        f"({ONE_STEP_OFF}): realbench writes the trainer's GPUs from the first and "
                                        "the rollout's after them, on the same node or on the nodes after the "
                                        "trainer's whole nodes")
    return None


def _after_the_trainer(trainer: Mesh, pool: Mesh, nodes: int, gpus_per_node: int) -> bool:
    """Whether a pool beside the trainer's (a reward model's, a distillation teacher's) lies where
    realbench writes verl's: the trainer on whole nodes from node 0, the pool from the first GPU of
    the node after them to the cluster's last node (whole nodes, or part of one)."""
    return (trainer == Mesh(0, trainer.nodes, 0, gpus_per_node) and not pool.gpu
            and (pool.node, pool.node + pool.nodes) == (trainer.nodes, nodes))


def pools(scenario: Scenario, options: dict[str, Option]) -> tuple[Mesh, Optional[Mesh]]:
    """(the trainer's pool, the reward model's own pool or None) of a plan: the actor's mesh, and
    the reward model's where it differs (a reward function runs on CPU workers: no pool)."""
    trainer = options["actor_train"].mesh
    if isinstance(scenario.models.get("reward"), FunctionSpec) or options["reward_inf"].mesh == trainer:
        return trainer, None
    return trainer, options["reward_inf"].mesh


def fsdp_version(scenario: Scenario, role: str) -> Optional[str]:
    """The FSDP version (STRATEGY) the configuration a scenario was read from set for a trained
    role, carried in its engine_settings; None where it set none (verl's default, FSDP1)."""
    return scenario.engine_settings.get(STRATEGY[role]) if scenario.engine == "verl" else None


# -- verl's space, for a search ----------------------------------------------------------------------
def _replica_tps(scenario: Scenario, name: str, mesh: Mesh) -> list[int]:
    call, c = scenario.dataflow.call(name), scenario.cluster
    # (the rollout and a teacher's server: their KV heads may be replicated; a reward model's forward splits them)
    return [t for t in divisors(mesh.size) if (c.gpus_per_node % t == 0 or t % c.gpus_per_node == 0)
            and heads_split(scenario.models[call.model], t, generating=served_by_an_engine(call))]


def _rollout_expert_layouts(scenario: Scenario, name: str, dp: int, tp: int) -> list[tuple[int, int]]:
    """The (ep, etp) a search offers the serving call `name` of `dp` replicas of `tp` GPUs
    (ROLLOUT_EP): none, and for the actor's rollout or a distillation teacher's server (served by an
    engine: a reward model's experts stay whole) of a mixture of experts its experts over replicas
    of tp x data_parallel_size GPUs that fit a node or span whole ones (SGLang's over a replica's tp
    GPUs alone), each expert whole (etp 1: 0 where tp is 1, the same). realbench.plan.options checks
    the rest (expert_problem)."""
    call, G = scenario.dataflow.call(name), scenario.cluster.gpus_per_node
    model = scenario.models[call.model]
    if not served_by_an_engine(call) or getattr(model, "moe", None) is None:
        return [(1, 0)]
    sglang = (scenario.rollout_server or "vllm") == "sglang"
    return [(ep, 0 if tp == 1 else etp)
            for ep, etp in expert_layouts(call, model, dp, 1, tp, True)
            if ep == 1 or ((G % ep == 0 or ep % G == 0) and not (sglang and ep != tp))]


def reward_pools(scenario: Scenario) -> list[tuple[Mesh, Optional[Mesh]]]:
    """The pools a search offers: (the trainer's, the reward model's own or None). Every role on
    all the GPUs; and with a reward model on a cluster of several nodes, the reward model on the
    last 1, 2, 4, ... nodes (up to half of them), the trainer on the rest. (Any whole-node pool,
    or part of a node, is read and written; the search keeps to these.)"""
    c = scenario.cluster
    G = c.gpus_per_node
    out: list[tuple[Mesh, Optional[Mesh]]] = [(Mesh(0, c.nodes, 0, G), None)]
    if not isinstance(scenario.models["reward"], FunctionSpec):
        r = 1
        while r <= c.nodes // 2:
            out.append((Mesh(0, c.nodes - r, 0, G), Mesh(c.nodes - r, r, 0, G)))
            r *= 2
    return out


def teacher_pools(scenario: Scenario) -> list[tuple[Mesh, Mesh]]:
    """The (trainer's, teacher's) pools a search offers on-policy distillation, the teacher's on the
    last nodes (TEACHER_POOL): the first 1, 2, 4, ... GPUs of the last node, or the last 2, 4, ...
    whole nodes (up to half of them), the trainer on the nodes before. (Any whole-node pool, or part
    of a node, is read and written; the search keeps to these.)"""
    c = scenario.cluster
    G = c.gpus_per_node
    if c.nodes < 2:
        raise ConfigError(f"{c.nodes} node: verl's distillation teacher runs on a pool of its own, on nodes after the "
                          f"trainer's ({TEACHER_POOL}): give 2 or more", "cluster.nodes")
    out = [(Mesh(0, c.nodes - 1, 0, G), Mesh(c.nodes - 1, 1, 0, g)) for g in divisors(G) if g & (g - 1) == 0]
    r = 2
    while r <= c.nodes // 2:
        out.append((Mesh(0, c.nodes - r, 0, G), Mesh(c.nodes - r, r, 0, G)))
        r *= 2
    return out


def plan_groups(scenario: Scenario) -> Iterator[dict[str, list[Option]]]:
    """verl's plans of a scenario, by what its calls must share (the pools of GPUs, the training
    engine and its layout, the critic's token budget): per group, the options of each call, any
    combination of which verl runs (the rules of `space_problem`, `to_config` and `critic_budget`).
    Options realbench cannot price on the cluster (strategy_problem) are left to the estimator's
    own checks."""
    problem = space_problem_of_scenario(scenario)
    if problem:
        raise ConfigError(problem[1], problem[0])
    problems: dict[tuple[str, Option], bool] = {}  # (the pools' groups repeat options: each checked once)
    if scenario.dataflow.max_staleness:
        for trainer, rollout in one_step_off_pools(scenario):
            yield from _groups_on(scenario, trainer, None, rollout, problems=problems)
        return
    if "teacher_inf" in scenario.dataflow.call_names:
        for trainer, teacher in teacher_pools(scenario):
            yield from _groups_on(scenario, trainer, None, teacher=teacher, problems=problems)
        return
    for trainer, pool in reward_pools(scenario):
        yield from _groups_on(scenario, trainer, pool, problems=problems)


def one_step_off_pools(scenario: Scenario) -> list[tuple[Mesh, Mesh]]:
    """The (trainer's, rollout's) pools a search offers the one-step-off entry point, every GPU
    used: on one node, half each; on several, the trainer's first 1, 2, ... nodes and the
    rollout's the rest. (Any split _one_step_off_problem allows is read and written.)"""
    c = scenario.cluster
    G = c.gpus_per_node
    if c.nodes == 1:
        return [(Mesh(0, 1, 0, G // 2), Mesh(0, 1, G // 2, G // 2))] if G > 1 else []
    return [(Mesh(0, t, 0, G), Mesh(t, c.nodes - t, 0, G)) for t in range(1, c.nodes)]


def _groups_on(scenario: Scenario, W: Mesh, pool: Optional[Mesh], rollout: Optional[Mesh] = None,
               problems: Optional[dict[tuple[str, Option], bool]] = None,
               teacher: Optional[Mesh] = None) -> Iterator[dict[str, list[Option]]]:
    """plan_groups with every role on the trainer's pool `W` but a reward model on `pool`, if any,
    a distillation teacher on `teacher`, and generation on `rollout` (the one-step-off entry's;
    default `W`). `problems`: whether each (call, option) checked so far is refused, kept across
    calls (groups repeat most options)."""
    from realbench.plan.options import option_problem

    c, df = scenario.cluster, scenario.dataflow
    N = W.size
    gen = df.call("actor_gen")
    rows, steps = gen.seqs, df.call("actor_train").optimizer_steps
    critic = "critic_train" in df.call_names
    problems = {} if problems is None else problems

    def refused(name: str, option: Option) -> bool:
        known = problems.get((name, option))
        if known is None:
            call = df.call(name)
            known = problems[(name, option)] = option_problem(call, scenario.models[call.model], c, option) is not None
        return known

    def valid(name: str, options: list[Option]) -> list[Option]:
        return [o for o in options if not refused(name, o)]

    def served(name: str, mesh: Mesh) -> list[Option]:  # replicas of tp GPUs, max_num_seqs rows decoding together
        # (a LoRA actor's: the adapters alone or merged into the base, lora.merge; `valid` keeps
        # the merged ones for LoRA models only)
        # (a mixture of experts' rollout also over replicas of tp x data_parallel_size GPUs, its experts
        # split over them: _rollout_expert_layouts)
        size = mesh.size
        return [Option(mesh, Strategy(size // t, t, 1, m, merge_lora=merge, ep=ep, etp=etp))
                for t in _replica_tps(scenario, name, mesh) if rows % (size // t) == 0
                for ep, etp in _rollout_expert_layouts(scenario, name, size // t, t)
                for m in divisors(rows // (size // t)) for merge in (False, True)]

    # (each rollout at the least share of each GPU's memory that gives it each count of slots, where
    # it runs as priced, its sync's peak and its captured decode batches: listing.served_shares)
    common = {"actor_gen": [shared for o in valid("actor_gen", served("actor_gen", rollout or W))
                            for shared in served_shares(scenario, o, lambda o: rollout_problem(
                                scenario, {"actor_gen": o}) is None)]}
    if isinstance(scenario.models["reward"], FunctionSpec):
        scorer = _function_mesh(rows, rollout or W)
        common["reward_inf"] = [Option(scorer, Strategy(scorer.size, 1, 1))]
    else:
        common["reward_inf"] = valid("reward_inf", served("reward_inf", pool or W))
    if teacher is not None:
        common["teacher_inf"] = valid("teacher_inf", served("teacher_inf", teacher))
    # tp, pp, v, train zeros, forward zero, and the sequence splits and shard groups each role takes:
    # FSDP's Ulysses groups and hybrid shard groups are the engine's settings of each role (verl sets
    # them per role: SEQUENCE_PARALLEL, FSDP_SIZE), Megatron's context-parallel ring (ring p2p) is
    # process-global, one for all. FSDP's state sharded over every GPU or, across nodes, hybrid
    # within groups of 1, 2, 4, ... nodes
    # (and each layout's one (ep, etp) for the models with experts, process-global under Megatron; FSDP
    # has none: (1, 0))
    layouts: list[tuple[int, int, int, tuple[int, ...], int, tuple[int, ...], tuple[int, ...], tuple[int, int]]] = []
    actor = scenario.models["actor"]
    if N > 1:  # FSDP, and Ulysses groups of 2, 4, ... GPUs of a node (for a model whose rows are packed:
        # `valid` drops the others, and the groups the model's heads do not split)
        G = c.gpus_per_node  # (hybrid groups of whole nodes, doubling: 1, 2, 4, ... nodes)
        hybrid = (0, *(G << k for k in range((N // G).bit_length()) if (G << k) < N and N % (G << k) == 0))
        layouts.append((1, 1, 1, (3, 2), 3, tuple(divisors(math.gcd(N, c.gpus_per_node))), hybrid, (1, 0)))
    # (a LoRA actor: verl's FSDP LoRA only; its fused kernels: FSDP's only; see space_problem)
    for tp in (t for t in divisors(c.gpus_per_node) if heads_split(actor, t)
               and actor.lora is None and not scenario.training.logits):
        for pp in (p for p in divisors(N // tp) if p <= actor.n_layers):
            for v in (1, 2, 4) if pp > 1 else (1,):
                for cp in divisors(N // (tp * pp)):  # (its rings inside a node or across whole nodes)
                    for experts in expert_layouts(df.call("actor_train"), actor, N // (tp * pp * cp), cp, tp, True):
                        layouts.append((tp, pp, v, (0, 1) if N // (tp * pp) > 1 else (0,), 0, (cp,), (0,),
                                        (experts[0], 0 if experts[1] == tp else experts[1])))  # Megatron
    for tp, pp, v, zeros, forward_zero, splits, shard_groups, (ep, etp) in layouts:
        ring = "p2p" if forward_zero == 0 and splits != (1,) else ""

        def experts_of(name: str) -> dict[str, int]:  # (the layout's, for a model with experts)
            return {"ep": ep, "etp": etp} if scenario.models[df.call(name).model].moe is not None else {}

        def data_parallel(sp: int) -> int:
            return N // (tp * pp * sp)

        def trained(name: str, sp: int, f: int, zero_options=zeros) -> list[Option]:
            dp = data_parallel(sp)
            per_gpu = rows // steps // dp
            lora = scenario.models[df.call(name).model].lora is not None  # (its parameter offload: not priced)
            offloads = [(False, False), (False, True)] + ([] if lora else [(True, False), (True, True)])
            return valid(name, [Option(W, Strategy(dp, tp, pp, m, ckpt, v, z, offload_params=params,
                                                   offload_optimizer=moments, sp=sp, ring=ring, shard_group=f,
                                                   **experts_of(name)))
                                for m in divisors(per_gpu) for ckpt in (False, True) for z in zero_options
                                for params, moments in offloads if not params or z != 2])

        # each role's sequence splits and shard groups whose data-parallel ranks share the rows evenly
        roles = [(sp, f) for sp in splits for f in shard_groups if rows % (steps * data_parallel(sp)) == 0]
        if not roles:
            continue
        group = {**common, "actor_train": [o for sp, f in roles for o in trained("actor_train", sp, f)]}
        if "ref_inf" in df.call_names:
            # (FSDP offloads its reference always; a Megatron one as its param_offload says)
            group["ref_inf"] = valid("ref_inf", [
                Option(W, Strategy(data_parallel(sp), tp, pp, m, zero=forward_zero, offload_params=off, sp=sp,
                                   ring=ring, shard_group=f, **experts_of("ref_inf")))
                for sp, f in roles
                for off in ((forward_zero == 3 and N // (tp * pp) > 1,) if forward_zero == 3 else (False, True))
                for m in divisors(rows // data_parallel(sp))])
        if not critic:
            if all(group.values()):
                yield group
            continue
        # the critic's two calls run on one engine: one sequence split and one shard group for both
        # (its groups apart), and one token budget (each from the mean tokens of m micro-batches; the
        # counts verl forms under it)
        for sp, f in roles:
            dp = data_parallel(sp)
            critic_options = trained("critic_train", sp, f)
            formed = set()
            for m in divisors(rows // steps // dp):
                budget = _mean_budget(scenario, rows // steps // dp, m, sp)
                counts = _critic_counts(scenario, rows // steps // dp, rows // dp, dp, _divided_by(pp, v), budget, sp)
                if None in counts or counts in formed:
                    continue
                formed.add(counts)
                train_m, inf_m = counts
                # (rows packed: each micro-batch within the budget, which memory is planned for)
                tokens = budget if df.call("critic_train").padding_free else None
                with_critic = {**group, "critic_train": [replace(o, strategy=replace(o.strategy, max_tokens=tokens))
                                                         for o in critic_options
                                                         if o.strategy.micro_batches == train_m],
                               "critic_inf": valid("critic_inf", [Option(W, Strategy(dp, tp, pp, inf_m,
                                                                                     zero=forward_zero,
                                                                                     max_tokens=tokens, sp=sp,
                                                                                     ring=ring, shard_group=f,
                                                                                     **experts_of("critic_inf")))])}
                if all(with_critic.values()):
                    yield with_critic


# verl's example for a comparable job (verl-project/verl examples/grpo_trainer/run_qwen3_8b_fsdp.sh and
# examples/ppo_trainer/run_qwen3_8b_fsdp.sh, main@1dda039): its engine settings, on the scenario's job
# (batch, lengths, models); its reference's param_offload=True is what verl's FSDP does to a reference anyway
EXAMPLE = {"source": "verl examples/{grpo,ppo}_trainer/run_qwen3_8b_fsdp.sh (main@1dda039)",
           "settings": {f"{R}.tensor_model_parallel_size": 2, f"{R}.gpu_memory_utilization": 0.6,
                        f"{A}.use_dynamic_bsz": True, f"{A}.ppo_max_token_len_per_gpu": 24576,
                        "critic.use_dynamic_bsz": True}, "memory_fraction": 0.6}


# verl's example for a job of a mixture of experts (verl-project/verl examples/grpo_trainer/
# run_qwen3_30b_a3b_megatron.sh, main@b3ea220, the Qwen3-30B-A3B GRPO recipe): Megatron tp 4 x pp 2, the
# experts over ep 4, every layer recomputed (full, uniform, 1), the actor's parameters and optimizer
# and the reference's parameters in host memory between calls (ALL_OFFLOAD; its grad_offload is not
# a key of verl 0.9.1), dynamic batching at a whole row a GPU (prompt + response, the reference's
# too), a vLLM rollout of tp 4 at 0.6 of each GPU. Its expert_tensor_parallel_size is left null
# (tp's, 4), which Megatron's parallel state refuses on its 8 GPUs as on 16 (etp x ep x pp = 32 GPUs
# a group: world % 32 != 0); the example is priced with each expert whole (etp 1), the layout verl's
# other Qwen3-30B-A3B recipes give (ETP=1)
MOE_EXAMPLE = {"source": "verl examples/grpo_trainer/run_qwen3_30b_a3b_megatron.sh (main@b3ea220; etp 1)",
               "settings": {f"{A}.megatron.tensor_model_parallel_size": 4,
                            f"{A}.megatron.pipeline_model_parallel_size": 2,
                            f"{A}.megatron.expert_model_parallel_size": 4,
                            f"{A}.megatron.expert_tensor_parallel_size": 1,
                            f"{A}.megatron.param_offload": True, f"{A}.megatron.optimizer_offload": True,
                            REF_MEGATRON_OFFLOAD: True,
                            **{f"{A}.megatron.override_transformer_config.{k}": v for k, v in
                               (("recompute_granularity", "full"), ("recompute_method", "uniform"),
                                ("recompute_num_layers", 1))},
                            f"{R}.tensor_model_parallel_size": 4, f"{R}.gpu_memory_utilization": 0.6,
                            f"{A}.use_dynamic_bsz": True, f"{A}.ppo_max_token_len_per_gpu": "row",
                            "actor_rollout_ref.ref.log_prob_use_dynamic_bsz": True,
                            "actor_rollout_ref.ref.log_prob_max_token_len_per_gpu": "row"},
               "memory_fraction": 0.6}


def example_of(scenario: Scenario) -> dict[str, Any]:
    """verl's example configuration for the scenario's job (EXAMPLE; MOE_EXAMPLE for an actor with
    experts), its settings on the job: "row" a whole row's tokens (prompt and response)."""
    example = MOE_EXAMPLE if getattr(scenario.models["actor"], "moe", None) is not None else EXAMPLE
    gen = scenario.dataflow.call("actor_gen")
    row = gen.prompt_len + gen.gen_len
    return {**example, "settings": {k: row if v == "row" else v for k, v in example["settings"].items()}}


def default_plan(scenario: Scenario, settings: Optional[dict[str, Any]] = None) -> dict[str, Option]:
    """The plan of verl's default configuration for the scenario's job: its YAML's settings
    (FSDP fully sharded, gradient checkpointing, rollout tp 2 with max_num_seqs 256, a reward
    model's tp 2), with dynamic batching at its default token budgets, since its per-GPU
    micro-batch sizes have no default (the actor's raised to a whole row where the job's rows are
    longer: verl asserts a budget holds one, verl/utils/seqlen_balancing.py:384-386); `settings`
    over those (EXAMPLE's, say). Generation running ahead: the one-step-off entry's config with the
    first pools a search offers it (one_step_off_pools). Settings of Megatron's engine blocks
    (MOE_EXAMPLE's) make it Megatron's."""
    df, c = scenario.dataflow, scenario.cluster
    engine = "megatron" if any(k.startswith((f"{A}.megatron.", "critic.megatron.")) for k in settings or {}) else "dp"
    gen, train = df.call("actor_gen"), df.call("actor_train")
    n = gen.group_size
    ref = "ref_inf" in df.call_names
    given = {"trainer.nnodes": c.nodes, "trainer.n_gpus_per_node": c.gpus_per_node,
             "data.train_batch_size": gen.seqs // n, "data.max_prompt_length": gen.prompt_len,
             "data.max_response_length": gen.gen_len, f"{R}.n": n, f"{R}.name": scenario.rollout_server or "vllm",
             "algorithm.adv_estimator": {v: k for k, v in ESTIMATORS.items()}[scenario.algorithm],
             f"{A}.ppo_mini_batch_size": gen.seqs // n // train.optimizer_steps, f"{A}.use_dynamic_bsz": True,
             f"{A}.ppo_epochs": scenario.training.num_iterations,
             "algorithm.use_kl_in_reward": ref and scenario.algorithm == "ppo",
             f"{A}.use_kl_loss": ref and scenario.algorithm != "ppo",
             **(settings or {})}
    if engine == "megatron" and "critic_train" in df.call_names:  # (Megatron's layout is process-global)
        moe = scenario.models["critic"].moe is not None
        given.update({key.replace(f"{A}.megatron.", "critic.megatron.", 1): value for key, value in given.items()
                      if key.startswith(f"{A}.megatron.") and not key.endswith(("_offload",))
                      and (moe or not key.endswith(EXPERT_KEYS))})
    packed = packs(scenario, "verl", PADDING_FREE)  # (as the scenario is priced: engines.priced_as)
    for key, flag in zip(REMOVE_PADDING, _remove_padding(scenario)):
        given.setdefault(key, flag)
    budget = f"{A}.ppo_max_token_len_per_gpu"  # the reference's and rollout's follow it (interpolation)
    given.setdefault(budget, max(int(defaults(engine)[budget]), gen.prompt_len + gen.gen_len))
    if isinstance(scenario.models["reward"], FunctionSpec):
        given["reward.custom_reward_function.path"] = "reward.py"
    else:
        given.update({f"{RM}.enable": True, f"{RM}.rollout.name": given[f"{R}.name"]})
    if "teacher_inf" in df.call_names:  # the teacher on the last node (verl's default n_gpus_per_node, 8)
        trainer, teacher = next(p for p in teacher_pools(scenario) if p[1].size == c.gpus_per_node)
        given.update({"trainer.nnodes": trainer.nodes, f"{DISTILL}.enabled": True, f"{DISTILL}.nnodes": teacher.nodes,
                      f"{DISTILL}.n_gpus_per_node": teacher.gpus,
                      f"{TEACHER}.model_path": getattr(scenario.models["teacher"], "path", None) or "teacher"})
    one_step_off = bool(df.max_staleness)
    if one_step_off:
        if not one_step_off_pools(scenario):
            raise ConfigError("verl's one-step-off trainer needs two pools of GPUs: the cluster has one GPU", "cluster")
        trainer, rollout = one_step_off_pools(scenario)[0]
        given.update({"trainer.nnodes": trainer.nodes, "trainer.n_gpus_per_node": trainer.gpus,
                      ROLLOUT_POOL[0]: rollout.nodes, ROLLOUT_POOL[1]: rollout.gpus, HYBRID: False})
    _, plan = to_plan(engine, resolve(engine, given, one_step_off), set(), scenario.name, "h100",
                      lengths=train.lengths, gpus_per_node=c.gpus_per_node if one_step_off else None,
                      models=dict(scenario.models))
    priced = scenario if packed == scenario.training.padding_free else scenario.with_padding_free(packed)
    return the_jobs_share(resolve_plan(plan_from_document({**plan, "scenario": scenario.name}), priced))
