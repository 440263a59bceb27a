"""bench coverage: the engines' example configurations, as a user's examples folder holds them (shell
scripts that set variables and launch through ray or torchrun, YAML files), each imported and priced
or counted apart with the reason by name."""

import json
import os
from pathlib import Path

import pytest

from realbench.bench import coverage

ROOT = Path(__file__).resolve().parents[1]
VERL_PYTHON = Path(os.environ.get("REALBENCH_VERL_PYTHON", ROOT / ".venv-verl" / "bin" / "python"))

# a verl example as its examples/ holds them: variables, set -x, a launch with Hydra overrides
VERL_GRPO = """\
set -x
ulimit -n 65535
export VLLM_USE_V1=1
MODEL=${MODEL:-Qwen/Qwen3-8B-Base}
python3 -m verl.trainer.main_ppo \\
    algorithm.adv_estimator=grpo \\
    data.train_files=$HOME/data/gsm8k/train.parquet \\
    data.train_batch_size=256 data.max_prompt_length=512 data.max_response_length=1024 \\
    actor_rollout_ref.model.path=$MODEL \\
    actor_rollout_ref.actor.ppo_mini_batch_size=64 \\
    actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=8 \\
    actor_rollout_ref.rollout.name=vllm actor_rollout_ref.rollout.n=4 \\
    actor_rollout_ref.rollout.tensor_model_parallel_size=2 \\
    actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=8 \\
    actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=8 \\
    trainer.n_gpus_per_node=8 trainer.nnodes=1 trainer.total_epochs=1 "$@"
"""
VERL_SFT = "torchrun --nproc_per_node=8 -m verl.trainer.fsdp_sft_trainer model.partial_pretrain=Qwen/Qwen3-8B\n"
VERL_UNKNOWN_MODEL = VERL_GRPO.replace("Qwen/Qwen3-8B-Base", "my-org/house-model-13b")
OPENRLHF_PPO = """\
set -x
ray job submit --address="http://127.0.0.1:8265" \\
   --runtime-env-json='{"working_dir": "/openrlhf"}' \\
   -- python3 -m openrlhf.cli.train_ppo_ray \\
   --ref.num_nodes 1 --ref.num_gpus_per_node 8 \\
   --actor.num_nodes 1 --actor.num_gpus_per_node 8 \\
   --vllm.num_engines 4 --vllm.tensor_parallel_size 2 \\
   --train.colocate_all --vllm.gpu_memory_utilization 0.5 --vllm.enable_sleep --ds.enable_sleep \\
   --actor.model_name_or_path Qwen/Qwen3-8B \\
   --train.batch_size 128 --rollout.batch_size 128 --rollout.n_samples_per_prompt 4 \\
   --data.max_len 2048 --rollout.max_new_tokens 1024 --ds.zero_stage 3 --ds.param_dtype bf16 \\
   --algo.advantage.estimator group_norm --algo.kl.init_coef 1e-3 --algo.kl.use_loss \\
   --data.prompt_dataset OpenRLHF/prompt-collection-v0.1 --data.input_key context_messages \\
   --data.apply_chat_template --reward.remote_url examples/reward_func.py \\
   --actor.gradient_checkpointing_enable
"""


@pytest.fixture(scope="module")
def examples(tmp_path_factory):
    """Two engines' repositories, their examples/ folders as a user's clone holds them."""
    root = tmp_path_factory.mktemp("engine repositories")
    files = {"verl/examples/grpo_trainer/run_qwen3-8b.sh": VERL_GRPO, "verl/examples/sft/run sft.sh": VERL_SFT,
             "verl/examples/grpo_trainer/run_house.sh": VERL_UNKNOWN_MODEL,
             "openrlhf/examples/scripts/train_grpo_ray_qwen3.sh": OPENRLHF_PPO,
             # (OpenRLHF's scripts name their reward function from the repository, where they are run)
             "openrlhf/examples/reward_func.py": "def reward_func(queries, prompts, labels):\n    return 0.0\n"}
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)
    return root


