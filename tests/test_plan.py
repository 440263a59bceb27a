import itertools
import math

import numpy as np

import pytest

from realbench.dataflow import build_algorithm
from realbench.errors import ConfigError
from realbench.hardware import cluster
from realbench.models import get_model
from realbench.plan import (BUILTIN, Mesh, Option, Strategy, all_meshes, enumerate_options, get_builtin,
                            mesh_problem, option_problem, parse_mesh, plan_from_options, resolve_plan)
from realbench.plan.plan import plan_from_document
from realbench.plan.scenario import scenario_from_document


def test_mesh_rules():
    c = cluster(2, 8)
    assert mesh_problem(Mesh(0, 1, 4, 4), c) is None
    assert "multiple of 4" in mesh_problem(Mesh(0, 1, 2, 4), c)
    assert "power of two" in mesh_problem(Mesh(0, 1, 0, 3), c)
    assert "whole nodes" in mesh_problem(Mesh(0, 2, 0, 4), c)
    assert "outside" in mesh_problem(Mesh(1, 2, 0, 8), c)
    assert "outside" in mesh_problem(Mesh(0, 1, 6, 4), c)


def test_mesh_labels_round_trip():
    c = cluster(4, 8)
    for m in all_meshes(c):
        assert parse_mesh(m.label(8), c) == m
    assert parse_mesh("n1:4-7", c).devices(8) == range(12, 16)
    assert parse_mesh("n1-2", c).devices(8) == range(8, 24)
    for bad in ("n9", "n0:3-4", "n0:0-2", "x0", "n2-1", "n0:7-6"):
        with pytest.raises(ConfigError):
            parse_mesh(bad, c)


def test_mesh_count():
    # per node 8 + 4 + 2 + 1 blocks, plus every run of >= 2 consecutive nodes
    assert len(list(all_meshes(cluster(3, 8)))) == 3 * 15 + 3


def searched_count(m, pp, per_replica):
    """The micro-batch counts the search offers, as the plan module's docstring states them."""
    return m & (m - 1) == 0 and m <= 16 or pp > 1 and m in (pp, 2 * pp, 4 * pp, per_replica)


def brute_force_options(call, model, c):
    """Every (mesh, strategy) tuple in generous ranges, kept when the rules accept it and the
    search offers its micro-batch count."""
    G, N = c.gpus_per_node, c.nodes
    count = 0
    for node, nodes, gpu, gpus in itertools.product(range(N), range(1, N + 1), range(G), range(1, G + 1)):
        mesh = Mesh(node, nodes, gpu, gpus)
        if mesh_problem(mesh, c):
            continue
        size = mesh.size
        for dp, tp, pp in itertools.product(range(1, size + 1), repeat=3):
            per_replica = call.seqs // call.optimizer_steps // dp
            for m, ckpt, v in itertools.product(range(1, call.seqs + 1), (False, True), range(1, 5)):
                # the search offers 1 to 4 virtual stages wherever they are valid
                # (without the engines' strategies, tp splits the KV heads: their replicas are the serving engines')
                if option_problem(call, model, c, Option(mesh, Strategy(dp, tp, pp, m, ckpt, v))) is None \
                        and searched_count(m, pp, per_replica) and model.n_kv_heads % tp == 0:
                    count += 1
    return count


@pytest.mark.parametrize("nodes,gpus", [(1, 4), (2, 2), (3, 2)])
def test_enumeration_matches_brute_force(nodes, gpus):
    c = cluster(nodes, gpus, "cpu")
    model = get_model("llama-tiny")
    df = build_algorithm("ppo", prompts=8, prompt_len=4, gen_len=4, minibatches=2)
    for call in (df.call("actor_gen"), df.call("actor_train")):
        opts = enumerate_options(call, model, c)
        assert len(opts) == len(set(opts)) == brute_force_options(call, model, c)
        assert all(option_problem(call, model, c, o) is None for o in opts)


def test_any_micro_batch_count_that_divides_a_replica_s_batch_is_valid():
    """Megatron's SC21 runs used hundreds of micro-batches per pipeline; a plan may say 280."""
    c = cluster(35, 8, "a100")
    model = get_model("llama-70b")
    call = build_algorithm("sft", seqs=2240, seq_len=2048).call("actor_train")
    option = Option(Mesh(0, 35, 0, 8), Strategy(dp=1, tp=8, pp=35, micro_batches=280))
    assert option_problem(call, model, c, option) is None
    problem = option_problem(call, model, c, Option(option.mesh, Strategy(1, 8, 35, 300)))
    assert problem[0] == "micro_batches" and "2240" in problem[1]
    offered = {o.strategy.micro_batches for o in enumerate_options(call, model, c)
               if (o.strategy.tp, o.strategy.pp) == (8, 35) and o.mesh.nodes == 35}
    assert offered == {1, 2, 4, 8, 16, 35, 70, 140, 2240}  # powers of two, pp, 2pp, 4pp, the largest
    # no pipeline: the powers of two alone (the bubble does not shrink with m)
    flat = {o.strategy.micro_batches for o in enumerate_options(call, get_model("llama-7b"), cluster(1, 8, "a100"))
            if o.strategy.pp == 1}
    assert flat == {1, 2, 4, 8, 16}


