import networkx as nx
import pytest
import yaml

from realbench.dataflow import ALGORITHMS, CallDef, Dataflow, build_algorithm
from realbench.dataflow.core import load_dataflow
from realbench.errors import ConfigError
from realbench.plan.scenario import scenario_from_document


def data_edges(df):
    return {(u, v) for u, v, d in df.graph.edges(data=True) if d["kind"] == "data"}


def lag1_edges(df):
    return {(u, v) for u, v, d in df.graph.edges(data=True) if d["lag"] == 1}


def test_ppo_graph():
    df = build_algorithm("ppo")
    assert set(df.call_names) == {"actor_gen", "reward_inf", "ref_inf", "critic_inf", "actor_train", "critic_train"}
    scorers = {"reward_inf", "ref_inf", "critic_inf"}
    assert {("actor_gen", s) for s in scorers} <= data_edges(df)
    assert {(s, t) for s in scorers for t in ("actor_train", "critic_train")} <= data_edges(df)
    # parameter versions: next iteration's actor calls wait for this iteration's actor_train
    assert lag1_edges(df) == {("actor_train", "actor_gen"), ("actor_train", "actor_train"),
                              ("critic_train", "critic_inf"), ("critic_train", "critic_train")}
    assert df.order[0] == "actor_gen" and set(df.order[-2:]) == {"actor_train", "critic_train"}
    assert df.input_keys == ("prompts",)
    assert df.trained_models == {"actor", "critic"}


def test_grpo_and_rloo_have_no_critic_and_group_samples():
    for name in ("grpo", "rloo"):
        df = build_algorithm(name, prompts=16, group_size=4)
        assert "critic" not in df.models
        assert df.call("actor_gen").seqs == 64
        assert set(df.call_names) == {"actor_gen", "reward_inf", "ref_inf", "actor_train"}


def test_a_teacher_scores_every_sequence_for_the_actors_loss():
    """On-policy distillation (`with_teacher`): the teacher's forward over each of the 4 x 2 = 8
    sequences of 3 + 5 tokens the actor generates, its log-probabilities an input of the actor's
    update and nothing else's; the teacher is frozen (no train call, no version edge)."""
    for name in ("grpo", "rloo"):
        df = build_algorithm(name, prompts=4, prompt_len=3, gen_len=5, group_size=2, with_ref=False,
                             with_teacher=True)
        teacher = df.call("teacher_inf")
        assert (teacher.model, teacher.kind.value, teacher.seqs, teacher.seq_len) == ("teacher", "inference", 8, 8)
        assert (teacher.inputs, teacher.outputs) == (("seqs",), ("teacher_logprobs",))
        assert {("actor_gen", "teacher_inf"), ("teacher_inf", "actor_train")} <= data_edges(df)
        assert "teacher_logprobs" in df.call("actor_train").inputs
        assert "teacher" not in df.trained_models and not any("teacher_inf" in e for e in lag1_edges(df))
        assert "teacher_inf" not in build_algorithm(name).call_names


def test_remax_two_generations_and_optional_ref():
    df = build_algorithm("remax")
    assert {("sample_gen", "sample_reward"), ("greedy_gen", "greedy_reward"),
            ("greedy_reward", "actor_train")} <= data_edges(df)
    assert "ref_inf" in df.call_names
    assert "ref_inf" not in build_algorithm("remax", with_ref=False).call_names
    # both generations read the version actor_train wrote
    assert {("actor_train", "sample_gen"), ("actor_train", "greedy_gen")} <= lag1_edges(df)


def test_dpo_and_sft():
    dpo = build_algorithm("dpo", pairs=4)
    assert data_edges(dpo) == {("ref_inf", "actor_train")}
    assert dpo.call("ref_inf").seqs == 8
    sft = build_algorithm("sft")
    assert sft.call_names == ("actor_train",) and not data_edges(sft)


def test_every_algorithm_is_a_dag():
    for name in ALGORITHMS:
        df = build_algorithm(name)
        dag = nx.DiGraph((u, v) for u, v, d in df.graph.edges(data=True) if d["lag"] == 0)
        assert nx.is_directed_acyclic_graph(dag)


def _call(name, model="m", kind="inference", inputs=(), outputs=(), **kw):
    return CallDef(name=name, model=model, kind=kind, inputs=inputs, outputs=outputs, seqs=4, seq_len=8, **kw)


def test_cycle_is_an_error():
    with pytest.raises(ValueError, match="cycle"):
        Dataflow(calls=(_call("a", inputs=("y",), outputs=("x",)), _call("b", inputs=("x",), outputs=("y",))))


