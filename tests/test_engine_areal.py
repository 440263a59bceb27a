"""AReaL 1.0.4's experiment YAMLs read into plans, plans written as its experiments, and what
realbench writes checked by AReaL's own loader, config classes and allocation parser in its own
environment (`make engines`: .venv-areal)."""

import dataclasses
import math
import json
import os
import random
import subprocess
from pathlib import Path

import pytest
import yaml

from realbench.engines import areal
from realbench.errors import ConfigError
from realbench.plan import load_scenario

ROOT = Path(__file__).resolve().parent.parent
PYTHON = Path(os.environ.get("REALBENCH_AREAL_PYTHON", ROOT / ".venv-areal" / "bin" / "python"))
CHECK = ROOT / "realbench" / "engines" / "areal" / "check.py"

# AReaL's examples/math/gsm8k_grpo.yaml as a user runs it (the keys that place and size the job, and
# some that do not: names, the optimizer, the loss's settings), on a local checkpoint
GSM8K_GRPO = """\
experiment_name: gsm8k-grpo
trial_name: trial0
seed: 1
enable_offload: false
total_train_epochs: 10
tokenizer_path: ${actor.path}
cluster:
  n_nodes: 1
  n_gpus_per_node: 8
  fileroot: /tmp/areal/experiments
scheduler:
  type: null
rollout:
  backend: "sglang:d4p1t1"
  experiment_name: ${experiment_name}
  trial_name: ${trial_name}
  max_concurrent_rollouts: 256
  consumer_batch_size: ${train_dataset.batch_size}
  max_head_offpolicyness: 2
  scheduling_spec: ${actor.scheduling_spec}
gconfig:
  n_samples: 4
  max_new_tokens: 1024
  max_tokens: 2048
  temperature: 1.0
actor:
  backend: "fsdp:d4p1t1"
  experiment_name: ${experiment_name}
  trial_name: ${trial_name}
  path: ckpt
  gradient_checkpointing: true
  dtype: bfloat16
  mb_spec:
    max_tokens_per_mb: 10240
  optimizer:
    type: adam
    lr: 1.70e-5
  eps_clip: 0.4
  kl_ctl: 0.0
  ppo_n_minibatches: 1
  recompute_logprob: true
  use_decoupled_loss: true
  rejection_sampling:
    metric: ratio
    upper: 5.0
  reward_norm:
    mean_level: group
    std_level: group
    group_size: ${gconfig.n_samples}
  scheduling_spec:
    - task_type: worker
      port_count: 2
      gpu: 1
      mem: 32
      cmd: python3 -m areal.infra.rpc.rpc_server
ref:
  backend: ${actor.backend}
  experiment_name: ${experiment_name}
  trial_name: ${trial_name}
  path: ${actor.path}
  optimizer: null
  mb_spec:
    max_tokens_per_mb: 10240
  scheduling_strategy:
    type: colocation
    target: actor
  scheduling_spec: ${actor.scheduling_spec}
sglang:
  model_path: ${actor.path}
  context_length: 32768
  mem_fraction_static: 0.8
train_dataset:
  batch_size: 256
  path: openai/gsm8k
  type: rl
  max_length: 1024
saver:
  experiment_name: ${experiment_name}
  trial_name: ${trial_name}
  fileroot: ${cluster.fileroot}
"""

# its PPO sibling (examples/math/gsm8k_ppo_megatron.yaml's shape): a critic with the actor's Megatron
# allocation, colocated, two optimizer steps, a reference (kl_ctl > 0), generation in step (η 0)
PPO_MEGATRON = GSM8K_GRPO.replace('"fsdp:d4p1t1"', '"megatron:d2p2t1"').replace("ppo_n_minibatches: 1",
                                                                                "ppo_n_minibatches: 2") \
    .replace("kl_ctl: 0.0", "kl_ctl: 0.05").replace("max_head_offpolicyness: 2", "max_head_offpolicyness: 0") \
    .replace("  reward_norm:\n    mean_level: group\n    std_level: group\n    group_size: ${gconfig.n_samples}\n", "") \
    + """critic:
  backend: ${actor.backend}
  is_critic: true
  experiment_name: ${experiment_name}
  trial_name: ${trial_name}
  path: ${actor.path}
  ppo_n_minibatches: ${actor.ppo_n_minibatches}
  mb_spec:
    max_tokens_per_mb: 10240
  optimizer: ${actor.optimizer}
  scheduling_strategy:
    type: colocation
    target: actor
  scheduling_spec: ${actor.scheduling_spec}
"""


@pytest.fixture(scope="module")
def job(tmp_path_factory):
    """A user's AReaL job folder: a checkpoint and two experiment YAMLs."""
    from realbench.examples import save_model

    folder = tmp_path_factory.mktemp("my areal job")
    save_model(folder / "ckpt", max_position_embeddings=32_768)  # (Qwen2.5's positions, the servers' default context)
    (folder / "gsm8k grpo.yaml").write_text(GSM8K_GRPO)
    (folder / "ppo_megatron.yaml").write_text(PPO_MEGATRON)
    return folder


@pytest.fixture(autouse=True)
def _keep_cwd():
    here = os.getcwd()
    yield
    os.chdir(here)


def areal_check(*args) -> list[dict]:
    assert PYTHON.is_file(), f"AReaL's environment is missing: run `make engines` ({PYTHON})"
    done = subprocess.run([str(PYTHON), str(CHECK), *map(str, args)], capture_output=True, text=True, timeout=300)
    return [json.loads(line) for line in done.stdout.strip().splitlines()]


def imported(cli, job, config, *overrides, out="plans", name=None):
    os.chdir(job)
    code, stdout, err = cli("import", "areal", config, *overrides, "--out", out, "--json",
                            *(("--name", name) if name else ()), "--force")
    assert code == 0, err
    result = json.loads(stdout)
    return result, yaml.safe_load(Path(result["plan"]).read_text()), yaml.safe_load(Path(result["scenario"]).read_text())


def test_the_settings_table_is_areals_own_config_classes():
    """realbench checks AReaL experiments against areal-1.0.4.json; the installed AReaL's PPOConfig
    declares exactly those settings with those defaults (and the same optional sections)."""
    assert areal_check("defaults") == [json.loads(areal.TABLE.read_text())]