def test_activation_checkpointing_is_an_option_of_train_calls_only():
    c = cluster(1, 4, "cpu")
    model = get_model("llama-tiny")
    df = build_algorithm("ppo", prompts=8, prompt_len=4, gen_len=4, minibatches=2)
    train = enumerate_options(df.call("actor_train"), model, c)
    assert sum(o.strategy.checkpointing for o in train) * 2 == len(train)  # each strategy with and without
    assert not any(o.strategy.checkpointing for o in enumerate_options(df.call("actor_gen"), model, c))
    mesh = Mesh(0, 1, 0, 4)
    assert option_problem(df.call("ref_inf"), model, c, Option(mesh, Strategy(4, 1, 1, 1, True)))[0] == \
        "activation_checkpointing"


def test_virtual_stages_are_an_option_of_train_calls_on_pipelines():
    """The interleaved schedule needs a train call, a pipeline, layers that split into pp x v
    chunks and micro-batches in groups of pp (Megatron's rules); the search offers 2, 3 and 4."""
    c = cluster(1, 8, "a100")
    model = get_model("llama-7b")  # 32 layers
    df = build_algorithm("ppo", prompts=64, prompt_len=128, gen_len=128)
    train, mesh = df.call("actor_train"), Mesh(0, 1, 0, 8)
    assert option_problem(train, model, c, Option(mesh, Strategy(1, 2, 4, 4, False, 2))) is None
    for strategy, says in ((Strategy(1, 2, 4, 4, False, 3), "32 layers"), (Strategy(1, 2, 4, 2, False, 2), "multiple"),
                           (Strategy(4, 2, 1, 4, False, 2), "pp > 1")):
        problem = option_problem(train, model, c, Option(mesh, strategy))
        assert problem[0] == "virtual_stages" and says in problem[1], (strategy, problem)
    assert option_problem(df.call("ref_inf"), model, c, Option(mesh, Strategy(1, 2, 4, 4, False, 2)))[0] == "virtual_stages"
    offered = {(o.strategy.pp, o.strategy.micro_batches, o.strategy.virtual_stages)
               for o in enumerate_options(train, model, c) if o.mesh.size == 8 and o.strategy.tp == 2}
    assert {v for pp, m, v in offered if (pp, m) == (4, 4)} == {1, 2, 4}  # 3 does not divide 8 layers a stage
    assert {v for pp, m, v in offered if (pp, m) == (4, 2)} == {1}  # 2 micro-batches: not a group of pp
    assert {v for pp, m, v in offered if pp == 1} == {1}
    assert not any(o.strategy.virtual_stages > 1 for o in enumerate_options(df.call("actor_gen"), model, c))


def test_strategy_rules():
    c = cluster(2, 8)
    model = get_model("llama-70b")
    call = build_algorithm("ppo").call("actor_train")  # 512 seqs, 4 optimizer steps
    mesh = Mesh(0, 2, 0, 8)
    assert option_problem(call, model, c, Option(mesh, Strategy(2, 8, 1, 4))) is None
    assert option_problem(call, model, c, Option(mesh, Strategy(1, 16, 1)))[0] == "tp"  # leaves the node
    assert option_problem(call, model, c, Option(mesh, Strategy(4, 2, 1)))[0] == "dp"  # 8 != 16
    assert option_problem(call, model, c, Option(mesh, Strategy(16, 1, 1, 16)))[0] == "micro_batches"  # 128/256
    small = get_model("llama-tiny")
    assert option_problem(call, small, c, Option(mesh, Strategy(2, 8, 1)))[0] == "tp"  # 4 heads
    assert option_problem(call, small, c, Option(mesh, Strategy(1, 2, 8)))[0] == "pp"  # 4 layers


def test_plan_space_is_product_of_option_counts():
    s = get_builtin("ppo-7b-7b-16gpu")
    assert s.plan_space_size == math.prod(len(v) for v in s.options.values())
    assert s.plan_space_size > 1e15  # the paper's order of magnitude for PPO on a few nodes


def test_every_builtin_scenario_loads():
    for name in BUILTIN:
        s = get_builtin(name)
        assert s.name == name and s.plan_space_size >= 1
    assert get_builtin("ppo-70b-7b-128gpu").cluster.n_devices == 128


def test_scenario_round_trip():
    for name in BUILTIN:
        s = get_builtin(name)
        assert scenario_from_document(s.to_document()) == s