def test_a_scripts_launch_is_captured_with_its_variables_expanded_and_nothing_run(examples, tmp_path):
    launches = coverage.captured_launches(examples / "verl/examples/grpo_trainer/run_qwen3-8b.sh")
    module, args, others = coverage.rl_launch("verl", launches)
    assert module == "verl.trainer.main_ppo" and not others
    assert "actor_rollout_ref.model.path=Qwen/Qwen3-8B-Base" in args and "trainer.n_gpus_per_node=8" in args
    # ray's `job submit ... -- python3 -m ...` is the launch after the `--`
    script = examples / "openrlhf/examples/scripts/train_grpo_ray_qwen3.sh"
    module, args, _ = coverage.rl_launch("openrlhf", coverage.captured_launches(script))
    assert module == "openrlhf.cli.train_ppo_ray"
    assert args[args.index("--actor.model_name_or_path") + 1] == "Qwen/Qwen3-8B"


def test_a_script_gets_positional_arguments_only_where_it_reads_them_itself(tmp_path):
    """A script that reads $1 (a usage line's GPU count) gets one; one whose only `$1` is inside a quoted
    program (awk's first field) and that passes "$@" on as overrides gets none, so no stray override."""
    reads = tmp_path / "reads.sh"
    reads.write_text('GPUS=${1:-4}\npython3 -m verl.trainer.main_ppo trainer.n_gpus_per_node=$GPUS "$@"\n')
    awk = tmp_path / "awk.sh"
    awk.write_text("for v in $(env | awk -F= '/^SLURM_/{print $1}'); do unset $v; done\n"
                   'python3 -m verl.trainer.main_ppo trainer.n_gpus_per_node=8 "$@"\n')
    _, args, _ = coverage.rl_launch("verl", coverage.captured_launches(reads))
    assert args[0] == "trainer.n_gpus_per_node=8" and len(args) == 3  # (the recorder's 8 and a folder)
    _, args, _ = coverage.rl_launch("verl", coverage.captured_launches(awk))
    assert args == ["trainer.n_gpus_per_node=8"]


def test_a_hub_ids_variants_stand_in_for_its_catalogue_entry():
    assert coverage.stand_in("Qwen/Qwen3-8B-Base") == "qwen3-8b"
    assert coverage.stand_in("meta-llama/Llama-3.1-8B") == "llama-3.1-8b"
    assert coverage.stand_in("/data/models/Qwen3-30B-A3B-Instruct-2507") == "qwen3-30b-a3b"
    assert coverage.stand_in("my-org/house-model-13b") is None


@pytest.mark.parametrize("reason, feature", [
    ("model_engine: model_engine 'veomni': realbench prices dp, megatron (FSDP and Megatron)", "VeOmni"),
    ("--actor.freeze_visual_encoder: True (OpenRLHF's default False) changes what OpenRLHF runs", "vision-language"),
    ("actor_rollout_ref.model.path: 'zai-org/GLM-4.1V-9B-Thinking': no such folder or config.json file",
     "vision-language"),
    ("actor_rollout_ref.rollout.multi_stage_wake_up: True (verl's default False)", "multi-stage wake-up"),
    ("train_dataset.max_length: is not set: realbench prices prompts at their cap", "without a length cap"),
    ("actor: 7 GPUs: realbench places a group on a power-of-two block of a node of 8 or on whole nodes",
     "power-of-two block"),
    ("actor_rollout_ref.model.path: 'my-org/house-13b': no such folder or config.json file", "no config here"),
    ("distillation.teacher_models.gsm8k.key: a teacher beside distillation.teacher_models.teacher_model: several "
     "teachers", "several teachers"),
    ("distillation.teacher_models.teacher_model.model_path: 'Qwen/Qwen3-VL-32B-Instruct': no such folder or "
     "config.json file", "no config here"),
    ("calls.reward_inf.tp: the plan verl would run is not one realbench can price: tp 8 does not divide the 16 "
     "attention heads and 2 KV heads of qwen3-8b", "reward model's tp beyond its KV heads"),
    ("econfig.domain: AReaL 1.0.4's PPOConfig has no such setting", "own config class"),
    ("gconfig.n_samples: 1: GRPO compares a prompt's samples: 2 or more", "group of one"),
    ("actor_rollout_ref.rollout.n: 1: realbench prices gpg with GRPO's calls, which compare a prompt's samples: 2 or "
     "more", "group of one"),
    ("gconfig.n_samples: 1: GRPO's group of one: AReaL centres it on itself (advantage 0)", "group of one"),
    ("actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu: 8 does not divide a GPU's 4 rows", "itself refuses"),
    ("actor_rollout_ref.rollout.enforce_eager: True (verl's default False) changes what verl runs", "CUDA graphs"),
    ("trainer.some_new_key: 3 (verl's default 1) changes what verl runs", "other")])