def test_the_gsm8k_example_reads_into_separate_rollout_and_trainer_gpus(cli, job):
    result, plan, scenario = imported(cli, job, "gsm8k grpo.yaml", name="gsm8k")
    calls = plan["calls"]
    # AReaL places the actor first, then the rollout: four GPUs each of one node
    assert calls["actor_gen"] == {"mesh": "n0:4-7", "dp": 4, "tp": 1, "pp": 1, "micro_batches": 1,
                                  "memory_fraction": 0.8}  # (its sglang.mem_fraction_static, the plan's choice)
    # 256 prompts x 4 samples over 4 GPUs, one optimizer step: 256 rows of 2048 tokens a GPU packed to
    # 10,240 tokens: ceil(256 x 2048 / 10240) = 52 micro-batches, the fewest even splits at least as many: 64;
    # memory planned for the budget realbench writes for them, the largest group of 4 rows: 8,192 tokens
    assert calls["actor_train"] == {"mesh": "n0:0-3", "dp": 4, "tp": 1, "pp": 1, "micro_batches": 64,
                                    "activation_checkpointing": True, "zero": 3, "max_tokens": 8192}
    # the reward: the rollout workers' function, on the rollout's GPUs; kl_ctl 0: no reference at all
    assert calls["reward_inf"]["mesh"] == "n0:4-7" and "ref_inf" not in calls
    assert scenario["models"]["reward"] == {"function": areal.REWARD} and "ref" not in scenario["models"]
    assert scenario["dataflow"] == {"algorithm": "grpo", "prompts": 256, "prompt_len": 1024, "gen_len": 1024,
                                    "minibatches": 1, "group_size": 4, "with_ref": False, "max_staleness": 2,
                                    "memory_fraction": 0.8}  # (its sglang.mem_fraction_static)
    assert plan["max_staleness"] == 2 and scenario["engine"] == "areal"
    assert scenario["cluster"] == {"nodes": 1, "gpus_per_node": 8, "device": "h100"}
    assert result["time_per_iter_s"] > 0 and result["not_priced"] == list(areal.PRICING_GAPS)


def test_a_megatron_ppo_with_critic_and_reference_reads_as_areal_runs_it(cli, job):
    _, plan, scenario = imported(cli, job, "ppo_megatron.yaml", name="ppo")
    calls = plan["calls"]
    # megatron:d2p2t1: the distributed optimizer (zero 1) on the trained models; 256 x 4 / 2 steps / 2 dp
    # = 256 rows a step a GPU: 64 micro-batches (as above, at least 2 pp and a multiple of pp)
    # of 4 rows, memory planned for the budget realbench writes for them: 4 whole rows
    row = scenario["dataflow"]["prompt_len"] + scenario["dataflow"]["gen_len"]
    assert calls["actor_train"] == {"mesh": "n0:0-3", "dp": 2, "tp": 1, "pp": 2, "micro_batches": 64,
                                    "activation_checkpointing": True, "zero": 1, "max_tokens": 4 * row}
    assert calls["critic_train"]["zero"] == 1 and calls["critic_train"]["micro_batches"] == 64
    # the forwards over the whole batch (512 rows a GPU) with the same token budget: 128 micro-batches
    # (the critic's values within its training's budget)
    for name in ("ref_inf", "critic_inf"):
        assert calls[name] == {"mesh": "n0:0-3", "dp": 2, "tp": 1, "pp": 2, "micro_batches": 128,
                               "max_tokens": 4 * row}, name
    assert scenario["dataflow"]["algorithm"] == "ppo" and scenario["dataflow"]["group_size"] == 4
    # without a token budget the reference runs n_mbs (1) micro-batches, which Megatron's pipeline
    # raises to 2 x pp
    _, plan, _ = imported(cli, job, "ppo_megatron.yaml", "ref.mb_spec.max_tokens_per_mb=null", name="ppo-n-mbs")
    assert plan["calls"]["ref_inf"]["micro_batches"] == 4
    assert "with_ref" not in scenario["dataflow"] and "max_staleness" not in scenario["dataflow"]
    assert scenario["models"]["critic"]["value_head"] is True