def test_plan_round_trip_and_checks():
    s = get_builtin("ppo-tiny-cpu")
    options = {n: opts[-1] for n, opts in s.options.items()}
    plan = plan_from_options(s, options)
    again = plan_from_document(plan.to_document())
    assert again == plan and resolve_plan(again, s) == options
    doc = plan.to_document()
    doc["calls"]["actor_gen"]["tp"] = 3
    with pytest.raises(ConfigError) as e:
        resolve_plan(plan_from_document(doc), s)
    assert e.value.field.startswith("calls.actor_gen.")
    doc = plan.to_document()
    doc["calls"]["bogus"] = doc["calls"]["actor_gen"]
    with pytest.raises(ConfigError, match="unknown call 'bogus'"):
        resolve_plan(plan_from_document(doc), s)
    doc = plan.to_document()
    del doc["calls"]["ref_inf"]
    with pytest.raises(ConfigError, match="no placement"):
        resolve_plan(plan_from_document(doc), s)
    doc = plan.to_document()
    doc["calls"]["ref_inf"]["mesh"] = "n1"
    with pytest.raises(ConfigError, match="outside the cluster"):
        resolve_plan(plan_from_document(doc), s)


def test_a_plan_s_own_micro_batch_count_is_estimated_and_the_offered_options_keep_their_indices(cli, tmp_path):
    """A valid count the search does not offer (12 micro-batches of a 48-row replica on pp 2):
    `realbench estimate` costs it as the cost model does, from a plan file."""
    import json

    import yaml

    from realbench.cost.calls import call_cost
    from realbench.cost.simulate import Estimator

    doc = get_builtin("sft-7b-8gpu").to_document()
    doc["name"] = "sft-own-count"
    doc["dataflow"] = {"algorithm": "sft", "seqs": 96, "seq_len": 1024}
    (tmp_path / "my scenario.yaml").write_text(yaml.safe_dump(doc))
    own = Option(Mesh(0, 1, 0, 8), Strategy(dp=2, tp=2, pp=2, micro_batches=12))
    plan = {"schema": "realbench.plan/1", "scenario": "sft-own-count",
            "calls": {"actor_train": {"mesh": "n0", "dp": 2, "tp": 2, "pp": 2, "micro_batches": 12}}}
    (tmp_path / "plan.yaml").write_text(yaml.safe_dump(plan))
    code, out, err = cli("estimate", "--scenario", tmp_path / "my scenario.yaml", "--plan", tmp_path / "plan.yaml", "--json")
    assert code == 0, err
    from realbench.plan import load_scenario

    s = load_scenario(str(tmp_path / "my scenario.yaml"))
    expect = call_cost(s.dataflow.call("actor_train"), s.models["actor"], s.cluster, own).time_s
    assert json.loads(out)["calls"]["actor_train"]["time_s"] == pytest.approx(expect, rel=1e-9)
    est = Estimator(s)
    offered = est.options[0][5]
    assert own not in est.options[0]
    k = est.index_of(0, own)
    assert k >= 5 and est.options[0][k] == own and est.index_of(0, offered) == 5
    assert float(est.dur[0][np.array([k])][0]) == pytest.approx(expect, rel=1e-9)


def test_a_scenario_copied_with_other_models_works_out_its_options_again():
    """pydantic's model_copy copies the instance's cached values: a copy with 8-layer models kept
    the 4-layer models' options (no virtual stages on 4 stages) until copies re-derived them."""
    base = get_builtin("ppo-tiny-cpu")
    assert not any(o.strategy.pp == 4 and o.strategy.virtual_stages > 1 for o in base.options["actor_train"])
    small = get_model("llama-small")  # 8 layers
    copy = base.model_copy(update={"models": {r: small.with_value_head(s.value_head) for r, s in base.models.items()}})
    assert any(o.strategy.pp == 4 and o.strategy.virtual_stages == 2 for o in copy.options["actor_train"])
    assert copy.dataflow.order == base.dataflow.order and copy.plan_space_size > base.plan_space_size


@pytest.mark.parametrize("field", ["zero", "offload_params", "offload_optimizer", "host_adam"])
def test_the_runtime_refuses_by_name_what_only_the_engines_run(field):
    """Sharding and the host-memory modes are priced for the engines; a plan carrying one (a
    hand-edited plan file: a single replica's offloaded optimizer or Adam on the host needs no
    ZeRO stage) is refused by `realbench run`, naming the key, never run without it."""
    from dataclasses import replace

    from realbench.cost import Estimator
    from realbench.cost.baselines import symmetric_plan
    from realbench.plan.plan import refuse_unrunnable

    scenario = get_builtin("ppo-tiny-cpu")
    est = Estimator(scenario)
    options = est.options_of(symmetric_plan(est))
    refuse_unrunnable(scenario, options)  # (the plain plan runs)
    actor = options["actor_train"]
    changed = {**options, "actor_train": replace(actor, strategy=replace(actor.strategy, **{field: 1 if field == "zero"
                                                                                          else True}))}
    with pytest.raises(ConfigError) as e:
        refuse_unrunnable(scenario, changed)
    assert e.value.field == f"calls.actor_train.{field}"
    # a serving engine's server that keeps its memory through the step (an engine plan's generation)
    gen = options["actor_gen"]
    awake = {**options, "actor_gen": replace(gen, strategy=replace(gen.strategy, keeps_memory=True))}
    with pytest.raises(ConfigError) as e:
        refuse_unrunnable(scenario, awake)
    assert e.value.field == "calls.actor_gen.keeps_memory"
