"""A misspelt key in any section of a scenario, plan or profile file is refused by its full path
with the closest valid key, in one line on stderr, exit status 2 (realbench.schema.FileModel,
refuse_unknown_keys). Each case starts from a real document (a built-in scenario written out, a
GRPO job with a checkpoint folder, data and a reward function, a plan that `realbench estimate`
wrote, this machine's profile from the session's cache), misspells one key and asks `realbench
validate` about a file named as a user would name it."""

import copy
import json
from pathlib import Path

import pytest
import yaml

from realbench.examples import tiny_grpo_job
from realbench.plan import load_scenario


def renamed(mapping: dict, old, new) -> dict:
    """`mapping` with key `old` renamed `new`, in its place."""
    assert old in mapping, (old, list(mapping))
    return {new if k == old else k: v for k, v in mapping.items()}


def misspell(doc: dict, where: tuple, old, new) -> dict:
    """A copy of `doc` with key `old` of the mapping at `where` (keys and list indices) renamed."""
    doc = copy.deepcopy(doc)
    if not where:
        return renamed(doc, old, new)
    parent = doc
    for part in where[:-1]:
        parent = parent[part]
    parent[where[-1]] = renamed(parent[where[-1]], old, new)
    return doc


def refused(cli, path: Path, field: str, closest: str | None, *argv):
    """`realbench validate path` (or `argv`) refuses `field` in one line, naming `closest`."""
    code, out, err = cli(*(argv or ("validate",)), path)
    assert code == 2, (code, out, err)
    assert err.count("\n") == 1 and "Traceback" not in err, err
    hint = f"did you mean {closest!r}? " if closest else ""
    assert err.startswith(f"realbench: error: {path}: {field}: unknown setting ({hint}valid: "), err
    return err


@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("user") / "my runs"
    out.mkdir()
    return out


def write(folder: Path, name: str, doc: dict) -> Path:
    path = folder / name
    path.write_text(json.dumps(doc) if name.endswith(".json") else yaml.safe_dump(doc, sort_keys=False))
    return path


# -- scenarios -----------------------------------------------------------------------------------------
TINY = load_scenario("ppo-tiny-cpu").to_document()  # every section in full: device, models' specs, calls
ALGORITHM_FORM = {**TINY, "dataflow": {"algorithm": "ppo", "prompts": 8, "prompt_len": 8, "gen_len": 8,
                                       "minibatches": 2}}
PRESETS = {**TINY, "models": {"actor": "llama-tiny", "ref": "llama-tiny",
                              "critic": {"arch": "llama-tiny", "value_head": True},
                              "reward": {"arch": "llama-tiny", "value_head": True}}}
LOGNORMAL = {**ALGORITHM_FORM, "dataflow": {**ALGORITHM_FORM["dataflow"],
                                            "gen_len": {"dist": "lognormal", "mean": 4, "cv": 1.0, "max": 8}}}
MEASURED = {**ALGORITHM_FORM, "dataflow": {**ALGORITHM_FORM["dataflow"],
                                           "gen_len": {"from": "lengths.jsonl", "call": "actor_gen"}}}
TRAINING = {**TINY, "training": {"learning_rate": 1e-3, "critic": {"learning_rate": 1e-3}}}

SCENARIO_CASES = [  # document, the mapping, its key, the misspelling, the field, the closest key
    (TINY, (), "dataflow", "dataflw", "dataflw", "dataflow"),
    (TINY, ("cluster",), "gpus_per_node", "gpus_per_nod", "cluster.gpus_per_nod", "gpus_per_node"),
    (TINY, ("cluster", "device"), "mem_bw", "mem_bandwidth", "cluster.device.mem_bandwidth", "mem_bw"),
    (TINY, ("models", "actor"), "n_layers", "n_layer", "models.actor.n_layer", "n_layers"),
    (PRESETS, ("models", "critic"), "value_head", "value_hed", "models.critic.value_hed", "value_head"),
    (PRESETS, ("models", "critic"), "arch", "arc", "models.critic.arc", "arch"),
    (TINY, ("dataflow",), "dataset_keys", "dataset_key", "dataflow.dataset_key", "dataset_keys"),
    (TINY, ("dataflow", "calls", 1), "seq_len", "seq_lenght", "dataflow.calls.1.seq_lenght", "seq_len"),
    (ALGORITHM_FORM, ("dataflow",), "minibatches", "mini_batches", "dataflow.mini_batches", "minibatches"),
    (ALGORITHM_FORM, ("dataflow",), "algorithm", "algoritm", "dataflow.algoritm", "algorithm"),
    (LOGNORMAL, ("dataflow", "gen_len"), "cv", "cvv", "dataflow.gen_len.cvv", "cv"),
    (MEASURED, ("dataflow", "gen_len"), "call", "cal", "dataflow.gen_len.cal", "call"),
    (TRAINING, ("training",), "learning_rate", "learnig_rate", "training.learnig_rate", "learning_rate"),
    (TRAINING, ("training", "critic"), "learning_rate", "learnig_rate", "training.critic.learnig_rate",
     "learning_rate"),
]