def test_exported_plans_pass_areals_own_loader_and_read_back_the_same(cli, job):
    """The imported plans (written by `export --format areal`) and random plans of AReaL's space (the
    search's list, written by the same writer): AReaL's loader, config classes and allocation parser
    accept every one (given the data set, which is the user's), and each reads back to the same plan
    and estimate."""
    from realbench.cost import Estimator
    from realbench.plan.plan import plan_from_document, resolve_plan
    from realbench.plan.scenario import load_scenario

    os.chdir(job)
    cases = []  # (written config, the scenario, the plan's options)
    lora = ("actor.use_lora=true", "actor.lora_rank=8", "actor.lora_alpha=16", "actor.target_modules=[q_proj,v_proj]")
    # the old log-probabilities: recomputed (the example's decoupled loss), or the rollout's (AReaL's default)
    rollout_logp = ("actor.use_decoupled_loss=false", "actor.recompute_logprob=false")
    # the decoupled loss's proximal ones interpolated from them (no forward), carried
    interpolated = ("actor.prox_logp_method=loglinear",)
    # vLLM servers (and LoRA on them), written back as vLLM
    vllm = ("rollout.backend=vllm:d4p1t1", "vllm.max_num_seqs=64", *lora)
    # FSDP's context parallelism (Ulysses groups of 2 GPUs) for the actor and, through
    # ${actor.backend}, the reference and critic
    ulysses = ("actor.backend=fsdp:d2c2",)
    # Megatron's context parallelism (p2p rings of 2 GPUs) beside a pipeline, and beside tp
    for config, name, overrides in (("ppo_megatron.yaml", "ppo-context-parallel", ("actor.backend=megatron:d1p2c2",)),
                                    ("ppo_megatron.yaml", "ppo-context-tp", ("actor.backend=megatron:d1t2c2",)),
                                    ("gsm8k grpo.yaml", "grpo", ()), ("ppo_megatron.yaml", "ppo", ()),
                                    ("gsm8k grpo.yaml", "grpo-lora", lora),
                                    ("gsm8k grpo.yaml", "grpo-rollout-logp", rollout_logp),
                                    ("gsm8k grpo.yaml", "grpo-loglinear", interpolated),
                                    ("gsm8k grpo.yaml", "grpo-vllm", vllm),
                                    ("ppo_megatron.yaml", "ppo-ulysses", ulysses)):
        first, plan_doc, scenario_doc = imported(cli, job, config, *overrides, out="first", name=name)
        assert scenario_doc["training"]["old_logprobs"] == \
            ("rollout" if overrides in (rollout_logp, interpolated) else "whole_batch")
        assert scenario_doc["engine_settings"].get("actor.prox_logp_method") == \
            ("loglinear" if overrides == interpolated else None)
        if overrides == lora:  # the LoRA settings, read
            assert scenario_doc["models"]["actor"]["lora"] == {"r": 8, "lora_alpha": 16,
                                                               "target_modules": ["q_proj", "v_proj"]}
        scenario = load_scenario(first["scenario"])
        out = job / "exported" / f"{name} areal.yaml"
        out.parent.mkdir(exist_ok=True)
        code, _, err = cli("export", "--plan", first["plan"], "--format", "areal", "--out", out, "--model-path",
                           "actor=ckpt", "--model-path", "critic=ckpt", "--force")
        assert code == 0, err
        assert os.access(out.with_name(f"{out.stem}-launch.sh"), os.X_OK)
        # the user's own settings (names, the optimizer, the data set) carried into the written experiment
        assert scenario.engine_settings["actor.optimizer.lr"] == 1.7e-5
        assert "actor.path" not in scenario.engine_settings and "actor.backend" not in scenario.engine_settings
        cases.append((out, scenario, resolve_plan(plan_from_document(plan_doc), scenario)))
        if overrides:
            continue
        table = list(areal.configurations(scenario))
        assert len(table) > 100
        for k, options in enumerate(random.Random(0).sample(table, 3)):
            backend, settings = areal.to_config(scenario, options, {"actor": "ckpt", "critic": "ckpt"})
            path = job / "exported" / f"{name}-random-{k}.yaml"
            for file, text, _ in areal.config_files(path, backend, settings):
                file.write_text(text)
            cases.append((path, scenario, options))
    checked = areal_check("validate", *(c[0] for c in cases), "train_dataset.path=openai/gsm8k")
    assert len(checked) == len(cases) and all(c["ok"] for c in checked), checked
    # as AReaL's config classes hold them: the imported ones' carried, the writer's own (names, a
    # placeholder learning rate) where written straight from a plan
    assert [(c["actor_lr"], c["experiment_name"]) for c in checked] == \
        [(1.7e-5, "gsm8k-grpo") if path.name.endswith(" areal.yaml") else (1e-6, scenario.name)
         for path, scenario, _ in cases]
    assert all(yaml.safe_load(path.read_text())["train_dataset"]["path"] == "openai/gsm8k"
               for path, _, _ in cases if path.name.endswith(" areal.yaml"))
    backends, contexts = set(), set()
    for (path, scenario, options), c in zip(cases, checked):
        again, plan_again, _ = imported(cli, job, path, out="again", name=path.stem)
        G = scenario.cluster.gpus_per_node
        back = resolve_plan(plan_from_document(plan_again), load_scenario(again["scenario"]))
        assert {n: o.label(G) for n, o in back.items()} == {n: o.label(G) for n, o in options.items()}, path
        assert plan_again.get("max_staleness", 0) == scenario.dataflow.max_staleness
        est = Estimator(scenario)
        assert again["time_per_iter_s"] == pytest.approx(est.estimate(est.choice_of(options)).time_per_iter_s,
                                                         rel=1e-9)
        # AReaL's own decision to run the trainer's forward for them is the plan's; the decoupled loss
        # of asynchronous RL where the forward runs
        mode = scenario.training.old_logprobs
        assert c["logprob_forward"] is (mode == "whole_batch") and load_scenario(again["scenario"]).training.old_logprobs == mode
        interpolating = scenario.engine_settings.get("actor.prox_logp_method") == "loglinear"
        assert (c["prox_logp_method"] == "loglinear") is interpolating
        assert c["use_decoupled_loss"] is ((mode == "whole_batch" or interpolating) and scenario.dataflow.max_staleness > 0)
        # the servers' share of each GPU's memory, as AReaL's config classes hold it: the plan's (a
        # searched one), else the one read (the example's 0.8), or the default a plan of a built-in job
        # is written with; read back into the scenario and the plan
        from realbench.plan.options import served_call

        share = c["gpu_memory_utilization" if scenario.rollout_server == "vllm" else "mem_fraction_static"]
        planned = served_call(scenario.dataflow.call("actor_gen"), options["actor_gen"].strategy).memory_fraction
        assert share == (planned or areal.MEMORY_FRACTION) == back["actor_gen"].strategy.memory_fraction == \
            load_scenario(again["scenario"]).dataflow.call("actor_gen").memory_fraction
        # the servers' context as AReaL's config classes hold it: a vLLM's read (AReaL's default, 32,768),
        # else the least the plan runs with, a sequence
        gen = scenario.dataflow.call("actor_gen")
        assert c["max_model_len" if scenario.rollout_server == "vllm" else "context_length"] == \
            (gen.max_model_len or gen.seq_len) == (load_scenario(again["scenario"]).dataflow.call("actor_gen").max_model_len
                                                   or gen.seq_len), path
        # the servers AReaL parses are the ones read (vLLM or SGLang)
        assert c["allocations"]["rollout"]["backend"] == (scenario.rollout_server or "sglang") == \
            load_scenario(again["scenario"]).rollout_server
        # AReaL's own parse of what realbench wrote names each trainer role's layout, its Ulysses
        # groups (context parallelism) too
        for role, call in (("actor", "actor_train"), ("ref", "ref_inf"), ("critic", "critic_train")):
            if call in options:
                a, parsed = options[call].strategy, c["allocations"][role]
                assert (parsed["dp"], parsed["tp"], parsed["pp"], parsed["cp"]) == (a.dp, a.tp, a.pp, a.sp), path
                # (the rings: Megatron's p2p ring, FSDP's Ulysses)
                assert a.ring == ("p2p" if parsed["backend"] == "megatron" and a.sp > 1 else ""), path
        contexts.add(c["allocations"]["actor"]["cp"])
        backends.add(c["allocations"]["actor"]["backend"])
        # the LoRA settings as AReaL's config classes hold them, the servers' side on too
        lora = scenario.models["actor"].lora
        assert c["lora"] == ({"use_lora": True, "rank": 8, "alpha": 16, "target_modules": ["q_proj", "v_proj"],
                              "rollout": True} if lora else
                             {"use_lora": False, "rank": 32, "alpha": 16, "target_modules": [], "rollout": False}), path
    assert backends == {"fsdp", "megatron"} and {1, 2} <= contexts


