"""OpenRLHF 0.11.2's command lines read into plans, plans written as its command lines, and what
realbench writes checked by OpenRLHF's own argument parser, post-parse checks and train()
assertions in its own environment (`make engines`: .venv-openrlhf)."""

import json
import os
import random
import subprocess
from pathlib import Path

import numpy as np
import pytest
import yaml

from realbench.engines import openrlhf

ROOT = Path(__file__).resolve().parent.parent
PYTHON = Path(os.environ.get("REALBENCH_OPENRLHF_PYTHON", ROOT / ".venv-openrlhf" / "bin" / "python"))
CHECK = ROOT / "realbench" / "engines" / "openrlhf" / "check.py"

# the README's quick-start (examples/scripts/train_ppo_ray_hybrid_engine.sh) on a small job
HYBRID = """\
#!/bin/bash
set -x
ray job submit --address="http://127.0.0.1:8265" \\
   --runtime-env-json='{"working_dir": "/openrlhf"}' \\
   -- python3 -m openrlhf.cli.train_ppo_ray \\
   --ref.num_nodes 1 --ref.num_gpus_per_node 8 \\
   --reward.num_nodes 1 --reward.num_gpus_per_node 8 \\
   --critic.num_nodes 1 --critic.num_gpus_per_node 8 \\
   --actor.num_nodes 1 --actor.num_gpus_per_node 8 \\
   --vllm.num_engines 4 --vllm.tensor_parallel_size 2 \\
   --train.colocate_all --vllm.gpu_memory_utilization 0.5 --vllm.enable_sleep \\
   --actor.model_name_or_path ckpt --reward.model_name_or_path ckpt \\
   --ds.zero_stage 3 --ds.param_dtype bf16 --actor.gradient_checkpointing_enable \\
   --train.micro_batch_size 1 --train.batch_size 16 \\
   --rollout.micro_batch_size 4 --rollout.batch_size 64 \\
   --data.max_len 192 --rollout.max_new_tokens 128 \\
   --algo.advantage.estimator gae  # PPO
"""

# the separate groups of the old 70B script (examples/scripts/train_ppo_llama_ray_70b.sh), GRPO with a
# reward function, as a file of flags
SPLIT_GRPO = """\
--ref.num_gpus_per_node 4 --actor.num_gpus_per_node 8
--vllm.num_engines 2 --vllm.tensor_parallel_size 2
--train.micro_batch_size 2 --train.batch_size 64 --rollout.micro_batch_size 8 --rollout.batch_size 32
--rollout.n_samples_per_prompt 4 --data.max_len 192 --rollout.max_new_tokens 128
--ds.zero_stage 2 --algo.advantage.estimator group_norm
--actor.model_name_or_path ckpt --reward.remote_url scoring/reward.py
"""


@pytest.fixture(scope="module")
def job(tmp_path_factory):
    """A user's OpenRLHF job folder: a checkpoint, a reward function, two launch files."""
    from realbench.examples import save_model

    folder = tmp_path_factory.mktemp("my openrlhf job")
    save_model(folder / "ckpt", max_position_embeddings=32_768)  # (Qwen2.5's positions)
    (folder / "scoring").mkdir()
    (folder / "scoring" / "reward.py").write_text("def reward_func(queries, prompts, labels):\n    return {}\n")
    (folder / "train ppo hybrid.sh").write_text(HYBRID)
    (folder / "grpo.args").write_text(SPLIT_GRPO)
    return folder


@pytest.fixture(autouse=True)
def _keep_cwd():
    here = os.getcwd()
    yield
    os.chdir(here)


def openrlhf_check(*args) -> dict:
    assert PYTHON.is_file(), f"OpenRLHF's environment is missing: run `make engines` ({PYTHON})"
    done = subprocess.run([str(PYTHON), str(CHECK), *map(str, args)], capture_output=True, text=True, timeout=120)
    return json.loads(done.stdout.strip().splitlines()[-1])


def imported(cli, job, config, *overrides, out="plans", name=None):
    os.chdir(job)
    code, stdout, err = cli("import", "openrlhf", config, *overrides, "--out", out, "--json",
                            *(("--name", name) if name else ()), "--force")
    assert code == 0, err
    result = json.loads(stdout)
    return result, yaml.safe_load(Path(result["plan"]).read_text()), yaml.safe_load(Path(result["scenario"]).read_text())


def test_the_flag_table_is_openrlhfs_own_parser():
    """realbench parses OpenRLHF's command lines with the flags of openrlhf-0.11.2.json; the
    installed OpenRLHF's argument parser declares exactly those (names, types, defaults)."""
    assert openrlhf_check("defaults") == json.loads(openrlhf.TABLE.read_text())


def test_the_hybrid_engine_reads_into_every_call_on_the_actors_gpus(cli, job):
    result, plan, scenario = imported(cli, job, "train ppo hybrid.sh", name="hybrid")
    calls = plan["calls"]
    assert {c["mesh"] for c in calls.values()} == {"n0"}
    # 4 engines of tp 2; 64 samples, 16 an engine: one vLLM batch (max_num_seqs 128)
    assert calls["actor_gen"] == {"mesh": "n0", "dp": 4, "tp": 2, "pp": 1, "micro_batches": 1, "memory_fraction": 0.5}
    # 16 samples an optimizer step over 8 GPUs, micro-batches of 1: 2 a GPU; ZeRO-3, checkpointed
    assert calls["actor_train"] == {"mesh": "n0", "dp": 8, "tp": 1, "pp": 1, "micro_batches": 2,
                                    "activation_checkpointing": True, "zero": 3}
    assert calls["critic_train"] == calls["actor_train"]
    # 64 samples over 8 GPUs in chunks of 4: 2 forwards a GPU, the forward-only models sharded under stage 3
    for name in ("ref_inf", "reward_inf", "critic_inf"):
        assert calls[name] == {"mesh": "n0", "dp": 8, "tp": 1, "pp": 1, "micro_batches": 2, "zero": 3}, name
    assert scenario["engine"] == "openrlhf" and scenario["cluster"]["nodes"] == 1
    # (vLLM taking the half of each GPU the script gives it, --vllm.gpu_memory_utilization)
    assert scenario["dataflow"] == {"algorithm": "ppo", "prompts": 64, "prompt_len": 64, "gen_len": 128,
                                    "minibatches": 4, "memory_fraction": 0.5}
    # the actor's old log-probabilities: a forward over the whole batch (experience_maker.py:153-158)
    assert scenario["training"]["old_logprobs"] == "whole_batch"
    assert result["time_per_iter_s"] > 0 and result["not_priced"] == list(openrlhf.PRICING_GAPS)