def test_a_refusal_is_counted_by_the_feature_it_names(reason, feature):
    assert feature in coverage.feature_of(reason)


def test_every_example_is_priced_or_counted_apart_by_name(examples, cli, monkeypatch):
    # (folders named as a user names them, relative to where they stand)
    monkeypatch.chdir(examples)
    code, out, err = cli("bench", "coverage", "--examples", "verl=verl/examples", "openrlhf=openrlhf/examples",
                         "--json")
    assert code == 0, err
    result = json.loads(out)
    verl, openrlhf = result["engines"]["verl"], result["engines"]["openrlhf"]
    assert (verl["examples"], verl["rl_jobs"], verl["priced"]) == (3, 2, 1), verl
    assert verl["not_rl"] == {"launches verl.trainer.fsdp_sft_trainer": 1}
    # the house model has no config here: refused naming the key and the model
    [(reason, count)] = verl["refused"].items()
    assert count == 1 and reason == "actor_rollout_ref.model.path", verl["refused"]
    row = {r["file"]: r for r in result["rows"]}
    assert "my-org/house-model-13b" in row["grpo_trainer/run_house.sh"]["reason"]
    # and counted by what realbench does not price (here: a model it has no config of)
    assert verl["refused_features"] == {"a model with no config here": 1}
    assert row["grpo_trainer/run_house.sh"]["feature"] == "a model with no config here"
    assert (openrlhf["rl_jobs"], openrlhf["priced"]) == (1, 1), openrlhf
    assert result["share_priced"] == pytest.approx(2 / 3)
    priced = [r for r in result["rows"] if r["status"] == "priced"]
    assert all(r["time_per_iter_s"] > 0 for r in priced) and {m for r in priced for m in r["models"]} == {
        "Qwen/Qwen3-8B-Base", "Qwen/Qwen3-8B"}


def test_what_a_script_writes_stays_out_of_the_users_clone(cli, tmp_path, monkeypatch):
    """verl's scripts make a logs folder and tee the run into it, write a helper script where they
    run, or remove a folder: run by the bench from a mirror of the repository with those commands
    stubbed, they leave the user's clone as it was (a file of the user's of the same name unchanged),
    and realbench writes its own configs elsewhere too."""
    repository = tmp_path / "verl"
    (repository / "examples" / "grpo_trainer").mkdir(parents=True)
    (repository / "get_model.py").write_text("# the user's own\n")
    launch = VERL_GRPO.split("python3 -m", 1)
    (repository / "examples" / "grpo_trainer" / "run_logged.sh").write_text(
        launch[0] + "mkdir -p logs\nrm -rf checkpoints\ncat > get_model.py <<EOF\nprint('downloading')\nEOF\n"
        "python3 -m" + launch[1].rstrip().removesuffix('"$@"') + '"$@" 2>&1 | tee logs/run.log\n')
    (repository / "checkpoints").mkdir()
    before = {p: p.read_bytes() if p.is_file() else None for p in repository.rglob("*")}
    monkeypatch.chdir(tmp_path)
    code, out, err = cli("bench", "coverage", "--examples", "verl=verl/examples", "--json")
    assert code == 0, err
    assert json.loads(out)["engines"]["verl"]["priced"] == 1
    assert {p: p.read_bytes() if p.is_file() else None for p in repository.rglob("*")} == before


def test_a_folder_that_is_not_there_is_one_line_and_status_2(cli, tmp_path):
    code, _, err = cli("bench", "coverage", "--examples", f"verl={tmp_path / 'absent'}")
    assert code == 2 and err.count("\n") == 1 and "no such folder" in err
    code, _, err = cli("bench", "coverage", "--examples", f"deepspeed-chat={tmp_path}")
    assert code == 2 and "unknown engine 'deepspeed-chat'" in err
    code, _, err = cli("bench", "coverage", "--examples", str(tmp_path))
    assert code == 2 and err.count("\n") == 1 and "--examples" in err and "is not ENGINE=DIR" in err