def test_without_the_data_set_areals_loader_refuses_what_the_launch_must_give(cli, job):
    os.chdir(job)
    no_data = GSM8K_GRPO.replace("  path: openai/gsm8k\n", "")
    assert no_data != GSM8K_GRPO
    (job / "no data.yaml").write_text(no_data)
    first, _, _ = imported(cli, job, "no data.yaml", out="first", name="grpo")
    out = job / "no data" / "grpo.yaml"
    out.parent.mkdir(exist_ok=True)
    code, _, err = cli("export", "--plan", first["plan"], "--format", "areal", "--out", out, "--model-path",
                       "actor=ckpt", "--force")
    assert code == 0, err
    assert "train_dataset.path=" in out.with_name("grpo-launch.sh").read_text()
    (checked,) = areal_check("validate", out)
    assert not checked["ok"] and "TrainDatasetConfig" in checked["error"] and "path" in checked["error"], checked


@pytest.mark.parametrize("overrides, key, says", [
    (["actor.backnd=fsdp:d4"], "actor.backnd", "did you mean 'actor.backend'"),
    # GRPO's group of one: AReaL centres it on itself (advantage 0), realbench takes its reward
    (["gconfig.n_samples=1"], "gconfig.n_samples", "AReaL centres it on itself"),
    (["actor.backend=archon:d4"], "actor.backend", "archon"),
    (["actor.backend=fsdp:d1t2c2"], "actor.backend", "without tensor parallelism (t1)"),
    # Ulysses groups the tiny model's 4 heads do not split (as AReaL's ulyssess_patch.py:165-176),
    # or wider than a node
    (["actor.backend=fsdp:d1c8", "cluster.n_nodes=2"], "calls.actor_train.sp", "does not split the 4 attention heads"),
    (["actor.backend=fsdp:d1c4", "cluster.n_gpus_per_node=2", "cluster.n_nodes=4"], "calls.actor_train.sp",
     "sp 4 does not divide the 2 devices of a node"),
    (["actor.backend=fsdp:d2p2"], "actor.backend", "no pipeline"),
    (["rollout.backend=sglang.d4"], "rollout.backend", "not an allocation AReaL parses"),
    (["actor.backend=megatron:(attn:d4|ffn:e4)"], "actor.backend", "MoE"),
    (["actor.kl_ctl=0.1", "ref.scheduling_strategy.type=separation"], "ref.scheduling_strategy.type",
     "one after another"),
    (["actor.kl_ctl=0.1", "ref.backend=fsdp:d2"], "ref.backend", "world size"),
    (["rollout.scheduling_strategy.type=colocation"], "rollout.scheduling_strategy.type", "does not price"),
    (["actor.offload=true"], "actor.offload", "does not price"),
    (["actor.use_lora=true", "actor.peft_type=lokr"], "actor.peft_type", "realbench trains LoRA adapters"),
    (["critic.use_lora=true"], "critic.use_lora", "does not price"),
    (["actor.path=my-org/house-model-7b"], "actor.path", "in the local Hugging Face cache"),
    (["train_dataset.batch_size=6"], "train_dataset.batch_size", "evenly"),
    (["actor.mb_spec.max_tokens_per_mb=600"], "actor.mb_spec.max_tokens_per_mb", "600 tokens hold no whole row"),
    (["actor.mb_spec.packing_algorithm=kk"], "actor.mb_spec.packing_algorithm", "does not price"),
    (["actor.mb_spec.granularity=2"], "actor.mb_spec.granularity", "does not price"),
    (["rollout.backend=sglang:d1t16"], "rollout.backend", "spans nodes"),
    (["rollout.backend=sglang:d2p2t1"], "rollout.backend", "without a pipeline"),
    # the servers' share of each GPU's memory: unset (SGLang would choose), or too small for one sequence
    (["sglang.mem_fraction_static=null"], "sglang.mem_fraction_static", "chooses its own share"),
    (["sglang.mem_fraction_static=0.000001"], "sglang.mem_fraction_static",
     "1e-06: the serving engine's KV cache at memory fraction 1e-06 holds 0 tokens"),
    (["rollout.backend=vllm:d4p1t1", "vllm.gpu_memory_utilization=0.000001"], "vllm.gpu_memory_utilization",
     "holds 0 tokens"),
    # the servers' context: beyond the checkpoint's positions (either server refuses it), or short of a
    # prompt and its response (1024 + 1024)
    (["sglang.context_length=65536"], "sglang.context_length", "65536: beyond the checkpoint's max_position_embeddings"),
    (["rollout.backend=vllm:d4p1t1", "vllm.max_model_len=2047"], "vllm.max_model_len",
     "2047, short of a prompt and its response (2048 tokens)"),
    (["--gpus-per-node", "4"], "--gpus-per-node", "cluster.n_gpus_per_node"),
    (["critic.backend=fsdp:d4", "critic.ppo_n_minibatches=2", "critic.scheduling_strategy.type=colocation",
      "critic.scheduling_strategy.target=actor"], "critic.ppo_n_minibatches", "the actor's optimizer steps"),
])
def test_what_realbench_cannot_read_or_price_is_refused_by_name(cli, job, overrides, key, says):
    os.chdir(job)
    code, _, err = cli("import", "areal", "gsm8k grpo.yaml", *overrides, "--out", "refused", "--force")
    assert code == 2 and err.count("\n") == 1, err
    assert key in err and says in err, err
    assert not (job / "refused").exists()


def test_areals_own_code_refuses_what_realbench_refuses_and_accepts_the_reference(cli, job):
    """The allocation rules realbench checks are AReaL's: its parser refuses the same strings; a
    reference with kl_ctl > 0 is read as AReaL builds it (rl_trainer.py:179-181)."""
    os.chdir(job)
    checked = areal_check("validate", "gsm8k grpo.yaml", "actor.backend=fsdp:d2p2")
    assert not checked[0]["ok"], checked
    _, plan, scenario = imported(cli, job, "gsm8k grpo.yaml", "actor.kl_ctl=0.1", name="with-ref")
    assert plan["calls"]["ref_inf"]["mesh"] == plan["calls"]["actor_train"]["mesh"]
    assert scenario["models"]["ref"]["path"] == scenario["models"]["actor"]["path"]