def test_duplicate_names_and_double_producers():
    with pytest.raises(ValueError, match="duplicate call name"):
        Dataflow(calls=(_call("a"), _call("a")))
    with pytest.raises(ValueError, match="produced by both"):
        Dataflow(calls=(_call("a", outputs=("x",)), _call("b", outputs=("x",))))


def test_dangling_key_with_declared_dataset():
    with pytest.raises(ValueError, match="produced by no call"):
        Dataflow(dataset_keys=("prompts",), calls=(_call("a", inputs=("promts",)),))
    # without a declared dataset, unproduced keys come from the dataset
    assert Dataflow(calls=(_call("a", inputs=("promts",)),)).input_keys == ("promts",)


def test_kind_specific_fields():
    with pytest.raises(ValueError, match="gen_len"):
        _call("g", kind="generate")
    with pytest.raises(ValueError, match="gen_len is only"):
        _call("g", kind="inference", gen_len=2)
    with pytest.raises(ValueError, match="consumes its own output"):
        _call("g", inputs=("x",), outputs=("x",))


def test_user_defined_dataflow_from_yaml(tmp_path):
    text = """
schema: realbench.scenario/1
name: my-flow
cluster: {nodes: 1, gpus_per_node: 4, device: cpu}
models: {policy: llama-tiny, judge: {arch: llama-tiny, value_head: true}}
dataflow:
  dataset_keys: [prompts]
  calls:
    - {name: rollout, model: policy, kind: generate, inputs: [prompts], outputs: [seqs], seqs: 8, seq_len: 16, gen_len: 8}
    - {name: judge, model: judge, kind: inference, inputs: [seqs], outputs: [scores], seqs: 8, seq_len: 16}
    - {name: update, model: policy, kind: train, inputs: [seqs, scores], seqs: 8, seq_len: 16}
"""
    s = scenario_from_document(yaml.safe_load(text))
    assert s.dataflow.order == ("rollout", "judge", "update")
    assert s.models["judge"].value_head


def test_call_on_unknown_model_names_the_field():
    doc = {"name": "x", "cluster": {"nodes": 1, "gpus_per_node": 2, "device": "cpu"},
           "models": {"actor": "llama-tiny"},
           "dataflow": {"calls": [{"name": "t", "model": "critic", "kind": "train", "seqs": 2, "seq_len": 4}]}}
    with pytest.raises(ConfigError) as e:
        scenario_from_document(doc, "x.yaml")
    assert e.value.field == "dataflow.calls.0.model" and "unknown model 'critic'" in str(e.value)


def test_load_dataflow_names_fields():
    with pytest.raises(ConfigError) as e:
        load_dataflow({"calls": [{"name": "a", "model": "m", "kind": "fly", "seqs": 1, "seq_len": 2}]})
    assert e.value.field == "calls.0.kind"


def test_without_a_reference_no_call_scores_with_one():
    """`with_ref: false` (the engines' KL coefficient 0: verl without use_kl_loss, OpenRLHF's
    init_kl_coef 0, AReaL's kl_ctl 0) leaves the reference out: no call, no input, no model."""
    for name in ("ppo", "grpo", "rloo"):
        df = build_algorithm(name, with_ref=False, **({} if name == "ppo" else {"group_size": 4}))
        assert "ref_inf" not in df.call_names and "ref" not in df.models
        assert all("ref_logprobs" not in c.inputs for c in df.calls)
        assert "ref_inf" in build_algorithm(name, **({} if name == "ppo" else {"group_size": 4})).call_names
    # PPO with several responses a prompt (AReaL's n_samples): each its own episode
    df = build_algorithm("ppo", prompts=16, group_size=4)
    assert df.call("actor_gen").seqs == 64 and df.call("actor_gen").group_size == 4
    assert df.call("critic_train").seqs == 64


def test_a_kl_penalty_without_a_reference_is_refused_by_name():
    from realbench.plan.builtin import BUILTIN

    doc = {**BUILTIN["grpo-tiny-cpu"], "dataflow": {**BUILTIN["grpo-tiny-cpu"]["dataflow"], "with_ref": False}}
    doc["models"] = {k: v for k, v in doc["models"].items() if k != "ref"}
    scenario = scenario_from_document(doc)
    assert "ref_inf" not in scenario.dataflow.call_names
    with pytest.raises(ConfigError) as e:
        scenario_from_document({**doc, "training": {**doc.get("training", {}), "beta": 0.1}})
    assert e.value.field == "training.beta" and "with_ref: false" in e.value.message
    with pytest.raises(ConfigError) as e:  # the reference named but used by no call
        scenario_from_document({**doc, "models": BUILTIN["grpo-tiny-cpu"]["models"]})
    assert "models.ref" in str(e.value)