# DAPO's overlong penalty, an argument of the reward manager (an open dict verl's Hydra adds to);
# SAPO's temperatures where a newer verl reads them (the policy loss's), which verl 0.9.1 refuses
VERL_DAPO = VERL_GRPO.replace('"$@"', '+reward.reward_kwargs.overlong_buffer_cfg.enable=True '
                                      '+reward.reward_kwargs.overlong_buffer_cfg.len=512 "$@"')
VERL_SAPO_NEWER = VERL_GRPO.replace('"$@"', '+actor_rollout_ref.actor.policy_loss.tau_pos=1.0 "$@"')
VERL_DISTILLED = VERL_GRPO.replace('"$@"', '+distillation.teacher_models.math.key=gsm8k "$@"')
# an entry point of a newer verl (0.9.1 has no trainer/main_ppo_sync.py), and verl's fully-async one
VERL_SYNC_ENTRY = VERL_GRPO.replace("verl.trainer.main_ppo", "verl.trainer.main_ppo_sync")
VERL_FULLY_ASYNC = VERL_GRPO.replace("verl.trainer.main_ppo", "verl.experimental.fully_async_policy.fully_async_main")
# Hydra's + on a key verl holds, which verl's composition refuses as realbench does
VERL_ADDED_TWICE = VERL_GRPO.replace('"$@"', '+actor_rollout_ref.model.lora.merge=True "$@"')


def test_examples_the_pinned_release_refuses_too_are_counted_apart_by_its_own_checks(cli, tmp_path, monkeypatch):
    for name, text in {"dapo/run_dapo.sh": VERL_DAPO, "sapo/run_sapo.sh": VERL_SAPO_NEWER,
                       "distillation/run_opd.sh": VERL_DISTILLED, "sync/run_sync.sh": VERL_SYNC_ENTRY,
                       "async/run_fully_async.sh": VERL_FULLY_ASYNC, "lora/run_merge.sh": VERL_ADDED_TWICE}.items():
        (tmp_path / "verl/examples" / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / "verl/examples" / name).write_text(text)
    monkeypatch.chdir(tmp_path)
    code, out, err = cli("bench", "coverage", "--examples", "verl=verl/examples", "--check-with",
                         f"verl={VERL_PYTHON}", "--json")
    assert code == 0, err
    result = json.loads(out)
    verl, row = result["engines"]["verl"], {r["file"]: r for r in result["rows"]}
    # the reward manager's keyword arguments are the user's, carried unpriced
    assert row["dapo/run_dapo.sh"]["status"] == "priced", row["dapo/run_dapo.sh"]
    # verl 0.9.1's own composition refuses tau_pos too, naming it: not a job the pinned release runs
    sapo = row["sapo/run_sapo.sh"]
    assert sapo["status"] == "stale" and "tau_pos" in sapo["reason"] and "PolicyLossConfig" in sapo["reason"], sapo
    # a second teacher verl adds to its open dict: refused by name as not priced, never "no such setting"
    opd = row["distillation/run_opd.sh"]
    assert opd["status"] == "refused" and "several teachers" in opd["reason"], opd
    assert row["sync/run_sync.sh"]["status"] == "stale" and "no such module" in row["sync/run_sync.sh"]["reason"]
    fully_async = row["async/run_fully_async.sh"]
    assert fully_async["status"] == "refused" and "an RL entry point realbench does not read" in fully_async["reason"]
    merge = row["lora/run_merge.sh"]
    assert merge["status"] == "stale" and "Could not append to config" in merge["reason"], merge
    assert (verl["rl_jobs"], verl["stale"], verl["priced"]) == (6, 3, 1), verl
    assert verl["share_priced"] == pytest.approx(1 / 6) and verl["share_priced_of_running"] == pytest.approx(1 / 3)
    assert verl["stale_settings"] == {"actor_rollout_ref.actor.policy_loss.tau_pos": 1, "verl.trainer.main_ppo_sync": 1,
                                      "+actor_rollout_ref.model.lora.merge=True": 1}, verl["stale_settings"]
    # without the engine's Python, the same example is one realbench refuses; without --json, the counts
    code, out, err = cli("bench", "coverage", "--examples", "verl=verl/examples")
    assert code == 0 and out.splitlines()[0] == "verl: 6 examples, 6 RL jobs, 0 stale, 1 priced (17%; 17% of those " \
                                                "not stale)", out
    code, out, err = cli("bench", "coverage", "--examples", "verl=verl/examples", "--json")
    unchecked = json.loads(out)["engines"]["verl"]
    assert unchecked["stale"] == 0 and unchecked["rl_jobs"] == 6 and unchecked["priced"] == 1
    code, _, err = cli("bench", "coverage", "--examples", "verl=verl/examples", "--check-with",
                       f"verl={tmp_path / 'no python'}")
    assert code == 2 and err.count("\n") == 1 and "--check-with" in err and "make engines" in err