def test_context_parallel_groups_are_read_as_areal_forms_them_by_hand(cli, job):
    """fsdp:d2c2 (AReaL's context parallelism under FSDP: Ulysses): 1024 samples over 2 data-parallel
    ranks, 512 rows a group of 2 GPUs; every row at its 2,048-token cap, the rank's budget of 10,240
    tokens (the group's, fsdp_engine.py:1915-1948 slicing each packed micro-batch over the two) packs
    5 rows, 103 micro-batches, priced as the fewest even splits at least as many: 128 of 4 rows, 8,192
    tokens, 4,096 a GPU. fsdp:d4 packs a GPU's 256 rows the same way: 64 of 8,192 tokens a GPU.
    A budget of one row (2,048) is a group's, so AReaL runs it: one row a micro-batch, 1,024 tokens a
    GPU. Written back: the allocation string with c2, the rank's budget and count."""
    _, plan, scenario = imported(cli, job, "gsm8k grpo.yaml", "actor.backend=fsdp:d2c2", name="cp")
    row = scenario["dataflow"]["prompt_len"] + scenario["dataflow"]["gen_len"]
    assert row == 2048
    assert plan["calls"]["actor_train"] == {"mesh": "n0:0-3", "dp": 2, "tp": 1, "pp": 1, "micro_batches": 128,
                                            "activation_checkpointing": True, "zero": 3, "sp": 2, "max_tokens": 4096}
    _, flat, _ = imported(cli, job, "gsm8k grpo.yaml", name="cp-flat")
    assert flat["calls"]["actor_train"]["micro_batches"] == 64 and flat["calls"]["actor_train"]["max_tokens"] == 8192
    result, tight, _ = imported(cli, job, "gsm8k grpo.yaml", "actor.backend=fsdp:d2c2",
                                "actor.mb_spec.max_tokens_per_mb=2048", name="cp-one-row")
    assert tight["calls"]["actor_train"]["micro_batches"] == 512 and tight["calls"]["actor_train"]["max_tokens"] == 1024
    (job / "cp").mkdir(exist_ok=True)
    code, _, err = cli("export", "--plan", result["plan"], "--format", "areal", "--out", job / "cp" / "one row.yaml",
                       "--model-path", "actor=ckpt", "--force")
    assert code == 0, err
    written = yaml.safe_load((job / "cp" / "one row.yaml").read_text())["actor"]
    assert (written["backend"], written["mb_spec"]["n_mbs"], written["mb_spec"]["max_tokens_per_mb"]) == \
        ("fsdp:d2c2", 512, 2048)


def test_megatron_context_parallel_rings_are_read_as_areal_forms_them_by_hand(cli, job):
    """megatron:d1p2c2 on the PPO job (4 GPUs): one data-parallel rank (Megatron's d), a ring of 2
    GPUs a pipeline stage; a step's 512 rows (256 prompts x 4 over 2 steps) the rank's, every row at
    its 2,048-token cap, the rank's budget of 10,240 tokens (megatron_engine.py:2060-2064: the ring's,
    "max_tokens_per_mb / cp_size" a GPU) packs 5 rows, 103 micro-batches (a multiple of pp: 104),
    priced as the fewest even splits at least as many: 128 of 4 rows, 8,192 tokens, 4,096 a GPU;
    the forwards over the whole batch twice that. megatron:d2p2t1 packs a GPU's 256 rows: 64 of
    8,192 tokens a GPU. Every trainer call attends by Megatron's p2p ring, the distributed optimizer
    sharding over d x c = 2 (zero 1)."""
    _, plan, _ = imported(cli, job, "ppo_megatron.yaml", "actor.backend=megatron:d1p2c2", name="megatron-cp")
    ring = {"dp": 1, "tp": 1, "pp": 2, "sp": 2, "ring": "p2p", "max_tokens": 4096}
    assert plan["calls"]["actor_train"] == {"mesh": "n0:0-3", **ring, "micro_batches": 128,
                                            "activation_checkpointing": True, "zero": 1}
    assert plan["calls"]["critic_train"] == {"mesh": "n0:0-3", **ring, "micro_batches": 128, "zero": 1}
    for name in ("ref_inf", "critic_inf"):
        assert plan["calls"][name] == {"mesh": "n0:0-3", **ring, "micro_batches": 256}, name


def test_the_search_offers_ulysses_groups_the_heads_split(cli, tmp_path):
    """AReaL's space holds FSDP's context parallelism: groups of 2, 4, ... GPUs of a node that
    divide the actor's GPUs, where the heads split (4 heads, 2 KV heads: 2 and 4; 6 heads: 2 only),
    and Megatron's p2p rings of any size its layout leaves, beside tp and pp, whose tp x c GPUs
    divide the node (a ring of 3 would sit astride two nodes of a 3-node layout). The tiny job's
    actor has 7, 6 or 4 of the node's 8 GPUs."""
    from realbench.examples import save_model

    os.chdir(tmp_path)
    for name, heads in (("four", 4), ("six", 6)):
        save_model(tmp_path / name, hidden=96 if heads == 6 else 64, heads=heads, kv_heads=2,
                   max_position_embeddings=32_768)
        (tmp_path / f"{name}.yaml").write_text(GSM8K_GRPO.replace("path: ckpt", f"path: {name}"))
        code, out, err = cli("import", "areal", f"{name}.yaml", "--out", "plans", "--json", "--force")
        assert code == 0, err
        options, _ = areal.plan_table(load_scenario(json.loads(out)["scenario"]))
        offered = {o.strategy.sp for o in options["actor_train"] if not o.strategy.ring}
        assert offered == ({1, 2, 4} if heads == 4 else {1, 2}), (name, offered)
        # Megatron's p2p rings need no heads split: on the 4 or 6 GPUs (7 split only one way)
        rings = {(o.strategy.sp, o.strategy.tp, o.strategy.pp) for o in options["actor_train"] if o.strategy.ring}
        assert {o.strategy.ring for o in options["actor_train"] if o.strategy.sp > 1} == {"", "p2p"}
        assert (2, 1, 1) in rings and (4, 1, 1) in rings and (2, 2, 1) in rings and (2, 1, 2) in rings, rings
        assert all(8 % (tp * cp) == 0 for cp, tp, _ in rings), rings


def test_search_inside_areal_reports_its_best_beside_the_imported_configuration(cli, job):
    result, _, _ = imported(cli, job, "ppo_megatron.yaml", name="search-me")
    code, out, err = cli("search", "--scenario", result["scenario"], "--engine", "areal", "--plan", result["plan"],
                         "--method", "mcmc", "--time-budget", "2", "--seed", "0", "--json")
    assert code == 0, err
    found = json.loads(out)
    assert found["engine"] == "areal" and found["best_time_s"] <= result["time_per_iter_s"] * (1 + 1e-9)


def test_a_servers_concurrent_sequences_set_its_decode_batches(cli, job):
    """Each SGLang server decodes the sequences in flight on it at once: the prompt groups in flight
    (rollout.max_concurrent_rollouts x n_samples) spread over its 4 servers, up to the server's own
    max_running_requests. 1024 samples, 256 a server: 32 groups in flight = 32 sequences a server,
    8 batches; capped at 16 a server, 16 batches."""
    _, plan, _ = imported(cli, job, "gsm8k grpo.yaml", "rollout.max_concurrent_rollouts=32", name="slots")
    assert plan["calls"]["actor_gen"]["micro_batches"] == 8
    _, plan, _ = imported(cli, job, "gsm8k grpo.yaml", "rollout.max_concurrent_rollouts=32",
                          "sglang.max_running_requests=16", name="slots")
    assert plan["calls"]["actor_gen"]["micro_batches"] == 16


