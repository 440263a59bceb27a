"""OpenRLHF's space: the plans it can run (`space_problem`: what the writer can write), listed
whole for a search (`plan_table`: every placement of its groups of GPUs using the whole cluster,
each with the strategies its global flags give), and the plans of its default configuration and of
its example (`default_plan`, `example_of`).
"""

from __future__ import annotations

from typing import Any, Iterator, Optional

from realbench.engines import listing
from realbench.engines.batches import rounds
from realbench.engines.listing import PlanTable, group_sizes, served_shares, the_jobs_share
from realbench.engines.openrlhf.pricing import MEMORY_FRACTION, _changed, space_problem_of_scenario
from realbench.engines.openrlhf.reader import _parser, to_plan
from realbench.engines.openrlhf.settings import ESTIMATORS, VLLM_MAX_NUM_SEQS
from realbench.engines.openrlhf.writer import _settings
from realbench.engines.placement import place
from realbench.errors import ConfigError
from realbench.models import FunctionSpec
from realbench.plan.mesh import Mesh, Option, Strategy, is_pow2
from realbench.plan.options import divisors, heads_split
from realbench.plan.plan import plan_from_document, resolve_plan
from realbench.plan.scenario import Scenario


def space_problem(scenario: Scenario, options: dict[str, Option]) -> Optional[tuple[str, str]]:
    """(plan key, what OpenRLHF cannot do) for the first part of a plan outside its space, or None."""
    return listing.problem_of(_settings, scenario, options)


# -- OpenRLHF's space, for a search ---------------------------------------------------------------------
def _placements(scenario: Scenario) -> Iterator[dict[str, Mesh]]:
    """Where OpenRLHF's groups can be, using every GPU of the cluster: the hybrid engine on all of
    them (the critic and reward model beside it, or on their own group), or separate groups for
    the actor (the reference with it or apart), vLLM, the critic (the reward model with it or
    apart) and a reward model."""
    c = scenario.cluster
    N, G = c.n_devices, c.gpus_per_node
    critic = "critic" in scenario.models
    rm = not isinstance(scenario.models["reward"], FunctionSpec)
    sizes = group_sizes(c)

    def fits(groups: dict[str, int]) -> Optional[dict[str, Mesh]]:
        if sum(groups.values()) != N:
            return None
        try:
            meshes, nodes = place(list(groups.items()), G)
        except ConfigError:
            return None
        return meshes if nodes <= c.nodes else None

    whole = Mesh(0, c.nodes, 0, G)
    hybrid = not scenario.dataflow.max_staleness  # (the asynchronous trainer runs vLLM on its own GPUs)
    if hybrid:
        yield {role: whole for role in ("actor", "vllm", "ref", "critic", "reward")}  # all beside the actor
    for a in sizes:  # hybrid, critic and reward model on their own GPUs
        if hybrid and critic and a < N:
            meshes = fits({"actor": a, "critic": N - a})
            if meshes:
                yield {**meshes, "vllm": meshes["actor"], "ref": meshes["actor"], "reward": meshes["critic"]}
    roles = ["actor", "vllm"] + (["critic"] if critic else [])
    for counts in _products(sizes, len(roles), N):
        base = dict(zip(roles, counts))
        left = N - sum(counts)
        reference = "ref_inf" in scenario.dataflow.call_names
        for ref in (0,) + tuple(x for x in sizes if x <= left and reference):  # 0: with the actor (or none)
            for reward in ((0,) + tuple(sizes) if rm and critic else tuple(sizes) if rm else (None,)):
                if (ref or 0) + (reward or 0) != left:
                    continue
                groups = {**base, **({"ref": ref} if ref else {}), **({"reward": reward} if reward else {})}
                meshes = fits(groups)
                if meshes:
                    meshes.setdefault("ref", meshes["actor"])
                    if rm:
                        meshes.setdefault("reward", meshes.get("critic"))
                    yield meshes


def _products(sizes: list[int], k: int, budget: int) -> Iterator[tuple[int, ...]]:
    """k-tuples of sizes whose sum is at most `budget`."""
    if k == 0:
        yield ()
        return
    for s in sizes:
        if s <= budget:
            for rest in _products(sizes, k - 1, budget - s):
                yield (s,) + rest