@pytest.mark.parametrize("doc, where, old, new, field, closest", SCENARIO_CASES,
                         ids=[c[4] for c in SCENARIO_CASES])
def test_a_misspelt_key_of_a_scenario_is_named_with_the_closest(cli, folder, doc, where, old, new, field, closest):
    (folder / "lengths.jsonl").write_text('{"step": 0, "actor_gen": [3, 5, 8]}\n')
    assert cli("validate", write(folder, "my ppo.yaml", doc))[0] == 0  # as it is: valid
    refused(cli, write(folder, "my ppo.yaml", misspell(doc, where, old, new)), field, closest)


@pytest.fixture(scope="module")
def job(tmp_path_factory) -> Path:
    """A GRPO job (a checkpoint folder `ckpt`, data, a reward function) in a folder with a space."""
    return tiny_grpo_job(tmp_path_factory.mktemp("user") / "grpo job")


def job_doc(job: Path) -> dict:
    return yaml.safe_load(job.read_text())


@pytest.mark.parametrize("edit, field, closest", [
    # a misspelt `path` with data: not "data needs a tokenizer" (the actor's folder gives it)
    (lambda d: d["models"].update(actor={"pth": "ckpt"}), "models.actor.pth", "path"),
    # not supported: an unknown key of a checkpoint entry, with the valid ones
    (lambda d: d["models"].update(actor={"path": "ckpt", "quantization": "int4"}), "models.actor.quantization", None),
    # a misspelt setting of LoRA, with PEFT's names
    (lambda d: d["models"].update(actor={"path": "ckpt", "lora": {"r": 8, "lora_alpa": 16}}), "models.actor.lora.lora_alpa",
     "lora_alpha"),
    (lambda d: d["models"].update(ref={"path": "ckpt", "value_hed": False}), "models.ref.value_hed", "value_head"),
    (lambda d: d["models"].update(reward={"function": "rewards.py:digits", "seconds_per_sampl": 0.01}),
     "models.reward.seconds_per_sampl", "seconds_per_sample"),
    (lambda d: d["models"].update(reward={"functon": "rewards.py:digits"}), "models.reward.functon", "function"),
    (lambda d: d["models"].update(reward=[{"path": "ckpt", "value_hed": True}, {"function": "rewards.py:digits"}]),
     "models.reward.0.value_hed", "value_head"),
    (lambda d: d["models"].update(reward=[{"function": "rewards.py:digits"}, {"functon": "rewards.py:digits"}]),
     "models.reward.1.functon", "function"),
    (lambda d: d.update(data=renamed(d["data"], "max_new_tokens", "max_new_token")), "data.max_new_token",
     "max_new_tokens"),
    (lambda d: d["data"].update(fields={"promt": "question"}), "data.fields.promt", "prompt"),
    (lambda d: d.update(dataflow=renamed(d["dataflow"], "group_size", "group_sise")), "dataflow.group_sise",
     "group_size"),
    (lambda d: d.update(modles=d.pop("models")), "modles", "models"),
])
def test_a_misspelt_key_of_a_job_with_data_is_named_with_the_closest(cli, job, edit, field, closest):
    doc = job_doc(job)
    edit(doc)
    refused(cli, write(job.parent, "my job.yaml", doc), field, closest)