def test_the_weights_reach_the_servers_as_areal_sends_them(cli, job):
    """AReaL's xccl update: the FSDP shards gathered, then the whole bf16 model from the trainer's
    first GPU to every server GPU (realbench.cost.realloc.broadcast_times), not realbench's own
    reshard between layouts (which sends each server GPU its tensor-parallel half)."""
    import numpy as np

    from realbench.cost.realloc import Layouts, broadcast_times, realloc_times
    from realbench.plan.scenario import load_scenario

    result, _, _ = imported(cli, job, "gsm8k grpo.yaml", "rollout.backend=sglang:d2t2", name="sync")
    scenario = load_scenario(result["scenario"])
    lay = lambda start, size, tp, zero: Layouts(*(np.array([x]) for x in (start, size, tp, 1, zero)))  # noqa: E731
    args = (scenario.models["actor"], scenario.cluster, lay(0, 4, 1, 3), lay(4, 4, 2, 0))
    sent = result["calls"]["actor_gen"]["realloc_s"]
    assert sent == pytest.approx(broadcast_times(*args)[0], rel=1e-9)
    assert sent != pytest.approx(realloc_times(*args)[0], rel=1e-3)


def test_the_workbench_opens_an_areal_experiment_and_writes_the_plan_shown(job):
    """The Engine tab: the experiment's scenario into the dataflow editor, the plan AReaL runs into
    the viewer; the plan written back as an AReaL experiment passes AReaL's loader (with the data set
    the launch gives); an unknown key is shown inline."""
    from realbench.widgets import Workbench

    os.chdir(job)
    wb = Workbench("ppo-tiny-cpu", budget_s=1)
    e = wb.engine
    e.engine_box.value, e.file_box.value, e.out_box.value = "areal", "gsm8k grpo.yaml", "from the lab"
    assert e.open(), e.status.value
    assert wb.editor.scenario.engine == "areal" and wb.viewer.options["actor_gen"].mesh.label(8) == "n0:4-7"
    assert "areal configuration gsm8k grpo.yaml" in wb.viewer.title.value
    e.export_box.value = "from the lab/grpo areal.yaml"
    assert e.write(), e.status.value
    (checked,) = areal_check("validate", job / "from the lab" / "grpo areal.yaml", "train_dataset.path=openai/gsm8k")
    assert checked["ok"], checked
    e.overrides_box.value, e.overwrite_box.value = "rollout.max_head_offpolicynes=1", True
    assert not e.open() and "did you mean &#x27;rollout.max_head_offpolicyness&#x27;" in e.status.value