def test_dynamic_batching_counts_micro_batches_by_first_fit_as_openrlhf_does(cli, job):
    """--train.dynamic_batch_enable: OpenRLHF counts micro-batches by first fit in arrival order
    (get_minimum_num_micro_batch_size), rows of 64 + 128 = 192 tokens here. Training: a GPU's 2 rows
    of an optimizer step within 300 tokens hold one each: 2 micro-batches. The experience maker's
    forwards: the step's 64 rows within 700 tokens hold 3 each, 22 micro-batches, counted down to a
    multiple of the actor's 8 ranks, 16, dispatched over each role's 8 GPUs: 2 a GPU, where the
    tokens' mean (8 x 192 / 700 = 2.2) would have priced 3, split evenly 4. OpenRLHF's own function
    gives the same first-fit counts. Dynamic batching packs the rows without padding, as OpenRLHF
    turns --ds.packing_samples on for it."""
    _, plan, scenario = imported(cli, job, "train ppo hybrid.sh", "train.dynamic_batch_enable=true",
                                 "train.max_tokens_per_gpu=300", "rollout.max_tokens_per_gpu=700", name="dynamic")
    assert scenario["training"]["padding_free"] is True
    calls = plan["calls"]
    assert calls["actor_train"]["micro_batches"] == calls["critic_train"]["micro_batches"] == 2
    for name in ("ref_inf", "reward_inf", "critic_inf"):
        assert calls[name]["micro_batches"] == 2, name
    done = subprocess.run([str(PYTHON), str(CHECK), "pack", "300"], input=json.dumps([[192, 192]]),
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and json.loads(done.stdout) == [2], done.stderr[-2000:]
    done = subprocess.run([str(PYTHON), str(CHECK), "pack", "700"], input=json.dumps([[192] * 64, [192] * 8]),
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and json.loads(done.stdout) == [22, 3], done.stderr[-2000:]


# the quick-start's job as OpenRLHF's newer examples write it: the flags gathered in bash arrays,
# sizes in variables, comments inside, a value bash computes, run by srun through bash -c
ARRAYS = """\
#!/bin/bash
MODEL=ckpt  # the checkpoint
GPUS=8
WORK_DIR=$(cd "$(dirname "$0")" && pwd)
ENGINE_ARGS=(
   --ref.num_nodes 1 --ref.num_gpus_per_node ${GPUS}
   --reward.num_nodes 1 --reward.num_gpus_per_node $GPUS
   --critic.num_nodes 1 --critic.num_gpus_per_node "${GPUS}"
   --actor.num_nodes 1 --actor.num_gpus_per_node ${GPUS}   # the actor's
   # --ds.adam_offload
   --vllm.num_engines 4 --vllm.tensor_parallel_size 2
   --train.colocate_all --vllm.gpu_memory_utilization 0.5 --vllm.enable_sleep
   --ds.zero_stage 3 --ds.param_dtype bf16 --actor.gradient_checkpointing_enable
)
MODEL_ARGS=( --actor.model_name_or_path ${MODEL} --reward.model_name_or_path "$MODEL" )
BATCH_ARGS=(
   --train.micro_batch_size 1 --train.batch_size 16
   --rollout.micro_batch_size 4 --rollout.batch_size 64
   --data.max_len 192 --rollout.max_new_tokens 128
   --algo.advantage.estimator gae
)
srun --overlap -w "$node" bash -c "pip install ray && ray job submit -- python3 -m openrlhf.cli.train_ppo_ray \
   ${ENGINE_ARGS[@]} ${MODEL_ARGS[@]} \
   ${BATCH_ARGS[@]} --ckpt.output_dir ${WORK_DIR}/ckpt" &>> log
echo done
"""


def test_a_launch_script_of_bash_arrays_reads_as_bash_expands_it(cli, job):
    """The flags a script gathers in bash arrays and variables read as bash expands them (a value
    bash would compute stays as written), inside srun's bash -c too: the same plan as the
    quick-start's flat command line."""
    words = openrlhf.flags_of(ARRAYS)
    assert words[:4] == ["--ref.num_nodes", "1", "--ref.num_gpus_per_node", "8"]
    assert "--ds.adam_offload" not in words and words[-2:] == ["--ckpt.output_dir", "${WORK_DIR}/ckpt"]
    assert words[words.index("--reward.model_name_or_path") + 1] == "ckpt"
    assert openrlhf.flags_of("A=(--x 1 '--y' \"two words\")\npython -m openrlhf.cli.train_ppo_ray \"${A[@]}\" \"$@\"") == \
        ["--x", "1", "--y", "two words"]
    (job / "train with arrays.sh").write_text(ARRAYS)
    _, flat, _ = imported(cli, job, "train ppo hybrid.sh", name="flat")
    _, arrays, _ = imported(cli, job, "train with arrays.sh", name="arrays")
    assert arrays["calls"] == flat["calls"]


def test_separate_groups_are_placed_largest_first(cli, job):
    """The actor's 8 GPUs, the reference's 4, vLLM's 4: a whole node, then blocks of the next one
    (largest first, in OpenRLHF's order of creation)."""
    _, plan, scenario = imported(cli, job, "grpo.args", name="grpo")
    calls = plan["calls"]
    assert calls["actor_train"]["mesh"] == "n0" and calls["actor_train"]["zero"] == 2
    assert calls["ref_inf"]["mesh"] == "n1:0-3" and calls["actor_gen"]["mesh"] == "n1:4-7"
    assert calls["ref_inf"]["dp"] == 4 and "zero" not in calls["ref_inf"]  # replicated under stage 2
    # the reward function runs in the vLLM engines' actors
    assert calls["reward_inf"]["mesh"] == "n1:4-7"
    assert scenario["models"]["reward"]["function"].endswith("reward.py:reward_func")
    assert scenario["cluster"] == {"nodes": 2, "gpus_per_node": 8, "device": "h100"}
    assert scenario["dataflow"]["group_size"] == 4 and scenario["dataflow"]["minibatches"] == 2


LORA = ("ds.lora.rank=8", "ds.lora.alpha=16", "ds.lora.target_modules=q_proj v_proj")
SLEEP = ("ds.enable_sleep=true",)
ADAM = ("ds.adam_offload=true",)
AWAKE = ("vllm.enable_sleep=false",)
RING = ("ds.ring_attn_size=2",)
# ring attention beside DeepSpeed's AutoTP (its (dp, sp, tp) mesh; AutoTP trains under ZeRO 0 to 2)
RING_TP = RING + ("ds.tensor_parallel_size=2", "ds.zero_stage=2")


@pytest.mark.parametrize("config, overrides", [("train ppo hybrid.sh", ()), ("grpo.args", ()), ("grpo.args", LORA),
                                               ("grpo.args", ("ds.packing_samples=true",)),
                                               # the README's quick-start as written: DeepSpeed's states asleep too
                                               ("train ppo hybrid.sh", SLEEP),
                                               # CPU Adam (ZeRO-Offload) for actor and critic
                                               ("train ppo hybrid.sh", ADAM),
                                               # ring attention groups of 2 GPUs for every DeepSpeed model
                                               ("train ppo hybrid.sh", RING),
                                               ("train ppo hybrid.sh", RING_TP),
                                               # the hybrid engine's vLLM awake while DeepSpeed trains
                                               ("train ppo hybrid.sh", AWAKE)])
def test_an_exported_plan_passes_openrlhfs_own_checks_and_reads_back_the_same(cli, job, config, overrides):
    """(With LoRA, its settings go out under OpenRLHF's flags and come back; OpenRLHF loads its
    reference as a model of its own.)"""
    first, plan, scenario = imported(cli, job, config, *overrides, out="first", name="job")
    out = job / "exported" / f"{Path(config).stem} run.sh"
    out.parent.mkdir(exist_ok=True)
    code, _, err = cli("export", "--plan", first["plan"], "--format", "openrlhf", "--out", out, "--force")
    assert code == 0, err
    assert os.access(out, os.X_OK) and "openrlhf.cli.train_ppo_ray" in out.read_text()
    checked = openrlhf_check("validate", out)
    assert checked["ok"], checked
    lora = {"rank": 8, "alpha": 16, "target_modules": ["q_proj", "v_proj"]} if overrides == LORA else \
        {"rank": 0, "alpha": 16, "target_modules": "all-linear"}
    assert checked["lora"] == lora
    again, plan_again, scenario_again = imported(cli, job, out, out="again", name="job")
    # rows packed without padding, as OpenRLHF parsed it (ring attention turns packing on)
    packed = overrides in (("ds.packing_samples=true",), RING, RING_TP)
    assert checked["packing_samples"] is packed and scenario_again["training"]["padding_free"] is packed
    # ring attention's groups: every DeepSpeed call's sp, the one size OpenRLHF parsed
    ring, tp = (2 if RING[0] in overrides else 1), (2 if overrides == RING_TP else 1)
    assert checked["ring_attn_size"] == ring and checked["ring_attn_head_stride"] == 1
    for name in ("actor_train", "ref_inf", "critic_train", "critic_inf", "reward_inf"):
        if name in plan["calls"]:
            assert (plan["calls"][name].get("sp", 1), plan["calls"][name].get("ring"), plan["calls"][name]["tp"]) == \
                (ring, "allgather" if ring > 1 else None, tp)
    # --ds.enable_sleep: the trained models' optimizers offloaded, as OpenRLHF parsed it
    asleep = overrides == SLEEP
    assert checked["ds_enable_sleep"] is asleep and checked["vllm_enable_sleep"] is ("hybrid" in config
                                                                                    and overrides != AWAKE)
    assert plan["calls"]["actor_gen"].get("keeps_memory", False) is (overrides == AWAKE)
    # --ds.adam_offload: Adam on the host, where OpenRLHF's own DeepSpeed config puts the optimizer
    host = overrides == ADAM
    assert checked["ds_adam_offload"] is host and checked["offload_optimizer_device"] == ("cpu" if host else "none")
    for name in ("actor_train", "critic_train"):
        if name in plan["calls"]:
            assert plan["calls"][name].get("offload_optimizer", False) is asleep
            assert plan["calls"][name].get("host_adam", False) is host
    # vLLM's share of each GPU's memory: the script's (0.5), or the flag's default (0.95), read and written back
    fraction = 0.5 if "hybrid" in config else 0.95
    assert checked["gpu_memory_utilization"] == scenario["dataflow"]["memory_fraction"] == \
        scenario_again["dataflow"]["memory_fraction"] == fraction
    assert plan_again["calls"] == plan["calls"]
    assert scenario_again["models"] == scenario["models"]
    if overrides == LORA:
        assert scenario["models"]["actor"]["lora"] == {"r": 8, "lora_alpha": 16, "target_modules": ["q_proj", "v_proj"]}
        assert "ref" in scenario["models"]
    assert again["time_per_iter_s"] == pytest.approx(first["time_per_iter_s"], rel=1e-12)


def test_the_users_own_flags_go_from_their_script_to_the_exported_one(cli, job):
    """The learning rate and the prompt data set the user gave (flags that change neither time nor
    memory) come back in the exported command line, as OpenRLHF's parser reads it."""
    first, _, scenario = imported(cli, job, "train ppo hybrid.sh", "actor.adam.lr=5e-7",
                                  "data.prompt_dataset=my data/prompts.jsonl", name="mine")
    assert scenario["engine_settings"]["actor.adam.lr"] == 5e-7
    assert scenario["engine_settings"]["data.prompt_dataset"] == "my data/prompts.jsonl"
    assert "actor.model_name_or_path" not in scenario["engine_settings"]
    out = job / "exported" / "mine run.sh"
    out.parent.mkdir(exist_ok=True)
    code, _, err = cli("export", "--plan", first["plan"], "--format", "openrlhf", "--out", out, "--force")
    assert code == 0, err
    checked = openrlhf_check("validate", out)
    assert checked["ok"] and (checked["actor_lr"], checked["prompt_dataset"]) == (5e-7, "my data/prompts.jsonl")


@pytest.mark.parametrize("overrides, flag, says", [
    (("vllm.num_engine_s=2",), "--vllm.num_engine_s", "did you mean '--vllm.num_engines'"),
    # a group of one: OpenRLHF's group_norm divides by its spread (NaN), realbench takes its reward
    (("algo.advantage.estimator=group_norm", "rollout.n_samples_per_prompt=1"), "--rollout.n_samples_per_prompt",
     "divides by its std, or by n - 1"),
    (("vllm.gpu_memory_utilization=0.000001",), "--vllm.gpu_memory_utilization", "the engine does not start"),
    # vLLM's context (a prompt and its response) beyond the checkpoint's positions: vLLM refuses it
    (("data.max_len=32769",), "--data.max_len", "32769: beyond the checkpoint's max_position_embeddings 32768"),
    # ring attention: with another head stride (the kernels' buffers priced for 1), a group that
    # does not divide a role's GPUs, or beside tp
    (("ds.ring_attn_size=2", "ds.ring_attn_head_stride=2"), "--ds.ring_attn_head_stride", "does not price it"),
    (("ds.ring_attn_size=3",), "--ds.ring_attn_size", "3 does not divide the actor's 8 GPUs"),
    (("ds.ring_attn_size=8", "ds.tensor_parallel_size=2", "ds.zero_stage=2"),
     "--ds.ring_attn_size", "8 x --ds.tensor_parallel_size 2 = 16 does not divide the actor's 8 GPUs"),
    (("vllm.num_engines=2",), "--vllm.num_engines", "the hybrid engine puts a vLLM worker on every actor GPU"),
    (("ds.tensor_parallel_size=2",), "--ds.zero_stage", "AutoTP trains under ZeRO 0 to 2"),
    (("train.async_enable=true",), "--vllm.enable_sleep", "asynchronous trainer keeps vLLM awake"),
    (("train.partial_rollout_enable=true",), "--train.partial_rollout_enable", "does not price it"),
    (("reward.remote_url=http://rm:5000/get_reward",), "--reward.remote_url", "remote reward server"),
    (("algo.advantage.estimator=reinforce",), "--algo.advantage.estimator", "realbench plans gae, group_norm, rloo"),
    # the PPO script: OpenRLHF's critic would take the same adapters
    (("ds.lora.rank=8",), "--ds.lora.rank", "wraps the critic in the same adapters"),
    # DeepSpeed's offload_states belongs to its ZeRO optimizers
    (("ds.enable_sleep=true", "ds.zero_stage=0"), "--ds.enable_sleep", "ZeRO optimizers only"),
    # CPU Adam runs under DeepSpeed's ZeRO optimizers (stage 0 keeps fp32 copies on the GPU)
    (("ds.adam_offload=true", "ds.zero_stage=0"), "--ds.adam_offload", "runs under its ZeRO optimizers"),
    # ZeRO++'s hierarchical partition (read under stage 3, the script's)
    (("ds.zpg=8",), "--ds.zpg", "hierarchical partitioning"),
])
def test_what_realbench_cannot_read_or_price_is_refused_by_name(cli, job, overrides, flag, says):
    os.chdir(job)
    code, _, err = cli("import", "openrlhf", "train ppo hybrid.sh", *overrides, "--out", "refused")
    assert code == 2 and err.count("\n") == 1, err
    assert flag in err and says in err, err
    assert not (job / "refused").exists()


def test_zeropp_hierarchical_partitioning_is_carried_where_deepspeed_does_not_read_it(cli, job):
    """--ds.zpg (ZeRO++'s zero_hpz_partition_size) is read by DeepSpeed under stage 3 only: beside
    stage 2 it is carried to the exported command line as given, and the search inside OpenRLHF
    then offers no stage 3, which would turn it on; a stage-3 plan with it is refused by name."""
    from dataclasses import replace

    from realbench.engines import import_config
    from realbench.plan import load_scenario

    os.chdir(job)
    result, _, scenario = imported(cli, job, "grpo.args", "ds.zpg=8", name="zpg")
    assert scenario["engine_settings"]["ds.zpg"] == 8
    loaded = load_scenario(result["scenario"])
    plans = list(openrlhf.configurations(loaded))
    assert plans and {o.strategy.zero for p in plans for o in p.values()} == {0, 1, 2}
    stage3 = {n: replace(o, strategy=replace(o.strategy, zero=3)) if n == "actor_train" else o
              for n, o in plans[0].items()}
    stage3 = {n: replace(o, strategy=replace(o.strategy, zero=3)) if n == "ref_inf" and o.strategy.shards > 1 else o
              for n, o in stage3.items()}
    problem = openrlhf.space_problem(loaded, stage3)
    assert problem and problem[0] == "engine_settings.ds.zpg" and "hierarchical copy" in problem[1], problem
    scenario_path, _ = import_config("openrlhf", "grpo.args", [], "no-zpg", overwrite=True)
    assert 3 in {o.strategy.zero for p in openrlhf.configurations(load_scenario(str(scenario_path))) for o in p.values()}


def test_a_hub_name_for_a_checkpoint_is_planned_from_the_catalogue_or_refused_naming_the_flag(cli, job):
    """OpenRLHF's scripts name hub models; realbench downloads nothing: a hub id it has a config for
    (the local cache, the catalogue) is planned from that config; any other is refused naming the flag."""
    os.chdir(job)
    code, _, err = cli("import", "openrlhf", "train ppo hybrid.sh", "reward.model_name_or_path=OpenRLHF/Llama-3-8b-rm",
                       "--out", "hub")
    assert code == 2 and err.count("\n") == 1, err
    assert "--reward.model_name_or_path" in err and "'OpenRLHF/Llama-3-8b-rm'" in err and "catalogue" in err
    assert not (job / "hub").exists()
    _, _, scenario = imported(cli, job, "train ppo hybrid.sh", "actor.model_name_or_path=Qwen/Qwen3-8B",
                              "reward.model_name_or_path=Qwen/Qwen3-8B", "critic.model_name_or_path=Qwen/Qwen3-8B",
                              out="hub", name="hub")
    assert scenario["models"]["actor"]["path"] == "Qwen/Qwen3-8B"
    from realbench.plan import load_scenario

    loaded = load_scenario(str(job / "hub" / "hub.yaml"))
    assert loaded.models["actor"].family == "qwen3" and loaded.models["actor"].n_layers == 36


def test_an_override_keeps_a_path_with_spaces_whole(cli, job):
    """A checkpoint folder named as a user names it, given as an override."""
    from realbench.examples import save_model

    save_model(job / "my actor", max_position_embeddings=32_768)
    _, _, scenario = imported(cli, job, "grpo.args", "actor.model_name_or_path=my actor", out="spaces", name="spaces")
    assert scenario["models"]["actor"]["path"] == str(job / "my actor")


def test_an_old_flat_flag_in_a_script_is_refused_with_the_new_name(cli, job):
    (job / "old.sh").write_text(HYBRID.replace("--actor.num_gpus_per_node 8", "--actor_num_gpus_per_node 8"))
    os.chdir(job)
    code, _, err = cli("import", "openrlhf", "old.sh", "--out", "old")
    assert code == 2 and "--actor_num_gpus_per_node" in err and "did you mean '--actor.num_gpus_per_node'" in err


@pytest.mark.parametrize("content, says", [("--actor.num_gpus_per_node 8 --vllm.num_engines '4\n", "No closing quotation"),
                                           (b"\xff\xfe--actor.num_gpus_per_node", "unreadable")])
def test_a_file_that_is_not_a_command_line_is_refused_naming_it(cli, job, content, says):
    bad = job / "not a script.sh"
    bad.write_bytes(content if isinstance(content, bytes) else content.encode())
    os.chdir(job)
    code, _, err = cli("import", "openrlhf", bad.name, "--out", "bad")
    assert code == 2 and err.count("\n") == 1 and "not a script.sh" in err and says in err, err


def test_openrlhf_refuses_the_hybrid_engine_realbench_refuses(job):
    """The rule realbench states is OpenRLHF's own: its train() asserts it too."""
    bad = job / "bad.sh"
    bad.write_text(HYBRID.replace("--vllm.num_engines 4", "--vllm.num_engines 2"))
    checked = openrlhf_check("validate", bad)
    assert not checked["ok"] and "must be equal to vllm_num_engines * vllm_tensor_parallel_size" in checked["error"]


def test_ring_attention_groups_are_read_as_openrlhf_forms_them_by_hand(cli, job):
    """--ds.ring_attn_size 2 on the quick-start: 8 GPUs a model, 4 data-parallel groups of 2. A
    group's 4 rows of an optimizer step (batch 16) in micro-batches of --train.micro_batch_size 1:
    4; the forwards' 64 rows, 16 a group, in chunks of 4: 4. Dynamic batching packs a group's rows
    to --train.max_tokens_per_gpu times the group (seqlen_balancing.py:237): 192 tokens x 2 holds 2
    rows of 192, so 2 micro-batches (without the factor 4)."""
    _, plan, scenario = imported(cli, job, "train ppo hybrid.sh", *RING, name="ring")
    assert scenario["training"]["padding_free"] is True
    assert plan["calls"]["actor_train"] == {"mesh": "n0", "dp": 4, "tp": 1, "pp": 1, "micro_batches": 4,
                                            "activation_checkpointing": True, "zero": 3, "sp": 2, "ring": "allgather"}
    assert plan["calls"]["ref_inf"] == {"mesh": "n0", "dp": 4, "tp": 1, "pp": 1, "micro_batches": 4, "zero": 3,
                                        "sp": 2, "ring": "allgather"}
    _, packed, _ = imported(cli, job, "train ppo hybrid.sh", *RING, "train.dynamic_batch_enable=true",
                            "train.max_tokens_per_gpu=192", name="ring-dynamic")
    assert packed["calls"]["actor_train"]["micro_batches"] == 2 and packed["calls"]["actor_train"]["dp"] == 4
    # beside DeepSpeed's tp 2: 2 data-parallel ranks of 2 x 2 GPUs, each a rank's 8 rows of a step in
    # micro-batches of 1 (8), the forwards' 32 rows in chunks of 4 (8)
    _, both, _ = imported(cli, job, "train ppo hybrid.sh", *RING_TP, name="ring-tp")
    assert both["calls"]["actor_train"] == {"mesh": "n0", "dp": 2, "tp": 2, "pp": 1, "micro_batches": 8,
                                            "activation_checkpointing": True, "zero": 2, "sp": 2, "ring": "allgather"}
    assert both["calls"]["ref_inf"] == {"mesh": "n0", "dp": 2, "tp": 2, "pp": 1, "micro_batches": 8,
                                        "sp": 2, "ring": "allgather"}


def test_ring_attention_lets_openrlhf_train_the_long_tailed_grpo_job_without_recomputation():
    """The README's reading: grpo-8b-32gpu-longtail (responses up to 16k tokens) with OpenRLHF's rows
    packed, on its hybrid engine (vLLM tp 4 on all 32 GPUs): no plan of 32 data-parallel GPUs trains
    the actor without recomputation (a GPU's micro-batch of a long row does not fit), while ring
    groups of 2 GPUs with 2 micro-batches do, faster than every recomputing plan of either layout."""
    from realbench.cost import Estimator
    from realbench.engines import priced_as
    from realbench.plan import Mesh, Option, Strategy, get_builtin

    scenario = priced_as(get_builtin("grpo-8b-32gpu-longtail").model_copy(update={"engine": "openrlhf"})
                         .with_padding_free(True), "openrlhf")
    est, mesh = Estimator(scenario), Mesh(0, 4, 0, 8)

    def estimate(dp: int, sp: int, m: int, recompute: bool):
        ring = "allgather" if sp > 1 else ""
        forward = Option(mesh, Strategy(dp, 1, 1, 1, zero=3, sp=sp, ring=ring))
        options = {"actor_gen": Option(mesh, Strategy(8, 4, 1, 1)), "reward_inf": forward, "ref_inf": forward,
                   "actor_train": Option(mesh, Strategy(dp, 1, 1, m, recompute, zero=3, sp=sp, ring=ring))}
        assert openrlhf.space_problem(scenario, options) is None
        return est.estimate(est.choice_of(options))

    assert all(estimate(32, 1, m, False).oom for m in (1, 2, 4))
    groups = estimate(16, 2, 2, False)
    recomputing = min(estimate(dp, sp, m, True).time_per_iter_s for dp, sp in ((32, 1), (16, 2)) for m in (1, 2, 4))
    assert not groups.oom and groups.time_per_iter_s < recomputing - 0.5, (groups.time_per_iter_s, recomputing)


def test_every_plan_of_openrlhfs_space_is_one_openrlhf_runs(job):
    """Plans the search lists pass realbench's rules, and a sample of them, written as command
    lines, passes OpenRLHF's own parser, checks and train() assertions."""
    from realbench.engines import import_config
    from realbench.plan import load_scenario

    os.chdir(job)
    scenario_path, _ = import_config("openrlhf", "train ppo hybrid.sh", ["actor.num_nodes=2", "ref.num_nodes=2",
                                                                         "vllm.num_engines=8"], "space",
                                     overwrite=True)
    scenario = load_scenario(str(scenario_path))
    plans = list(openrlhf.configurations(scenario))
    assert len(plans) > 1000
    rng = random.Random(0)
    hybrid = split = 0
    paths = {"actor": "ckpt", "critic": "ckpt", "reward": "ckpt"}
    for i, options in enumerate(rng.sample(plans, 12)):
        assert openrlhf.space_problem(scenario, options) is None
        _, settings = openrlhf.to_config(scenario, options, paths)
        script = job / f"space-{i}.sh"
        script.write_text(openrlhf.config_files(script, "deepspeed", settings)[0][1])
        checked = openrlhf_check("validate", script)
        assert checked["ok"], (checked, settings)
        hybrid += bool(settings.get("train.colocate_all"))
        split += not settings.get("train.colocate_all")
    assert split > 0
    assert any(p["actor_gen"].mesh == p["actor_train"].mesh for p in plans)  # the hybrid engine is listed
    # rows padded (OpenRLHF's default): no ring attention, which packs them; packed, groups of 2 to 8
    # GPUs of a node for every DeepSpeed model, two of them written and passing OpenRLHF's checks
    assert all(o.strategy.sp == 1 for p in plans for o in p.values())
    scenario_path, _ = import_config("openrlhf", "train ppo hybrid.sh", ["actor.num_nodes=2", "ref.num_nodes=2",
                                                                         "vllm.num_engines=8", "ds.packing_samples=true"],
                                     "space-packed", overwrite=True)
    scenario = load_scenario(str(scenario_path))
    rings = [p for p in openrlhf.configurations(scenario) if p["actor_train"].strategy.sp > 1]
    assert {p["actor_train"].strategy.sp for p in rings} == {2, 4, 8}
    # beside DeepSpeed's tp too, tp x ring GPUs of a node (the tiny model's 2 KV heads: tp 1 or 2)
    assert {(p["actor_train"].strategy.sp, p["actor_train"].strategy.tp) for p in rings} == \
        {(2, 1), (4, 1), (8, 1), (2, 2), (4, 2)}
    beside_tp = [p for p in rings if p["actor_train"].strategy.tp > 1]
    for i, options in enumerate(rng.sample(rings, 2) + rng.sample(beside_tp, 1)):
        assert all(o.strategy.ring and o.strategy.sp == options["actor_train"].strategy.sp
                   for n, o in options.items() if n != "actor_gen")  # (every model a DeepSpeed one)
        _, settings = openrlhf.to_config(scenario, options, paths)
        script = job / f"space-ring-{i}.sh"
        script.write_text(openrlhf.config_files(script, "deepspeed", settings)[0][1])
        checked = openrlhf_check("validate", script)
        assert checked["ok"] and checked["ring_attn_size"] == options["actor_train"].strategy.sp, (checked, settings)


def test_deepspeeds_states_asleep_cross_the_host_link_around_each_update_by_hand(cli, job):
    """--ds.enable_sleep: OpenRLHF reloads the actor's and critic's DeepSpeed states before each fit and
    offloads them after it. Under ZeRO-3 they are the fp32 master weights, Adam's two moments and the
    bf16 gradient partition, 14 / dp bytes a parameter (FSDP's offload moves its moments alone, 8 / dp;
    ZeRO-2's, its gradients freed after each step, 12 / dp): each update takes two crossings of them
    over the host link more, and the plan's peak falls by them. A plan offloading one model's
    optimizer and not the other's, or offloading without a ZeRO stage, is refused on export."""
    from realbench.cost import Estimator
    from realbench.cost.calls import shard_params
    from realbench.cost.sharding import offloaded_state_bytes
    from realbench.plan import load_plan

    awake, _, _ = imported(cli, job, "train ppo hybrid.sh", out="awake", name="job")
    asleep, plan, _ = imported(cli, job, "train ppo hybrid.sh", *SLEEP, out="asleep", name="job")
    _, scenario, options = load_plan(asleep["plan"])
    _, _, awake_options = load_plan(awake["plan"])
    assert scenario.engine == "openrlhf"
    est = Estimator(scenario)
    a, b = est.estimate(est.choice_of(awake_options)), est.estimate(est.choice_of(options))
    P = shard_params(scenario.models["actor"], 1, 1)
    moved = P / 8 * (12 + 2)  # fp32 master and moments, bf16 gradients: 8 GPUs
    host_bw = scenario.cluster.host_bw
    off_gpu = 0.0
    for name in ("actor_train", "critic_train"):
        P_role = shard_params(scenario.models[scenario.dataflow.call(name).model], 1, 1)
        assert b.calls[name].time_s - a.calls[name].time_s == pytest.approx(2 * P_role / 8 * 14 / host_bw, rel=1e-9)
        off_gpu += P_role / 8 * 14
    assert offloaded_state_bytes(3, P, 8, master_in_optimizer=True) == pytest.approx(moved)
    assert offloaded_state_bytes(3, P, 8) == pytest.approx(P / 8 * 8)  # FSDP's moments
    assert offloaded_state_bytes(2, P, 8, master_in_optimizer=True) == pytest.approx(P / 8 * 12)
    assert offloaded_state_bytes(1, P, 8, master_in_optimizer=True) == pytest.approx(P / 8 * 12)
    # both trained models (the critic: the actor's checkpoint with a value head) keep their states
    # off the GPUs while vLLM generates, where the plan peaks
    assert a.peak_mem_bytes - b.peak_mem_bytes == pytest.approx(off_gpu, abs=8)
    (key, why), (key0, why0), listed = _written_and_listed(scenario, options, "offload_optimizer")
    assert key == "calls.critic_train.offload_optimizer" and "together (--ds.enable_sleep)" in why
    assert key0 == "calls.actor_train.offload_optimizer" and "ZeRO optimizers only" in why0
    # a single replica's optimizer is offloaded whole (no ZeRO stage of its own): kept in the plan
    from realbench.engines.documents import job_documents

    _, one = job_documents("openrlhf", "job", "", "", algorithm="grpo", models={}, prompts=1, prompt_len=1, gen_len=1,
                           steps=1, group_size=2, cluster={}, epochs=1, old_logprobs="whole_batch",
                           rollout_server="vllm", padding_free=False,
                           calls={"actor_train": {"dp": 1, "zero": 3, "offload_optimizer": True, "offload_params": True}})
    assert one["calls"]["actor_train"] == {"dp": 1, "offload_optimizer": True}
    # the search lists both, under every ZeRO stage
    # (a single replica under the plan's stage has none of its own)
    assert {(z, True, True) for z in (1, 2, 3)} <= listed and (0, True, True) not in listed


def _written_and_listed(scenario, options, switch: str):
    """What OpenRLHF's writer says of the plan with the critic's `switch` off beside the actor's on,
    and of it without a ZeRO stage; and the actor's (zero, switch, sharded) the search lists."""
    from dataclasses import replace

    from realbench.plan import Option

    critic = options["critic_train"]
    mixed = {**options, "critic_train": Option(critic.mesh, replace(critic.strategy, **{switch: False}))}
    unsharded = {n: Option(o.mesh, replace(o.strategy, zero=0, offload_params=False)) if n.endswith(("_train", "_inf"))
                 else o for n, o in options.items()}
    listed = {(o.strategy.zero, getattr(o.strategy, switch), o.strategy.dp > 1)
              for o in openrlhf.plan_table(scenario)[0]["actor_train"]}
    return openrlhf.space_problem(scenario, mixed), openrlhf.space_problem(scenario, unsharded), listed


def test_cpu_adam_updates_each_ranks_partition_on_one_host_core_by_hand(cli, job):
    """--ds.adam_offload, DeepSpeed's ZeRO-Offload: each optimizer step the rank's gradient partition
    crosses to the host in fp32 (4 / dp bytes a parameter), Adam updates it there on one core (Ray
    gives OpenRLHF's workers OMP_NUM_THREADS=1) at the fitted rate, and the bf16 partition comes back
    (2 / dp); under ZeRO-2 each micro-batch but the last also sends its gradients out and, from the
    second on, the running sum in and out (4 (m - 1) / dp). The fp32 master weights and moments,
    12 / dp, leave the GPUs for good. `--ds.enable_sleep` beside it moves nothing more. Refused on
    export: one model's Adam on the host and not the other's, no ZeRO stage, and engines whose
    Adam runs on the GPUs."""
    from dataclasses import replace

    from realbench.cost import Estimator
    from realbench.cost.calls import call_cost, shard_params
    from realbench.engines import areal, verl
    from realbench.hardware import FITTED
    from realbench.plan import Option, get_builtin, load_plan

    on_gpu, _, _ = imported(cli, job, "train ppo hybrid.sh", out="gpu adam", name="job")
    on_host, _, _ = imported(cli, job, "train ppo hybrid.sh", *ADAM, out="cpu adam", name="job")
    both, _, _ = imported(cli, job, "train ppo hybrid.sh", *ADAM, *SLEEP, out="cpu adam asleep", name="job")
    _, scenario, options = load_plan(on_host["plan"])
    _, _, gpu_options = load_plan(on_gpu["plan"])
    c = scenario.cluster
    r = c.host_adam_rate
    assert r == FITTED["host_adam_rate"] and c.host_bw == 64e9
    est = Estimator(scenario)
    a, b = est.estimate(est.choice_of(gpu_options)), est.estimate(est.choice_of(options))
    held = 0.0
    for name in ("actor_train", "critic_train"):
        call = scenario.dataflow.call(name)
        model = scenario.models[call.model]
        o = options[name]
        assert o.strategy.host_adam and (o.strategy.zero, o.strategy.dp) == (3, 8)
        P = shard_params(model, 1, 1)
        steps = call.optimizer_steps * call.iterations
        cost = call_cost(call, model, c, o)
        assert cost.optimizer_s == pytest.approx(steps * (P / 8 * 6 / 64e9 + P / 8 / r), rel=1e-12)
        gpu = call_cost(call, model, c, gpu_options[name])
        assert gpu.master_bytes - cost.master_bytes == pytest.approx(P / 8 * 12, abs=2)
        assert b.calls[name].time_s - a.calls[name].time_s == pytest.approx(cost.optimizer_s - gpu.optimizer_s,
                                                                           rel=1e-9)
        # ZeRO-2 over 4 micro-batches: the running sum's three trips more
        two = Option(o.mesh, replace(o.strategy, zero=2, micro_batches=4))
        assert call_cost(call, model, c, two).optimizer_s == pytest.approx(
            steps * (P / 8 * 6 / 64e9 + P / 8 * 4 * 3 / 64e9 + P / 8 / r), rel=1e-12)
        held += P / 8 * 12
    assert a.peak_mem_bytes - b.peak_mem_bytes == pytest.approx(held, abs=8)
    assert both["time_per_iter_s"] == on_host["time_per_iter_s"]  # (asleep beside CPU Adam: nothing moves)
    # a host of another kind: its own rate in the scenario's cluster (as `bench host-adam` measures it)
    scenario_file = Path(on_host["scenario"])
    document = yaml.safe_load(scenario_file.read_text())
    document["cluster"]["host_adam_rate"] = r / 4
    slower = scenario_file.with_name("slower host.yaml")
    slower.write_text(yaml.safe_dump(document))
    from realbench.plan import load_scenario

    slow = load_scenario(str(slower))
    assert slow.cluster.host_adam_rate == r / 4 and slow.cluster.host_bw == c.host_bw
    call = slow.dataflow.call("actor_train")
    P = shard_params(slow.models["actor"], 1, 1)
    assert call_cost(call, slow.models["actor"], slow.cluster, options["actor_train"]).optimizer_s == pytest.approx(
        call.optimizer_steps * call.iterations * (P / 8 * 6 / 64e9 + 4 * P / 8 / r), rel=1e-12)
    # refused on export; the search lists it under every ZeRO stage, never without one
    (key, why), (key0, why0), listed = _written_and_listed(scenario, options, "host_adam")
    assert key == "calls.critic_train.host_adam" and "together (--ds.adam_offload)" in why
    assert key0 == "calls.actor_train.host_adam" and "needs a ZeRO optimizer" in why0
    assert {(z, True, True) for z in (1, 2, 3)} <= listed and (0, True, True) not in listed
    # verl and AReaL run Adam on the GPUs
    job7 = get_builtin("grpo-7b-16gpu")
    for module, scenario7 in ((verl, job7), (areal, areal.job_of(job7.model_copy(update={"engine": None})))):
        plan7 = module.default_plan(scenario7)
        actor = plan7["actor_train"]
        plan7["actor_train"] = replace(actor, strategy=replace(actor.strategy, host_adam=True, offload_optimizer=False))
        key, why = module.space_problem(scenario7, plan7)
        assert key == "calls.actor_train.host_adam" and "Adam on the GPUs" in why, (module, why)


def test_the_actors_old_log_probabilities_run_beside_the_other_scorers_by_hand(monkeypatch):
    """OpenRLHF's experience maker dispatches the actor's old-log-probability forward with the
    reference's, critic's and reward model's: on the separate groups of its multi-node example
    (actor and reference on a quarter of the GPUs, critic and reward model on another) it runs
    while the critic's group scores, not after it. The train call starts once generation's rows
    are there and its mesh is free, and ends at start + its time + whatever it waited for the
    other inputs beyond its forward: max(0, ready - start - forward). The forward is what the call
    costs beyond taking the rollout's log-probabilities. Where the actor's GPUs are the scorers'
    (the hybrid engine), nothing changes."""
    from realbench.cost import Estimator, simulate
    from realbench.cost.calls import call_cost
    from realbench.engines import priced_as
    from realbench.plan import get_builtin

    job = get_builtin("ppo-7b-7b-16gpu")
    scenario = priced_as(job, "openrlhf")
    example = openrlhf.default_plan(job, openrlhf.EXAMPLE["settings"])
    hybrid = openrlhf.default_plan(job)

    def timed(plan, **scale):
        est = Estimator(scenario, call_scale=scale)
        return est.estimate(est.choice_of(plan))

    # (and with the critic's values three times as slow: a wait longer than the forward)
    early, early_hybrid, early_slow = timed(example), timed(hybrid), timed(example, critic_inf=3.0)
    monkeypatch.setattr(simulate, "EARLY_OLD_LOGPROBS_ENGINES", ())
    after, after_hybrid, after_slow = timed(example), timed(hybrid), timed(example, critic_inf=3.0)
    call = scenario.dataflow.call("actor_train")
    actor = scenario.models["actor"]
    o = example["actor_train"]
    forward = call_cost(call, actor, scenario.cluster, o, True, early_old_logprobs=True).early_s
    rollout = call_cost(call.model_copy(update={"old_logprobs": "rollout"}), actor, scenario.cluster, o, True)
    assert forward > 0 and forward == pytest.approx(call_cost(call, actor, scenario.cluster, o, True).time_s
                                                    - rollout.time_s, rel=1e-12)
    dur = call_cost(call, actor, scenario.cluster, o, True).time_s  # the call's own time, its forward in it
    a, b = early.calls["actor_train"], after.calls["actor_train"]
    assert b.end_s - b.start_s == pytest.approx(dur, rel=1e-12)
    # the critic's group scores longer than the reference on the actor's: the forward starts first
    assert early.calls["critic_inf"].end_s > early.calls["ref_inf"].end_s and a.start_s < b.start_s
    assert a.start_s == pytest.approx(early.calls["ref_inf"].end_s)  # (the actor's GPUs free again)
    # (from generation's end in each schedule: the iterations start at different times)
    start, ready = a.start_s - early.calls["actor_gen"].end_s, b.start_s - after.calls["actor_gen"].end_s
    assert a.end_s - early.calls["actor_gen"].end_s == pytest.approx(
        start + dur + max(0.0, ready - start - forward), rel=1e-12)
    # the step gains the wait the forward hid (here all of it: the critic's group took less than it)
    assert 0 < ready - start < forward
    assert after.time_per_iter_s - early.time_per_iter_s == pytest.approx(ready - start, rel=1e-9)
    # a longer wait: the forward hides under it whole, the rest waits for the critic's values
    a, b = early_slow.calls["actor_train"], after_slow.calls["actor_train"]
    start, ready = a.start_s - early_slow.calls["actor_gen"].end_s, b.start_s - after_slow.calls["actor_gen"].end_s
    assert ready - start > forward
    assert a.end_s - early_slow.calls["actor_gen"].end_s == pytest.approx(ready + dur - forward, rel=1e-12)
    assert after_slow.time_per_iter_s - early_slow.time_per_iter_s == pytest.approx(forward, rel=1e-9)
    assert early_hybrid.time_per_iter_s == after_hybrid.time_per_iter_s
    assert not any("old log-probabilities" in gap for gap in openrlhf.PRICING_GAPS)


def test_a_sleeping_vllm_sends_its_weights_to_the_host_and_back_each_step_by_hand(cli, job, monkeypatch):
    """The hybrid engine's --vllm.enable_sleep (vLLM's level 1): after generation its weights go to
    host memory, before the weight sync they come back. Each GPU of a tp 2 engine holds a bf16 half
    of the weights: two crossings of it over the host link a step, beside the broadcast. vLLM on
    its own GPUs does not sleep."""
    from realbench.cost import Estimator, simulate
    from realbench.cost.calls import shard_params
    from realbench.plan import load_plan

    def realloc(config: str):
        result, _, _ = imported(cli, job, config, out="sleep", name="job")
        _, scenario, options = load_plan(result["plan"])
        est = Estimator(scenario)
        asleep = est.estimate(est.choice_of(options)).calls["actor_gen"].realloc_s
        with monkeypatch.context() as m:
            m.setattr(simulate, "ROLLOUT_SLEEP_ENGINES", ())
            est = Estimator(scenario)
            awake = est.estimate(est.choice_of(options)).calls["actor_gen"].realloc_s
        return asleep, awake, scenario, options

    asleep, awake, scenario, options = realloc("train ppo hybrid.sh")
    assert options["actor_gen"].mesh == options["actor_train"].mesh and options["actor_gen"].strategy.tp == 2
    half = shard_params(scenario.models["actor"], 2, 1) * 2
    assert asleep - awake == pytest.approx(2 * half / scenario.cluster.host_bw, rel=1e-9)
    asleep, awake, _, options = realloc("grpo.args")
    assert options["actor_gen"].mesh != options["actor_train"].mesh and asleep == awake


def test_the_weights_reach_vllm_as_openrlhf_broadcasts_them():
    """Hand-worked: ZeRO-3 on node 0 (dp 8) to vLLM on node 1: the data-parallel all-gather of
    the bf16 model, then the whole model once over the inter-node link; on the actor's own GPUs
    (CUDA IPC) the gather only; realbench's own reallocation sends each vLLM GPU its tp shard."""
    from realbench.cost import comm
    from realbench.cost.realloc import Layouts, broadcast_times, realloc_times
    from realbench.hardware import ClusterSpec
    from realbench.plan import get_builtin

    scenario = get_builtin("ppo-7b-7b-16gpu")
    model, c = scenario.models["actor"], scenario.cluster
    assert isinstance(c, ClusterSpec)
    lay = lambda start, size, tp, zero: Layouts(*(np.array([x]) for x in (start, size, tp, 1, zero)))  # noqa: E731
    trainer, vllm, same = lay(0, 8, 1, 3), lay(8, 8, 2, 0), lay(0, 8, 2, 0)
    nbytes = model.n_params * 2.0
    gather = comm.all_gather(c, np.array([8]), nbytes, np.array([False]), np.array([8]))[0]
    assert broadcast_times(model, c, trainer, vllm)[0] == pytest.approx(gather + nbytes / c.inter_bw + c.inter_latency_s)
    assert broadcast_times(model, c, trainer, same)[0] == pytest.approx(gather)
    assert realloc_times(model, c, trainer, vllm)[0] == pytest.approx(gather + nbytes / 2 / c.inter_bw
                                                                      + c.inter_latency_s)


def test_search_inside_openrlhf_lists_its_plans_and_beats_its_quick_start(cli, job, tmp_path):
    code, out, err = cli("search", "--scenario", "grpo-7b-16gpu", "--engine", "openrlhf", "--method", "mcmc",
                         "--time-budget", "60",
                         "--json", "--out", tmp_path / "best.yaml")
    assert code == 0, err
    result = json.loads(out)
    assert result["method"] == "mcmc" and result["evaluations"] == result["groups"] > 1000  # all listed, all priced
    assert result["best_time_s"] <= result["compared"]["time_per_iter_s"]
    assert result["compared"]["name"] == "openrlhf's default configuration"
    from realbench.plan import get_builtin, load_plan

    # the README's quick-start as written: the hybrid engine with vLLM and DeepSpeed asleep between phases
    quick = openrlhf.default_plan(get_builtin("grpo-7b-16gpu"))
    assert quick["actor_gen"].mesh == quick["actor_train"].mesh and quick["actor_train"].strategy.offload_optimizer
    # its multi-node example (train_ppo_ray_slurm.sh): separate groups, CPU Adam
    example = openrlhf.default_plan(get_builtin("grpo-7b-16gpu"), openrlhf.EXAMPLE["settings"])
    assert example["actor_gen"].mesh != example["actor_train"].mesh and example["actor_train"].strategy.host_adam

    _, scenario, options = load_plan(str(tmp_path / "best.yaml"))
    assert openrlhf.space_problem(scenario, options) is None


def test_the_workbench_opens_a_launch_script_and_writes_the_plan_back(job):
    """The Engine tab: the script's scenario into the dataflow editor, the plan OpenRLHF runs into
    the viewer (the estimate `import` prints), the plan written back passes OpenRLHF's checks; a
    bad flag and a second open without overwrite are shown inline, nothing written."""
    from realbench.cost import Estimator
    from realbench.widgets import Workbench

    os.chdir(job)
    wb = Workbench("ppo-tiny-cpu", budget_s=1)
    e = wb.engine
    e.engine_box.value, e.file_box.value, e.out_box.value = "openrlhf", "train ppo hybrid.sh", "from the lab"
    assert e.open(), e.status.value
    assert wb.editor.scenario.engine == "openrlhf" and wb.search.scenario_override is wb.editor.scenario
    est = Estimator(wb.editor.scenario)
    assert wb.viewer.estimate.time_per_iter_s == pytest.approx(est.estimate(est.choice_of(e.shown[1])).time_per_iter_s)
    assert "openrlhf configuration train ppo hybrid.sh" in wb.viewer.title.value
    assert not e.open() and "exists; pass --force" in e.status.value  # the first import is kept
    e.export_box.value = "from the lab/run.sh"
    assert e.write(), e.status.value
    assert openrlhf_check("validate", job / "from the lab" / "run.sh")["ok"]
    e.overrides_box.value, e.overwrite_box.value = "vllm.num_engine_s=2", True
    assert not e.open() and "did you mean" in e.status.value


def test_the_asynchronous_trainer_reads_as_generation_running_ahead(cli, job):
    """--train.async_enable with a queue of 2 batches: max_staleness 2, vLLM on its own GPUs even
    under colocate_all (only the DeepSpeed models share the actor's); written back with the same
    flags, OpenRLHF accepts it, and it reads back to the same plan and estimate. Synchronous, the
    same layout is slower (generation no longer overlaps training)."""
    flags = ["vllm.enable_sleep=false", "train.async_enable=true", "train.async_queue_size=2", "vllm.num_engines=2"]
    first, plan, scenario = imported(cli, job, "train ppo hybrid.sh", *flags, out="async", name="async")
    assert scenario["dataflow"]["max_staleness"] == 2
    calls = plan["calls"]
    assert calls["actor_gen"]["mesh"] == "n1:0-3" and calls["actor_train"]["mesh"] == "n0"
    assert calls["ref_inf"]["mesh"] == calls["critic_train"]["mesh"] == calls["reward_inf"]["mesh"] == "n0"
    out = job / "async" / "run.sh"
    code, _, err = cli("export", "--plan", first["plan"], "--format", "openrlhf", "--out", out, "--force")
    assert code == 0, err
    assert "--train.async_queue_size 2" in out.read_text()
    assert openrlhf_check("validate", out)["ok"]
    again, plan_again, _ = imported(cli, job, out, out="async-again", name="async")
    assert plan_again["calls"] == plan["calls"]
    assert again["time_per_iter_s"] == pytest.approx(first["time_per_iter_s"], rel=1e-12)
    from realbench.cost import Estimator
    from realbench.plan import load_plan
    from realbench.plan.scenario import scenario_from_document

    _, asynchronous, options = load_plan(first["plan"])
    doc = yaml.safe_load(Path(first["scenario"]).read_text())
    del doc["dataflow"]["max_staleness"]
    est = Estimator(scenario_from_document(doc))
    assert est.estimate(est.choice_of(options)).time_per_iter_s > first["time_per_iter_s"]


def test_without_a_kl_coefficient_openrlhf_places_no_reference(cli, job):
    """--algo.kl.init_coef 0: OpenRLHF builds no reference (cli/train_ppo_ray.py:93-103), so its
    group is not placed and no call scores with it; written back, OpenRLHF accepts it and it reads
    back the same."""
    first, plan, scenario = imported(cli, job, "grpo.args", "algo.kl.init_coef=0", out="no-ref", name="noref")
    assert "ref_inf" not in plan["calls"] and "ref" not in scenario["models"]
    assert scenario["dataflow"]["with_ref"] is False
    # the actor's 8 GPUs and vLLM's 4 only: the reference's 4 are not placed
    assert plan["calls"]["actor_train"]["mesh"] == "n0" and plan["calls"]["actor_gen"]["mesh"] == "n1:0-3"
    out = job / "exported" / "no ref.sh"
    out.parent.mkdir(exist_ok=True)
    code, _, err = cli("export", "--plan", first["plan"], "--format", "openrlhf", "--out", out, "--force")
    assert code == 0, err
    assert "--algo.kl.init_coef 0.0" in out.read_text()
    assert openrlhf_check("validate", out)["ok"]
    again, plan_again, _ = imported(cli, job, out, out="no-ref-again", name="noref")
    assert plan_again["calls"] == plan["calls"]
    assert again["time_per_iter_s"] == pytest.approx(first["time_per_iter_s"], rel=1e-12)


def test_expert_parallelism_openrlhf_does_not_have_is_refused_on_export_and_never_listed(cli, tmp_path):
    """OpenRLHF 0.11.2 has no expert parallelism (no flag; --ds.experts_implementation only picks
    transformers' kernel, its vLLM engines get no enable_expert_parallel). On the Qwen3-30B-A3B job
    its listed plans split no experts (ep 1, each expert as tp splits it: etp tp's), and a plan that
    does, in generation (vLLM's expert parallelism over 4 GPUs) or training (Megatron's folding over
    2), is refused by name on export: one line, exit 2, naming the call's ep."""
    from dataclasses import replace

    from realbench.engines import priced_as
    from realbench.plan import get_builtin
    from realbench.plan.plan import plan_from_options
    from realbench.schema import write_document

    scenario = priced_as(get_builtin("grpo-qwen3-30b-a3b-16gpu"), "openrlhf")
    table, rows = openrlhf.plan_table(scenario)
    assert rows and all((o.strategy.ep, o.strategy.etp) == (1, 0) for options in table.values() for o in options)
    quick = openrlhf.default_plan(scenario)  # (the hybrid engine: vLLM tp 2, ZeRO-3)
    assert openrlhf.space_problem(scenario, quick) is None
    gen, train = quick["actor_gen"], quick["actor_train"]
    for name, option in (("actor_gen", replace(gen, strategy=replace(gen.strategy, ep=4, etp=1))),
                         ("actor_train", replace(train, strategy=replace(train.strategy, zero=1, ep=2)))):
        plan = tmp_path / f"{name}-plan.yaml"
        write_document(plan_from_options(scenario, {**quick, name: option}, scenario_ref=scenario.name).to_document(),
                       plan, True)
        code, _, err = cli("export", "--plan", plan, "--format", "openrlhf", "--out", tmp_path / f"{name}.sh")
        assert code == 2 and err.count("\n") == 1, err
        assert f"calls.{name}.ep" in err and "OpenRLHF 0.11.2 has no expert parallelism" in err, err
        assert not (tmp_path / f"{name}.sh").exists()