def test_the_job_as_written_is_valid_and_other_commands_refuse_the_same_line(cli, job):
    code, out, err = cli("validate", job)
    assert code == 0, err
    doc = job_doc(job)
    doc["models"]["actor"] = {"pth": "ckpt"}
    path = write(job.parent, "my job.yaml", doc)
    err = refused(cli, path, "models.actor.pth", "path")
    for argv in (("estimate", "--baseline", "symmetric", "--profile", "none", "--scenario"),
                 ("search", "--method", "random", "--time-budget", "1", "--profile", "none", "--scenario")):
        assert refused(cli, path, "models.actor.pth", "path", *argv) == err


# -- plans -----------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def plan(cli_once, folder) -> dict:
    path = folder / "plan.yaml"
    code, _, err = cli_once("estimate", "--scenario", "ppo-tiny-cpu", "--baseline", "symmetric",
                            "--profile", "none", "--out", path)
    assert code == 0, err
    return yaml.safe_load(path.read_text())


@pytest.mark.parametrize("where, old, new, field, closest", [
    ((), "scenario", "scenaro", "scenaro", "scenario"),
    (("calls", "actor_train"), "micro_batches", "micro_batch", "calls.actor_train.micro_batch", "micro_batches"),
    (("calls", "actor_gen"), "mesh", "meshes", "calls.actor_gen.meshes", "mesh"),
    (("origin",), "method", "methd", "origin.methd", "method"),
])
def test_a_misspelt_key_of_a_plan_is_named_with_the_closest(cli, folder, plan, where, old, new, field, closest):
    assert cli("validate", write(folder, "my plan.yaml", plan))[0] == 0
    refused(cli, write(folder, "my plan.yaml", misspell(plan, where, old, new)), field, closest)


def test_a_misspelt_call_of_a_plan_is_named_with_the_closest(cli, folder, plan):
    path = write(folder, "my plan.yaml", misspell(plan, ("calls",), "actor_gen", "actor_gn"))
    code, _, err = cli("validate", path)
    assert code == 2 and err.count("\n") == 1
    assert err.startswith(f"realbench: error: {path}: calls.actor_gn: unknown call 'actor_gn' "
                          "(did you mean 'actor_gen'? the scenario has: actor_gen, "), err


# -- profiles --------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def profile(machine_profile_cache) -> dict:
    """This machine's profile of 2 processes (with their collectives), as the profiler wrote it
    into the session's cache (which other tests' runs may add profiles to)."""
    files = sorted((Path(machine_profile_cache) / "profiles").glob("*.json"))
    docs = [json.loads(f.read_text()) for f in files]
    return next(d for d in docs if d["device"]["processes"] == 2 and "2" in d["collectives"].get("all_reduce", {}))


def test_a_misspelt_key_of_a_profile_is_named_with_the_closest(cli, folder, profile):
    model = next(iter(profile["models"]))
    m = ("models", model)
    cases = [
        ((), "collectives", "colectives", "colectives", "collectives"),
        (("device",), "processes", "procesess", "device.procesess", "processes"),
        (m, "hidden", "hiden", f"models.{model}.hiden", "hidden"),
        ((*m, "ops", "1", "block.fwd", 0), "median_s", "median", f"models.{model}.ops.1.block.fwd.0.median",
         "median_s"),
        ((*m, "ops", "1"), "block.fwd", "block.fwdd", f"models.{model}.ops.1.block.fwdd", "block.fwd"),
        ((*m, "optimizer", "1"), "per_tensor_s", "per_tensors_s", f"models.{model}.optimizer.1.per_tensors_s",
         "per_tensor_s"),
        ((*m, "calls", 0), "copies", "copy", f"models.{model}.calls.0.copy", "copies"),
        (("collectives", "all_reduce", "2", 0), "nbytes", "n_bytes", "collectives.all_reduce.2.0.n_bytes", "nbytes"),
        (("collectives",), "all_reduce", "allreduce", "collectives.allreduce", "all_reduce"),
    ]
    assert cli("validate", write(folder, "my profile.json", profile))[0] == 0
    for where, old, new, field, closest in cases:
        refused(cli, write(folder, "my profile.json", misspell(profile, where, old, new)), field, closest)
    # the commands that read a profile say the same
    path = write(folder, "my profile.json", misspell(profile, ("device",), "processes", "procesess"))
    refused(cli, path, "device.procesess", "processes", "estimate", "--scenario", "ppo-tiny-cpu", "--baseline",
            "symmetric", "--profile")