def test_areals_packer_as_realbench_prices_it_by_hand_and_against_areals_own():
    """AReaL's first fit decreasing, worked by hand: rows [5, 4, 3, 3, 2, 1] within 8 tokens, at
    least 2 groups. 5 and 4 open the two; 3 joins the smaller-sum of the two single-row groups (4:
    7); 3 joins 5 (8: the only one it fits); 2 fits neither (7 + 2 > 8) and opens a third; 1 joins
    the one holding the fewest rows (2: 3). Three groups, the largest 8. Unbounded the two groups
    take 3 rows each (9 and 9), and within 9 tokens the packer forms exactly those two. Ranks that
    disagree pack again at the largest count. And on random steps the count and the largest group
    are AReaL's own (areal_check.py pack: seqpack.ffd_allocate), a Megatron pipeline's divisor too."""
    import numpy as np

    from realbench.engines.areal import packer as areal_packer

    rows = np.array([[5, 4, 3, 3, 2, 1]])
    assert [x.tolist() for x in areal_packer.pack(rows, 8, 2)] == [[3], [8]]
    assert [x.tolist() for x in areal_packer.pack(rows, math.inf, 2)] == [[2], [9]]
    assert areal_packer.budget_for(rows[None], 2, row=6) == 9 and areal_packer.budget_for(rows[None], 2, row=12) == 12
    assert [x.tolist() for x in areal_packer.pack(rows, 9, 2)] == [[2], [9]]
    # rank 1 forms 3, rank 2 (six rows of 1) 2: both pack again with at least 3
    assert areal_packer.micro_batches(np.array([[[5, 4, 3, 3, 2, 1], [1] * 6]]), 8, 2) == 3
    rng = np.random.default_rng(3)
    for capacity, n_mbs, divisor in ((6000, 1, 1), (9000, 4, 1), (20000, 3, 1), (7000, 4, 2), (12000, 8, 4)):
        steps = (300 + rng.lognormal(6.5, 1.0, size=(20, 32)).clip(1, 3000)).astype(int)
        done = subprocess.run([str(PYTHON), str(CHECK), "pack", str(capacity), str(n_mbs), str(divisor)],
                              input=json.dumps(steps.tolist()), capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stderr[-2000:]
        theirs = json.loads(done.stdout)
        if divisor == 1:
            groups, largest = areal_packer.pack(steps, capacity, n_mbs)
            assert groups.tolist() == [len(t) for t in theirs] and largest.tolist() == [max(t) for t in theirs]
        # (a pipeline of pp = divisor stages asks at least 2 pp groups: each n_mbs here is that already)
        assert [areal_packer.micro_batches(step[None, None], capacity, n_mbs, divisor) for step in steps] == \
            [float(len(t)) for t in theirs]


def test_token_budgets_make_areal_run_the_micro_batches_priced_when_responses_run_long():
    """AReaL packs each step's rows by their real lengths (first fit decreasing within
    max_tokens_per_mb, at least n_mbs). On ppo-8b-16gpu-longtail (responses log-normal, mean 971
    of a 4,096 cap, prompts 512) AReaL's example plan gives each of 8 trainer GPUs 16 rows a step in
    4 micro-batches. The budget written is the largest micro-batch of 4 rows that 64 drawn steps
    reach (areal_packer.budget_for): on 200 fresh steps, AReaL's own packer forms exactly the 4
    priced on all 8 ranks in nearly every step. The budget of one mean micro-batch written before,
    ceil(16 / 4 x 1,483.16) = 5,933 tokens, made it form 4.65 on a GPU on average, and 5.5 once the
    ranks agree on their largest count: micro-batches the plan did not price. Where rows are longer
    than the example's 10,240 tokens, its budget is raised to one row (AReaL's packer refuses a
    longer row), and the micro-batches are what the packer forms within it."""
    import numpy as np

    from realbench.engines import priced_as
    from realbench.engines.areal import packer as areal_packer

    s = areal.job_of(priced_as(load_scenario("ppo-8b-16gpu-longtail"), "areal"))
    gen = s.dataflow.call("actor_gen")
    assert 971 < gen.lengths.expected < 972
    options = areal.default_plan(s)
    train = options["actor_train"].strategy
    assert (train.dp, train.micro_batches, 512 // 4 // train.dp) == (8, 4, 16)
    settings = areal._settings(s, options)
    step = areal_packer.StepRows(512, 4096, gen.lengths)
    budget = settings["actor.mb_spec.max_tokens_per_mb"]
    assert budget == areal_packer.budget_for(step.tokens(16, 8), 4, 512 + 4096) == 8809
    assert settings["actor.mb_spec.n_mbs"] == 4
    # the plan carries that budget, and memory is planned for a micro-batch that full (the 16 rows of a
    # step hold far more at the 0.99 quantile), where rows of the mean response would hold 5,933 and 4
    # fixed rows' heaviest of 4 more than 8,809: AReaL's packer balances them
    assert train.max_tokens == 8809
    call = s.dataflow.call("actor_train")
    assert call.peak_tokens(4, 4, train.max_tokens) == 8809 < call.peak_tokens(4, 4)
    assert 4 * (512 + gen.lengths.expected) < 5933
    from realbench.cost.calls import call_cost
    model = s.models["actor"]
    at = lambda o: call_cost(call, model, s.cluster, o).working_bytes  # noqa: E731
    fixed = options["actor_train"].__class__(options["actor_train"].mesh, dataclasses.replace(train, max_tokens=None))
    assert at(options["actor_train"]) < at(fixed)
    # a budget other than the one realbench writes for the plan's count is refused by name
    other = {**options, "actor_train": options["actor_train"].__class__(options["actor_train"].mesh,
                                                                        dataclasses.replace(train, max_tokens=8000))}
    with pytest.raises(ConfigError) as refused:
        areal._settings(s, other)
    assert refused.value.field == "calls.actor_train.max_tokens" and "8809" in refused.value.message
    rng = np.random.default_rng(1)  # (not the seed the budget was drawn with)
    steps = (512 + np.searchsorted(gen.lengths.cdf(), rng.random((200, 8, 16)), side="left")).reshape(-1, 16)

    def packed(capacity: int, n_mbs: int) -> np.ndarray:
        done = subprocess.run([str(PYTHON), str(CHECK), "pack", str(capacity), str(n_mbs)],
                              input=json.dumps(steps.tolist()), capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stderr[-2000:]
        return np.array([len(g) for g in json.loads(done.stdout)]).reshape(200, 8)

    ours = packed(budget, 4)
    assert ours.min() == 4 and (ours.max(axis=1) == 4).mean() == pytest.approx(0.99)  # the ranks agree on 4
    assert ours.max(axis=1).mean() == pytest.approx(4.01)
    before = packed(5933, 4)
    assert before.mean() == pytest.approx(4.65, abs=0.05) and before.max(axis=1).mean() == pytest.approx(5.5, abs=0.1)
    # rows of 512 + 16,384 tokens: the example's 10,240-token micro-batches raised to one row
    long = areal.job_of(priced_as(load_scenario("grpo-8b-32gpu-longtail"), "areal"))
    plan = areal.default_plan(long)
    t = plan["actor_train"].strategy
    per_gpu = long.dataflow.call("actor_gen").seqs // 4 // t.dp
    rows = areal_packer.StepRows(512, 16384, long.dataflow.call("actor_gen").lengths)
    assert t.micro_batches == areal._micro_batches(rows, per_gpu, t.dp, None, 512 + 16384, 1)
    assert round(rows.micro_batches(per_gpu, t.dp, 1, 512 + 16384)) <= t.micro_batches


# -- a mixture of experts ------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def moe(job):
    """Qwen3-30B-A3B's hub config (the catalogue's copy: 128 experts, 8 a token, 48 layers, 4 KV
    heads) in a checkpoint folder of the job: its config alone, which is what realbench prices."""
    from realbench.models import catalogue

    folder = job / "moe"
    folder.mkdir(exist_ok=True)
    (folder / "config.json").write_text(json.dumps(catalogue.config("qwen3-30b-a3b")))
    return job


@pytest.mark.parametrize("backend, layout, written", [
    # the attention/FFN form: each expert over the attention's tp (etp 2, the plan's tp's: no etp),
    # the experts over 2 of a stage's 4 GPUs; written back in that form
    ("megatron:(attn:d2t2|ffn:d1t2e2)", {"dp": 2, "tp": 2, "ep": 2}, "megatron:(attn:d2t2|ffn:d1t2e2)"),
    # the tau2 example's shape (pp 4 x attention tp 2 of 32 GPUs there) on 4: pp 2, each expert whole
    # (the FFN's t1: etp 1) over 2 GPUs of a stage, its d derived (1); AReaL's flat form of the same
    ("megatron:(attn:d1p2t2|ffn:p2e2)", {"dp": 1, "tp": 2, "pp": 2, "ep": 2, "etp": 1}, "megatron:d1p2t2e2"),
    # the flat form folds e into the world, each expert whole (etp 1)
    ("megatron:d2t2e2", {"dp": 2, "tp": 2, "ep": 2, "etp": 1}, "megatron:d2t2e2"),
    # without e a flat Megatron allocation still holds each expert whole on every GPU of a tp group
    # (AReaL's expert_tensor_parallel_size defaults to 1): etp 1, not tp's
    ("megatron:d2t2", {"dp": 2, "tp": 2, "etp": 1}, "megatron:d2t2"),
    ("megatron:(attn:d4|ffn:e4)", {"dp": 4, "ep": 4}, "megatron:d4e4"),
])
def test_an_allocation_of_experts_reads_as_areal_parses_it_and_round_trips(cli, moe, backend, layout, written):
    """The actor's allocation of a mixture of experts (AReaL's flat form with e, or its attention/FFN
    form: api/alloc_mode.py:594-637, 943-1040) reads into the plan's ep and etp (tp's left out) as
    worked out by hand above; written back (the attention/FFN form where an expert is split, the
    flat form where each is whole), AReaL's own parser reads the same layout (its dp, tp, pp, ep and
    expert_tensor_parallel_size), and imported again it is the same plan with the same estimate."""
    first, plan, _ = imported(cli, moe, "gsm8k grpo.yaml", "actor.path=moe", f"actor.backend={backend}", out="first",
                              name="moe")
    actor = plan["calls"]["actor_train"]
    assert {k: actor[k] for k in ("dp", "tp", "pp", "ep", "etp") if k in actor} == {"tp": 1, "pp": 1, **layout}
    assert actor.get("zero") == (1 if actor["dp"] > 1 else None)  # (Megatron's distributed optimizer, where sharded)
    out = moe / "exported" / "moe areal.yaml"
    out.parent.mkdir(exist_ok=True)
    code, _, err = cli("export", "--plan", first["plan"], "--format", "areal", "--out", out, "--model-path",
                       "actor=moe", "--force")
    assert code == 0, err
    assert yaml.safe_load(out.read_text())["actor"]["backend"] == written
    (checked,) = areal_check("validate", out, "train_dataset.path=openai/gsm8k")
    assert checked["ok"], checked
    parsed = checked["allocations"]["actor"]
    assert (parsed["dp"], parsed["tp"], parsed["pp"], parsed["ep"], parsed["etp"]) == \
        (actor["dp"], actor["tp"], actor.get("pp", 1), actor.get("ep", 1), actor.get("etp", actor["tp"]))
    again, plan_again, _ = imported(cli, moe, out, out="again", name="moe")
    assert plan_again["calls"] == plan["calls"]
    assert again["time_per_iter_s"] == pytest.approx(first["time_per_iter_s"], rel=1e-12)


@pytest.mark.parametrize("backend, says, areal_refuses", [
    # AReaL's parser refuses these too (api/alloc_mode.py)
    ("megatron:(attn:d2p2|ffn:d1p1e4)", "the FFN's pipeline must be the attention's (p2", True),
    ("megatron:(attn:d2t2|ffn:d3e2)", "the FFN's world (d x p x t x e) must be the attention's (4", True),
    ("megatron:d4e3", "expert model parallel size p x e = 3 does not divide the world 4", True),
    ("fsdp:(attn:d4|ffn:e4)", "attention/FFN (MoE) form for Megatron", True),
    ("fsdp:d2e2", "FSDP has no pipeline or expert parallelism", True),
    # AReaL runs these, not as realbench prices them: its FSDP splits only the attention by tp (each
    # expert whole on every tp rank), or the experts do not split as asked
    ("fsdp:d2t2", "FSDP splits only the attention of a mixture of experts", False),
    ("megatron:(attn:d4|ffn:e4t1)", None, False),  # (ep 4 of a stage's 4 GPUs: realbench reads it)
])
def test_an_expert_layout_areal_or_realbench_refuses_is_refused_by_name(cli, moe, backend, says, areal_refuses):
    os.chdir(moe)
    code, _, err = cli("import", "areal", "gsm8k grpo.yaml", "actor.path=moe", f"actor.backend={backend}", "--out",
                       "refused", "--force")
    if says is None:
        assert code == 0, err
    else:
        assert code == 2 and err.count("\n") == 1 and "actor.backend" in err and says in err, err
        assert not (moe / "refused").exists()
    # AReaL's own loader and allocation parser on a written experiment with that allocation (quoted, as
    # Hydra takes parentheses)
    first, _, _ = imported(cli, moe, "gsm8k grpo.yaml", "actor.path=moe", out="first", name="moe-base")
    base = moe / "exported" / "moe base.yaml"
    base.parent.mkdir(exist_ok=True)
    code, _, err = cli("export", "--plan", first["plan"], "--format", "areal", "--out", base, "--model-path",
                       "actor=moe", "--force")
    assert code == 0, err
    (checked,) = areal_check("validate", base, f"actor.backend='{backend}'", "train_dataset.path=openai/gsm8k")
    assert checked["ok"] is not areal_refuses and "OverrideParseException" not in checked.get("error", ""), checked


def test_the_tau2_moe_example_is_the_benchs_layout_and_the_search_offers_expert_layouts():
    """AReaL's MoE example (examples/tau2/config_30b_moe_airline.yaml: (attn:d4p4t2|ffn:d2p4e4) on 32
    GPUs) on the 16-GPU Qwen3-30B-A3B job: half the GPUs SGLang servers of 4 GPUs (sglang:d2t4), the
    other 8 the actor's pp 4 x tp 2 with the experts over 8 / 4 = 2 GPUs of a stage, each whole
    (megatron:d1p4t2e2). The search lists Megatron with experts over 1, 2, ... GPUs of a stage, each
    whole (etp 1) or split as tp (etp tp's), FSDP only without tensor parallelism, and every listed
    plan is one AReaL's writer writes."""
    import random

    from realbench.engines import priced_as
    from realbench.plan import get_builtin

    assert areal.tau2_backend(32) == "megatron:d4p4t2e4" and areal.tau2_backend(8) == "megatron:d1p4t2e2"
    scenario = areal.job_of(get_builtin("grpo-qwen3-30b-a3b-16gpu"))
    example = areal.default_plan(scenario, areal.example_of(scenario)["settings"])
    _, settings = areal.to_config(scenario, example, {"actor": "ckpt", "ref": "ckpt"})
    assert (settings["actor"]["backend"], settings["ref"]["backend"], settings["rollout"]["backend"]) == \
        ("megatron:d1p4t2e2", "megatron:d1p4t2e2", "sglang:d2t4")
    assert settings["actor"]["mb_spec"]["n_mbs"] == example["actor_train"].strategy.micro_batches
    job = priced_as(scenario, "areal")
    table, rows = areal.plan_table(job)
    trained = [o.strategy for o in table["actor_train"]]
    assert trained and all(s.ep == 1 and not s.etp and s.tp == 1 for s in trained if s.zero == 3)
    megatron = {(s.dp, s.sp, s.tp, s.pp, s.ep, s.etp) for s in trained if s.zero < 3}
    # tp 2 x dp 4 (8 GPUs, no pipeline): the experts over ep x etp dividing the stage's 8 GPUs
    assert {(ep, etp) for dp, sp, tp, pp, ep, etp in megatron if (dp, sp, tp, pp) == (4, 1, 2, 1)} == \
        {(1, 0), (2, 0), (4, 0), (1, 1), (2, 1), (4, 1), (8, 1)}
    assert all(o.strategy.ep == 1 for o in table["actor_gen"])  # (the servers split the experts as tp)
    for k in random.Random(0).sample(range(len(rows)), 20):
        options = {name: table[name][i] for name, i in zip(table, rows[k])}
        assert areal.space_problem(job, options) is None, options