def plan_table(scenario: Scenario) -> tuple[dict[str, list[Option]], list[tuple[int, ...]]]:
    """Every plan OpenRLHF can run of a scenario on its whole cluster (placements x DeepSpeed's
    tensor parallel size, ZeRO stage, checkpointing and the optimizer's states (on the GPUs, asleep
    between updates, or on the host with CPU Adam) x micro-batch and chunk sizes x vLLM's
    tensor parallel size and share of each GPU's memory, listing.served_shares), as per call the
    options used and per plan a row of their indices (in the order of the dict). Each block of
    plans that share a placement, tp and batch sizes is checked by the rules that write it
    (`_settings`); the stages and switches varied inside a block change none of those rules."""
    problem = space_problem_of_scenario(scenario)
    if problem:
        raise ConfigError(problem[1], problem[0])
    c, df = scenario.cluster, scenario.dataflow
    G = c.gpus_per_node
    rows = df.call("actor_gen").seqs
    batch = rows // df.call("actor_train").optimizer_steps
    critic = "critic_train" in df.call_names
    fn_reward = isinstance(scenario.models["reward"], FunctionSpec)
    heads = lambda role, t: heads_split(scenario.models[role], t)  # noqa: E731
    ds_roles = ["actor"] + (["critic"] if critic else []) + ([] if fn_reward else ["reward"])
    # DeepSpeed's tensor parallel size, and (where the rows are packed) ring attention groups of 2, 4,
    # ... beside it, tp x ring GPUs of a node: (tp, ring)
    layouts = [(t, r) for t in divisors(G) if all(heads(role, t) for role in ds_roles)
               for r in divisors(G // t) if r == 1 or scenario.training.padding_free]
    rollout_tps = [t for t in divisors(G) if heads_split(scenario.models["actor"], t, generating=True)]
    names = list(df.call_names)
    listed = PlanTable(names)
    intern = listed.intern

    for meshes in _placements(scenario):
        A, V = meshes["actor"], meshes["vllm"]
        for T, ring in layouts:
            groups = {"actor_train": A, **({"ref_inf": meshes["ref"]} if "ref_inf" in names else {})}
            if critic:
                groups.update({"critic_train": meshes["critic"], "critic_inf": meshes["critic"]})
            if not fn_reward:
                groups["reward_inf"] = meshes["reward"]
            if any(m.size % (T * ring) for m in groups.values()):
                continue
            dps = {n: m.size // (T * ring) for n, m in groups.items()}
            split = {"sp": ring, "ring": "allgather" if ring > 1 else ""}
            widest = max(dps.values())
            if batch % widest or rows % widest:
                continue
            micros = [m for m in divisors(batch // widest) if is_pow2(m) or m == batch // widest]
            chunks = [k for k in divisors(rows // widest) if is_pow2(k) or k == rows // widest]
            # (each vLLM engine at the least share of each GPU's memory that gives it each count of slots:
            # listing.served_shares)
            gens = [shared for t in rollout_tps if V.size % t == 0 and rows % (V.size // t) == 0
                    for shared in served_shares(scenario, Option(V, Strategy(
                        V.size // t, t, 1, rounds(rows // (V.size // t), VLLM_MAX_NUM_SEQS))))]
            if not gens:
                continue
            trained = [n for n in ("actor_train", "critic_train") if n in groups]
            sharded = any(dps[n] * ring > 1 for n in trained)
            # (under a ZeRO stage the trained models' optimizers on the device, offloaded between updates
            # by --ds.enable_sleep, or on the host with Adam run there by --ds.adam_offload)
            # (not stage 3 where the scenario carries ZeRO++'s hierarchical partition, which it would turn on)
            stages = (0, 1, 2, 3) if T == 1 and int(scenario.engine_settings.get("ds.zpg", 1)) <= 1 else (0, 1, 2)
            variants = [(z, ckpt, states) for z in (stages if sharded else (0,))
                        for ckpt in (False, True) for states in (("device", "sleep", "host") if z else ("device",))]
            scorer = Option(V, Strategy(V.size, 1, 1)) if fn_reward else None
            for micro in micros:
                for chunk in chunks:
                    def option(name: str, zero: int, ckpt: bool, states: str = "device") -> Option:
                        dp = dps[name]
                        shards = dp * ring > 1
                        if name in trained:
                            return Option(groups[name], Strategy(dp, T, 1, batch // dp // micro, ckpt, 1,
                                                                 zero if shards else 0,
                                                                 offload_optimizer=states == "sleep",
                                                                 host_adam=states == "host", **split))
                        return Option(groups[name], Strategy(dp, T, 1, rounds(rows // dp, chunk),
                                                             zero=(3 if zero == 3 else 0) if shards else 0, **split))

                    first = {n: option(n, 0, False) for n in groups}
                    first["actor_gen"] = gens[0]
                    if scorer:
                        first["reward_inf"] = scorer
                    # the batch and chunk rules hold for all the stages and switches below alike, or for none
                    if space_problem(scenario, first) is not None:
                        continue
                    gen_k = [intern("actor_gen", g) for g in gens]
                    fixed = {"reward_inf": intern("reward_inf", scorer)} if scorer else {}
                    for zero, ckpt, states in variants:
                        ks = {**fixed, **{n: intern(n, option(n, zero, ckpt, states)) for n in groups}}
                        for g in gen_k:
                            ks["actor_gen"] = g
                            listed.add(ks)
    return listed.result()


def configurations(scenario: Scenario) -> Iterator[dict[str, Option]]:
    """The plans of `plan_table`, one dict of options each."""
    return listing.configurations(plan_table, scenario)


def _fit(value: int, total: int) -> int:
    """The largest divisor of `total` not above `value` (an example's micro-batch size on another job)."""
    return max(d for d in divisors(total) if d <= max(1, value))


# OpenRLHF's examples for a comparable job (OpenRLHF/OpenRLHF examples/scripts, v0.11.0): the README's
# quick-start hybrid engine (train_ppo_ray_hybrid_engine.sh) as the default, and the separate groups of
# train_ppo_ray_slurm.sh (actor+ref a quarter of the GPUs, critic+reward a quarter, vLLM tp 2 the half;
# without a critic, actor+ref the half) as the example; ZeRO-3, gradient checkpointing, micro-batches of 8
# samples to train and 16 to infer (lowered to divide the job's where they do not); the slurm script's
# --ds.adam_offload (CPU Adam) with it
EXAMPLE = {"source": "OpenRLHF examples/scripts/train_ppo_ray_slurm.sh (v0.11.0)", "settings": {"layout": "split"},
           "memory_fraction": 0.95}  # (the script sets none: the flag's default)


def example_of(scenario: Scenario) -> dict[str, Any]:
    """OpenRLHF's example configuration for the scenario's job: EXAMPLE, whatever the job (it has no
    expert parallelism, and no example of its own for a mixture of experts)."""
    return EXAMPLE


def default_plan(scenario: Scenario, settings: Optional[dict[str, Any]] = None) -> dict[str, Option]:
    """The plan of OpenRLHF's README quick-start (the hybrid engine) for the scenario's job, or with
    `settings` {"layout": "split"} (or an asynchronous job: `max_staleness` batches queued) of its
    multi-node example (EXAMPLE)."""
    c, df = scenario.cluster, scenario.dataflow
    N, G = c.n_devices, c.gpus_per_node
    gen, train = df.call("actor_gen"), df.call("actor_train")
    rows, n = gen.seqs, gen.group_size
    batch = rows // train.optimizer_steps
    critic = "critic" in scenario.models
    staleness = df.max_staleness  # (the asynchronous trainer has no hybrid engine: its example's groups)
    split = (settings or {}).get("layout") == "split" or bool(staleness)
    quarter = lambda k: (k * N // 4 // G, G) if k * N // 4 >= G else (1, k * N // 4)  # noqa: E731 (nodes, per node)
    rm = not isinstance(scenario.models["reward"], FunctionSpec)
    actor = quarter(1 if critic or rm else 2) if split else (c.nodes, G)
    dp_a = actor[0] * actor[1]
    argv = ["--actor.num_nodes", actor[0], "--actor.num_gpus_per_node", actor[1], "--ref.num_nodes", actor[0],
            "--ref.num_gpus_per_node", actor[1], "--vllm.tensor_parallel_size", 2,
            "--vllm.num_engines", (N // 2 if split else N) // 2, "--ds.zero_stage", 3,
            "--actor.gradient_checkpointing_enable", "--train.micro_batch_size", _fit(8, batch // dp_a),
            "--rollout.micro_batch_size", _fit(16, rows // dp_a), "--rollout.batch_size", rows // n,
            "--rollout.n_samples_per_prompt", n, "--train.batch_size", batch,
            "--train.max_epochs", scenario.training.num_iterations, "--data.max_len", gen.prompt_len + gen.gen_len,
            "--rollout.max_new_tokens", gen.gen_len,
            "--algo.advantage.estimator", {v: k for k, v in ESTIMATORS.items()}[scenario.algorithm],
            "--actor.model_name_or_path", "actor"]
    argv += ["--train.colocate_actor_ref", "--ds.adam_offload"] if split else [
        "--train.colocate_all", "--vllm.enable_sleep", "--ds.enable_sleep", "--vllm.gpu_memory_utilization", MEMORY_FRACTION]
    argv += [] if "ref_inf" in df.call_names else ["--algo.kl.init_coef", 0]  # no KL term: no reference
    argv += ["--train.async_enable", "--train.async_queue_size", staleness] if staleness else []
    if critic:
        argv += ["--critic.model_name_or_path", "critic", "--critic.num_nodes", actor[0],
                 "--critic.num_gpus_per_node", actor[1], "--reward.num_nodes", actor[0],
                 "--reward.num_gpus_per_node", actor[1]]
        argv += ["--train.colocate_critic_reward"] if split else []
    if not rm:
        argv += ["--reward.remote_url", "reward.py"]
    else:
        argv += ["--reward.model_name_or_path", "reward"]
        if not critic:
            argv += ["--reward.num_nodes", actor[0], "--reward.num_gpus_per_node", actor[1]]
    ns, _ = _parser("default").parse_known_args([str(w) for w in argv])
    settings_ = vars(ns)
    _, plan = to_plan("deepspeed", settings_, _changed(settings_), scenario.name,
                      "h100", gpus_per_node=G)
    return the_jobs_share(resolve_plan(plan_from_document({**plan, "scenario": scenario.name}), scenario))