def test_areal_yaml_files_that_are_no_rl_experiment_are_counted_apart(tmp_path):
    files = {"sky.yaml": "name: train\nresources:\n  accelerators: H100:8\nrun: python3 train.py\n",
             "sft.yaml": "experiment_name: sft\nactor:\n  path: Qwen/Qwen3-8B\ntrain_dataset:\n  path: d\n",
             "grpo.yaml": "experiment_name: grpo\nactor:\n  path: Qwen/Qwen3-8B\ngconfig:\n  n_samples: 4\n"}
    for name, text in files.items():
        (tmp_path / name).write_text(text)
    assert "not an AReaL experiment" in coverage.areal_kind(tmp_path / "sky.yaml")
    assert "SFT, reward-model or DPO" in coverage.areal_kind(tmp_path / "sft.yaml")
    assert coverage.areal_kind(tmp_path / "grpo.yaml") is None


def test_an_areal_example_without_a_prompt_cap_is_priced_with_the_stand_in(tmp_path):
    """AReaL keeps every prompt where train_dataset.max_length is unset; realbench would price them at
    gconfig.max_tokens less max_new_tokens, rows no micro-batch of the example holds. The bench gives
    such an example the stand-in cap (1,024 tokens, as AReaL's math examples set), and only such a one."""
    from test_engine_areal import GSM8K_GRPO

    root = tmp_path / "examples"
    (root / "math").mkdir(parents=True)
    capped = root / "math" / "grpo capped.yaml"
    example = GSM8K_GRPO.replace("path: ckpt", "path: Qwen/Qwen3-0.6B")  # (a hub id: its catalogue stand-in)
    capped.write_text(example)
    uncapped = root / "math" / "boba grpo.yaml"
    uncapped.write_text(example.replace("  max_length: 1024\n", "", 1)
                        .replace("max_tokens: 2048", "max_tokens: 32768", 1).replace("max_tokens_per_mb: 10240", "max_tokens_per_mb: 4096"))
    assert coverage.prompt_cap_stand_in(capped) == []
    assert coverage.prompt_cap_stand_in(uncapped) == ["train_dataset.max_length=1024"]
    work = tmp_path / "work"
    work.mkdir()
    assert coverage.examine("areal", uncapped, root, work).status == "priced"
    from realbench.engines import import_config
    from realbench.errors import ConfigError

    with pytest.raises(ConfigError) as e:  # as a user's import without the cap reads it
        import_config("areal", str(uncapped), ["train_dataset.path=data", "actor.path=qwen3-0.6b"],
                      str(tmp_path / "out"), name="job")
    assert e.value.field == "train_dataset.max_length" and "set it to the data's longest prompt" in e.value.message


def test_a_refusal_is_stored_as_its_user_reads_it_without_this_machines_paths():
    """A script's sandbox home and this machine's home become `~`, a required variable's path its
    `$NAME`; the stored measurement holds neither machine's paths."""
    import tempfile

    sandbox = f"{tempfile.gettempdir()}/run1a2b"
    assert coverage.as_user_reads(f"'{sandbox}/home/models/Qwen3-8B': no such folder") == "'~/models/Qwen3-8B': no such folder"
    assert coverage.as_user_reads(f"'{sandbox}/lora_adapter_path' is not") == "'$LORA_ADAPTER_PATH' is not"
    home = os.path.expanduser("~")
    assert coverage.as_user_reads(f"not in the local cache ({home}/.cache/huggingface/hub)") == \
        "not in the local cache (~/.cache/huggingface/hub)"
    stored = (Path(__file__).parents[1] / "docs" / "measurements" / "data" / "bench-coverage.json").read_text()
    assert home + "/" not in stored and tempfile.gettempdir() + "/" not in stored
