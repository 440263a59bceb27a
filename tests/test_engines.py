"""verl 0.9.1's configurations read into plans, plans written as its configurations, and what
realbench writes checked by verl's own code (composition, validate_config and its config
dataclasses) in verl's own environment (`make engines`: .venv-verl)."""

import json
import math
import os
import shlex
import subprocess
from pathlib import Path

import pytest
import yaml

from engine_checks import CheckServer
from realbench.engines import verl
from realbench.plan.mesh import Mesh, Option, Strategy

ROOT = Path(__file__).resolve().parent.parent
VERL_PYTHON = Path(os.environ.get("REALBENCH_VERL_PYTHON", ROOT / ".venv-verl" / "bin" / "python"))
CHECK = ROOT / "realbench" / "engines" / "verl" / "check.py"

GRPO = """\
hydra:
  searchpath: [pkg://verl.trainer.config]
defaults: [ppo_trainer, _self_]
trainer: {nnodes: 1, n_gpus_per_node: 8}
data: {train_batch_size: 32, max_prompt_length: 64, max_response_length: 128}
algorithm: {adv_estimator: grpo}
actor_rollout_ref:
  model: {path: ckpt}
  actor: {ppo_mini_batch_size: 8, ppo_micro_batch_size_per_gpu: 4, use_kl_loss: true}
  rollout: {name: vllm, n: 4, tensor_model_parallel_size: 2, log_prob_micro_batch_size_per_gpu: 4}
  ref: {log_prob_micro_batch_size_per_gpu: 8}
reward:
  custom_reward_function: {path: scoring/reward.py}
"""

PPO_MEGATRON = """\
hydra:
  searchpath: [pkg://verl.trainer.config]
defaults:
  - ppo_trainer
  - override model_engine: megatron
  - _self_
trainer: {nnodes: 2, n_gpus_per_node: 8}
data: {train_batch_size: 64, max_prompt_length: 64, max_response_length: 192}
algorithm: {adv_estimator: gae, use_kl_in_reward: true}
actor_rollout_ref:
  model: {path: ckpt}
  actor:
    ppo_mini_batch_size: 16
    ppo_micro_batch_size_per_gpu: 2
    megatron:
      tensor_model_parallel_size: 2
      pipeline_model_parallel_size: 2
      virtual_pipeline_model_parallel_size: 2
      override_transformer_config: {recompute_granularity: full, recompute_method: uniform, recompute_num_layers: 1}
  rollout: {name: vllm, tensor_model_parallel_size: 2, max_num_seqs: 8, log_prob_micro_batch_size_per_gpu: 2}
  ref: {log_prob_micro_batch_size_per_gpu: 4}
critic:
  model: {path: ckpt}
  ppo_micro_batch_size_per_gpu: 2
  megatron: {tensor_model_parallel_size: 2, pipeline_model_parallel_size: 2, virtual_pipeline_model_parallel_size: 2}
reward:
  custom_reward_function: {path: scoring/reward.py}
"""


PPO_REWARD_MODEL = """\
hydra:
  searchpath: [pkg://verl.trainer.config]
defaults: [ppo_trainer, _self_]
trainer: {nnodes: 1, n_gpus_per_node: 8}
data: {train_batch_size: 32, max_prompt_length: 64, max_response_length: 128}
algorithm: {use_kl_in_reward: true}
actor_rollout_ref:
  model: {path: ckpt}
  actor: {ppo_mini_batch_size: 8, ppo_micro_batch_size_per_gpu: 1}
  rollout: {name: vllm, tensor_model_parallel_size: 2, log_prob_micro_batch_size_per_gpu: 4}
  ref: {log_prob_micro_batch_size_per_gpu: 2}
critic:
  model: {path: ckpt}
  ppo_micro_batch_size_per_gpu: 1
reward:
  reward_model: {enable: true, model_path: ckpt, rollout: {name: vllm, tensor_model_parallel_size: 1, max_num_seqs: 2}}
"""


OPTIMIZER_OFFLOAD = ("actor_rollout_ref.actor.fsdp_config.optimizer_offload=true", "critic.fsdp.optimizer_offload=true")
PARAM_OFFLOAD = ("actor_rollout_ref.actor.fsdp_config.param_offload=true", "critic.fsdp.param_offload=true")
# Megatron's, the reference's with the actor's (it follows the actor's unless set)
MEGATRON_OFFLOAD = ("actor_rollout_ref.actor.megatron.param_offload=true", "critic.megatron.optimizer_offload=true")
# FSDP2 for both trained roles (the reference's follows the actor's), carried as set
FSDP2 = ("actor_rollout_ref.actor.strategy=fsdp2", "critic.strategy=fsdp2")
BYPASS = ("algorithm.rollout_correction.bypass_mode=true", "actor_rollout_ref.rollout.calculate_log_probs=true")
SGLANG = ("actor_rollout_ref.rollout.name=sglang", "reward.reward_model.rollout.name=sglang")
MEMORY = "actor_rollout_ref.rollout.gpu_memory_utilization=0.7"
# the weight sync's buffer a GPU (verl's examples/grpo_trainer/run_qwen3_4b_fsdp.sh sets 4096 MB)
BUCKET = "actor_rollout_ref.rollout.checkpoint_engine.update_weights_bucket_megabytes=4096"
# a keyword argument of the chat template, added as Qwen3 jobs add it
THINKING = "+data.apply_chat_template_kwargs.enable_thinking=false"
# open dicts of verl's config a job adds to (Hydra's +): the reward manager's keyword arguments
# (DAPO's overlong penalty), and FSDP's mixed precision at verl's own dtypes
OPEN_DICTS = ("+reward.reward_kwargs.overlong_buffer_cfg.enable=true", "+reward.reward_kwargs.max_resp_len=256",
              "+actor_rollout_ref.actor.fsdp_config.mixed_precision.param_dtype=bfloat16",
              # (the gradients reduced in bf16, as verl's Qwen3-Next examples set it: what realbench prices)
              "+actor_rollout_ref.actor.fsdp_config.mixed_precision.reduce_dtype=bf16")
# verl's fused kernels, with the entropy settings of verl's GSPO example
# (examples/gspo_trainer/run_qwen3_8b_fsdp.sh), which the kernels or the reference make moot
FUSED = "actor_rollout_ref.model.use_fused_kernels=true"
GSPO_ENTROPY = ("actor_rollout_ref.actor.use_torch_compile=false", "actor_rollout_ref.actor.entropy_checkpointing=true",
                "actor_rollout_ref.actor.entropy_from_logits_with_chunking=true",
                "actor_rollout_ref.ref.use_torch_compile=false")
# GSPO's sequence-level policy loss (the same example), carried as given
GSPO_LOSS = "actor_rollout_ref.actor.policy_loss.loss_mode=gspo"
# no reward function named (and no reward model): verl scores with its built-in rule-based scorers
BUILTIN_SCORER = "reward.custom_reward_function.path=null"
DYNAMIC = ("actor_rollout_ref.actor.use_dynamic_bsz=true", "actor_rollout_ref.actor.ppo_max_token_len_per_gpu=384")
# Ulysses: the actor's (the reference's follows it), or each role's engine its own
ULYSSES = ("actor_rollout_ref.actor.ulysses_sequence_parallel_size=2",)
# Megatron's context parallelism: the actor's (the reference's block follows it) and the critic's,
# one process-global size
CONTEXT_PARALLEL = ("actor_rollout_ref.actor.megatron.context_parallel_size=2", "critic.megatron.context_parallel_size=2")
ULYSSES_EACH = ("actor_rollout_ref.actor.fsdp_config.ulysses_sequence_parallel_size=4",
                "critic.fsdp.ulysses_sequence_parallel_size=2")
# FSDP's hybrid sharding: the actor's state within groups of 4 GPUs, the critic's of 2 (the reference's: all 8)
HSDP = ("actor_rollout_ref.actor.fsdp_config.fsdp_size=4", "critic.fsdp.fsdp_size=2")
# verl's LoRA sync a layer at a time, and vLLM's CUDA graphs of the decode step alone (carried)
LAYERED = "actor_rollout_ref.rollout.layered_summon=true"
CUDAGRAPH = "+actor_rollout_ref.rollout.engine_kwargs.vllm.compilation_config.cudagraph_mode=FULL_DECODE_ONLY"
# the decode batches vLLM captures, all of a replica's 16 decoding together (carried)
CAPTURED = ("actor_rollout_ref.rollout.cudagraph_capture_sizes=[8,16]", "actor_rollout_ref.rollout.max_num_seqs=16")
LORA = ("actor_rollout_ref.model.lora_rank=8", "actor_rollout_ref.model.lora_alpha=16",
        "actor_rollout_ref.model.target_modules=[q_proj,v_proj]")


def assert_import_refused(cli, folder, config, overrides, key, says, out="refused"):
    """`realbench import verl` of `config` with `overrides`, run in `folder`: one line naming `key` and
    saying `says`, exit 2, and nothing written to `out`."""
    os.chdir(folder)
    code, _, err = cli("import", "verl", config, *overrides, "--out", out)
    assert code == 2 and err.count("\n") == 1 and key in err and says in err, err
    assert not (folder / out).exists()


@pytest.fixture(scope="module")
def job(tmp_path_factory):
    """A user's verl job folder: a checkpoint, a reward function of verl's form, two configs
    (GRPO on FSDP, PPO on Megatron), named as a user names them."""
    from realbench.examples import save_model

    folder = tmp_path_factory.mktemp("my verl job")
    save_model(folder / "ckpt", max_position_embeddings=32_768)  # (Qwen2.5's positions)
    (folder / "scoring").mkdir()
    (folder / "scoring" / "reward.py").write_text(
        "def compute_score(data_source, solution_str, ground_truth, extra_info=None):\n"
        "    return float(ground_truth in solution_str)\n")
    (folder / "grpo_qwen_fsdp.yaml").write_text(GRPO)
    (folder / "ppo megatron.yaml").write_text(PPO_MEGATRON)
    (folder / "ppo-rm.yaml").write_text(PPO_REWARD_MODEL)
    return folder


@pytest.fixture(scope="module")
def verl_check():
    """verl's own checks (verl_check.py's commands), verl imported once for the module."""
    server = CheckServer(VERL_PYTHON, CHECK)
    yield server
    server.close()


def imported(cli, job, config, *overrides, out="plans", name=None):
    """Import from the job folder (verl takes paths relative to where it is launched)."""
    os.chdir(job)
    code, stdout, err = cli("import", "verl", config, *overrides, "--out", out, "--json",
                            *(("--name", name) if name else ()), "--force")
    assert code == 0, err
    result = json.loads(stdout)
    return result, yaml.safe_load(Path(result["plan"]).read_text()), yaml.safe_load(Path(result["scenario"]).read_text())


@pytest.fixture(autouse=True)
def _keep_cwd():
    here = os.getcwd()
    yield
    os.chdir(here)


def test_the_settings_table_is_verls_own_composition(verl_check):
    """realbench reads verl's settings against verl-0.9.1.json; the installed verl composes the
    same keys with the same defaults (for both training engines)."""
    got = verl_check("defaults")
    assert got == json.loads(verl.TABLE.read_text())
    assert got["verl"] == verl.VERSION


def test_an_fsdp_grpo_config_reads_into_the_plan_verl_runs(cli, job):
    """32 prompts x 4 samples = 128 rows on 8 GPUs: FSDP trains with dp 8, zero 3, each GPU's
    128 / 4 steps / 8 = 4 rows a step in micro-batches of 4 (1); the reference's 128 / 8 = 16
    rows in micro-batches of 8 (2); vLLM replicas of tp 2 (4 of them) decode their 32 rows
    together (max_num_seqs 256: 1 batch); gradient checkpointing is verl's default."""
    result, plan, scenario = imported(cli, job, "grpo_qwen_fsdp.yaml")
    assert plan["calls"] == {
        # (the rollout's share of each GPU's memory, the plan's choice: its gpu_memory_utilization)
        "actor_gen": {"mesh": "n0", "dp": 4, "tp": 2, "pp": 1, "micro_batches": 1, "memory_fraction": 0.5},
        "actor_train": {"mesh": "n0", "dp": 8, "tp": 1, "pp": 1, "micro_batches": 1, "activation_checkpointing": True,
                        "zero": 3},
        # the reference's parameters in host memory: verl's FSDP offloads a forward-only model
        "ref_inf": {"mesh": "n0", "dp": 8, "tp": 1, "pp": 1, "micro_batches": 2, "zero": 3, "offload_params": True},
        "reward_inf": {"mesh": "n0", "dp": 8, "tp": 1, "pp": 1, "micro_batches": 1},
    }
    # rollout.max_model_len unset: verl gives vLLM the checkpoint's max_position_embeddings, 32,768
    assert scenario["dataflow"] == {"algorithm": "grpo", "prompts": 32, "prompt_len": 64, "gen_len": 128,
                                    "minibatches": 4, "group_size": 4, "memory_fraction": 0.5, "max_model_len": 32_768}
    assert scenario["engine"] == "verl" and scenario["cluster"] == {"nodes": 1, "gpus_per_node": 8, "device": "h100"}
    assert scenario["models"]["actor"]["path"] == str(job / "ckpt")
    assert scenario["models"]["reward"]["function"] == f"{job / 'scoring' / 'reward.py'}:compute_score"
    # (what is not priced, as this plan meets it: no reward pool, no teacher, no offloaded actor)
    assert result["time_per_iter_s"] > 0 and result["not_priced"] == [verl.pricing.DYNAMIC_GAP,
                                                                       verl.pricing.SERVING_GAP]
    # overrides as on verl's command line, resolved as verl resolves them: the reference's packing
    # follows the actor's (interpolations of ref.log_prob_use_dynamic_bsz and its token budget)
    _, plan, _ = imported(cli, job, "grpo_qwen_fsdp.yaml", "actor_rollout_ref.rollout.max_num_seqs=8",
                          "actor_rollout_ref.actor.use_dynamic_bsz=true",
                          "actor_rollout_ref.actor.ppo_max_token_len_per_gpu=384")
    assert plan["calls"]["actor_gen"]["micro_batches"] == 32 // 8
    assert plan["calls"]["actor_train"]["micro_batches"] == 4 * 192 // 384
    assert plan["calls"]["ref_inf"]["micro_batches"] == 16 * 192 // 384
    # verl's examples set the reference's param_offload, which its FSDP engine does to a reference anyway
    _, same, _ = imported(cli, job, "grpo_qwen_fsdp.yaml", "actor_rollout_ref.ref.fsdp_config.param_offload=true")
    assert same["calls"]["ref_inf"]["offload_params"] is True


def test_a_vllm_rollout_starts_where_its_cache_holds_one_request_of_its_context(cli, job, tmp_path):
    """vLLM starts only where its KV cache holds one request of its max_model_len (verl's default:
    the checkpoint's positions, 65,536 for this one). At the share of each GPU that leaves a cache
    of 32,768 tokens, a sequence (192) fits but 65,536 do not: refused, naming max_model_len; at
    max_model_len 32,768 it imports. SGLang starts with less: the same share imports with it."""
    import shutil

    from realbench.cost.calls import serving_cache_tokens
    from realbench.plan import load_plan
    from realbench.plan.options import decode_slots

    long = tmp_path / "long context"
    shutil.copytree(job / "ckpt", long)
    config = json.loads((long / "config.json").read_text())
    (long / "config.json").write_text(json.dumps({**config, "max_position_embeddings": 65_536}))
    given = (f"actor_rollout_ref.model.path={long}", "actor_rollout_ref.rollout.checkpoint_engine.update_weights_bucket_megabytes=1")
    result, _, read = imported(cli, job, "grpo_qwen_fsdp.yaml", *given)
    assert read["dataflow"]["max_model_len"] == 65_536
    _, scenario, options = load_plan(result["plan"])
    gen = scenario.dataflow.call("actor_gen")
    tokens = [serving_cache_tokens(gen.model_copy(update={"memory_fraction": f}), scenario.model_of(gen),
                                   scenario.cluster, 2, decode_slots(gen, options["actor_gen"])) for f in (0.5, 1.0)]
    share = 0.5 + (32_768.5 - tokens[0]) * 0.5 / (tokens[1] - tokens[0])  # (the cache grows with the share, linearly)
    memory = f"actor_rollout_ref.rollout.gpu_memory_utilization={share!r}"
    code, _, err = cli("import", "verl", "grpo_qwen_fsdp.yaml", *given, memory, "--out", "plans", "--force")
    assert code == 2 and "actor_rollout_ref.rollout.max_model_len: 65536:" in err, err
    assert "holds 32768 tokens a replica of tp 2, fewer than one request of max_model_len 65536" in err, err
    _, _, read = imported(cli, job, "grpo_qwen_fsdp.yaml", *given, memory, "actor_rollout_ref.rollout.max_model_len=32768")
    assert read["dataflow"]["max_model_len"] == 32_768
    _, _, read = imported(cli, job, "grpo_qwen_fsdp.yaml", *given, memory, "actor_rollout_ref.rollout.name=sglang")
    assert "max_model_len" not in read["dataflow"]


def test_a_launch_script_composed_by_verls_own_hydra_imports_scored_by_verls_own_scorers(cli, job):
    """A launch script as verl's examples write them (overrides, then "$@"), run with Hydra's
    `--cfg job`, prints the configuration verl 0.9.1's main_ppo composes without starting the
    job; that file imports. It names no reward function and no reward model: verl scores with its
    own rule-based scorers, which the scenario names by realbench's stand-in."""
    script = job / "run grpo gsm8k.sh"
    script.write_text(f"#!/usr/bin/env bash\nset -e\n{shlex.quote(str(VERL_PYTHON))} -m verl.trainer.main_ppo "
                      "algorithm.adv_estimator=grpo data.train_batch_size=32 data.max_prompt_length=64 "
                      "data.max_response_length=128 actor_rollout_ref.model.path=ckpt "
                      "actor_rollout_ref.actor.ppo_mini_batch_size=8 actor_rollout_ref.actor.use_dynamic_bsz=true "
                      "actor_rollout_ref.actor.use_kl_loss=true actor_rollout_ref.rollout.name=vllm "
                      "actor_rollout_ref.rollout.n=4 actor_rollout_ref.rollout.tensor_model_parallel_size=2 "
                      "trainer.n_gpus_per_node=8 trainer.nnodes=1 \"$@\"\n")
    done = subprocess.run(["bash", str(script), "--cfg", "job"], capture_output=True, text=True, cwd=job, timeout=300)
    assert done.returncode == 0, done.stderr
    (job / "composed.yaml").write_text(done.stdout)
    _, plan, scenario = imported(cli, job, "composed.yaml")
    assert scenario["models"]["reward"] == {"function": verl.BUILTIN_REWARD}
    assert scenario["dataflow"]["prompts"] == 32 and scenario["dataflow"]["group_size"] == 4
    assert plan["calls"]["actor_gen"] == {"mesh": "n0", "dp": 4, "tp": 2, "pp": 1, "micro_batches": 1,
                                          "memory_fraction": 0.5}
    assert plan["calls"]["actor_train"]["max_tokens"] == 16384  # (verl's default budget)


def test_overrides_add_keys_as_hydra_adds_them(cli, job):
    """`++key=value` sets a key verl's config holds (Hydra's add or override); `+` adds Megatron's
    override_transformer_config fields, which Hydra adds (verl's examples do: the recompute ones
    here, Megatron's full recomputation) and refuses on a key the config holds (the refusal test)."""
    _, plan, _ = imported(cli, job, "grpo_qwen_fsdp.yaml", "++actor_rollout_ref.actor.use_dynamic_bsz=true",
                          "++actor_rollout_ref.actor.ppo_max_token_len_per_gpu=384")
    assert plan["calls"]["actor_train"]["max_tokens"] == 384
    recompute = [f"+actor_rollout_ref.actor.megatron.override_transformer_config.{k}={v}"
                 for k, v in (("recompute_granularity", "full"), ("recompute_method", "uniform"),
                              ("recompute_num_layers", 1))]
    _, plain, _ = imported(cli, job, "grpo_qwen_fsdp.yaml", "model_engine=megatron")
    _, recomputed, _ = imported(cli, job, "grpo_qwen_fsdp.yaml", "model_engine=megatron", *recompute)
    assert plain["calls"]["actor_train"].get("activation_checkpointing", False) is False
    assert recomputed["calls"]["actor_train"]["activation_checkpointing"] is True


@pytest.mark.parametrize("overrides, says", [
    # 0.02 of an 80 GiB H100 is 1.6 GiB (the tiny model's weights a few hundred kB), less than the
    # default 2048 MB buffer and the largest tensor (6 bytes x 176 x 64): refused
    (("actor_rollout_ref.rollout.gpu_memory_utilization=0.02",),
     "2048 MB: verl's weight sync holds its buffer and the largest tensor gathered (2.0 GiB a GPU) beside the rollout's "
     "weights, more than the KV cache it runs without (1.6 GiB at gpu_memory_utilization 0.02, tp 2)"),
    (("actor_rollout_ref.rollout.gpu_memory_utilization=0.02",
      "actor_rollout_ref.rollout.checkpoint_engine.update_weights_bucket_megabytes=1024"), None),
    (("actor_rollout_ref.rollout.gpu_memory_utilization=0.03",), None),  # (2.4 GiB)
    (("actor_rollout_ref.rollout.gpu_memory_utilization=0.03", BUCKET),
     "4096 MB: verl's weight sync holds its buffer and the largest tensor gathered (4.0 GiB a GPU)"),
])
def test_the_weight_syncs_buffer_must_fit_in_the_cache_it_runs_without(cli, job, overrides, says):
    """verl syncs the weights with the rollout's KV cache released (resume weights, send them
    through its buffer, resume the cache): realbench prices the generation's share of each GPU,
    and a buffer that would outgrow the cache it replaces is refused by name (the sync would set
    the peak); one that fits is read, carried and priced as the same plan."""
    os.chdir(job)
    code, out, err = cli("import", "verl", "grpo_qwen_fsdp.yaml", *overrides, "--out", "sync", "--force", "--json")
    if says is None:
        assert code == 0, err
        carried = yaml.safe_load(Path(json.loads(out)["scenario"]).read_text()).get("engine_settings", {})
        assert carried.get(verl.BUCKET) == (1024 if any(o.endswith("=1024") for o in overrides) else None)
    else:
        assert code == 2 and err.count("\n") == 1, err
        assert verl.BUCKET in err and says in err, err


def test_the_search_offers_only_rollout_layouts_whose_sync_buffer_fits_worked_by_hand():
    """grpo-7b-16gpu as verl runs it, its rollout taking 0.1 of each 80 GiB GPU (8,589,934,592 B).
    The sync needs the 2048 MB buffer (2,147,483,648 B) and the largest tensor, the embedding's
    32,000 x 4,096 at 6 bytes (786,432,000 B): 2,933,915,648 B, 2.7 GiB. At rollout tp 2 the
    weights are 6,738,415,616 B (LLaMA-7B in bf16 over 2), the cache 1,851,518,976 B (1.7 GiB):
    refused; at tp 4, 3,369,207,808 B of weights leave 5,220,726,784 B: it fits. The search offers
    tp 4 and 8 at that share, tp 1 and 2 from the least share it offers above it (0.3: 25,769,803,776
    B, the cache of tp 2 19,031,388,160 B), never below: tp 1's weights (13,476,831,232 B) outgrow
    0.1, and its server would not start. tp 16, a replica over both nodes (a serving engine's tp may
    span whole nodes), fits at 0.1 as tp 8 does."""
    from realbench.cost.calls import serving_cache_problem
    from realbench.engines import priced_as
    from realbench.plan.builtin import BUILTIN
    from realbench.plan.scenario import scenario_from_document

    scenario = priced_as(scenario_from_document({"schema": "realbench.scenario/1", **BUILTIN["grpo-7b-16gpu"]}),
                         "verl").with_memory_fraction(0.1)
    whole = Mesh(0, 2, 0, 8)
    assert verl.sync_buffer_problem(scenario, {"actor_gen": Option(whole, Strategy(8, 2, 1))}) == (
        verl.BUCKET, "2048 MB: verl's weight sync holds its buffer and the largest tensor gathered (2.7 GiB a GPU) "
        "beside the rollout's weights, more than the KV cache it runs without (1.7 GiB at gpu_memory_utilization 0.1, "
        "tp 2): the sync would set the peak, which realbench does not price (a smaller buffer, or a larger memory "
        "share)")
    assert verl.sync_buffer_problem(scenario, {"actor_gen": Option(whole, Strategy(4, 4, 1))}) is None
    least: dict[int, float] = {}
    for g in verl.plan_groups(scenario):
        for o in g["actor_gen"]:
            least[o.strategy.tp] = min(least.get(o.strategy.tp, 1.0), o.strategy.memory_fraction)
    assert least == {1: 0.3, 2: 0.3, 4: 0.1, 8: 0.1, 16: 0.1}
    gen = scenario.dataflow.call("actor_gen")
    assert serving_cache_problem(gen, scenario.model_of(gen), scenario.cluster, Strategy(16, 1, 1)) is not None


def test_the_search_offers_each_servers_least_share_of_each_slot_count_worked_by_hand():
    """ppo-7b-7b-16gpu's 512 rows of 1024 tokens on one replica of tp 2 (LLaMA-7B on 80 GiB H100s):
    at a share f the cache holds (f x 85,899,345,920 - 6,738,415,616 of weights - 184,549,376 of
    activations - 32,768,000 of logits) / 262,144 tokens, 71,770 at 0.3 and 32,768 more a tenth,
    so 70, 102, 134, 166, 198, 230 and 262 sequences of 1024 from 0.3 to 0.9: each share its own
    count, all offered. In 4 micro-batches the server admits at most 128: 0.5 and above give 128,
    so 0.3, 0.4 and 0.5 are offered. Shares the caller's check refuses are left out."""
    from realbench.cost.calls import serving_slots
    from realbench.engines import priced_as
    from realbench.engines.listing import served_shares
    from realbench.plan import load_scenario

    scenario = priced_as(load_scenario("ppo-7b-7b-16gpu"), "verl")
    gen = scenario.dataflow.call("actor_gen")
    assert gen.memory_fraction == verl.MEMORY_FRACTION == 0.5  # (verl's default, in the searched ones)

    def offered(m: int, fits=None) -> dict[float, int]:
        shares = served_shares(scenario, Option(Mesh(0, 1, 0, 2), Strategy(1, 2, 1, m)), fits)
        return {o.strategy.memory_fraction: serving_slots(gen, scenario.model_of(gen), scenario.cluster, o)
                for o in shares}

    assert offered(1) == {0.3: 70, 0.4: 102, 0.5: 134, 0.6: 166, 0.7: 198, 0.8: 230, 0.9: 262}
    assert offered(4) == {0.3: 70, 0.4: 102, 0.5: 128}
    assert offered(4, lambda o: o.strategy.memory_fraction >= 0.4) == {0.4: 102, 0.5: 128}


def test_a_plans_share_is_raised_to_the_largest_that_fits_and_takes_no_longer():
    """The engines' searches offer each slot count at its least share; the plan they return takes
    the largest share offered that fits and is no slower (search.engine.widest_share). verl's default
    plan of ppo-7b-7b-16gpu-long (rollout tp 2, 64 rows a replica): 8 slots at 0.3, 12 at 0.4
    (slower: the rows' waves), 16 at 0.5 and 0.6, and from 0.7 the colocated plan does not fit. From
    0.3 or 0.5 the plan is raised to 0.6; grpo-7b-16gpu's (64 slots at every share) to 0.7, where
    0.8 does not fit; a plan without a share is left as it is."""
    from dataclasses import replace

    from realbench.cost import Estimator
    from realbench.engines import priced_as
    from realbench.plan import load_scenario
    from realbench.search.engine import plan_time, widest_share

    def at(options, share):
        g = options["actor_gen"]
        return {**options, "actor_gen": Option(g.mesh, replace(g.strategy, memory_fraction=share))}

    def time_of(scenario, options):
        return plan_time(Estimator(scenario, only={n: [o] for n, o in options.items()}), options)

    long = priced_as(load_scenario("ppo-7b-7b-16gpu-long"), "verl")
    plan = verl.default_plan(long)
    times = {f: time_of(long, at(plan, f)) for f in (0.3, 0.4, 0.5, 0.6, 0.7)}
    assert times[0.4] > times[0.3] > times[0.5] == times[0.6] and times[0.7] == math.inf, times
    for start in (0.3, 0.4, 0.5):
        raised = widest_share(long, at(plan, start), times[start])
        assert raised["actor_gen"].strategy.memory_fraction == 0.6
        assert {n: o for n, o in raised.items() if n != "actor_gen"} == {n: o for n, o in plan.items() if n != "actor_gen"}
    grpo = priced_as(load_scenario("grpo-7b-16gpu"), "verl")
    plan = verl.default_plan(grpo)
    t = time_of(grpo, at(plan, 0.3))
    assert time_of(grpo, at(plan, 0.7)) == t and time_of(grpo, at(plan, 0.8)) == math.inf
    assert widest_share(grpo, at(plan, 0.3), t)["actor_gen"].strategy.memory_fraction == 0.7
    assert plan["actor_gen"].strategy.memory_fraction is None and widest_share(grpo, plan, t) == plan


def test_an_engines_search_starts_from_the_leanest_plan_where_the_first_does_not_fit():
    """verl's default plan of ppo-7b-7b-16gpu-long with its rollout offered in tp 2 at 0.7 of each
    GPU's memory first (fits alone, but beside the trainer's state the plan does not: the test
    above), then in tp 4 at 0.3: the search starts from each call's leanest option, the second,
    which fits; the first plan is the next start. (They are different layouts: neither stands in
    for the other where the space prunes.)"""
    from dataclasses import replace

    from realbench.cost import Estimator
    from realbench.engines import priced_as
    from realbench.plan import load_scenario
    from realbench.plan.mesh import Strategy
    from realbench.search.space import SearchSpace

    long = priced_as(load_scenario("ppo-7b-7b-16gpu-long"), "verl")
    plan = verl.default_plan(long)
    g = plan["actor_gen"]
    assert (g.strategy.dp, g.strategy.tp) == (8, 2)
    rollouts = [Option(g.mesh, replace(g.strategy, memory_fraction=0.7)),
                Option(g.mesh, Strategy(4, 4, 1, 1, memory_fraction=0.3))]
    est = Estimator(long, only={**{n: [o] for n, o in plan.items()}, "actor_gen": rollouts})
    space = SearchSpace(est)
    gen = est.call_names.index("actor_gen")
    assert list(space.candidates[gen]) == [0, 1]  # (each fits alone)
    starts = space.plain_starts()
    assert [est.options_of(c)["actor_gen"] for c in starts] == rollouts[::-1]
    assert est.evaluate(starts[0])[1] <= est.capacity < est.evaluate(starts[1])[1]


def test_a_critic_budget_verls_trainer_does_not_read_is_priced_as_verl_runs_and_said(cli, job):
    """verl's own PPO examples set critic.ppo_max_token_len_per_gpu (24576 in
    examples/ppo_trainer/run_qwen3_8b_fsdp.sh), which verl 0.9.1's trainer does not read: it packs
    both critic calls to critic.ppo_infer_max_token_len_per_gpu (512 here). The import prices the
    budget verl packs to, the same plan and estimate as without the setting, and says which setting
    verl ignores and what it reads instead."""
    ignored = ("critic.ppo_max_token_len_per_gpu=24576", "critic.forward_max_token_len_per_gpu=4096")
    base, plan, _ = imported(cli, job, "ppo megatron.yaml", "+critic.ppo_infer_max_token_len_per_gpu=512")
    result, same, _ = imported(cli, job, "ppo megatron.yaml", "+critic.ppo_infer_max_token_len_per_gpu=512", *ignored)
    assert same["calls"] == plan["calls"] and same["calls"]["critic_train"]["max_tokens"] == 512
    assert result["time_per_iter_s"] == base["time_per_iter_s"] and base["unread_by_engine"] == []
    assert [u.split(":")[0] for u in result["unread_by_engine"]] == sorted(ignored)
    assert all("critic.ppo_infer_max_token_len_per_gpu=512" in u for u in result["unread_by_engine"])
    code, out, err = cli("import", "verl", "ppo megatron.yaml", "+critic.ppo_infer_max_token_len_per_gpu=512",
                         ignored[0], "--out", "said", "--force")
    assert code == 0, err
    assert f"not read by verl: {ignored[0]}: verl 0.9.1's trainer does not read it" in out


def test_verls_fused_kernels_are_priced_a_chunk_at_a_time_as_measured_in_verls_own_code(cli, job, verl_check):
    """use_fused_kernels: verl's FusedLinearForPPO computes 512 tokens' logits at a time, never the
    micro-batch's; its peak, measured running verl's own kernels, is what realbench prices (12 bytes
    a chunk's logit in a forward, 20 in training, 28 with the entropy's gradient). The import prices
    both the actor's and the reference's calls so, holds less at the actor's peak than without, and
    says which of the GSPO example's entropy settings verl reads to no effect: the role-level
    torch.compile (verl's own composition leaves the engine's on) and the entropy's chunking under the
    kernels, the reference's (no entropy)."""
    for mode, entropy, priced in (("forward", "entropy", verl.FUSED_FORWARD_BYTES),
                                  ("train", "none", verl.FUSED_TRAIN_BYTES_NO_ENTROPY),
                                  ("train", "entropy", verl.FUSED_TRAIN_BYTES)):
        measured = verl_check("fused", mode, entropy)
        assert measured["chunk_tokens"] == verl.FUSED_CHUNK and measured["allocations"] > 0, measured
        assert measured["bytes_per_chunk_logit"] == pytest.approx(priced, rel=0.02), (mode, entropy, measured)
    base, _, _ = imported(cli, job, "grpo_qwen_fsdp.yaml")
    result, plan, scenario = imported(cli, job, "grpo_qwen_fsdp.yaml", FUSED, *GSPO_ENTROPY,
                                      "actor_rollout_ref.ref.entropy_from_logits_with_chunking=true")
    path = {"forward_bytes": 12.0, "moved_bytes": 62.0, "chunk_tokens": 512, "recomputed": True}
    assert scenario["training"]["logits"] == {"actor_train": {**path, "train_bytes": 20.0}, "ref_inf": path}
    assert [u.split(":")[0] for u in result["unread_by_engine"]] == [
        "actor_rollout_ref.actor.entropy_checkpointing=True", "actor_rollout_ref.actor.entropy_from_logits_with_chunking=True",
        "actor_rollout_ref.actor.use_torch_compile=False", "actor_rollout_ref.ref.entropy_from_logits_with_chunking=True",
        "actor_rollout_ref.ref.use_torch_compile=False"]
    checked = verl_check("validate", job / "grpo_qwen_fsdp.yaml", FUSED, *GSPO_ENTROPY)
    assert checked["engine_use_torch_compile"] is True and checked["use_fused_kernels"] is True
    # the search inside verl offers FSDP layouts only (the kernels realbench prices are FSDP's)
    from realbench.plan import load_scenario

    fused = load_scenario(result["scenario"])
    assert {o.strategy.zero for g in verl.plan_groups(fused) for o in g["actor_train"]} == {2, 3}
    megatron = next(g for g in verl.plan_groups(fused.without_logits()) if g["actor_train"][0].strategy.zero < 2)
    assert verl.space_problem(fused, {name: options[0] for name, options in megatron.items()})[0] == \
        "calls.actor_train.zero"
    # priced as another engine runs it: that engine's own way of computing the logits (realbench's default)
    from realbench.engines import priced_as

    other = priced_as(fused, "openrlhf")
    assert other.training.logits == {} and all(c.logits is None for c in other.dataflow.calls)
    assert priced_as(fused, "verl").dataflow.call("actor_train").logits.chunk_tokens == 512
    # without the kernels the chunked entropy shapes only the actor's forward for its old
    # log-probabilities, which never holds more than its update: priced as verl's default, unsaid
    chunked, same_plan, chunked_scenario = imported(cli, job, "grpo_qwen_fsdp.yaml",
                                                    "actor_rollout_ref.actor.entropy_from_logits_with_chunking=true")
    assert "logits" not in chunked_scenario["training"] and chunked["unread_by_engine"] == []
    assert chunked["time_per_iter_s"] == base["time_per_iter_s"] and chunked["peak_mem_bytes"] == base["peak_mem_bytes"]


def test_hybrid_sharding_is_read_from_fsdp_size_priced_within_a_node_and_searched(cli, job):
    """fsdp_size 8 on 2 nodes of 8 (verl's Qwen3.5 FSDP examples set it): verl builds a (2, 8) mesh
    and HYBRID_SHARD for the actor, read as shard_group 8 on its update only (the reference keeps
    its own fsdp_size, -1). On LLaMA-7B (grpo-7b-16gpu as verl runs it) the actor holds its state
    over 8 GPUs, not 16 (twice the bytes), and gathers it on NVLink instead of across the nodes: less
    communication; the search inside verl offers both, groups of whole nodes only across nodes."""
    from dataclasses import replace

    from realbench.cost.calls import call_cost
    from realbench.engines import priced_as
    from realbench.plan import Option, get_builtin

    _, plan, _ = imported(cli, job, "grpo_qwen_fsdp.yaml", "trainer.nnodes=2",
                          "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2",
                          "actor_rollout_ref.actor.fsdp_config.fsdp_size=8", name="hybrid")
    assert plan["calls"]["actor_train"]["shard_group"] == 8 and "shard_group" not in plan["calls"]["ref_inf"]
    scenario = priced_as(get_builtin("grpo-7b-16gpu"), "verl")
    default = verl.default_plan(scenario)["actor_train"]
    assert default.mesh.nodes == 2 and default.strategy.zero == 3 and default.strategy.shards == 16
    call, model = scenario.dataflow.call("actor_train"), scenario.models["actor"]
    full, hybrid = (call_cost(call, model, scenario.cluster, Option(default.mesh, replace(default.strategy, shard_group=f)))
                    for f in (0, 8))
    assert hybrid.master_bytes == pytest.approx(2 * full.master_bytes, rel=1e-6)
    assert hybrid.dp_comm_s < full.dp_comm_s and hybrid.compute_s == full.compute_s
    # (its collectives hide behind the compute either way, and Adam runs over twice the parameters)
    assert hybrid.time_s > full.time_s
    offered = {o.strategy.shard_group for g in verl.plan_groups(scenario) for o in g["actor_train"]}
    assert offered == {0, 8}
    # a 70B actor on 16 nodes: groups of 1, 2, 4 and 8 nodes
    big = priced_as(get_builtin("ppo-70b-7b-128gpu"), "verl")
    assert {o.strategy.shard_group for g in verl.plan_groups(big) for o in g["actor_train"]} == {0, 8, 16, 32, 64}
    # where full sharding's gathers across 16 nodes are in the open, groups of 2 nodes and of one
    # take less time and hold more (one node's: more state than an H100 holds)
    update = verl.default_plan(big)["actor_train"]
    seventy = {f: call_cost(big.dataflow.call("actor_train"), big.models["actor"], big.cluster,
                            Option(update.mesh, replace(update.strategy, shard_group=f))) for f in (0, 16, 8)}
    assert seventy[0].time_s > seventy[16].time_s > seventy[8].time_s
    assert seventy[0].dp_comm_s > seventy[16].dp_comm_s > seventy[8].dp_comm_s
    assert seventy[16].master_bytes / 2 ** 30 == pytest.approx(64.2, abs=0.05)
    assert seventy[8].master_bytes > big.cluster.device.memory_bytes
    one_node = priced_as(get_builtin("grpo-7b-lora-8gpu"), "verl")
    assert {o.strategy.shard_group for g in verl.plan_groups(one_node) for o in g["actor_train"]} == {0}


def test_a_setting_written_out_as_verl_would_resolve_it_changes_nothing(cli, job):
    """verl's examples write the reference's strategy out as the actor's (ref.strategy=fsdp2 beside
    actor.strategy=fsdp2, run_seed_oss_36b_fsdp.sh), which it follows by interpolation anyway: the
    same plan and estimate as without it. Set otherwise than the actor's, it changes what verl runs
    and is refused by name."""
    base, plan, _ = imported(cli, job, "grpo_qwen_fsdp.yaml", *FSDP2[:1])
    same, same_plan, _ = imported(cli, job, "grpo_qwen_fsdp.yaml", *FSDP2[:1], "actor_rollout_ref.ref.strategy=fsdp2")
    assert same_plan["calls"] == plan["calls"] and same["time_per_iter_s"] == base["time_per_iter_s"]
    code, _, err = cli("import", "verl", "grpo_qwen_fsdp.yaml", *FSDP2[:1], "actor_rollout_ref.ref.strategy=fsdp",
                       "--out", "refused")
    assert code == 2 and "actor_rollout_ref.ref.strategy: 'fsdp'" in err and "realbench does not price it" in err, err


def test_a_megatron_ppo_config_reads_into_the_plan_verl_runs(cli, job):
    """16 GPUs, Megatron tp 2 x pp 2 (dp 4), 2 virtual stages, distributed optimizer (zero 1),
    full recomputation: 64 rows, 4 steps, 4 rows a GPU a step in micro-batches of 2; the
    critic packs to a 512-token budget (`+` key): 4 rows x 256 tokens -> 2 micro-batches a step,
    its inference 16 x 256 -> 8; the reference 16 rows in 4s; rollout replicas of tp 2 (8) with 8
    rows together: their 8 rows in 1."""
    _, plan, scenario = imported(cli, job, "ppo megatron.yaml", "+critic.ppo_infer_max_token_len_per_gpu=512")
    layout = {"mesh": "n0-1", "dp": 4, "tp": 2, "pp": 2}
    assert plan["calls"] == {
        "actor_gen": {"mesh": "n0-1", "dp": 8, "tp": 2, "pp": 1, "micro_batches": 1, "memory_fraction": 0.5},
        "actor_train": {**layout, "micro_batches": 2, "activation_checkpointing": True, "virtual_stages": 2, "zero": 1},
        "ref_inf": {**layout, "micro_batches": 4},
        "reward_inf": {"mesh": "n0-1", "dp": 16, "tp": 1, "pp": 1, "micro_batches": 1},
        "critic_train": {**layout, "micro_batches": 2, "virtual_stages": 2, "zero": 1, "max_tokens": 512},
        "critic_inf": {**layout, "micro_batches": 8, "max_tokens": 512},
    }
    assert scenario["algorithm"] == "ppo" and scenario["models"]["critic"]["value_head"] is True


@pytest.mark.parametrize("config, overrides", [("grpo_qwen_fsdp.yaml", ()),
                                               ("ppo megatron.yaml", ("+critic.ppo_infer_max_token_len_per_gpu=512",)),
                                               ("ppo-rm.yaml", ()),
                                               # no KL term: verl builds no reference; PPO with 2 samples a prompt
                                               ("grpo_qwen_fsdp.yaml", ("actor_rollout_ref.actor.use_kl_loss=false",)),
                                               ("ppo-rm.yaml", ("actor_rollout_ref.rollout.n=2",)),
                                               # no reward function and no reward model: verl's own scorers
                                               ("grpo_qwen_fsdp.yaml", (BUILTIN_SCORER,)),
                                               # the weight sync's buffer: carried and written back
                                               ("ppo-rm.yaml", (BUCKET,)),
                                               # the chat template's own keyword arguments (Hydra's +): carried
                                               ("grpo_qwen_fsdp.yaml", (THINKING, *OPEN_DICTS)),
                                               # verl's fused kernels (the entropy's settings carried as given)
                                               ("grpo_qwen_fsdp.yaml", (FUSED, *GSPO_ENTROPY, GSPO_LOSS)),
                                               # LoRA: the reference is the actor with its adapters off; the
                                               # rollout receives them merged into the base, or alone
                                               ("grpo_qwen_fsdp.yaml", LORA + ("actor_rollout_ref.model.lora.merge=true",)),
                                               ("grpo_qwen_fsdp.yaml", LORA),
                                               # the adapters gathered a layer at a time; vLLM's decode graphs
                                               ("grpo_qwen_fsdp.yaml", LORA + (LAYERED, CUDAGRAPH)),
                                               ("grpo_qwen_fsdp.yaml", CAPTURED),
                                               # the old log-probabilities: the rollout's (bypass_mode)
                                               ("grpo_qwen_fsdp.yaml", BYPASS),
                                               # rows padded (verl packs them by default)
                                               ("ppo megatron.yaml", ("+critic.ppo_infer_max_token_len_per_gpu=512",
                                                                      "actor_rollout_ref.model.use_remove_padding=false",
                                                                      "critic.model.use_remove_padding=false")),
                                               # an SGLang rollout and reward model, written back as SGLang,
                                               # its server taking 0.7 of each GPU
                                               ("ppo-rm.yaml", SGLANG + (MEMORY,)),
                                               # Adam's moments in host memory between updates
                                               ("ppo-rm.yaml", OPTIMIZER_OFFLOAD),
                                               # the parameters too, and both on a GRPO actor
                                               ("ppo-rm.yaml", PARAM_OFFLOAD),
                                               ("grpo_qwen_fsdp.yaml", OPTIMIZER_OFFLOAD[:1] + PARAM_OFFLOAD[:1]),
                                               ("ppo megatron.yaml", ("+critic.ppo_infer_max_token_len_per_gpu=512",
                                                                      *MEGATRON_OFFLOAD)),
                                               ("ppo-rm.yaml", FSDP2 + OPTIMIZER_OFFLOAD),
                                               # dynamic batching: the actor's and reference's budgets
                                               ("grpo_qwen_fsdp.yaml", DYNAMIC),
                                               # Ulysses sequence parallelism, with dynamic batching too
                                               ("grpo_qwen_fsdp.yaml", ULYSSES + DYNAMIC),
                                               ("ppo-rm.yaml", ULYSSES_EACH),
                                               # hybrid sharding, each role's own group
                                               ("ppo-rm.yaml", HSDP),
                                               # Megatron's context parallelism (rows padded too)
                                               ("ppo megatron.yaml", ("+critic.ppo_infer_max_token_len_per_gpu=512",
                                                                      *CONTEXT_PARALLEL)),
                                               ("ppo megatron.yaml", ("+critic.ppo_infer_max_token_len_per_gpu=512",
                                                                      *CONTEXT_PARALLEL,
                                                                      "actor_rollout_ref.model.use_remove_padding=false",
                                                                      "critic.model.use_remove_padding=false"))])
def test_an_exported_plan_passes_verls_own_checks_and_reads_back_the_same(cli, job, config, overrides, verl_check):
    """The plan written as verl's configuration composes with verl's Hydra config and passes
    validate_config and its config dataclasses; imported again it is the same plan with the same
    estimate (round trip)."""
    first, plan, _ = imported(cli, job, config, *overrides, out="first", name="job")
    out = job / "exported" / f"{Path(config).stem} config.yaml"
    out.parent.mkdir(exist_ok=True)
    code, _, err = cli("export", "--plan", first["plan"], "--format", "verl", "--out", out, "--force")
    assert code == 0, err
    assert os.access(out.with_name(out.stem + "-launch.sh"), os.X_OK)
    assert "--config-name" in out.with_name(out.stem + "-launch.sh").read_text()
    checked = verl_check("validate", out)
    assert checked["ok"], checked
    assert checked["n_gpus"] == (16 if "megatron" in config else 8)
    without_ref = "actor_rollout_ref.actor.use_kl_loss=false" in overrides
    assert checked["critic"] == ("ppo" in config) and checked["ref"] is not without_ref
    assert ("ref_inf" in plan["calls"]) is not without_ref
    if LORA[0] in overrides:
        merged = "actor_rollout_ref.model.lora.merge=true" in overrides
        assert (checked["lora_rank"], checked["lora_alpha"], checked["target_modules"], checked["lora_merge"]) == \
            (8, 16, ["q_proj", "v_proj"], merged)
        assert plan["calls"]["actor_gen"].get("merge_lora", False) is merged
    # the old log-probabilities: a forward over the whole batch, or with bypass_mode the rollout's,
    # returned by it (verl's composed settings)
    bypass = overrides == BYPASS
    assert checked["bypass_mode"] is bypass and checked["calculate_log_probs"]
    assert checked["rollout_name"] == ("sglang" if SGLANG[0] in overrides else "vllm")
    again, plan_again, scenario_again = imported(cli, job, out, out="again", name="job")
    assert scenario_again["training"]["old_logprobs"] == ("rollout" if bypass else "whole_batch")
    packed = "actor_rollout_ref.model.use_remove_padding=false" not in overrides
    assert checked["use_remove_padding"] is packed and checked["critic_use_remove_padding"] in (None, packed)
    assert scenario_again["training"]["padding_free"] is packed
    assert scenario_again["rollout_server"] == checked["rollout_name"]
    assert checked["bucket_mb"] == (4096 if BUCKET in overrides else 2048)
    assert checked["layered_summon"] is (LAYERED in overrides)
    assert checked["cudagraph_mode"] == ("FULL_DECODE_ONLY" if CUDAGRAPH in overrides else None)
    assert checked["capture_sizes"] == ([8, 16] if overrides == CAPTURED else None)
    assert checked["chat_template_kwargs"] == ({"enable_thinking": False} if THINKING in overrides else {})
    opened = OPEN_DICTS[0] in overrides
    assert checked["reward_kwargs"] == ({"overlong_buffer_cfg": {"enable": True}, "max_resp_len": 256} if opened else {})
    assert checked["mixed_precision"] == ({"param_dtype": "bfloat16", "reduce_dtype": "bf16"} if opened else None)
    # the log-probabilities: verl's fused kernels written back where read, their torch backend
    fused = FUSED in overrides
    assert (checked["use_fused_kernels"], checked["fused_backend"]) == (fused, "torch")
    assert ("logits" in scenario_again["training"]) is fused
    assert checked["engine_entropy_chunking"] is (GSPO_ENTROPY[2] in overrides)
    assert checked["loss_mode"] == ("gspo" if GSPO_LOSS in overrides else "vanilla")
    # the scorer: the user's function, or verl's own (named by realbench's stand-in, written back as none)
    builtin = BUILTIN_SCORER in overrides
    assert checked["builtin_scorer"] == ("default_compute_score" if builtin else None)
    if "reward_model" not in (job / config).read_text():
        assert checked["reward_function"] == (None if builtin else str(job / "scoring" / "reward.py"))
        assert scenario_again["models"]["reward"]["function"] == \
            (verl.BUILTIN_REWARD if builtin else f"{job / 'scoring' / 'reward.py'}:compute_score")
    # the rollout server's share of each GPU's memory: verl's default, or the user's, read and written back
    fraction = 0.7 if MEMORY in overrides else 0.5
    assert checked["memory_fraction"] == scenario_again["dataflow"]["memory_fraction"] == fraction
    # vLLM's context: the checkpoint's positions, which verl gives it where unset, written back; an
    # SGLang rollout (which starts with less) written a sequence's, the least the plan runs with
    sequence = scenario_again["dataflow"]["prompt_len"] + scenario_again["dataflow"]["gen_len"]
    assert checked["max_model_len"] == scenario_again["dataflow"].get("max_model_len", sequence) == \
        (32_768 if checked["rollout_name"] == "vllm" else sequence)
    # verl's optimizer_offload and param_offload, per trained role, as its engines read them
    critic = "ppo" in config
    for key, field in (("optimizer_offload", "offload_optimizer"), ("param_offload", "offload_params")):
        offloaded = tuple(any(o.startswith(block) and o.endswith(f".{key}=true") for o in overrides)
                          for block in ("actor_rollout_ref.actor.", "critic."))
        assert (checked[key], checked[f"critic_{key}"]) == (offloaded[0], offloaded[1] if critic else None)
        for name, off in zip(("actor_train", "critic_train"), offloaded):
            if name in plan["calls"]:
                assert plan["calls"][name].get(field, False) is off
    # the FSDP version each engine is built with: the user's, carried (verl's default FSDP1 else)
    fsdp = "megatron" if "megatron" in config else "fsdp2" if FSDP2[0] in overrides else "fsdp"
    assert (checked["engine_strategy"], checked["critic_engine_strategy"], checked["ref_strategy"]) == \
        (fsdp, fsdp if critic else None, fsdp if checked["ref"] else None)
    assert scenario_again.get("engine_settings", {}).get("actor_rollout_ref.actor.strategy") == \
        ("fsdp2" if fsdp == "fsdp2" else None)
    # a Megatron reference offloaded as the actor (its param_offload follows the actor's), read, planned and written so
    ref_off = MEGATRON_OFFLOAD[0] in overrides
    assert checked["ref_megatron_param_offload"] is (ref_off if "megatron" in config and checked["ref"] else None)
    if "megatron" in config and "ref_inf" in plan["calls"]:
        assert plan["calls"]["ref_inf"].get("offload_params", False) is ref_off
    if LORA[0] in overrides:
        assert scenario_again["models"]["actor"]["lora"] == {"r": 8, "lora_alpha": 16, "target_modules": ["q_proj", "v_proj"]}
        assert "ref" not in scenario_again["models"] and "ref_inf" in plan_again["calls"]
    if "actor_rollout_ref.rollout.n=2" in overrides:  # PPO, each prompt's 2 responses their own episodes
        assert scenario_again["algorithm"] == "ppo" and scenario_again["dataflow"]["group_size"] == 2
    # dynamic batching's budgets, carried by the plan's calls (max_tokens) and written back as verl's
    dynamic = DYNAMIC[0] in overrides
    assert (checked["use_dynamic_bsz"], checked["ref_dynamic_bsz"]) == (dynamic, dynamic if checked["ref"] else None)
    assert plan["calls"]["actor_train"].get("max_tokens") == (384 if dynamic else None)
    if dynamic:
        assert checked["ppo_max_token_len_per_gpu"] == checked["ref_max_token_len_per_gpu"] == 384
        assert plan["calls"]["ref_inf"]["max_tokens"] == 384
    if critic:  # (the V1 critic always packs, both its calls to one budget)
        assert plan["calls"]["critic_train"].get("max_tokens") == plan["calls"]["critic_inf"].get("max_tokens") == \
            (checked["critic_budget"] if packed else None)
    # Ulysses: each engine built with the plan's groups (the reference's following the actor's
    # role-level size, its own engine's otherwise), a group's rows its data-parallel rank's
    sp = {"actor": 2 if ULYSSES[0] in overrides else 4 if ULYSSES_EACH[0] in overrides else 1,
          "critic": 2 if ULYSSES_EACH[1] in overrides else 1}
    sp["ref"] = sp["actor"] if ULYSSES[0] in overrides else 1
    fsdp_roles = "megatron" not in config
    assert (checked["ulysses"], checked["ref_ulysses"], checked["critic_ulysses"]) == \
        ((sp["actor"] if fsdp_roles else None), sp["ref"] if fsdp_roles and checked["ref"] else None,
         sp["critic"] if fsdp_roles and critic else None)
    # hybrid sharding: each FSDP engine's device mesh and sharding as verl builds them on the 8 GPUs
    # (a fake process group), from the plan's shard groups
    hsdp = {"actor_train": 4, "critic_train": 2, "critic_inf": 2} if HSDP[0] in overrides else {}
    for key, call in (("fsdp_mesh", "actor_train"), ("ref_fsdp_mesh", "ref_inf"), ("critic_fsdp_mesh", "critic_train")):
        if not fsdp_roles or call not in plan["calls"]:
            assert checked[key] is None, (key, checked[key])
            continue
        f = hsdp.get(call)
        assert checked[key] == ({"dims": {"ddp": 8 // f, "fsdp": f}, "sharding": "HYBRID_SHARD"} if f else
                                {"dims": {"fsdp": 8}, "sharding": "FULL_SHARD"}), (key, checked[key])
    assert {n: c["shard_group"] for n, c in plan["calls"].items() if "shard_group" in c} == hsdp
    # Megatron's context parallelism: every engine built with the actor's rings (process-global)
    cp = 2 if CONTEXT_PARALLEL[0] in overrides else 1
    megatron = "megatron" in config
    assert (checked["context_parallel"], checked["ref_context_parallel"], checked["critic_context_parallel"]) == \
        ((cp, cp if checked["ref"] else None, cp if critic else None) if megatron else (None, None, None))
    if megatron:
        sp = {"actor": cp, "ref": cp, "critic": cp}
    for name, role in (("actor_train", "actor"), ("ref_inf", "ref"), ("critic_train", "critic"), ("critic_inf", "critic")):
        if name in plan["calls"]:
            assert plan["calls"][name].get("sp", 1) == sp[role], name
            assert plan["calls"][name].get("ring") == ("p2p" if megatron and cp > 1 else None), name
            assert plan["calls"][name]["dp"] * sp[role] * plan["calls"][name]["tp"] * plan["calls"][name]["pp"] == \
                checked["n_gpus"], name
    assert plan_again["calls"] == plan["calls"]
    assert again["time_per_iter_s"] == pytest.approx(first["time_per_iter_s"], rel=1e-12)


def test_ulysses_groups_are_read_as_verl_forms_them_by_hand(cli, job):
    """verl's FSDP engine with ulysses_sequence_parallel_size 2 on 8 GPUs: 4 data-parallel groups
    of 2 (its (dp, sp) mesh), each a group's rows: a step's 32 rows (8 prompts x 4) 8 a group, in
    micro-batches of 4 (ppo_micro_batch_size_per_gpu): 2; the reference's 128 rows 32 a group, 8 a
    micro-batch: 4. Its dynamic batching packs a group's rows to its budget times 2: a group's 8
    rows of 192 tokens within 384 x 2, 2 micro-batches (within 384 alone it would be 4), as many as
    a GPU's 4 rows within 384 without the groups."""
    _, plan, _ = imported(cli, job, "grpo_qwen_fsdp.yaml", *ULYSSES, out="ulysses", name="sp")
    calls = plan["calls"]
    assert {n: (calls[n]["dp"], calls[n].get("sp"), calls[n]["micro_batches"]) for n in ("actor_train", "ref_inf")} == \
        {"actor_train": (4, 2, 2), "ref_inf": (4, 2, 4)}
    _, packed, _ = imported(cli, job, "grpo_qwen_fsdp.yaml", *ULYSSES, *DYNAMIC, out="ulysses", name="sp-packed")
    assert (packed["calls"]["actor_train"]["micro_batches"], packed["calls"]["actor_train"]["max_tokens"]) == (2, 384)
    assert (packed["calls"]["actor_train"]["dp"], packed["calls"]["actor_train"]["sp"]) == (4, 2)
    _, flat, _ = imported(cli, job, "grpo_qwen_fsdp.yaml", *DYNAMIC, out="ulysses", name="flat-packed")
    assert flat["calls"]["actor_train"]["micro_batches"] == 2 and "sp" not in flat["calls"]["actor_train"]


@pytest.mark.parametrize("overrides, key, says", [
    (ULYSSES + ("actor_rollout_ref.model.use_remove_padding=false",), ULYSSES[0].split("=")[0],
     "verl runs Ulysses on packed rows only"),
    (("actor_rollout_ref.actor.ulysses_sequence_parallel_size=3",), ULYSSES[0].split("=")[0],
     "3 does not divide the trainer's 8 GPUs"),
    (("trainer.nnodes=2", "actor_rollout_ref.actor.ulysses_sequence_parallel_size=16"), ULYSSES[0].split("=")[0],
     "inside a node of 8 GPUs"),
    # (verl's Megatron blocks have no such key: Megatron's is context_parallel_size, not priced)
    (("model_engine=megatron", "actor_rollout_ref.actor.ulysses_sequence_parallel_size=2"), ULYSSES[0].split("=")[0],
     "verl 0.9.1 has no such setting"),
    # (the reference's groups follow the actor's: the first call named)
    (("actor_rollout_ref.actor.ulysses_sequence_parallel_size=8",), "calls.ref_inf.sp",
     "sp 8 does not split the 4 attention heads and 2 KV heads"),
])
def test_ulysses_groups_verl_or_realbench_cannot_run_are_refused_by_name(cli, job, overrides, key, says):
    assert_import_refused(cli, job, "grpo_qwen_fsdp.yaml", overrides, key, says)


def test_context_parallel_rings_are_read_as_verls_megatron_forms_them_by_hand(cli, job):
    """verl's Megatron engine with tp 2 x pp 2 x context_parallel_size 2 on 16 GPUs: 2 data-parallel
    ranks (Megatron's dp, GPUs / (tp pp cp)), each a ring of 2 x (tp 2 x pp 2) GPUs: a step's 16
    rows (64 over 4 steps) 8 a rank, in micro-batches of 2 a GPU (ppo_micro_batch_size_per_gpu):
    4 (2 without the rings); the reference's 64 rows 32 a rank, 4 each: 8. The critic packs a rank's
    rows to its budget times 2 (verl's sp_size is cp): 8 rows of 256 tokens within 512 x 2, 2
    micro-batches, as many as a GPU's 4 within 512 without the rings. Every call attends by
    Megatron's p2p ring."""
    result, plan, _ = imported(cli, job, "ppo megatron.yaml", "+critic.ppo_infer_max_token_len_per_gpu=512",
                               *CONTEXT_PARALLEL, out="cp", name="cp")
    calls = plan["calls"]
    assert {n: (calls[n]["dp"], calls[n]["tp"], calls[n]["pp"], calls[n]["sp"], calls[n]["ring"],
                calls[n]["micro_batches"]) for n in ("actor_train", "ref_inf", "critic_train", "critic_inf")} == {
        "actor_train": (2, 2, 2, 2, "p2p", 4), "ref_inf": (2, 2, 2, 2, "p2p", 8),
        "critic_train": (2, 2, 2, 2, "p2p", 2), "critic_inf": (2, 2, 2, 2, "p2p", 8)}
    _, flat, _ = imported(cli, job, "ppo megatron.yaml", "+critic.ppo_infer_max_token_len_per_gpu=512",
                          out="cp", name="flat")
    assert (flat["calls"]["actor_train"]["micro_batches"], flat["calls"]["critic_train"]["micro_batches"]) == (2, 2)
    # the HTML report names how each call splits its sequences
    code, _, err = cli("export", "--plan", result["plan"], "--format", "html", "--out",
                       job / "cp" / "cp report.html", "--force")
    assert code == 0, err
    assert "2 (context parallel p2p ring sp 2)" in (job / "cp" / "cp report.html").read_text()


@pytest.mark.parametrize("overrides, key, says", [
    (("critic.megatron.context_parallel_size=1",), "critic.megatron.context_parallel_size",
     "verl's Megatron state is process-global, the actor's (2) wins"),
    (("critic.megatron.context_parallel_size=2", "actor_rollout_ref.actor.megatron.dynamic_context_parallel=true"),
     "actor_rollout_ref.actor.megatron.dynamic_context_parallel", "dynamic context parallelism"),
    (("critic.megatron.context_parallel_size=2", "actor_rollout_ref.actor.megatron.context_parallel_size=3",
      "critic.megatron.context_parallel_size=3"), "actor_rollout_ref.actor.megatron.context_parallel_size",
     "tp x pp x cp = 12 does not divide the 16 GPUs"),
    # no ring at all (0 is not read as 1)
    (("critic.megatron.context_parallel_size=0", "actor_rollout_ref.actor.megatron.context_parallel_size=0"),
     "actor_rollout_ref.actor.megatron.context_parallel_size", "0: a context-parallel ring is 1 GPU or more"),
    # Megatron's other ring exchanges (a2a, all_gather, a2a+p2p), set through verl's pass-through
    (("critic.megatron.context_parallel_size=2",
      "+actor_rollout_ref.actor.megatron.override_transformer_config.cp_comm_type=a2a"),
     "actor_rollout_ref.actor.megatron.override_transformer_config.cp_comm_type",
     "a Megatron TransformerConfig field verl passes through, which realbench does not price"),
    # Megatron's optimizer offload, as verl's large MoE examples set it through its optimizer pass-through
    (("critic.megatron.context_parallel_size=2",
      "+actor_rollout_ref.actor.optim.override_optimizer_config.optimizer_offload_fraction=1"),
     "actor_rollout_ref.actor.optim.override_optimizer_config.optimizer_offload_fraction",
     "a Megatron OptimizerConfig field verl passes through (its optimizer offload among them)"),
])
def test_context_parallel_settings_verl_or_realbench_cannot_run_are_refused_by_name(cli, job, overrides, key, says):
    assert_import_refused(cli, job, "ppo megatron.yaml",
                          ("+critic.ppo_infer_max_token_len_per_gpu=512", CONTEXT_PARALLEL[0], *overrides), key, says)


def test_ulysses_lets_the_long_tailed_grpo_job_train_without_recomputation():
    """The README's bench reading: on grpo-8b-32gpu-longtail (responses up to 16k tokens) as verl
    runs it, no FSDP plan of 32 data-parallel GPUs trains its actor without recomputation (a GPU's
    micro-batch of one long row does not fit), while groups of 2 GPUs with 4 micro-batches (a
    GPU holding half of two rows) do, and their step is faster than the fastest recomputing plan
    of either layout."""
    from realbench.cost import Estimator
    from realbench.engines import priced_as
    from realbench.plan import Option, Strategy, get_builtin

    scenario = priced_as(get_builtin("grpo-8b-32gpu-longtail"), "verl")
    est, plan = Estimator(scenario), verl.default_plan(scenario)
    mesh = plan["actor_train"].mesh

    def estimate(dp: int, sp: int, m: int, recompute: bool):
        options = dict(plan, actor_train=Option(mesh, Strategy(dp, 1, 1, m, recompute, zero=3, sp=sp)),
                       ref_inf=Option(mesh, Strategy(dp, 1, 1, 1, zero=3, offload_params=True, sp=sp)))
        return est.estimate(est.choice_of(options))

    assert all(estimate(32, 1, m, False).oom for m in (1, 2, 4))
    groups = estimate(16, 2, 4, False)
    recomputing = min(estimate(dp, sp, m, True).time_per_iter_s for dp, sp in ((32, 1), (16, 2)) for m in (1, 2, 4))
    assert not groups.oom and groups.time_per_iter_s < recomputing - 0.5, (groups.time_per_iter_s, recomputing)


def test_a_critics_role_level_ulysses_size_which_verl_ignores_is_priced_as_verl_runs_it(cli, job):
    """verl 0.9.1 builds the critic's engine from critic.fsdp alone: the role-level size is said on
    import and the critic priced without sequence parallelism, the same plan and estimate as
    without the setting; the engine's own key is the one that splits it."""
    base, plan, _ = imported(cli, job, "ppo-rm.yaml", out="base")
    result, same, _ = imported(cli, job, "ppo-rm.yaml", "critic.ulysses_sequence_parallel_size=2", out="ignored")
    assert same["calls"] == plan["calls"] and result["time_per_iter_s"] == base["time_per_iter_s"]
    assert [u.split(":")[0] for u in result["unread_by_engine"]] == ["critic.ulysses_sequence_parallel_size=2"]
    assert "runs with critic.fsdp.ulysses_sequence_parallel_size" in result["unread_by_engine"][0]
    _, split, _ = imported(cli, job, "ppo-rm.yaml", "critic.fsdp.ulysses_sequence_parallel_size=2", out="split")
    assert split["calls"]["critic_train"]["sp"] == 2 and plan["calls"]["critic_train"].get("sp", 1) == 1
    # the rollout's multi_stage_wake_up, which verl 0.9.1's RolloutConfig holds and nothing reads
    woken, same, _ = imported(cli, job, "ppo-rm.yaml", "actor_rollout_ref.rollout.multi_stage_wake_up=true", out="woken")
    assert same["calls"] == plan["calls"] and woken["time_per_iter_s"] == base["time_per_iter_s"]
    assert [u.split(":")[0] for u in woken["unread_by_engine"]] == ["actor_rollout_ref.rollout.multi_stage_wake_up=True"]
    assert "reads it nowhere" in woken["unread_by_engine"][0]


def test_a_lora_actors_adapter_gather_and_vllms_decode_graphs_are_priced_as_verl_runs_them(cli, job):
    """layered_summon gathers a LoRA actor's adapters a layer at a time; without it FSDP1 summons the
    whole model's fp32 parameters on every GPU for the sync, beside the rollout's weights: Qwen3-8B's
    4 x 8.19e9 bytes (30.5 GiB) do not fit the 22.1 GiB of KV cache a rollout of tp 2 at 0.4 of an
    80 GiB GPU runs without, and are refused by name, where a layer at a time fits. vLLM's graph
    modes that capture the decode step whole are carried, priced as without them; the others, and
    layered_summon where it sets vLLM's sleep level beyond a LoRA actor's own, are refused by name."""
    from realbench.models import catalogue

    (job / "qwen3-8b").mkdir(exist_ok=True)
    (job / "qwen3-8b" / "config.json").write_text(json.dumps(catalogue.config("qwen3-8b")))
    big = ("actor_rollout_ref.model.path=qwen3-8b", "actor_rollout_ref.rollout.gpu_memory_utilization=0.4", *LORA)
    assert_import_refused(cli, job, "grpo_qwen_fsdp.yaml", big, "actor_rollout_ref.rollout.layered_summon",
                          "summoning the whole model's fp32 parameters on every GPU (30.5 GiB)")
    layered, plan, scenario = imported(cli, job, "grpo_qwen_fsdp.yaml", *big, LAYERED, out="layered")
    assert scenario["engine_settings"]["actor_rollout_ref.rollout.layered_summon"] is True
    base, base_plan, _ = imported(cli, job, "grpo_qwen_fsdp.yaml", *LORA, out="lora")
    graphs, same, scenario = imported(cli, job, "grpo_qwen_fsdp.yaml", *LORA, CUDAGRAPH, out="graphs")
    assert same["calls"] == base_plan["calls"] and graphs["time_per_iter_s"] == base["time_per_iter_s"]
    assert scenario["engine_settings"][CUDAGRAPH.lstrip("+").split("=")[0]] == "FULL_DECODE_ONLY"
    # vLLM's captured decode batches: 128 rows over 4 replicas of tp 2 decode 32 together, above a largest
    # captured 16 (refused by name, either key); 16 a replica (max_num_seqs 16: two rounds) are captured
    capture = "actor_rollout_ref.rollout.cudagraph_capture_sizes=[8,16]"
    assert_import_refused(cli, job, "grpo_qwen_fsdp.yaml", (capture,), "cudagraph_capture_sizes",
                          "16 at most: a replica decodes up to 32 sequences together")
    assert_import_refused(cli, job, "grpo_qwen_fsdp.yaml",
                          ("+actor_rollout_ref.rollout.engine_kwargs.vllm.compilation_config.cudagraph_capture_sizes=[8,16]",),
                          "engine_kwargs.vllm.compilation_config.cudagraph_capture_sizes", "up to 32 sequences")
    _, rounds, scenario = imported(cli, job, "grpo_qwen_fsdp.yaml", capture, "actor_rollout_ref.rollout.max_num_seqs=16",
                                   out="captured")
    assert rounds["calls"]["actor_gen"]["micro_batches"] == 2
    assert scenario["engine_settings"][capture.split("=")[0]] == [8, 16]
    for overrides, says in (((LAYERED,), "no LoRA"), (LORA + ("actor_rollout_ref.model.lora.merge=true", LAYERED),
                                                      "merged into the base"),
                            ((CUDAGRAPH.replace("FULL_DECODE_ONLY", "PIECEWISE"),), "kernel by kernel")):
        key = "layered_summon" if LAYERED in overrides else "cudagraph_mode"
        assert_import_refused(cli, job, "grpo_qwen_fsdp.yaml", overrides, key, says)


def test_settings_that_change_neither_bytes_nor_flops_are_carried_and_priced_as_without_them(cli, job):
    """FSDP1's forward_prefetch (the next all-gather issued before the layer computes: realbench prices
    the gathers prefetched already) and use_orig_params (views of the same flat shards), a
    forward-only reference's offload settings (verl offloads it whatever they say; it has no
    optimizer), and rollout correction (element-wise on the driver): the same plan and estimate,
    each carried into the scenario as given."""
    given = ("actor_rollout_ref.actor.fsdp_config.forward_prefetch=true",
             "actor_rollout_ref.actor.fsdp_config.use_orig_params=true",
             "actor_rollout_ref.ref.fsdp_config.optimizer_offload=true",
             "actor_rollout_ref.ref.fsdp_config.offload_policy=true", "actor_rollout_ref.model.use_shm=true",
             # (rollout correction's token-level importance weights and rejection, element-wise on the driver)
             "algorithm.rollout_correction.rollout_is=token", "algorithm.rollout_correction.rollout_rs=token_k1")
    logprobs = "actor_rollout_ref.rollout.calculate_log_probs=true"  # (which realbench writes for every plan)
    base, plan, _ = imported(cli, job, "grpo_qwen_fsdp.yaml", logprobs, out="base")
    result, same, scenario = imported(cli, job, "grpo_qwen_fsdp.yaml", logprobs, *given, out="carried")
    assert same["calls"] == plan["calls"] and result["time_per_iter_s"] == base["time_per_iter_s"]
    assert {k: scenario["engine_settings"].get(k) for k in (g.split("=")[0] for g in given)} == \
        {k: True if v == "true" else v for k, v in (g.split("=") for g in given)}
    assert scenario["training"]["old_logprobs"] == "whole_batch"  # (bypass_mode, read, is not set)


def test_a_prompt_of_one_sample_reads_from_verl_and_goes_only_where_the_engine_runs_it_alike(cli, job, tmp_path):
    """rollout.n 1 (verl's rollout-correction and distillation examples): verl takes a group of one's
    reward as its advantage (mean 0, std 1), as realbench does: read with group_size 1, written back to
    verl, and refused by name for AReaL's GRPO (which centres the group on itself) and OpenRLHF's
    (which divides by its spread)."""
    solo = ("actor_rollout_ref.rollout.n=1", "actor_rollout_ref.actor.ppo_mini_batch_size=32",
            "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=4")  # (32 rows: 4 a GPU)
    result, plan, scenario = imported(cli, job, "grpo_qwen_fsdp.yaml", *solo, out="solo")
    assert scenario["dataflow"]["group_size"] == 1 and result["time_per_iter_s"] > 0
    code, _, err = cli("export", "--plan", result["plan"], "--format", "verl", "--out", tmp_path / "solo verl.yaml")
    assert code == 0, err
    _, again, _ = imported(cli, job, tmp_path / "solo verl.yaml", out="again")
    assert again["calls"] == plan["calls"]
    # (the same job as another engine's: the scenario without verl's own settings)
    from realbench.engines import engine_module
    from realbench.plan import load_scenario

    job_alone = load_scenario(result["scenario"]).model_copy(update={"engine": None, "engine_settings": {}})
    for engine, says in (("areal", "AReaL centres it on itself"), ("openrlhf", "divides by its std")):
        field, why = engine_module(engine).space_problem_of_scenario(job_alone)
        assert field == "group_size" and says in why, (field, why)


def test_an_estimator_priced_with_grpos_calls_goes_to_verl_and_back(cli, job, verl_check):
    """verl's gpg (and the others of SAME_CALLS) is priced as GRPO, the same plan and estimate as
    grpo's, its name carried: written back, composed by verl, read back the same; a scenario that
    carries it beside another algorithm is refused by name."""
    first, plan, scenario = imported(cli, job, "grpo_qwen_fsdp.yaml", "algorithm.adv_estimator=gpg", out="gpg", name="job")
    assert scenario["algorithm"] == "grpo" and scenario["engine_settings"]["algorithm.adv_estimator"] == "gpg"
    _, grpo_plan, _ = imported(cli, job, "grpo_qwen_fsdp.yaml", out="gpg", name="grpo")
    assert plan["calls"] == grpo_plan["calls"]
    out = job / "gpg" / "verl.yaml"
    code, _, err = cli("export", "--plan", first["plan"], "--format", "verl", "--out", out, "--force")
    assert code == 0, err
    assert yaml.safe_load(out.read_text())["algorithm"]["adv_estimator"] == "gpg"
    assert verl_check("validate", out)["ok"]
    again, plan_again, scenario_again = imported(cli, job, out, out="gpg again", name="job")
    assert plan_again["calls"] == plan["calls"] and scenario_again["engine_settings"]["algorithm.adv_estimator"] == "gpg"
    assert again["time_per_iter_s"] == pytest.approx(first["time_per_iter_s"])
    # carried beside PPO's calls: refused where the plan is written
    wrong = dict(scenario, algorithm="ppo")
    from realbench.engines import verl as verl_engine
    from realbench.plan.scenario import scenario_from_document

    problem = verl_engine.space_problem_of_scenario(scenario_from_document(wrong))
    assert problem and problem[0] == "engine_settings.algorithm.adv_estimator" and "'gpg'" in problem[1], problem
    # FSDP's mixed precision written into a scenario by hand is checked as an import checks it
    block = "actor_rollout_ref.actor.fsdp_config.mixed_precision"
    for key, value, problem in ((f"{block}.reduce_dtype", "fp32", None), (f"{block}.reduce_dtype", "bf16", None),
                                (f"{block}.reduce_dtype", "fp16", f"engine_settings.{block}.reduce_dtype"),
                                (f"{block}.buffer_dtype", "bf16", f"engine_settings.{block}.buffer_dtype")):
        edited = dict(scenario, engine_settings={**scenario["engine_settings"], key: value})
        got = verl_engine.space_problem_of_scenario(scenario_from_document(edited))
        assert (got and got[0]) == problem, got


def test_a_lora_actor_starting_from_an_adapter_folder_goes_to_verl_and_back(cli, job, verl_check):
    """verl's lora_adapter_path (PeftModel.from_pretrained of the folder, its r with lora_rank) is
    realbench's `adapter:`: read, written, composed by verl, read back to the same plan and estimate;
    a rank other than the folder's, a folder without lora_rank, and a folder that is not there are
    refused by name."""
    import torch

    from realbench.models.hf import spec_from_checkpoint_entry
    from realbench.models.shards import adapter_specs
    from realbench.runtime.checkpoint import save_adapters

    spec = spec_from_checkpoint_entry({"path": str(job / "ckpt"), "lora": {"r": 8, "lora_alpha": 16,
                                                                          "target_modules": ["q_proj", "v_proj"]}}, job)
    g = torch.Generator().manual_seed(0)
    save_adapters(job / "my adapter", spec, {p.name: torch.randn(p.shape, generator=g) * 0.01 for p in adapter_specs(spec)},
                  base=str(job / "ckpt"))
    start = ("actor_rollout_ref.model.lora_rank=8", "actor_rollout_ref.model.lora_adapter_path=my adapter")
    first, plan, scenario = imported(cli, job, "grpo_qwen_fsdp.yaml", *start, out="adapter", name="job")
    assert scenario["models"]["actor"] == {"path": str(job / "ckpt"), "adapter": str(job / "my adapter")}
    assert "ref" not in scenario["models"] and "ref_inf" in plan["calls"]  # the actor with its adapters off
    out = job / "adapter" / "verl.yaml"
    code, _, err = cli("export", "--plan", first["plan"], "--format", "verl", "--out", out, "--force")
    assert code == 0, err
    checked = verl_check("validate", out)
    assert checked["ok"], checked
    assert (checked["lora_adapter_path"], checked["lora_rank"], checked["lora_alpha"], checked["target_modules"]) == \
        (str(job / "my adapter"), 8, 16, ["q_proj", "v_proj"])
    again, plan_again, scenario_again = imported(cli, job, out, out="adapter-again", name="job")
    assert plan_again["calls"] == plan["calls"] and scenario_again["models"]["actor"] == scenario["models"]["actor"]
    assert again["time_per_iter_s"] == pytest.approx(first["time_per_iter_s"], rel=1e-12)
    for overrides, key, says in (
            (("actor_rollout_ref.model.lora_rank=4", start[1]), "actor_rollout_ref.model.lora_rank",
             "the adapter folder's r is 8"),
            ((start[1],), "actor_rollout_ref.model.lora_adapter_path", "with lora_rank 0"),
            ((start[0], "actor_rollout_ref.model.lora_adapter_path=no such folder"),
             "actor_rollout_ref.model.lora_adapter_path", "is not an adapter folder here")):
        assert_import_refused(cli, job, "grpo_qwen_fsdp.yaml", overrides, key, says, out="refused adapter")
    # OpenRLHF and AReaL have no setting for a folder to start from: their writers refuse it by name
    from realbench.engines import areal, openrlhf
    from realbench.plan import get_builtin

    lora_job = get_builtin("grpo-7b-lora-8gpu")
    actor = lora_job.models["actor"]
    from_folder = lora_job.model_copy(update={"models": {
        **lora_job.models, "actor": actor.model_copy(update={"lora": actor.lora.model_copy(update={"path": "/adapter"})})}})
    assert verl.space_problem_of_scenario(from_folder) is None
    for module, scenario in ((openrlhf, from_folder), (areal, areal.job_of(from_folder))):
        key, why = module.space_problem_of_scenario(scenario)
        assert key == "models.actor.adapter" and "adapter folder" in why, why


@pytest.mark.parametrize("overrides, key, says", [
    (("actor_rollout_ref.actor.ppo_mini_batch_sise=8",), "actor_rollout_ref.actor.ppo_mini_batch_sise",
     "did you mean 'actor_rollout_ref.actor.ppo_mini_batch_size'"),
    (("+trainer.my_setting=1",), "trainer.my_setting", "verl 0.9.1 has no such setting"),
    # a trained model's parameter offload: priced fully sharded, without LoRA
    (("actor_rollout_ref.actor.fsdp_config.param_offload=true", "actor_rollout_ref.actor.fsdp_config.reshard_after_forward=false"),
     "actor_rollout_ref.actor.fsdp_config.param_offload", "realbench prices a trained model's parameter offload fully sharded"),
    (LORA + ("actor_rollout_ref.actor.fsdp_config.param_offload=true",), "actor_rollout_ref.actor.fsdp_config.param_offload",
     "a LoRA model's parameter offload is not priced"),
    # FSDP versions: another package's engine; an FSDP strategy under model_engine megatron
    (("actor_rollout_ref.actor.strategy=fsdp_turbo",), "actor_rollout_ref.actor.strategy",
     "'fsdp_turbo': realbench prices verl's FSDP1 and FSDP2 (fsdp, fsdp2)"),
    (("model_engine=megatron", "actor_rollout_ref.actor.strategy=fsdp2"), "actor_rollout_ref.actor.strategy",
     "verl's Megatron engine is strategy megatron"),

    (("trainer.v1.trainer_mode=separate_async",), "trainer.v1.trainer_mode", "synchronous V1 trainer"),
    (("algorithm.adv_estimator=remax",), "algorithm.adv_estimator", "realbench plans gae, grpo, rloo"),
    (("algorithm.adv_estimator=reinforce_plus_plus", "actor_rollout_ref.rollout.n=1"), "actor_rollout_ref.rollout.n",
     "1: realbench prices reinforce_plus_plus with GRPO's calls, which compare a prompt's samples"),
    (("actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=3",), "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu",
     "3 does not divide a GPU's 4 rows"),
    (("model_engine=torchtitan",), "model_engine", "realbench prices dp, megatron"),
    # Hydra's search path beyond verl's own configs (another package's engine configs)
    (("hydra.searchpath=[pkg://verl_mlite.config]",), "hydra.searchpath",
     "pkg://verl_mlite.config: configs from beyond verl's own"),
    (("data.train_batch_size",), "data.train_batch_size", "an override is key=value"),
    # LoRA: on Megatron (verl's model.lora.*), leaving modules out, a rank realbench refuses
    (("model_engine=megatron", "actor_rollout_ref.model.lora_rank=8"), "actor_rollout_ref.model.lora_rank",
     "realbench reads verl's FSDP LoRA"),
    # the rollout's log-probabilities, which it returns only when asked; IS weights realbench does not run
    (("algorithm.rollout_correction.bypass_mode=true", "actor_rollout_ref.rollout.calculate_log_probs=false"),
     "actor_rollout_ref.rollout.calculate_log_probs",
     "bypass_mode takes the rollout's log-probabilities"),
    # (the rollout's decoding without CUDA graphs)
    (("+actor_rollout_ref.rollout.engine_kwargs.vllm.compilation_config.cudagraph_mode=NONE",),
     "cudagraph_mode", "kernel by kernel"),
    # a rollout server whose share of each GPU holds no whole sequence: it would not start
    (("actor_rollout_ref.rollout.gpu_memory_utilization=0.000001",), "actor_rollout_ref.rollout.gpu_memory_utilization",
     "fewer than one request of max_model_len 32768: the engine does not start"),
    # a context short of a prompt and its response (verl would cut them), or beyond the checkpoint's
    (("actor_rollout_ref.rollout.max_model_len=191",), "actor_rollout_ref.rollout.max_model_len",
     "191, short of a prompt and its response (192 tokens)"),
    (("actor_rollout_ref.rollout.max_model_len=32769",), "actor_rollout_ref.rollout.max_model_len",
     "32769: beyond the checkpoint's max_position_embeddings 32768"),
    # a rollout realbench does not write
    (("actor_rollout_ref.rollout.name=trtllm",), "actor_rollout_ref.rollout.name", "vllm and sglang rollouts"),
    (("actor_rollout_ref.rollout.name=???",), "actor_rollout_ref.rollout.name", "is not set: verl needs it"),
    (LORA + ("actor_rollout_ref.model.exclude_modules=o_proj",), "actor_rollout_ref.model.exclude_modules",
     "reads the exclusion of a vision-language model's tower only"),
    (("actor_rollout_ref.model.lora_rank=8", "actor_rollout_ref.model.target_modules=[q_proj,qkv]"),
     "models.actor.lora.target_modules", "no module 'qkv'"),
    # what verl passes through to the serving engine or the model's HF config: not priced
    (("+actor_rollout_ref.rollout.engine_kwargs.vllm.max_model_len=4096",),
     "actor_rollout_ref.rollout.engine_kwargs.vllm.max_model_len",
     "an argument verl passes to the rollout's serving engine (rollout.engine_kwargs)"),
    (("+actor_rollout_ref.model.override_config.max_position_embeddings=4096",),
     "actor_rollout_ref.model.override_config.max_position_embeddings", "a field of the model's HF config verl overrides"),
    # `+` adds a key verl's config does not hold: Hydra refuses it for one it holds
    (("+actor_rollout_ref.actor.use_dynamic_bsz=true",), "+actor_rollout_ref.actor.use_dynamic_bsz=true",
     "give actor_rollout_ref.actor.use_dynamic_bsz=... without +"),
    # a token budget that holds no whole row (64 + 128 tokens): verl's own assert, at run time
    (("actor_rollout_ref.actor.use_dynamic_bsz=true", "actor_rollout_ref.actor.ppo_max_token_len_per_gpu=100"),
     "actor_rollout_ref.actor.ppo_max_token_len_per_gpu", "100 tokens hold no whole row of 192"),
    # the log-probabilities: fused kernels realbench has not priced; the entropy chunked or
    # checkpointed where the update computes it (what it keeps for the backward)
    (("model_engine=megatron", FUSED), "actor_rollout_ref.model.use_fused_kernels", "Megatron's fused forward"),
    ((FUSED, "actor_rollout_ref.model.fused_kernel_options.impl_backend=triton"),
     "actor_rollout_ref.model.fused_kernel_options.impl_backend", "'triton': the Triton kernels"),
    (("actor_rollout_ref.actor.entropy_coeff=0.001", "actor_rollout_ref.actor.entropy_from_logits_with_chunking=true"),
     "actor_rollout_ref.actor.fsdp_config.entropy_from_logits_with_chunking", "entropy in the actor's update"),
    (("actor_rollout_ref.actor.entropy_coeff=0.001", "actor_rollout_ref.actor.fsdp_config.entropy_checkpointing=true"),
     "actor_rollout_ref.actor.fsdp_config.entropy_checkpointing", "what it keeps for the backward is not priced"),
    # the engine config's own torch.compile (the role-level one is not read): eager entropy, not priced
    (("actor_rollout_ref.actor.fsdp_config.use_torch_compile=false",),
     "actor_rollout_ref.actor.fsdp_config.use_torch_compile", "realbench does not price it"),
    # the rollout decoding without CUDA graphs, or keeping its share of the GPUs through training
    (("actor_rollout_ref.rollout.enforce_eager=true",), "actor_rollout_ref.rollout.enforce_eager",
     "decodes without CUDA graphs"),
    # FSDP's mixed precision other than verl's own, a dtype verl does not read; verl's distillation
    (("+actor_rollout_ref.actor.fsdp_config.mixed_precision.buffer_dtype=bf16",),
     "actor_rollout_ref.actor.fsdp_config.mixed_precision.buffer_dtype", "prices FSDP's mixed precision as verl "
                                                                        "defaults it"),
    (("+critic.fsdp.mixed_precision.cast_forward_inputs=true",), "critic.fsdp.mixed_precision.cast_forward_inputs",
     "reads param_dtype, reduce_dtype, buffer_dtype"),
    # (a second teacher; distillation on verl's defaults, which name no teacher's checkpoint)
    (("+distillation.teacher_models.math.key=gsm8k",), "distillation.teacher_models.math.key",
     "several teachers, each scoring the rows of its own data sources"),
    (("distillation.enabled=true",), "distillation.teacher_models.teacher_model.model_path",
     "is not set: verl needs the teacher's checkpoint"),
    # hybrid sharding groups verl's device mesh does not cover the GPUs with, or that straddle nodes
    (("actor_rollout_ref.actor.fsdp_config.fsdp_size=3",), "actor_rollout_ref.actor.fsdp_config.fsdp_size",
     "3 does not divide the trainer's 8 GPUs"),
    (("actor_rollout_ref.ref.fsdp_config.fsdp_size=0",), "actor_rollout_ref.ref.fsdp_config.fsdp_size",
     "0 does not divide"),
    (("trainer.nnodes=3", "actor_rollout_ref.actor.fsdp_config.fsdp_size=12"),
     "actor_rollout_ref.actor.fsdp_config.fsdp_size", "divides a node of 8 GPUs or spans whole ones"),
])
def test_what_realbench_cannot_read_or_price_is_refused_by_name(cli, job, overrides, key, says):
    assert_import_refused(cli, job, "grpo_qwen_fsdp.yaml", overrides, key, says)


@pytest.mark.parametrize("flag, padded", [("critic.model.use_remove_padding=false", ["critic"]),
                                          ("actor_rollout_ref.model.use_remove_padding=false", ["actor", "ref"])])
def test_a_critic_padded_beside_a_packed_actor_goes_to_verl_and_back(cli, job, flag, padded, verl_check):
    """verl's critic and actor each pack their rows or not (use_remove_padding, per model block):
    read as padding_free with the other block's models kept padded (training.padded_models). Their
    calls are priced padded, as wide as their longest row, without a token budget in the plan,
    the packed block's with its budget; written back, verl composes the same two flags, and read
    again it is the same plan and estimate."""
    folder = job / f"{padded[0]} padded"
    result, plan, scenario = imported(cli, job, "ppo-rm.yaml", flag, out=folder, name="half")
    assert scenario["training"]["padding_free"] is True and scenario["training"]["padded_models"] == padded
    from realbench.plan import load_scenario

    s = load_scenario(result["scenario"])
    for call in s.dataflow.calls:
        if call.kind.value in ("train", "inference") and call.name != "reward_inf":
            assert call.padding_free is (call.model not in padded), call.name
            assert ("max_tokens" in plan["calls"][call.name]) is (call.model == "critic" and "critic" not in padded)
    out = folder / "verl" / "half.yaml"
    out.parent.mkdir()
    code, _, err = cli("export", "--plan", result["plan"], "--format", "verl", "--out", out)
    assert code == 0, err
    checked = verl_check("validate", out)
    assert checked["ok"] and (checked["use_remove_padding"], checked["critic_use_remove_padding"]) == \
        ("actor" not in padded, "critic" not in padded), checked
    again, plan_again, scenario_again = imported(cli, job, out, out=folder / "again", name="half")
    assert plan_again["calls"] == plan["calls"] and scenario_again["training"] == scenario["training"]
    assert again["time_per_iter_s"] == pytest.approx(result["time_per_iter_s"], rel=1e-12)
    # a written scenario whose calls are listed all packed, given padded_models by hand: the section
    # wins; priced as an engine with one setting for every call, every call packs as that engine does
    from realbench.engines import priced_as
    from realbench.plan.scenario import scenario_from_document

    document = s.with_padding_free(True).to_document()
    assert all(c.get("padding_free") for c in document["dataflow"]["calls"] if c["kind"] in ("train", "inference"))
    document["training"]["padded_models"] = padded
    dumped = scenario_from_document(document)
    assert {c.name: c.padding_free for c in dumped.dataflow.calls} == {c.name: c.padding_free for c in s.dataflow.calls}
    for engine, packs in (("areal", True), ("openrlhf", False)):
        other = priced_as(s, engine)
        assert other.training.padded_models == () and all(
            c.padding_free is packs for c in other.dataflow.calls if c.kind.value in ("train", "inference")), engine


@pytest.mark.parametrize("training, key, says", [
    ({"padding_free": False, "padded_models": ["critic"]}, "training.padded_models", "give padding_free: true"),
    ({"padding_free": True, "padded_models": ["critc"]}, "training.padded_models", "'critc' is not a model"),
    ({"padding_free": True, "padded_models": ["ref"]}, "training.padded_models",
     "the actor's block for the actor and its reference alike")])
def test_padded_models_verl_cannot_express_are_refused_by_name(cli, job, training, key, says):
    """A scenario's padded models: only beside padding_free, only its own models, and for verl
    whole model blocks (the actor and its reference share one)."""
    result, _, scenario = imported(cli, job, "ppo-rm.yaml", out="padded-edit", name="edited")
    scenario["training"].update(training)
    path = Path(result["scenario"]).with_name("edited by hand.yaml")
    path.write_text(yaml.safe_dump(scenario))
    code, _, err = cli("search", "--scenario", path, "--engine", "verl", "--method", "mcmc", "--time-budget", 1)
    assert code == 2 and err.count("\n") == 1 and key in err and says in err, err


FUSED_PATH = {"forward_bytes": 12.0, "moved_bytes": 62.0, "chunk_tokens": 512, "recomputed": True}


@pytest.mark.parametrize("logits, key, says", [
    ({"actor_trian": FUSED_PATH}, "training.logits", "'actor_trian' is not a call of the dataflow"),
    ({"reward_inf": FUSED_PATH}, "training.logits.reward_inf", "a function call computes no log-probabilities"),
    ({"ref_inf": {**FUSED_PATH, "train_bytes": 20.0}}, "training.logits.ref_inf",
     "give train_bytes for a train call's passes, and only for them"),
    ({"ref_inf": {**FUSED_PATH, "chunk_tokens": None}}, "recomputed", "logits computed chunk by chunk"),
])
def test_logits_paths_a_scenario_cannot_have_are_refused_by_name(cli, job, logits, key, says):
    """A scenario's training.logits: only its own scoring and training calls of a model with logits,
    train_bytes for train calls only, recomputation only of chunks."""
    result, _, scenario = imported(cli, job, "grpo_qwen_fsdp.yaml", out="logits-edit", name="edited")
    scenario["training"]["logits"] = logits
    path = Path(result["scenario"]).with_name("logits edited by hand.yaml")
    path.write_text(yaml.safe_dump(scenario))
    code, _, err = cli("search", "--scenario", path, "--engine", "verl", "--method", "mcmc", "--time-budget", 1)
    assert code == 2 and err.count("\n") == 1 and key in err and says in err, err


def test_a_way_of_computing_logits_verl_does_not_have_is_not_written_and_realbenchs_runtime_has_none(cli, job):
    """export writes use_fused_kernels for verl's fused kernels as priced, and nothing else: a
    scenario edited to another path is refused by name, and so is one of realbench's own runtime."""
    result, _, scenario = imported(cli, job, "grpo_qwen_fsdp.yaml", FUSED, out="logits-other", name="other")
    scenario["training"]["logits"]["actor_train"]["train_bytes"] = 8.0
    Path(result["scenario"]).write_text(yaml.safe_dump(scenario))
    out = job / "logits-other" / "verl.yaml"
    code, _, err = cli("export", "--plan", result["plan"], "--format", "verl", "--out", out)
    assert code == 2 and err.count("\n") == 1 and "training.logits.actor_train" in err and \
        "or with its fused kernels (actor_rollout_ref.model.use_fused_kernels)" in err, err
    assert not out.exists()
    from realbench.errors import ConfigError
    from realbench.plan import get_builtin
    from realbench.plan.scenario import scenario_from_document

    document = get_builtin("grpo-7b-16gpu").to_document()
    document["training"]["logits"] = {"actor_train": {**FUSED_PATH, "train_bytes": 20.0}}
    with pytest.raises(ConfigError, match="a scenario of realbench's own runtime has its own"):
        scenario_from_document(document)


def test_a_megatron_critic_with_its_own_layout_and_a_typo_in_the_file_are_refused(cli, job):
    os.chdir(job)
    code, _, err = cli("import", "verl", "ppo megatron.yaml", "critic.megatron.tensor_model_parallel_size=1",
                       "--out", "refused")
    assert code == 2 and "critic.megatron.tensor_model_parallel_size: 1: verl's Megatron state is process-global" in err
    (job / "typo.yaml").write_text(GRPO.replace("ppo_mini_batch_size: 8", "ppo_mini_batchsize: 8"))
    code, _, err = cli("import", "verl", "typo.yaml", "--out", "refused")
    assert code == 2 and "typo.yaml: actor_rollout_ref.actor.ppo_mini_batchsize: verl 0.9.1 has no such setting " \
                         "(did you mean 'actor_rollout_ref.actor.ppo_mini_batch_size'?)" in err, err


def test_a_reward_model_is_served_like_the_rollout(cli, job):
    """verl serves a reward model with vLLM replicas on the same GPUs (tp 1: 8 of them), each
    scoring its 32 / 8 = 4 rows in batches of max_num_seqs 2; the critic packs to verl's default
    budget of 32768 tokens: one micro-batch."""
    _, plan, scenario = imported(cli, job, "ppo-rm.yaml")
    assert plan["calls"]["reward_inf"] == {"mesh": "n0", "dp": 8, "tp": 1, "pp": 1, "micro_batches": 2}
    assert plan["calls"]["critic_inf"]["micro_batches"] == plan["calls"]["critic_train"]["micro_batches"] == 1
    assert scenario["models"]["reward"] == {"path": str(job / "ckpt"), "value_head": True}
    # one serving engine a job: an SGLang rollout beside a vLLM reward model is refused by name
    os.chdir(job)
    code, _, err = cli("import", "verl", "ppo-rm.yaml", "actor_rollout_ref.rollout.name=sglang", "--out", "refused")
    assert code == 2 and err.count("\n") == 1 and "reward.reward_model.rollout.name: 'vllm'" in err, err


def test_a_rollout_replica_over_whole_nodes_is_read_priced_and_written_back(cli, job, verl_check):
    """verl's rollout replica of tp 16 on nodes of 8 (its Qwen2.5-72B scaling recipe): read as one
    generation replica over both nodes, its all-reduces priced across them, written back as tp 16
    and composed by verl's own code the same."""
    from realbench.cost.calls import call_cost
    from realbench.plan import Option, Strategy
    from realbench.plan.plan import load_plan

    _, plan, _ = imported(cli, job, "grpo_qwen_fsdp.yaml", "trainer.nnodes=2", "actor_rollout_ref.model.path=qwen3-8b",
                          "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2",
                          "actor_rollout_ref.rollout.tensor_model_parallel_size=16", out="wide", name="wide")
    gen = plan["calls"]["actor_gen"]
    assert (gen["mesh"], gen["dp"], gen["tp"]) == ("n0-1", 1, 16), gen
    _, scenario, options = load_plan(str(job / "wide" / "wide-plan.yaml"))
    call, model = scenario.dataflow.call("actor_gen"), scenario.models["actor"]
    wide = call_cost(call, model, scenario.cluster, options["actor_gen"])
    narrow = call_cost(call, model, scenario.cluster, Option(options["actor_gen"].mesh, Strategy(2, 8, 1, 1)))
    assert wide.tp_comm_s > narrow.tp_comm_s > 0
    out = job / "wide-verl" / "job.yaml"
    out.parent.mkdir()
    code, _, err = cli("export", "--plan", str(job / "wide" / "wide-plan.yaml"), "--format", "verl", "--out", str(out),
                       "--model-path", "actor=Qwen/Qwen3-8B", "--model-path", "ref=Qwen/Qwen3-8B")
    assert code == 0, err
    checked = verl_check("validate", out)
    assert checked["ok"] and (checked["n_gpus"], checked["rollout_tp"]) == (16, 16), checked


def test_a_rollout_keeping_its_memory_is_read_priced_and_written_back(cli, job, verl_check):
    """free_cache_engine false (verl's Qwen2.5-VL LoRA recipe): the colocated rollout's server keeps
    its share of every GPU through the step (Strategy.keeps_memory): each device's peak is the
    busiest other call's with the server's share beside it; the time is the same (verl resends the
    weights either way). Written back, verl composes the same flag; read again, the same plan."""
    from dataclasses import replace

    from realbench.cost import Estimator
    from realbench.cost.calls import call_cost
    from realbench.plan import Option
    from realbench.plan.plan import load_plan

    _, plan, _ = imported(cli, job, "grpo_qwen_fsdp.yaml", "actor_rollout_ref.rollout.free_cache_engine=False",
                          out="awake", name="awake")
    assert plan["calls"]["actor_gen"]["keeps_memory"] is True
    _, scenario, options = load_plan(str(job / "awake" / "awake-plan.yaml"))
    released = dict(options, actor_gen=Option(options["actor_gen"].mesh,
                                              replace(options["actor_gen"].strategy, keeps_memory=False)))
    est = Estimator(scenario)
    kept, freed = (est.estimate(est.choice_of(o)) for o in (options, released))
    assert kept.time_per_iter_s == freed.time_per_iter_s
    cost = {name: call_cost(scenario.dataflow.call(name), scenario.model_of(scenario.dataflow.call(name)),
                            scenario.cluster, o) for name, o in options.items() if name != "reward_inf"}
    # every call on the 8 GPUs: the actor's sharded state held throughout, generation's share (its working
    # set and its own copy of the weights) beside the update's working set, the busiest other call
    share = cost["actor_gen"].working_bytes + cost["actor_gen"].weights_bytes
    others = max(cost[n].working_bytes + (cost[n].weights_bytes if n == "ref_inf" else 0) for n in ("ref_inf", "actor_train"))
    assert kept.peak_mem_bytes == pytest.approx(cost["actor_train"].master_bytes + share + others, rel=1e-9)
    assert freed.peak_mem_bytes < kept.peak_mem_bytes
    out = job / "awake-verl" / "job.yaml"
    out.parent.mkdir()
    code, _, err = cli("export", "--plan", str(job / "awake" / "awake-plan.yaml"), "--format", "verl", "--out", str(out))
    assert code == 0, err
    assert verl_check("validate", out)["free_cache_engine"] is False
    _, again, _ = imported(cli, out.parent, "job.yaml", out="back", name="back")
    assert again["calls"]["actor_gen"] == plan["calls"]["actor_gen"]


def exported_and_checked(cli, verl_check, plan, out: Path) -> dict:
    """`plan` exported as verl's configuration `out` (in a new folder) and checked by verl's own code
    on a trainer's pool of 8 GPUs: what the check says of it."""
    out.parent.mkdir()
    code, _, err = cli("export", "--plan", plan, "--format", "verl", "--out", out)
    assert code == 0, err
    checked = verl_check("validate", out)
    assert checked["ok"] and checked["n_gpus"] == 8, checked
    return checked


POOL = ("reward.reward_model.enable_resource_pool=true", "reward.reward_model.nnodes=1",
        "reward.reward_model.n_gpus_per_node=4")


def test_a_reward_model_on_its_own_pool_is_read_priced_written_and_read_back(cli, job, verl_check):
    """verl's reward pool (enable_resource_pool: nnodes x n_gpus_per_node GPUs beside the
    trainer's) is read as the nodes after the trainer's: 4 GPUs of a second node, 4 vLLM
    replicas of tp 1, each scoring 32 / 4 = 8 rows in batches of max_num_seqs 2 (4 of them).
    Priced on its own GPUs: the reference starts as generation ends, training waits for the
    scores, the pool holds the reward model alone and the node's other GPUs nothing. Written
    back, verl's own trainer asks Ray for the same pools; read again, the same plan and estimate."""
    result, plan, scenario = imported(cli, job, "ppo-rm.yaml", *POOL, out="pool", name="pooled")
    assert scenario["cluster"] == {"nodes": 2, "gpus_per_node": 8, "device": "h100"}
    assert verl.pricing.POOL_GAP in result["not_priced"] and verl.pricing.TEACHER_GAP not in result["not_priced"]
    assert plan["calls"]["reward_inf"] == {"mesh": "n1:0-3", "dp": 4, "tp": 1, "pp": 1, "micro_batches": 4}
    assert {o["mesh"] for name, o in plan["calls"].items() if name != "reward_inf"} == {"n0"}
    code, out, err = cli("estimate", "--scenario", result["scenario"], "--plan", result["plan"], "--json")
    assert code == 0, err
    estimate = json.loads(out)
    calls, peaks = estimate["calls"], estimate["device_peak_bytes"]
    assert calls["ref_inf"]["start_s"] == calls["actor_gen"]["end_s"]
    assert calls["reward_inf"]["start_s"] >= calls["actor_gen"]["end_s"]
    assert calls["actor_train"]["start_s"] >= calls["reward_inf"]["end_s"]
    assert peaks[8:12] == [calls["reward_inf"]["mem_bytes"]] * 4 and peaks[12:] == [0] * 4
    assert min(peaks[:8]) > 0
    out = job / "pool" / "verl" / "pooled job.yaml"
    checked = exported_and_checked(cli, verl_check, result["plan"], out)
    assert (checked["pools"], checked["reward_pool"]) == ({"global_pool": [8], "reward_pool": [4]}, "reward_pool")
    # verl refuses a pool of no nodes, as realbench does reading it
    refused = verl_check("validate", out, "reward.reward_model.nnodes=0")
    assert not refused["ok"] and "reward.reward_model.nnodes must be greater than 0" in refused["error"], refused
    again, plan_again, scenario_again = imported(cli, job, out, out="pool-again", name="pooled")
    assert plan_again["calls"] == plan["calls"] and scenario_again["cluster"] == scenario["cluster"]
    assert again["time_per_iter_s"] == pytest.approx(result["time_per_iter_s"], rel=1e-12)
    # a pool of whole nodes: two after the trainer's
    _, whole, scenario = imported(cli, job, "ppo-rm.yaml", *POOL[:1], "reward.reward_model.nnodes=2",
                                  "reward.reward_model.n_gpus_per_node=8", out="pool-whole")
    assert scenario["cluster"]["nodes"] == 3
    assert whole["calls"]["reward_inf"] == {"mesh": "n1-2", "dp": 16, "tp": 1, "pp": 1, "micro_batches": 1}
    code, _, err = cli("export", "--plan", job / "pool-whole" / "ppo-rm-plan.yaml", "--format", "verl",
                       "--out", job / "pool-whole" / "verl.yaml")
    assert code == 0, err
    assert verl_check("validate", job / "pool-whole" / "verl.yaml")["pools"] == {"global_pool": [8],
                                                                                "reward_pool": [8, 8]}


# verl's on-policy distillation, as its examples/on_policy_distillation_trainer/run_qwen3_8b_fsdp.sh sets
# it (the k1 reverse-KL reward on the policy gradient, no task rewards), with a teacher of 4 GPUs (tp 2)
# and its server's steps of 1024 tokens
TEACHER = "distillation.teacher_models.teacher_model"
DISTILLED = ("distillation.enabled=true", "distillation.nnodes=1", "distillation.n_gpus_per_node=4",
             f"{TEACHER}.model_path=ckpt", f"{TEACHER}.inference.tensor_model_parallel_size=2",
             f"{TEACHER}.inference.name=vllm", f"{TEACHER}.inference.max_num_batched_tokens=1024",
             "distillation.distillation_loss.loss_mode=k1", "distillation.distillation_loss.use_task_rewards=false",
             "distillation.distillation_loss.use_policy_gradient=true", "distillation.distillation_loss.topk=64")


def test_on_policy_distillation_is_read_priced_searched_written_and_read_back(cli, job, verl_check):
    """verl's teacher pool (distillation.nnodes x n_gpus_per_node beside the trainer's) is read as
    the nodes after the trainer's: 4 GPUs of a second node, 2 vLLM replicas of tp 2, each prefilling
    32 x 4 / 2 = 64 rows of 64 + 128 tokens in steps of at most 1024 tokens: ceil(64 x 192 / 1024) =
    12 steps, priced as the fewest equal splits of 64 rows at least as many, 16. The teacher's call
    reads every sequence and feeds the actor's loss: it starts as the sequences reach its node and training
    waits for it; its pool holds the teacher alone. Written back, verl's own DistillationConfig
    resolves the same teacher (2 replicas of tp 2, the pool of 4) and its trainer asks Ray for the
    same pools; read again, the same plan and estimate. A search keeps the teacher on its pool."""
    result, plan, scenario = imported(cli, job, "grpo_qwen_fsdp.yaml", *DISTILLED, out="distilled", name="opd")
    assert scenario["cluster"] == {"nodes": 2, "gpus_per_node": 8, "device": "h100"}
    assert scenario["models"]["teacher"] == {"path": str(job / "ckpt")}
    assert scenario["dataflow"]["with_teacher"] is True
    assert plan["calls"]["teacher_inf"] == {"mesh": "n1:0-3", "dp": 2, "tp": 2, "pp": 1, "micro_batches": 16}
    assert {o["mesh"] for name, o in plan["calls"].items() if name != "teacher_inf"} == {"n0"}
    # the loss's settings are the user's, carried unpriced
    assert scenario["engine_settings"]["distillation.distillation_loss.loss_mode"] == "k1"
    # what is not priced, as the plan meets it: the teacher's streaming; no reward pool, no offload
    pricing = verl.pricing
    assert pricing.TEACHER_GAP in result["not_priced"] and pricing.SERVING_GAP in result["not_priced"]
    assert pricing.POOL_GAP not in result["not_priced"] and pricing.OFFLOAD_SYNC_GAP not in result["not_priced"]
    offloaded, _, _ = imported(cli, job, "grpo_qwen_fsdp.yaml", "actor_rollout_ref.actor.fsdp_config.param_offload=true",
                               out="offloaded")
    assert pricing.OFFLOAD_SYNC_GAP in offloaded["not_priced"] and pricing.TEACHER_GAP not in offloaded["not_priced"]
    code, out, err = cli("estimate", "--scenario", result["scenario"], "--plan", result["plan"], "--json")
    assert code == 0, err
    estimate = json.loads(out)
    calls, peaks = estimate["calls"], estimate["device_peak_bytes"]
    # (the sequences cross to the teacher's node first)
    assert calls["actor_gen"]["end_s"] < calls["teacher_inf"]["start_s"] < calls["actor_gen"]["end_s"] + 1e-3
    assert calls["actor_train"]["start_s"] >= calls["teacher_inf"]["end_s"] > calls["teacher_inf"]["start_s"]
    assert peaks[8:12] == [calls["teacher_inf"]["mem_bytes"]] * 4 and peaks[12:] == [0] * 4
    out = job / "distilled" / "verl" / "opd job.yaml"
    checked = exported_and_checked(cli, verl_check, result["plan"], out)
    assert (checked["pools"], checked["teacher_pool"]) == ({"global_pool": [8], "teacher_pool": [4]},
                                                            "teacher_pool"), checked
    teacher = checked["teachers"]["default"]
    assert (teacher["model_path"], teacher["tp"], teacher["replicas"]) == (str(job / "ckpt"), 2, 2), teacher
    # (a step of the teacher's server: 64 / 16 = 4 rows of 192 tokens)
    assert (teacher["max_num_seqs"], teacher["max_num_batched_tokens"]) == (4, 768), teacher
    # a hub id for a checkpoint is written as given, for verl to fetch (a folder here: made absolute)
    hub = job / "distilled" / "verl" / "hub.yaml"
    code, _, err = cli("export", "--plan", result["plan"], "--format", "verl", "--out", hub,
                       "--model-path", "teacher=Qwen/Qwen3-32B")
    assert code == 0, err
    written = yaml.safe_load(hub.read_text())
    assert written["distillation"]["teacher_models"]["teacher_model"]["model_path"] == "Qwen/Qwen3-32B"
    assert written["actor_rollout_ref"]["model"]["path"] == str(job / "ckpt")
    again, plan_again, scenario_again = imported(cli, job, out, out="distilled-again", name="opd")
    assert plan_again["calls"] == plan["calls"] and scenario_again["cluster"] == scenario["cluster"]
    assert again["time_per_iter_s"] == pytest.approx(result["time_per_iter_s"], rel=1e-12)
    code, out, err = cli("search", "--scenario", result["scenario"], "--engine", "verl", "--method", "mcmc",
                         "--time-budget", "3", "--seed", "0", "--out", job / "distilled" / "searched")
    assert code == 0, err
    searched = yaml.safe_load((job / "distilled" / "searched").read_text())
    assert searched["calls"]["teacher_inf"]["mesh"].startswith("n1") and searched["calls"]["actor_train"]["mesh"] == "n0"


def test_a_mixture_of_experts_teacher_spreads_its_experts_over_its_servers(cli, job, verl_check):
    """A teacher of experts (Qwen3-30B-A3B, from the catalogue) served as the rollout is: replicas of
    tp 4 x data_parallel_size 2 GPUs, its experts over expert_parallel_size 8 of them, each whole:
    the call's dp 2 (tp groups), ep 8, etp 1; each tp group prefills 128 / 2 = 64 rows of 192
    tokens in ceil(64 x 192 / 1024) = 12 steps, 16 as equal splits of its rows. Written back as verl's own keys, which its
    DistillationConfig takes (one replica of 8 GPUs); read again, the same plan."""
    moe = (f"{TEACHER}.model_path=qwen3-30b-a3b", "distillation.n_gpus_per_node=8",
           f"{TEACHER}.inference.tensor_model_parallel_size=4", f"{TEACHER}.inference.data_parallel_size=2",
           f"{TEACHER}.inference.expert_parallel_size=8")
    result, plan, _ = imported(cli, job, "grpo_qwen_fsdp.yaml", *DISTILLED[:3], *DISTILLED[5:], *moe,
                               out="distilled-moe", name="moe")
    assert plan["calls"]["teacher_inf"] == {"mesh": "n1", "dp": 2, "tp": 4, "pp": 1, "micro_batches": 16, "ep": 8,
                                            "etp": 1}
    out = job / "distilled-moe" / "verl.yaml"
    code, _, err = cli("export", "--plan", result["plan"], "--format", "verl", "--out", out,
                       "--model-path", "teacher=Qwen/Qwen3-30B-A3B")
    assert code == 0, err
    served = yaml.safe_load(out.read_text())["distillation"]["teacher_models"]["teacher_model"]["inference"]
    assert (served["tensor_model_parallel_size"], served["data_parallel_size"], served["expert_parallel_size"]) == \
        (4, 2, 8)
    checked = verl_check("validate", out)
    assert checked["ok"] and checked["teachers"]["default"]["replicas"] == 1, checked
    _, again, _ = imported(cli, job, out, out="distilled-moe-again", name="moe")
    assert again["calls"] == plan["calls"]
    # verl's own rule for a server's experts, as for the rollout's
    assert_import_refused(cli, job, "grpo_qwen_fsdp.yaml", (*DISTILLED[:3], *DISTILLED[5:], *moe[:-1],
                                                            f"{TEACHER}.inference.expert_parallel_size=4"),
                          f"{TEACHER}.inference.expert_parallel_size",
                          "4: verl asserts expert_parallel_size == tensor_model_parallel_size x data_parallel_size")


def test_a_teachers_server_replicates_its_kv_heads_as_a_rollouts_does():
    """A teacher's server (vLLM, SGLang) splits its 8 attention heads over tp 8 and replicates its 4 KV
    heads on 2 GPUs each, as a generation does (the call is `served`); the reference's forward, which
    Megatron computes, must split them, and is refused at tp 8 naming tp."""
    from realbench.plan.options import strategy_problem
    from realbench.plan.scenario import scenario_from_document

    scenario = scenario_from_document({
        "name": "opd", "algorithm": "grpo", "cluster": {"nodes": 2, "gpus_per_node": 8, "device": "h100"},
        "models": {"actor": "llama-tiny", "ref": "llama-small", "teacher": "llama-small",
                   "reward": {"arch": "llama-tiny", "value_head": True}},
        "dataflow": {"algorithm": "grpo", "prompts": 4, "prompt_len": 8, "gen_len": 8, "group_size": 2,
                     "with_teacher": True}})
    teacher, ref = scenario.dataflow.call("teacher_inf"), scenario.dataflow.call("ref_inf")
    assert (scenario.models["teacher"].n_heads, scenario.models["teacher"].n_kv_heads) == (8, 4)
    assert teacher.served and not ref.served
    tp8 = (scenario.cluster, Mesh(1, 1, 0, 8), Strategy(1, 8, 1))
    assert strategy_problem(teacher, scenario.models["teacher"], *tp8) is None
    assert strategy_problem(ref, scenario.models["ref"], *tp8)[0] == "tp"


def test_a_teacher_on_the_trainers_gpus_is_refused_by_name_on_export(cli, job):
    """verl runs a teacher on a pool of its own: a plan that puts it on the trainer's GPUs is not
    one verl runs, refused naming the call's mesh."""
    os.chdir(job)
    result, plan, _ = imported(cli, job, "grpo_qwen_fsdp.yaml", *DISTILLED, out="distilled-moved", name="moved")
    plan["calls"]["teacher_inf"]["mesh"] = "n0:0-3"
    moved = job / "distilled-moved" / "moved plan.yaml"
    moved.write_text(yaml.safe_dump(plan))
    code, _, err = cli("export", "--plan", moved, "--format", "verl", "--out", job / "distilled-moved" / "v.yaml")
    assert code == 2 and err.count("\n") == 1 and "calls.teacher_inf.mesh: verl runs a distillation teacher" in err, err


@pytest.mark.parametrize("overrides, key, says", [
    (("+distillation.teacher_models.second.model_path=ckpt",), "distillation.teacher_models.second.model_path",
     "several teachers, each scoring the rows of its own data sources"),
    (("distillation.nnodes=0",), "distillation.nnodes", "0: verl needs the teacher pool's nnodes above 0"),
    ((f"{TEACHER}.inference.name=sglang",), f"{TEACHER}.inference.name",
     "'sglang': realbench carries one serving engine a job, the rollout's ('vllm')"),
    ((f"{TEACHER}.inference.data_parallel_size=2",), f"{TEACHER}.inference.data_parallel_size",
     "2 without expert parallelism (expert_parallel_size 1)"),
    ((f"{TEACHER}.inference.max_model_len=192",), f"{TEACHER}.inference.max_model_len",
     "192: the teacher takes a prompt and its whole response and generates one token: 193 at least"),
    (("distillation.n_gpus_per_node=16",), "distillation.n_gpus_per_node", "16 on 1 node(s)"),
    (("+distillation.distillation_loss.use_chunked_topk=true",), "distillation.distillation_loss.use_chunked_topk",
     "True: the top-k log-probabilities computed chunk by chunk"),
    (("algorithm.adv_estimator=gae", "critic.enable=true", "critic.model.path=ckpt"), "distillation.enabled",
     "True: realbench prices on-policy distillation in verl's synchronous trainer with GRPO's or RLOO's calls")])
def test_distillation_realbench_cannot_price_is_refused_by_name(cli, job, overrides, key, says):
    assert_import_refused(cli, job, "grpo_qwen_fsdp.yaml", (*DISTILLED, *overrides), key, says)


def test_a_teacher_is_refused_by_realbench_s_runtime_and_the_other_engines():
    """realbench's runtime computes no teacher: a scenario of its own with one is refused by run,
    naming the dataflow's setting (it is still priced and searched); OpenRLHF's and AReaL's spaces
    refuse it the same way (realbench writes verl's distillation only)."""
    from realbench.engines.areal.pricing import space_problem_of_scenario as areal_problem
    from realbench.engines.openrlhf.pricing import space_problem_of_scenario as openrlhf_problem
    from realbench.errors import ConfigError
    from realbench.plan.plan import refuse_unrunnable
    from realbench.plan.scenario import scenario_from_document

    scenario = scenario_from_document({
        "name": "opd", "algorithm": "grpo", "cluster": {"nodes": 2, "gpus_per_node": 2, "device": "cpu"},
        "models": {"actor": "llama-tiny", "teacher": "llama-small", "reward": {"arch": "llama-tiny", "value_head": True}},
        "dataflow": {"algorithm": "grpo", "prompts": 4, "prompt_len": 8, "gen_len": 8, "group_size": 2,
                     "with_ref": False, "with_teacher": True}})
    assert [c.name for c in scenario.dataflow.calls] == ["actor_gen", "reward_inf", "teacher_inf", "actor_train"]
    with pytest.raises(ConfigError) as e:
        refuse_unrunnable(scenario, {})
    assert e.value.field == "dataflow.with_teacher" and "does not compute it" in e.value.message
    for problem, engine in ((openrlhf_problem, "OpenRLHF"), (areal_problem, "AReaL")):
        assert problem(scenario) == ("dataflow.with_teacher", "on-policy distillation (a teacher's log-probabilities "
                                     f"in the actor's loss): realbench reads and writes verl's, not {engine}'s")


@pytest.mark.parametrize("config, overrides, key, says", [
    ("ppo-rm.yaml", POOL[:1], "reward.reward_model.nnodes", "0: verl needs a reward pool's nnodes above 0"),
    ("ppo-rm.yaml", (*POOL[:1], "reward.reward_model.nnodes=2", "reward.reward_model.n_gpus_per_node=4"),
     "reward.reward_model.n_gpus_per_node", "4 on 2 node(s): realbench's nodes have the trainer's 8 GPUs"),
    ("ppo-rm.yaml", (*POOL[:2], "reward.reward_model.n_gpus_per_node=16"),
     "reward.reward_model.n_gpus_per_node", "16 on 1 node(s)"),
    ("grpo_qwen_fsdp.yaml", POOL, "reward.reward_model.enable_resource_pool",
     "True without reward.reward_model.enable: verl would hold a pool of GPUs for no reward model")])
def test_a_reward_pool_realbench_cannot_place_is_refused_by_name(cli, job, config, overrides, key, says):
    os.chdir(job)
    code, _, err = cli("import", "verl", config, *overrides, "--out", "refused")
    assert code == 2 and err.count("\n") == 1 and f"{key}: {says}" in err, err
    assert not (job / "refused").exists()


def test_search_inside_verl_offers_the_reward_model_its_own_pool(cli, job):
    """On two nodes the search offers every role on both, or the reward model on the second node
    and the rest on the first; any plan of either kind is one verl runs, written with or without
    the pool. Searched from an imported pooled plan, that plan is the one compared. A reward model
    placed otherwise is refused on export, naming the reward call's mesh."""
    import random

    from realbench.plan import load_scenario

    result, plan, _ = imported(cli, job, "ppo-rm.yaml", *POOL, out="pool-search", name="pooled")
    scenario = load_scenario(result["scenario"])
    groups = list(verl.plan_groups(scenario))
    kinds = {}
    rng = random.Random(0)
    for group in groups:
        options = {name: rng.choice(opts) for name, opts in group.items()}
        assert verl.space_problem(scenario, options) is None
        _, written = verl.to_config(scenario, options, {"actor": "a", "ref": "a", "critic": "c", "reward": "r"})
        pooled = options["reward_inf"].mesh != options["actor_train"].mesh
        assert written["trainer.nnodes"] == (1 if pooled else 2)
        assert written.get("reward.reward_model.enable_resource_pool", False) is pooled
        if pooled:
            assert options["reward_inf"].mesh.label(8) == "n1" and written["reward.reward_model.nnodes"] == 1
            assert {o.mesh.label(8) for n, o in options.items() if n != "reward_inf"} == {"n0"}
        kinds[pooled] = kinds.get(pooled, 0) + 1
    assert set(kinds) == {False, True}, kinds
    code, out, err = cli("search", "--scenario", result["scenario"], "--engine", "verl", "--method", "mcmc",
                         "--time-budget", 3, "--plan", result["plan"], "--json")
    assert code == 0, err
    found = json.loads(out)
    assert found["compared"]["time_per_iter_s"] == pytest.approx(result["time_per_iter_s"], rel=1e-12)
    assert found["best_time_s"] <= found["compared"]["time_per_iter_s"]
    plan["calls"]["reward_inf"].update({"mesh": "n0:4-7"})
    path = job / "pool-search" / "overlapping-plan.yaml"
    path.write_text(yaml.safe_dump(plan))
    code, _, err = cli("export", "--plan", path, "--format", "verl", "--out", job / "pool-search" / "verl.yaml")
    assert code == 2 and err.count("\n") == 1 and "calls.reward_inf.mesh: verl runs a reward model on the " \
        "trainer's pool or on its own" in err, err


def test_search_inside_verl_finds_a_plan_verl_runs(cli, job, verl_check):
    """search --engine verl searches only plans verl can run: its best (exhaustive) is no slower
    than verl's default configuration and estimates as reported; written out, verl's own checks
    accept it. Compared with an imported plan, that plan's estimate is the one reported."""
    _, _, _ = imported(cli, job, "ppo-rm.yaml", out="searched")
    scenario = job / "searched" / "ppo-rm.yaml"
    code, out, err = cli("search", "--scenario", scenario, "--engine", "verl", "--method", "exhaustive",
                         "--time-budget", 60, "--out", job / "searched" / "best-plan.yaml", "--json")
    assert code == 0, err
    found = json.loads(out)
    assert found["engine"] == "verl" and found["groups"] > 1
    assert found["groups_searched"] >= 1 and found["groups_searched"] + found["groups_ruled_out"] <= found["groups"]
    assert found["compared"]["name"] == "verl's default configuration" and found["compared"]["fits"]
    assert found["best_time_s"] <= found["compared"]["time_per_iter_s"] and found["speedup"] >= 1
    estimate = json.loads(cli("estimate", "--scenario", scenario, "--plan", job / "searched" / "best-plan.yaml",
                              "--json")[1])
    assert estimate["time_per_iter_s"] == pytest.approx(found["best_time_s"], rel=1e-9)
    config = job / "searched" / "verl" / "best.yaml"
    config.parent.mkdir()
    code, _, err = cli("export", "--plan", job / "searched" / "best-plan.yaml", "--format", "verl", "--out", config)
    assert code == 0, err
    assert verl_check("validate", config)["ok"]
    code, out, err = cli("search", "--scenario", scenario, "--engine", "verl", "--method", "mcmc", "--time-budget", 2,
                         "--plan", job / "searched" / "ppo-rm-plan.yaml", "--json")
    assert code == 0, err
    estimate = json.loads(cli("estimate", "--scenario", scenario, "--plan", job / "searched" / "ppo-rm-plan.yaml",
                              "--json")[1])
    assert json.loads(out)["compared"]["time_per_iter_s"] == pytest.approx(estimate["time_per_iter_s"], rel=1e-12)


def test_verls_search_rules_out_only_groups_none_of_whose_plans_beats_its_best(cli, job, one_step_off_yaml):
    """A group's bound (search.engine.group_bound): a device runs one call at a time, so no plan of
    the group takes less than, on each device, the sum of the fastest options of the calls there.
    On a group of one plan: colocated, the sum of its calls' times; generation (and the reward
    function) a step ahead on a pool of their own, the larger of the two pools' sums. Random plans
    of the groups of the imported jobs take no less. The search goes best bound first and stops
    at the first group whose bound is not below its best: exhaustive on the imported PPO job, it
    searches under a quarter of the groups, and the groups whose bound is below its best plan,
    each searched whole, hold none better."""
    import numpy as np

    from realbench.cost import Estimator
    from realbench.engines import priced_as
    from realbench.plan import load_plan, load_scenario
    from realbench.search import run_search
    from realbench.search.engine import engine_search, group_bound

    ppo, _, _ = imported(cli, job, "ppo-rm.yaml", out="bound")
    ahead, _, _ = imported(cli, job, one_step_off_yaml, *ONE_STEP_OFF, out="bound-ahead")
    for result, pools in ((ppo, 1), (ahead, 2)):
        plan = load_plan(result["plan"], load_scenario(result["scenario"]))[2]
        scenario = priced_as(load_scenario(result["scenario"]), "verl")
        one = Estimator(scenario, only={n: [o] for n, o in plan.items()})
        sums: dict = {}
        for i, name in enumerate(one.call_names):
            sums[plan[name].mesh] = sums.get(plan[name].mesh, 0.0) + float(one.dur[i][0])
        assert len(sums) == pools and group_bound(one) == pytest.approx(max(sums.values()), rel=1e-12)
        rng = np.random.default_rng(0)
        for only in list(verl.plan_groups(scenario))[::7]:
            est = Estimator(scenario, only=only)
            bound = group_bound(est)
            choices = np.stack([rng.choice(est.candidates(i), 32) for i in range(est.n)], axis=1)
            assert (est.evaluate_batch(choices)[0] >= bound * (1 - 1e-12)).all()
    scenario = load_scenario(ppo["scenario"])
    events = []
    found = engine_search(scenario, "verl", "exhaustive", 600, on_event=events.append)
    assert [e.done for e in events].count(True) == 1 and events[-1].done  # one stream, the groups' counts added
    assert (events[-1].evaluations, events[-1].best_time_s) == (found.evaluations, found.best_time_s)
    assert all(a.seconds <= b.seconds and a.evaluations <= b.evaluations for a, b in zip(events, events[1:]))
    priced = priced_as(scenario, "verl")
    groups = list(verl.plan_groups(priced))
    bounds = [group_bound(Estimator(priced, only=only)) for only in groups]
    below = [only for only, bound in zip(groups, bounds) if bound < found.best_time_s]
    assert found.groups == len(groups) and found.searched >= len(below) and found.searched < len(groups) / 4
    assert found.searched + found.ruled_out == found.groups  # (none left unsearched for want of time)
    # the groups that may hold a better plan (the others cannot: their bounds), each searched whole
    assert min(run_search(Estimator(priced, only=only), "exhaustive", 600).best_time_s for only in below) == \
        pytest.approx(found.best_time_s, rel=1e-12)


def test_every_plan_of_verls_space_is_one_verl_runs(job):
    """Random plans of every group the search explores pass the space's rules and are written as
    a configuration (micro-batch divisibility and the critic's token budget included)."""
    import random
    from dataclasses import replace

    from realbench.engines import import_config
    from realbench.plan import load_scenario

    os.chdir(job)
    for config in ("ppo-rm.yaml", "ppo megatron.yaml", "grpo_qwen_fsdp.yaml"):
        scenario_path, _ = import_config("verl", config, ["+critic.ppo_infer_max_token_len_per_gpu=512"]
                                         if "megatron" in config else [], "space", overwrite=True)
        scenario = load_scenario(str(scenario_path))
        rng, groups = random.Random(0), list(verl.plan_groups(scenario))
        engines = set()
        for group in groups:
            for _ in range(5):
                options = {name: rng.choice(opts) for name, opts in group.items()}
                assert verl.space_problem(scenario, options) is None
                engine, written = verl.to_config(scenario, options, {"actor": "a", "ref": "a", "critic": "c",
                                                                      "reward": "r"})
                engines.add(engine)
                if engine == "dp":  # (Ulysses: each engine's groups as planned)
                    assert all(written[verl.SEQUENCE_PARALLEL[role][1]] == options[name].strategy.sp
                               for role, name in (("actor", "actor_train"), ("ref", "ref_inf"),
                                                  ("critic", "critic_train")) if name in options)
                else:  # (Megatron's rings: one size, the actor's block and the critic's)
                    assert {o.strategy.sp for n, o in options.items() if n in ("actor_train", "ref_inf", "critic_train", "critic_inf")} == \
                        {written["actor_rollout_ref.actor.megatron.context_parallel_size"]}
                    assert written.get("critic.megatron.context_parallel_size",
                                       options["actor_train"].strategy.sp) == options["actor_train"].strategy.sp
                if "critic_train" in options:  # (its rows packed: the budget its memory is planned for)
                    assert options["critic_train"].strategy.max_tokens == options["critic_inf"].strategy.max_tokens \
                        == written["critic.ppo_infer_max_token_len_per_gpu"]
        assert engines == {"dp", "megatron"}, engines  # both training engines are searched
        # FSDP with Ulysses groups of 2 and 4 GPUs (the checkpoint's 4 heads split no further);
        # Megatron with context-parallel rings of any size its layout leaves (the heads need not split)
        fsdp = {o.strategy.sp for g in groups for o in g["actor_train"] if o.strategy.zero >= 2}
        rings = {(o.strategy.sp, o.strategy.ring) for g in groups for o in g["actor_train"] if o.strategy.zero < 2}
        N = scenario.cluster.nodes * scenario.cluster.gpus_per_node
        assert fsdp == {1, 2, 4} and rings == {(1, "")} | {(cp, "p2p") for cp in (2, 4, 8, 16) if cp <= N}, rings
        # FSDP's Ulysses sizes are each role's own (verl's engine settings per role): the actor, the
        # reference and the critic are each offered every size, and one group offers them apart
        for name in ("actor_train", "ref_inf", "critic_train"):
            offered = {o.strategy.sp for g in groups for o in g.get(name, [])
                       if o.strategy.zero >= 2 or (name == "ref_inf" and o.strategy.zero == 3)}
            assert offered == ({1, 2, 4} if name in groups[0] else set()), (name, offered)
        if "critic_train" in groups[0]:
            assert any(len({o.strategy.sp for o in g["actor_train"]}) == 3 and g["critic_train"][0].strategy.sp == 2
                       for g in groups)
        # a reference whose rings differ from the actor's: verl's Megatron state is process-global
        ringed = next({n: opts[0] for n, opts in g.items()} for g in groups if g["actor_train"][0].strategy.ring)
        if "ref_inf" in ringed:
            ref = ringed["ref_inf"]
            ringed["ref_inf"] = replace(ref, strategy=replace(ref.strategy, dp=ref.strategy.dp * ref.strategy.sp, sp=1,
                                                              ring=""))
            key, why = verl.space_problem(scenario, ringed)
            assert key == "calls.ref_inf.sp" and "one context_parallel_size" in why, why
        # both engines' offloads are searched, and written as verl's settings
        for group in groups:
            options = {name: opts[-1] for name, opts in group.items()}
            actor = options["actor_train"].strategy
            assert (actor.offload_params, actor.offload_optimizer) == (actor.zero != 2, True), actor
            assert verl.space_problem(scenario, options) is None
            engine, written = verl.to_config(scenario, options, {"actor": "a", "ref": "a", "critic": "c",
                                                                  "reward": "r"})
            block = verl.OFFLOAD_BLOCK[engine]["actor"]
            assert (written[f"{block}.param_offload"], written[f"{block}.optimizer_offload"]) == \
                (actor.offload_params, True)


def test_a_users_fsdp2_is_carried_searched_and_written_as_fsdp2_runs(cli, job, verl_check):
    """verl's `strategy: fsdp2`, priced as FSDP1 is but for an offloaded model's weight sync, is carried
    from the configuration read to the one written (the round trip checks verl builds its engines so).
    FSDP2 stages the sync's shards in one way where FSDP1 brings the module in and sends it back: the
    sync's host crossing is half FSDP1's, 4 P / dp bytes over the host link (P parameters, their fp32
    shard). The search offers FSDP2's parameter offload, and a plan with one is written and composed
    by verl; a Megatron plan beside the user's FSDP version and a version verl's FSDP does not have are
    refused by name."""
    from dataclasses import replace

    from realbench.cost import Estimator
    from realbench.engines import priced_as
    from realbench.plan import Option, load_scenario

    os.chdir(job)
    first, plan, scenario_doc = imported(cli, job, "ppo-rm.yaml", *FSDP2, out="fsdp2", name="job")
    assert {k: scenario_doc["engine_settings"][k] for k in verl.STRATEGY.values()} == \
        {"actor_rollout_ref.actor.strategy": "fsdp2", "critic.strategy": "fsdp2"}
    scenario = priced_as(load_scenario(first["scenario"]), "verl")
    offered = {"fsdp": set(), "megatron": set()}
    for group in verl.plan_groups(scenario):
        engine = "fsdp" if group["actor_train"][0].strategy.zero >= 2 else "megatron"
        for name in ("actor_train", "critic_train"):
            offered[engine] |= {(o.strategy.offload_params, o.strategy.offload_optimizer) for o in group[name]}
    both = {(False, False), (False, True), (True, False), (True, True)}
    assert offered == {"fsdp": both, "megatron": both}, offered
    fsdp_plan = next({n: opts[0] for n, opts in g.items()} for g in verl.plan_groups(scenario)
                     if g["actor_train"][0].strategy.zero == 3)
    assert verl.space_problem(scenario, fsdp_plan) is None
    offloaded = {**fsdp_plan, "actor_train": Option(fsdp_plan["actor_train"].mesh,
                                                    replace(fsdp_plan["actor_train"].strategy, offload_params=True))}
    assert verl.space_problem(scenario, offloaded) is None

    def sync_s(scen, chosen):
        est = Estimator(scen)
        return est.estimate(est.choice_of(chosen)).calls["actor_gen"].realloc_s

    fsdp1 = scenario.model_copy(update={"engine_settings": {**scenario.engine_settings,
                                                            "actor_rollout_ref.actor.strategy": "fsdp"}})
    base = sync_s(scenario, fsdp_plan)
    one_way, both_ways = sync_s(scenario, offloaded) - base, sync_s(fsdp1, offloaded) - base
    from realbench.cost.simulate import FSDP_VERSION_KEYS

    assert FSDP_VERSION_KEYS["verl"] == verl.STRATEGY  # (the cost model names verl's setting as its reader does)
    params, dp = scenario.models["actor"].n_params, offloaded["actor_train"].strategy.dp
    assert one_way == pytest.approx(4 * params / dp / scenario.cluster.host_bw, rel=1e-9)
    assert both_ways == pytest.approx(2 * one_way, rel=1e-9)
    megatron = next({n: opts[0] for n, opts in g.items()} for g in verl.plan_groups(scenario)
                    if g["actor_train"][0].strategy.zero < 2)
    key, why = verl.space_problem(scenario, megatron)
    assert key == "engine_settings.actor_rollout_ref.actor.strategy" and "this plan trains with Megatron" in why
    edited = scenario.model_copy(update={"engine_settings": {**scenario.engine_settings,
                                                             "critic.strategy": "fsdp_turbo"}})
    assert verl.space_problem(edited, fsdp_plan) == ("engine_settings.critic.strategy",
                                                     "'fsdp_turbo': realbench writes verl's FSDP1 and FSDP2 (fsdp, fsdp2)")
    # the command line: the imported plan with the actor's parameters offloaded, written and composed by verl
    doc = yaml.safe_load(Path(first["plan"]).read_text())
    doc["calls"]["actor_train"]["offload_params"] = True
    (job / "fsdp2" / "offloaded.yaml").write_text(yaml.safe_dump(doc))
    code, _, err = cli("export", "--plan", job / "fsdp2" / "offloaded.yaml", "--format", "verl", "--out",
                       job / "fsdp2" / "verl.yaml", "--force")
    assert code == 0, err
    checked = verl_check("validate", job / "fsdp2" / "verl.yaml")
    assert checked["ok"] and checked["engine_strategy"] == "fsdp2", checked
    _, again, _ = imported(cli, job, job / "fsdp2" / "verl.yaml", out="fsdp2 again", name="job")
    assert again["calls"]["actor_train"]["offload_params"] is True

def test_search_inside_an_engine_refuses_what_it_cannot_do(cli, job, tmp_path):
    code, _, err = cli("search", "--scenario", "dpo-tiny-cpu", "--engine", "verl", "--method", "mcmc",
                       "--time-budget", 1)
    assert code == 2 and "scenario.algorithm: realbench writes verl's PPO, GRPO and RLOO, not dpo" in err, err
    code, _, err = cli("search", "--scenario", "grpo-tiny-cpu", "--engine", "verl", "--method", "mcmc",
                       "--time-budget", 1, "--storage", f"sqlite:///{tmp_path / 's.db'}")
    assert code == 2 and "--storage: is not used with --engine" in err, err
    code, _, err = cli("estimate", "--scenario", "grpo-tiny-cpu", "--baseline", "heuristic", "--profile", "none",
                       "--out", tmp_path / "realbench-plan.yaml")
    assert code == 0, err
    code, _, err = cli("search", "--scenario", "grpo-tiny-cpu", "--engine", "verl", "--method", "mcmc",
                       "--time-budget", 1, "--plan", tmp_path / "realbench-plan.yaml")
    assert code == 2 and "verl cannot run it" in err and err.count("\n") == 1, err


def test_each_engine_prices_the_old_log_probabilities_as_it_takes_them(cli, tmp_path):
    """realbench's later_steps is, to an engine, its forward over the whole batch (the same
    numbers, one forward of a minibatch more: grpo-7b-16gpu's 4 optimizer steps take 4 forwards, not
    3); generation's (rollout) stays generation's in verl and AReaL and is refused for OpenRLHF,
    which always recomputes them, on search and on export alike."""
    from realbench.cost import Estimator
    from realbench.cost.baselines import symmetric_plan
    from realbench.cost.calls import behaviour_forwards
    from realbench.engines import ENGINES, priced_as
    from realbench.errors import ConfigError
    from realbench.plan import get_builtin
    from realbench.plan.mesh import Option, Strategy

    job = get_builtin("grpo-7b-16gpu")
    assert job.training.old_logprobs == "later_steps"
    est = Estimator(job, profile=None)
    options = est.options_of(symmetric_plan(est))
    # (an engine's rollout server has no pipeline: the symmetric plan's generation on its GPUs without one)
    options["actor_gen"] = Option(options["actor_gen"].mesh, Strategy(4, 4, 1, 1))
    plan = est.choice_of(options)
    ours = est.estimate(plan).calls["actor_train"].time_s
    rollout = job.with_old_logprobs("rollout")
    theirs = Estimator(rollout, profile=None).estimate(plan).calls["actor_train"].time_s
    forward = (ours - theirs) / 3  # one minibatch's forward
    for engine in ENGINES:
        as_run = priced_as(job, engine)
        train = as_run.dataflow.call("actor_train")
        assert as_run.training.old_logprobs == train.old_logprobs == "whole_batch", engine
        assert behaviour_forwards(train, as_run.models["actor"]) == 4
        priced = Estimator(as_run, profile=None)
        assert priced.estimate(priced.choice_of(options)).calls["actor_train"].time_s == \
            pytest.approx(ours + forward, rel=1e-9), engine
    assert priced_as(rollout, "verl").training.old_logprobs == priced_as(rollout, "areal").training.old_logprobs == \
        "rollout"
    with pytest.raises(ConfigError) as refused:
        priced_as(rollout, "openrlhf")
    assert refused.value.field == "training.old_logprobs" and "always" in refused.value.message
    # the same refusal on the command line, by a scenario file of the user's
    path = tmp_path / "grpo, rollout log-probs.yaml"
    path.write_text(yaml.safe_dump(rollout.to_document(), sort_keys=False))
    code, _, err = cli("search", "--scenario", path, "--engine", "openrlhf", "--method", "mcmc", "--time-budget", 1)
    assert code == 2 and err.count("\n") == 1 and "training.old_logprobs" in err and "OpenRLHF" in err, err
    code, _, err = cli("estimate", "--scenario", path, "--baseline", "symmetric", "--profile", "none",
                       "--out", tmp_path / "plan.yaml")
    assert code == 0, err
    code, _, err = cli("export", "--plan", tmp_path / "plan.yaml", "--format", "openrlhf", "--out", tmp_path / "run.sh")
    assert code == 2 and err.count("\n") == 1 and "training.old_logprobs" in err, err
    assert not (tmp_path / "run.sh").exists()


def test_the_engines_that_offload_otherwise_refuse_a_reference_offloaded_as_verl_does():
    """An offloaded reference is priced as verl's FSDP keeps it (fp32 shards copied in every
    forward); OpenRLHF's and AReaL's own offloads are not that, and their writers refuse it by name."""
    from dataclasses import replace

    from realbench.engines import areal, openrlhf
    from realbench.plan import get_builtin

    job = get_builtin("grpo-7b-16gpu")
    for module, flag, scenario in ((openrlhf, "--ref.offload", job), (areal, "ref.fsdp.offload_params",
                                                                        areal.job_of(job.model_copy(update={"engine": None})))):
        plan = module.default_plan(scenario)
        ref = plan["ref_inf"]
        assert module.space_problem(scenario, plan) is None and ref.strategy.dp > 1
        plan["ref_inf"] = replace(ref, strategy=replace(ref.strategy, zero=3, offload_params=True))
        key, why = module.space_problem(scenario, plan)
        assert key == "calls.ref_inf.offload_params" and flag in why, why
        # nor do they write verl's parameter offload of a trained model, nor AReaL its optimizer
        # offload (OpenRLHF's is --ds.enable_sleep, which its quick-start sets)
        plan["ref_inf"] = ref
        actor = plan["actor_train"]
        assert actor.strategy.zero == 3 and actor.strategy.offload_optimizer is (module is openrlhf), actor
        for field in ("offload_params",) if module is openrlhf else ("offload_optimizer", "offload_params"):
            plan["actor_train"] = replace(actor, strategy=replace(actor.strategy, **{field: True}))
            key, why = module.space_problem(scenario, plan)
            assert key == f"calls.actor_train.{field}" and "realbench does not write" in why, why
        # nor Ulysses groups in OpenRLHF, which splits sequences by ring attention; AReaL writes them
        # (an FSDP allocation's c: test_engine_areal.py), but not beside tensor parallelism
        half = replace(actor.strategy, dp=actor.strategy.dp // 2, sp=2, max_tokens=None)
        plan["actor_train"] = replace(actor, strategy=half)
        if module is areal:
            assert module.space_problem(scenario, plan) is None
            plan["actor_train"] = replace(actor, strategy=replace(half, dp=half.dp // 2, tp=2))
        key, why = module.space_problem(scenario, plan)
        assert key == "calls.actor_train.sp" and ("--ds.ring_attn_size" if module is openrlhf else
                                                  "without tensor parallelism") in why, why
        # OpenRLHF's DeepSpeed has no Megatron p2p ring either
        if module is openrlhf:
            plan["actor_train"] = replace(actor, strategy=replace(half, zero=1, ring="p2p"))
            key, why = module.space_problem(scenario, plan)
            assert key == "calls.actor_train.sp" and "not by Megatron's p2p ring" in why, why
        # and AReaL's writer refuses ring attention (OpenRLHF's), as verl's does
        if module is areal:
            plan["actor_train"] = replace(actor, strategy=replace(half, ring="allgather"))
            key, why = module.space_problem(scenario, plan)
            assert key == "calls.actor_train.ring" and "not ring attention" in why, why
    from realbench.engines import verl

    plan = verl.default_plan(job)
    actor = plan["actor_train"]
    plan["actor_train"] = replace(actor, strategy=replace(actor.strategy, dp=actor.strategy.dp // 2, sp=2, ring="allgather"))
    key, why = verl.space_problem(job, plan)
    assert key == "calls.actor_train.ring" and "not by ring attention" in why, why
    # and Megatron's p2p ring under FSDP (verl's Megatron engine writes it: context_parallel_size)
    plan["actor_train"] = replace(actor, strategy=replace(actor.strategy, dp=actor.strategy.dp // 2, sp=2, ring="p2p"))
    key, why = verl.space_problem(job, plan)
    assert key == "calls.actor_train.ring" and "Ulysses' head exchanges under FSDP" in why, why


def test_a_rollout_server_is_an_engines_and_openrlhf_serves_with_vllm(cli, tmp_path):
    from realbench.engines import openrlhf
    from realbench.plan import get_builtin
    from realbench.plan.builtin import BUILTIN

    path = tmp_path / "my job.yaml"
    path.write_text(yaml.safe_dump({"schema": "realbench.scenario/1", **BUILTIN["grpo-tiny-cpu"], "rollout_server": "sglang"}))
    code, _, err = cli("validate", path)
    assert code == 2 and err.count("\n") == 1 and "rollout_server" in err and "engine" in err, err
    job = get_builtin("grpo-7b-16gpu").model_copy(update={"engine": "openrlhf", "rollout_server": "sglang"})
    key, why = openrlhf.space_problem_of_scenario(job)
    assert key == "rollout_server" and "vLLM only" in why


MY_SETTINGS = ("actor_rollout_ref.actor.optim.weight_decay=1e-3", "data.train_files=[~/data/gsm8k/train.parquet]",
               "trainer.experiment_name=qwen-grpo-try3", "trainer.logger=[console,tensorboard]")


def test_the_users_own_settings_go_from_their_config_to_the_exported_one(cli, job, verl_check):
    """What the user set that changes neither time nor memory (learning rate, data files, names,
    the logger) is read into the scenario's engine_settings and written back into the exported
    configuration, a searched plan's too, where verl composes it; what realbench reads into the
    scenario (the checkpoint) is not carried twice."""
    # (3e-6 is a number in the file and on the command line, as OmegaConf reads it)
    (job / "grpo mine.yaml").write_text(GRPO.replace("use_kl_loss: true}", "use_kl_loss: true, optim: {lr: 3e-6}}"))
    first, _, scenario = imported(cli, job, "grpo mine.yaml", *MY_SETTINGS, out="mine", name="mine")
    carried = scenario["engine_settings"]
    assert carried["actor_rollout_ref.actor.optim.lr"] == 3e-6
    assert carried["actor_rollout_ref.actor.optim.weight_decay"] == 1e-3
    assert carried["data.train_files"] == ["~/data/gsm8k/train.parquet"]
    assert carried["trainer.logger"] == ["console", "tensorboard"]
    assert "actor_rollout_ref.model.path" not in carried and "reward.custom_reward_function.path" not in carried
    assert not any(k.startswith("actor_rollout_ref.rollout.tensor") for k in carried)
    code, _, err = cli("search", "--scenario", first["scenario"], "--engine", "verl", "--method", "mcmc",
                       "--time-budget", 2, "--out", "mine/searched.yaml")
    assert code == 0, err
    out = job / "exported" / "mine searched.yaml"
    out.parent.mkdir(exist_ok=True)
    code, _, err = cli("export", "--plan", "mine/searched.yaml", "--format", "verl", "--out", out, "--force")
    assert code == 0, err
    checked = verl_check("validate", out)
    assert checked["ok"], checked
    assert (checked["actor_lr"], checked["train_files"], checked["experiment_name"]) == \
        (3e-6, ["~/data/gsm8k/train.parquet"], "qwen-grpo-try3")
    # read back: the same settings again
    _, _, again = imported(cli, job, out, out="mine-again", name="mine")
    assert {k: again["engine_settings"][k] for k in carried} == carried
    # another engine does not read verl's names; a setting that changes the run is not carried
    code, _, err = cli("export", "--plan", "mine/searched.yaml", "--format", "openrlhf", "--out", "mine/o.sh",
                       "--model-path", "actor=ckpt")
    assert code == 2 and err.count("\n") == 1 and "engine_settings" in err and "verl" in err, err
    edited = yaml.safe_load(Path(first["scenario"]).read_text())
    edited["engine_settings"]["actor_rollout_ref.rollout.tensor_model_parallel_size"] = 4
    path = job / "mine" / "edited by hand.yaml"
    path.write_text(yaml.safe_dump(edited))
    code, _, err = cli("validate", path)
    assert code == 2 and "engine_settings.actor_rollout_ref.rollout.tensor_model_parallel_size" in err, err


def test_carried_settings_the_plan_writes_otherwise_are_refused_by_name():
    """A carried setting the written configuration needs otherwise (verl's bypass mode needs the
    rollout's log-probabilities), one the plan's engine does not have (an FSDP key in a Megatron
    plan) and one realbench reads into the scenario are refused by name; the same value passes."""
    from realbench.engines import carried_problem, with_carried
    from realbench.errors import ConfigError
    from realbench.plan import get_builtin

    logp = "actor_rollout_ref.rollout.calculate_log_probs"
    job = get_builtin("grpo-7b-16gpu").model_copy(update={"engine": "verl", "engine_settings": {logp: False}})
    with pytest.raises(ConfigError, match="bypass_mode") as e:
        with_carried(job, "verl", "dp", {logp: True})
    assert e.value.field == f"engine_settings.{logp}"
    assert with_carried(job, "verl", "dp", {"trainer.nnodes": 2}) == {"trainer.nnodes": 2, logp: False}
    offload = "actor_rollout_ref.ref.fsdp_config.param_offload"
    job = job.model_copy(update={"engine_settings": {offload: True}})
    assert with_carried(job, "verl", "dp", {}) == {offload: True}
    with pytest.raises(ConfigError, match="megatron") as e:
        with_carried(job, "verl", "megatron", {})
    assert e.value.field == f"engine_settings.{offload}"
    assert "scenario's models" in carried_problem("verl", "actor_rollout_ref.model.path")
    assert "verl runs differently with it" in carried_problem("verl", "actor_rollout_ref.rollout.n")
    assert carried_problem("openrlhf", "actor.adam.lr") is None and carried_problem("areal", "actor.optimizer.lr") is None


def test_a_second_import_keeps_the_first_unless_forced(cli, job):
    imported(cli, job, "grpo_qwen_fsdp.yaml", out="kept")
    plan = job / "kept" / "grpo_qwen_fsdp-plan.yaml"
    before = plan.read_text()
    code, _, err = cli("import", "verl", "grpo_qwen_fsdp.yaml", "actor_rollout_ref.rollout.max_num_seqs=8",
                       "--out", "kept")
    assert code == 2 and "exists; pass --force" in err and plan.read_text() == before


def test_a_plan_verl_cannot_run_is_refused_by_what_verl_cannot_do(cli, job):
    """realbench's own plans place calls on parts of the cluster; verl puts every role on one
    pool. A scenario of presets has no checkpoint for verl to load without --model-path. And
    realbench's runtime does not run a verl scenario."""
    _, plan, _ = imported(cli, job, "grpo_qwen_fsdp.yaml", out="outside")
    path = job / "outside" / "grpo_qwen_fsdp-plan.yaml"
    plan["calls"]["ref_inf"].update({"mesh": "n0:0-3", "dp": 4})
    path.write_text(yaml.safe_dump(plan))
    code, _, err = cli("export", "--plan", path, "--format", "verl", "--out", job / "outside" / "verl.yaml")
    assert code == 2 and "calls.ref_inf.mesh: verl places every role on one pool of all the GPUs" in err, err
    # the FSDP reference kept on the GPUs, which verl's FSDP engine never does
    plan["calls"]["ref_inf"].update({"mesh": "n0", "dp": 8, "offload_params": False})
    path.write_text(yaml.safe_dump(plan))
    code, _, err = cli("export", "--plan", path, "--format", "verl", "--out", job / "outside" / "verl.yaml")
    assert code == 2 and err.count("\n") == 1 and "calls.ref_inf.offload_params: verl's FSDP engine offloads" in err, err
    assert not (job / "outside" / "verl.yaml").exists()
    code, _, err = cli("run", "--scenario", job / "outside" / "grpo_qwen_fsdp.yaml", "--plan", path, "--nproc", 8, "--steps", 1)
    assert code == 2 and "engine: the scenario is verl's" in err, err
    code, _, err = cli("estimate", "--scenario", "grpo-7b-16gpu", "--baseline", "symmetric", "--profile", "none",
                       "--out", job / "outside" / "preset.yaml")
    assert code == 0, err
    code, _, err = cli("export", "--plan", job / "outside" / "preset.yaml", "--format", "verl",
                       "--out", job / "outside" / "preset-verl.yaml")
    assert code == 2 and err.count("\n") == 1, err
    assert "verl" in err and not (job / "outside" / "preset-verl.yaml").exists()


def test_a_configuration_whose_rollout_server_cannot_start_does_not_fit():
    """verl's example on the 70B job: rollout tp 2 at 0.6 of an 80 GiB GPU is 51.5 GB for 70 GB of
    weights a GPU, no KV cache at all; compared with the engine's best it does not fit (inf), as
    the server would not start; at tp 8 (17.6 GB of weights) the same share leaves a cache."""
    from realbench.cost import Estimator
    from realbench.engines import priced_as
    from realbench.plan import get_builtin
    from realbench.plan.mesh import Strategy
    from realbench.cost.calls import serving_cache_problem
    from realbench.search.engine import plan_time

    scenario = get_builtin("ppo-70b-7b-128gpu")
    example = verl.default_plan(scenario, verl.EXAMPLE["settings"])
    assert example["actor_gen"].strategy.tp == 2
    est = Estimator(priced_as(scenario.with_memory_fraction(verl.EXAMPLE["memory_fraction"]), "verl"))
    assert plan_time(est, example) == math.inf
    call = est.scenario.dataflow.call("actor_gen")
    model, cluster = est.scenario.models["actor"], est.scenario.cluster
    assert "the engine does not start" in serving_cache_problem(call, model, cluster, example["actor_gen"].strategy)
    assert serving_cache_problem(call, model, cluster, Strategy(16, 8, 1, 1)) is None


@pytest.mark.alone  # verl's 2 s search must reach a plan no slower than its example's and default's
def test_bench_engines_quick_reports_a_row_per_engine_and_scenario(cli):
    """Each engine's best is no slower than its example and default configurations (verl's search
    starts from neither, so this can fail; OpenRLHF's lists every plan, so its best is no slower
    than any), and the gains are the ratios of the times reported."""
    from realbench.engines import areal, openrlhf

    code, out, err = cli("bench", "engines", "--quick", "--json")
    assert code == 0, err
    rows = json.loads(out)["rows"]
    assert [(r["engine"], r["scenario"]) for r in rows] == [("verl", "grpo-7b-16gpu"), ("openrlhf", "grpo-7b-16gpu"),
                                                            ("areal", "grpo-7b-16gpu")]
    for r, module, example in zip(rows, (verl, openrlhf, areal),
                                  ("run_qwen3_8b_fsdp.sh", "train_ppo_ray_slurm.sh", "gsm8k_grpo.yaml")):
        assert example in r["example"] and r["version"] == module.VERSION
        assert r["best_s"] <= min(r["example_s"], r["default_s"])
        assert r["search_gain"] == pytest.approx(min(r["example_s"], r["default_s"]) / r["best_s"])
        assert r["realbench_gain"] == pytest.approx(r["best_s"] / r["realbench_s"])
        assert set(r["best_plan"]) == set(r["realbench_plan"]) == {"actor_gen", "reward_inf", "ref_inf", "actor_train"}
    for r in rows[1:]:  # OpenRLHF's and AReaL's plans are listed whole and all priced (quick: whatever the time)
        assert r["method"] == "all plans" and r["evaluations"] == r["plans"]
    # AReaL runs no reward model: its row is the job with the workflow's reward function, and realbench's
    # own best beside it is of that job (a reward model's forward less: no slower than the scenario's)
    assert [r["reward"] for r in rows] == ["as the scenario", "as the scenario", "function"]
    assert rows[2]["realbench_s"] <= rows[0]["realbench_s"] + 1e-9
    # realbench's own with the engines' sharding offered (search --zero): the same job, a plan that
    # shards, the gain the ratio reported
    for r in rows:
        assert r["reallocation_gain"] == pytest.approx(r["best_s"] / r["realbench_zero_s"])
    assert rows[0]["realbench_zero_s"] == rows[1]["realbench_zero_s"]
    assert any("z" in label.rsplit("/", 1)[1] for label in rows[0]["realbench_zero_plan"].values())
    # the manual's table (docs/measurements/engines.md) is the stored JSON of a measured run, rows of these fields
    stored = json.loads((ROOT / "docs" / "measurements" / "data" / "bench-engines.json").read_text())
    assert all(set(r) == set(rows[0]) for r in stored["rows"]) and len(stored["rows"]) == 24
    # its progress, a row at a time (the CLI's bar on a terminal)
    from realbench.bench import engines as bench_engines

    done = []
    bench_engines.run(scenarios=("grpo-7b-16gpu",), budget_s=0.2, on_progress=lambda *step: done.append(step))
    assert done == [(1, 3), (2, 3), (3, 3)]


def test_the_workbench_opens_a_verl_config_into_the_editor_and_the_viewer(job):
    from realbench.widgets import Workbench

    os.chdir(job)
    wb = Workbench("ppo-tiny-cpu", budget_s=1)
    e = wb.engine
    e.file_box.value, e.overrides_box.value, e.out_box.value = "grpo_qwen_fsdp.yaml", \
        "actor_rollout_ref.rollout.tensor_model_parallel_size=1 trainer.experiment_name=from-the-lab", "lab"
    assert e.open(), e.status.value
    assert wb.editor.scenario.engine == "verl" and wb.editor.scenario.cluster.n_devices == 8
    assert wb.viewer.options["actor_gen"].strategy.tp == 1  # the override (the file says 2) reached the plan shown
    assert "verl configuration grpo_qwen_fsdp.yaml" in wb.viewer.title.value
    assert "not read by" not in e.status.value
    # a setting verl's trainer does not read: opened, priced as verl runs, and said
    e.overrides_box.value = "critic.ppo_max_token_len_per_gpu=24576"
    e.overwrite_box.value = True
    assert e.open(), e.status.value
    assert "not read by verl: critic.ppo_max_token_len_per_gpu=24576: verl 0.9.1&#x27;s trainer does not read it" in \
        e.status.value
    e.overrides_box.value = "actor_rollout_ref.rollout.tensor_model_parallel_size=1 trainer.experiment_name=from-the-lab"
    assert e.open(), e.status.value
    # written back: the user's own settings with it
    e.export_box.value = "lab/written.yaml"
    assert e.write(), e.status.value
    written = yaml.safe_load((job / "lab" / "written.yaml").read_text())
    assert written["trainer"]["experiment_name"] == "from-the-lab"
    assert written["actor_rollout_ref"]["rollout"]["tensor_model_parallel_size"] == 1


def test_dynamic_batching_counts_the_rows_real_tokens_and_a_budget_holds_a_row():
    """verl splits a GPU's rows into the micro-batches its dynamic batching forms (the largest
    count over the data-parallel ranks, each rank's rows counted by the tokens they ran: verl_packer),
    not by their cap. ppo-8b-16gpu-longtail under verl's defaults (512 samples, 4 optimizer steps,
    16 GPUs; prompts 512, responses of mean 971.16 and cap 4,096; budgets 16,384 for the actor and
    its reference, 32,768 for the critic): a GPU's 8 training rows hold 8 x 1,483.16 = 11,865
    tokens on average, one budget, but the heaviest of the 16 ranks passes it on most drawn steps:
    verl forms 1.5625 on average, priced 2 (at the cap, 36,864 tokens: 3, split evenly 4); the
    reference's 32 rows 4 on every step; the critic's values 2. grpo-8b-32gpu-longtail's rows reach
    512 + 16,384 tokens, past verl's default budget, which verl asserts holds a row: its default
    configuration is priced with the budget raised to one row, 4 rows a GPU in 2."""
    from realbench.engines import priced_as
    from realbench.engines.documents import budget_row
    from realbench.engines.verl.packer import mean_count
    from realbench.plan import load_scenario

    s = priced_as(load_scenario("ppo-8b-16gpu-longtail"), "verl")
    assert budget_row(s, "actor_train") == pytest.approx(512 + s.dataflow.call("actor_gen").lengths.expected)
    plan = verl.default_plan(s)
    assert (plan["actor_train"].strategy.dp, plan["actor_train"].strategy.micro_batches) == (16, 2)
    assert mean_count(verl._step_rows(s), 8, 16, 16384) == 1.5625 and 8 * budget_row(s, "actor_train") < 16384
    assert plan["ref_inf"].strategy.micro_batches == 4 and plan["critic_inf"].strategy.micro_batches == 2
    long = priced_as(load_scenario("grpo-8b-32gpu-longtail"), "verl")
    actor = verl.default_plan(long)["actor_train"].strategy
    assert (actor.micro_batches, actor.max_tokens) == (2, 512 + 16384)


def test_dynamic_batching_forms_the_micro_batches_verls_own_function_forms(verl_check):
    """realbench.engines.verl.packer against verl's rearrange_micro_batches (verl_check.py count, in
    verl's environment): the same count on each of 48 steps drawn from ppo-8b-16gpu-longtail's
    response lengths, 32 rows a GPU, under three budgets (one a Megatron pipeline of 2 with virtual
    stages rounds to even counts). Rows all alike: the partition is as even as rows allow, for
    every count up to 64 rows. The ranks agree, by hand: a rank of four rows of 300 tokens alone
    forms 2 micro-batches within 1,000 (600 each); one of 950, 650, 300 and 100 (2,000 tokens: 2 by
    the bound) cannot keep two within it (the 950 beside any other passes it): 3; together, 3 on
    both; rounded to a pipeline of 2, 4."""
    import numpy as np

    from realbench.engines.areal.packer import StepRows
    from realbench.engines.verl.packer import count, partition
    from realbench.plan import load_scenario

    s = load_scenario("ppo-8b-16gpu-longtail")
    gen = s.dataflow.call("actor_gen")
    tokens = StepRows(gen.prompt_len, gen.gen_len, s.dataflow.call("actor_train").lengths).tokens(32, 1)[:48, 0]
    for budget, divided_by in ((16384, None), (24576, None), (9000, 2)):
        job = Path(os.environ.get("TMPDIR", "/tmp")) / f"realbench-verl-count-{os.getpid()}-{budget}.json"
        job.write_text(json.dumps({"budget": budget, "divided_by": divided_by, "steps": tokens.tolist()}))
        try:
            verls = verl_check("count", job)["counts"]
        finally:
            job.unlink()
        ours = [count(t[None, :], budget, divided_by) for t in tokens]
        assert ours == verls, (budget, ours, verls)
        assert len(set(ours)) > 1 or budget == 24576  # (counts that differ step by step)
    for rows in range(1, 65):
        for n in range(1, rows + 1):
            assert max(map(len, partition([7] * rows, n))) == -(-rows // n)
    # the partition itself, part by part, against verl's karmarkar_karp: workloads of rows at a few
    # lengths (many ties, which verl breaks by the parts' sizes and then their rows) and drawn ones
    rng = np.random.default_rng(0)
    cases = [([int(v) for v in rng.choice(values, size=rows)], int(rng.integers(1, rows + 1)))
             for values in ([5, 5, 9], [3, 4, 7, 11], list(range(1, 10 ** 6, 9973))) for rows in (2, 7, 40, 150)
             for _ in range(6)]
    job = Path(os.environ.get("TMPDIR", "/tmp")) / f"realbench-verl-partitions-{os.getpid()}.json"
    job.write_text(json.dumps(cases))
    try:
        verls = verl_check("partitions", job)["partitions"]
    finally:
        job.unlink()
    assert [partition(values, k) for values, k in cases] == verls
    assert count(np.array([[300] * 4]), 1000) == 2 and count(np.array([[950, 650, 300, 100]]), 1000) == 3
    assert count(np.array([[300] * 4, [950, 650, 300, 100]]), 1000) == 3
    assert count(np.array([[300] * 4, [950, 650, 300, 100]]), 1000, divided_by=2) == 4


def test_dynamic_batching_plans_memory_for_a_micro_batch_as_full_as_its_budget(cli, job):
    """verl's dynamic batching keeps every micro-batch within its budget (it adds micro-batches
    until its balanced partition does, verl/utils/seqlen_balancing.py:395-455): the plan's packed
    calls carry the budget (max_tokens), and memory is planned for a micro-batch that full. On
    ppo-8b-16gpu-longtail under verl's defaults, a GPU's 32 reference rows hold 32 x 1,483.16 =
    47,461 tokens on average, past the 16,384 budget: its micro-batches are planned full, 16,384
    tokens, where the heaviest of 4 micro-batches of 8 fixed rows (20,011 at the 0.99 quantile) is more
    than verl lets one hold. The critic's calls carry its one budget (32,768). A budget that packs a GPU's rows
    into another count than the plan's is refused on export, naming it."""
    from realbench.engines import priced_as
    from realbench.engines.documents import budget_row
    from realbench.plan import load_scenario

    s = priced_as(load_scenario("ppo-8b-16gpu-longtail"), "verl")
    plan = verl.default_plan(s)
    assert {n: o.strategy.max_tokens for n, o in plan.items()} == {
        "actor_gen": None, "reward_inf": None, "actor_train": 16384, "ref_inf": 16384,
        "critic_train": 32768, "critic_inf": 32768}
    ref = s.dataflow.call("ref_inf")
    assert plan["ref_inf"].strategy.micro_batches == 4
    assert ref.peak_tokens(8, 4, 16384) == 16384 < ref.peak_tokens(8, 4) == 20011
    assert 32 * budget_row(s, "ref_inf") == pytest.approx(47461, abs=1)
    # on export: the budget gives the plan's count, or it is refused by name
    _, imported_plan, _ = imported(cli, job, "grpo_qwen_fsdp.yaml", *DYNAMIC, out="dynamic")
    path = job / "dynamic" / "grpo_qwen_fsdp-plan.yaml"
    imported_plan["calls"]["actor_train"]["micro_batches"] = 4
    path.write_text(yaml.safe_dump(imported_plan))
    code, _, err = cli("export", "--plan", path, "--format", "verl", "--out", job / "dynamic" / "verl.yaml")
    assert code == 2 and err.count("\n") == 1 and "calls.actor_train.max_tokens: 384: verl's dynamic batching packs " \
        "a GPU's 4 rows into 2 micro-batches under it, not 4" in err, err
    assert not (job / "dynamic" / "verl.yaml").exists()


def test_an_offloaded_optimizer_leaves_the_gpus_between_updates_for_two_trips_over_pcie():
    """verl's FSDP optimizer_offload: Adam's two fp32 moments of each GPU's shard (8 bytes a
    parameter over dp 16: 6,738,415,616 / 16 x 8 = 3,369,207,808 bytes for LLaMA-7B) live in host
    memory between updates. The actor's update brings them in and sends them back: 2 x 3.369 GB /
    64 GB/s (an H100's host link) = 0.10529 s more; every other call runs with 3.369 GB less
    beside it, so the plan's peak (generation's, with its KV cache) falls by exactly that."""
    from realbench.cost import Estimator
    from realbench.engines import priced_as
    from realbench.plan import get_builtin

    scenario = get_builtin("grpo-7b-16gpu")
    est = Estimator(priced_as(scenario, "verl"))
    plain = verl.default_plan(scenario)
    off = verl.default_plan(scenario, {f"{verl.OFFLOAD_BLOCK['dp']['actor']}.optimizer_offload": True})
    assert (plain["actor_train"].strategy.offload_optimizer, off["actor_train"].strategy.offload_optimizer) == \
        (False, True)
    assert scenario.models["actor"].n_params == 6_738_415_616 and scenario.cluster.host_bw == 64e9
    a, b = (est.estimate(est.choice_of(p)) for p in (plain, off))
    moments = 3_369_207_808
    assert b.calls["actor_train"].time_s - a.calls["actor_train"].time_s == pytest.approx(2 * moments / 64e9)
    for name in ("actor_gen", "ref_inf", "reward_inf"):
        assert b.calls[name].time_s == pytest.approx(a.calls[name].time_s, rel=1e-12)
    assert a.peak_mem_bytes - b.peak_mem_bytes == moments
    # the search inside verl sees it: the same plan with the offload is one of verl's
    assert verl.space_problem(scenario, off) is None


def test_a_megatron_reference_offloaded_is_loaded_for_its_forward_and_sent_back():
    """verl's Megatron reference with param_offload (it follows the actor's unless set): its bf16
    shard waits in host memory and the engine's eval context loads it whole before the forward
    and sends it back after (workers/engine/base.py:314-333). LLaMA-7B under tp 2 x pp 2: a stage's
    16 layers of 202,383,360 parameters and the embedding (or head) of 131,076,096, over tp 2, are
    1,684,604,928 parameters, 3,369,209,856 bytes a GPU, over a 64 GB/s host link 52.64 ms each way:
    the forward takes 105.3 ms more, holds the shard only while it runs (its master bytes 0, its
    working bytes the shard more), and verl's space offers it both ways."""
    from dataclasses import replace

    from realbench.cost.calls import call_cost
    from realbench.engines import priced_as
    from realbench.plan import Option, Strategy, get_builtin

    scenario = priced_as(get_builtin("ppo-7b-7b-16gpu"), "verl")
    mesh = verl.default_plan(scenario)["ref_inf"].mesh
    kept = Strategy(4, 2, 2, 8)
    model, call = scenario.models["ref"], scenario.dataflow.call("ref_inf")
    a, b = (call_cost(call, model, scenario.cluster, Option(mesh, s))
            for s in (kept, replace(kept, offload_params=True)))
    assert (model.layer_params, model.ends_params(2)) == (202_383_360, 131_076_096)
    shard = (16 * 202_383_360 + 131_076_096) / 2 * 2
    assert shard == 3_369_209_856 and shard / 64e9 == pytest.approx(0.05264, abs=1e-5)
    assert b.time_s - a.time_s == pytest.approx(2 * shard / 64e9) and b.optimizer_s == pytest.approx(2 * shard / 64e9)
    assert (b.master_bytes, a.master_bytes) == (0, int(shard))
    assert b.working_bytes - a.working_bytes == pytest.approx(shard, abs=1)
    assert b.compute_s == a.compute_s and b.dp_comm_s == a.dp_comm_s == 0
    # in verl's space under Megatron, both ways; under FSDP always offloaded (its FORWARD_OFFLOAD)
    groups = list(verl.plan_groups(scenario))
    megatron = [o for g in groups for o in g.get("ref_inf", []) if o.strategy.zero == 0]
    assert {o.strategy.offload_params for o in megatron} == {False, True}
    assert {o.strategy.offload_params for g in groups for o in g.get("ref_inf", []) if o.strategy.zero == 3} == {True}


def test_offloaded_parameters_cross_pcie_around_every_call_on_their_layout_and_the_sync():
    """verl's FSDP param_offload of a trained model: its fp32 shard (6,738,415,616 / 16 x 4 =
    1,684,603,904 bytes for LLaMA-7B on 16 GPUs; 26.32 ms over a 64 GB/s host link) lives in host
    memory between calls. PPO on `ppo-7b-7b-16gpu`: the actor's update and its old
    log-probabilities' forward (priced in actor_train) are two engine calls, 4 crossings; the
    critic's update one call (2 crossings of its own shard), its values on the same layout 2 more
    before them; the weight sync to the rollout too (FSDP1 unshards on the device: 2); the reference and
    reward are other models. Every GPU then holds both shards less between calls."""
    from dataclasses import replace

    from realbench.cost import Estimator
    from realbench.engines import priced_as
    from realbench.plan import Option, get_builtin

    scenario = get_builtin("ppo-7b-7b-16gpu")
    est = Estimator(priced_as(scenario, "verl"))
    plain = verl.default_plan(scenario)
    settings = {verl.PARAM_OFFLOAD["actor"]: True, verl.PARAM_OFFLOAD["critic"]: True}
    off = verl.default_plan(scenario, settings)
    assert off == {n: Option(o.mesh, replace(o.strategy, offload_params=True)) if n.endswith("_train") else o
                   for n, o in plain.items()}
    assert verl.space_problem(scenario, off) is None
    a, b = (est.estimate(est.choice_of(p)) for p in (plain, off))
    actor, critic = (scenario.models[r].n_params / 16 * 4 for r in ("actor", "critic"))
    assert actor == 1_684_603_904
    crossing = {"actor": actor / 64e9, "critic": critic / 64e9}
    assert b.calls["actor_train"].time_s - a.calls["actor_train"].time_s == pytest.approx(4 * crossing["actor"])
    assert b.calls["critic_train"].time_s - a.calls["critic_train"].time_s == pytest.approx(2 * crossing["critic"])
    assert b.calls["critic_inf"].realloc_s - a.calls["critic_inf"].realloc_s == pytest.approx(2 * crossing["critic"])
    assert b.calls["actor_gen"].realloc_s - a.calls["actor_gen"].realloc_s == pytest.approx(2 * crossing["actor"])
    for name in ("actor_gen", "ref_inf", "reward_inf", "critic_inf"):
        assert b.calls[name].time_s == pytest.approx(a.calls[name].time_s, rel=1e-12)
    assert a.peak_mem_bytes - b.peak_mem_bytes == pytest.approx(actor + critic, abs=2)
    # the critic's values run on its layout with its shard brought back: where they hold the most
    # (the long-tailed job's 32 rows a GPU in one micro-batch, beside an update of single rows with
    # checkpointing; its responses all 3,000 or 3,100 tokens, so that the heaviest single row is not far
    # above the others), the critic's calls alone peak as high offloaded as not
    import numpy as np

    from realbench.dataflow.lengths import LengthDistribution

    long = priced_as(get_builtin("ppo-8b-16gpu-longtail"), "verl")
    even = LengthDistribution(dist="empirical", max=4096, lengths=(3000, 3100), counts=(1, 1))
    long = long.model_copy(update={"dataflow": long.dataflow.with_calls(
        [c.model_copy(update={"lengths": even}) if c.lengths else c for c in long.dataflow.calls])})
    est = Estimator(long)
    base = verl.default_plan(long)
    # (rows of fixed counts, not verl's token budget, which plans both calls' micro-batches equally full)
    critic = {"critic_train": replace(base["critic_train"].strategy, micro_batches=8, checkpointing=True,
                                      max_tokens=None),
              "critic_inf": replace(base["critic_inf"].strategy, micro_batches=1, max_tokens=None)}
    peaks = []
    for offloaded in (False, True):
        plan = {**base, **{n: Option(base[n].mesh, replace(s, offload_params=offloaded and n == "critic_train"))
                           for n, s in critic.items()}}
        choice = np.array(est.choice_of(plan))
        i_inf, i_train = est.call_names.index("critic_inf"), est.call_names.index("critic_train")
        if not offloaded:  # the values' call is where the critic's calls peak
            assert est.working[i_inf][choice[i_inf]] > est.working[i_train][choice[i_train]]
        only = np.where(np.isin(np.arange(len(choice)), [i_inf, i_train]), choice, -1)
        peaks.append(est.peak_memory_batch(only[None, :])[0])
    assert peaks[0] == pytest.approx(peaks[1], abs=2)
    # Megatron (zero 0 or 1): the bf16 buffer of the tp x pp shard crosses (2 bytes a parameter),
    # so the critic's values on its layout pay 2 x P' x 2 / 64 GB/s more
    from realbench.cost.calls import shard_params

    job = priced_as(scenario, "verl")
    megatron = next(g for g in verl.plan_groups(job) if g["actor_train"][0].strategy.zero < 2)
    plan = {n: opts[0] for n, opts in megatron.items()}
    critic_train = plan["critic_train"].strategy
    offloaded = {**plan, "critic_train": Option(plan["critic_train"].mesh, replace(critic_train, offload_params=True))}
    assert verl.space_problem(job, offloaded) is None
    est = Estimator(job)
    a, b = (est.estimate(est.choice_of(p)) for p in (plan, offloaded))
    moved = shard_params(job.models["critic"], critic_train.tp, critic_train.pp) * 2
    assert b.calls["critic_inf"].realloc_s - a.calls["critic_inf"].realloc_s == pytest.approx(2 * moved / 64e9)
    assert b.calls["actor_train"].time_s == pytest.approx(a.calls["actor_train"].time_s, rel=1e-12)


# verl's one-step-off entry point (verl/experimental/one_step_off_policy), as its example scripts run it
# (shell/grpo_3b_gsm8k_fsdp2_2_6.sh: overrides of its own YAML), on a node split in halves
ONE_STEP_OFF = ("algorithm.adv_estimator=grpo", "data.train_batch_size=32", "data.max_prompt_length=64",
                "data.max_response_length=128", "actor_rollout_ref.model.path=ckpt", "actor_rollout_ref.hybrid_engine=False",
                "actor_rollout_ref.actor.ppo_mini_batch_size=8", "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=4",
                "actor_rollout_ref.actor.use_kl_loss=True", "actor_rollout_ref.model.enable_gradient_checkpointing=True",
                "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=4",
                "actor_rollout_ref.rollout.tensor_model_parallel_size=2", "actor_rollout_ref.rollout.name=vllm",
                "actor_rollout_ref.rollout.gpu_memory_utilization=0.6", "actor_rollout_ref.rollout.n=4",
                "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=8",
                "actor_rollout_ref.ref.fsdp_config.param_offload=True",
                "reward.custom_reward_function.path=scoring/reward.py", "trainer.nnodes=1", "trainer.n_gpus_per_node=4",
                "rollout.nnodes=1", "rollout.n_gpus_per_node=4")


@pytest.fixture(scope="module")
def one_step_off_yaml(job) -> str:
    """verl's own one_step_off_ppo_trainer.yaml, beside the user's job (the file its entry point reads)."""
    done = subprocess.run([str(VERL_PYTHON), "-c", "import importlib.util; print(importlib.util.find_spec('verl').origin)"],
                          capture_output=True, text=True, timeout=60)
    source = Path(done.stdout.strip()).parent / "experimental" / "one_step_off_policy" / "config"
    (job / "one_step_off_ppo_trainer.yaml").write_text((source / "one_step_off_ppo_trainer.yaml").read_text())
    return "one_step_off_ppo_trainer.yaml"


def test_verls_one_step_off_entry_reads_as_generation_a_step_ahead_on_its_own_gpus(cli, job, one_step_off_yaml,
                                                                                  verl_check):
    """verl's one-step-off entry point (its own YAML and an example's overrides, the trainer's 4
    GPUs and the rollout's 4 on one node): generation one step ahead (max_staleness 1) on the
    node's last 4 GPUs, 2 vLLM replicas of tp 2, the old log-probabilities the rollout's (its YAML
    sets bypass_mode), actor and reference on the first 4 (32 x 4 rows / 4 steps / 4 GPUs = 8 rows
    a GPU, micro-batches of 4: 2; the reference's 32 rows a GPU in 8s: 4), the reward function
    beside generation. Priced so: a step ends
    sooner than generation, scoring and training one after another, and its GPUs hold one role each.
    Written back, verl's one-step-off entry accepts it (its pools, its trainer's construction) and
    the launch script runs that entry; read again, the same plan and estimate."""
    result, plan, scenario = imported(cli, job, one_step_off_yaml, *ONE_STEP_OFF, out="ahead", name="grpo ahead")
    assert scenario["cluster"] == {"nodes": 1, "gpus_per_node": 8, "device": "h100"}
    assert (scenario["dataflow"]["max_staleness"], plan["max_staleness"]) == (1, 1)
    assert scenario["training"]["old_logprobs"] == "rollout" and scenario["dataflow"]["memory_fraction"] == 0.6
    calls = plan["calls"]
    assert calls["actor_gen"] == {"mesh": "n0:4-7", "dp": 2, "tp": 2, "pp": 1, "micro_batches": 1, "memory_fraction": 0.6}
    assert calls["reward_inf"]["mesh"] == "n0:4-7"
    assert {calls[c]["mesh"] for c in ("actor_train", "ref_inf")} == {"n0:0-3"}
    assert (calls["actor_train"]["dp"], calls["actor_train"]["micro_batches"]) == (4, 2)
    assert (calls["ref_inf"]["dp"], calls["ref_inf"]["micro_batches"]) == (4, 4)
    code, out, err = cli("estimate", "--scenario", result["scenario"], "--plan", result["plan"], "--json")
    assert code == 0, err
    estimate = json.loads(out)
    times = {name: c["time_s"] for name, c in estimate["calls"].items()}
    assert estimate["max_staleness"] == 1
    assert estimate["time_per_iter_s"] < times["actor_gen"] + times["reward_inf"] + times["ref_inf"] + times["actor_train"]
    peaks = estimate["device_peak_bytes"]
    assert peaks[4:] == [max(estimate["calls"][c]["mem_bytes"] for c in ("actor_gen", "reward_inf"))] * 4
    config = job / "ahead" / "verl" / "grpo ahead.yaml"
    config.parent.mkdir()
    code, _, err = cli("export", "--plan", result["plan"], "--format", "verl", "--out", config)
    assert code == 0, err
    checked = verl_check("validate", config)
    assert checked["ok"], checked
    assert (checked["pools"], checked["rollout_pool"], checked["hybrid_engine"], checked["rollout_mode"]) == \
        ({"trainer_pool": [4]}, [4], False, "async")
    assert (checked["rollout_tp"], checked["bypass_mode"], checked["memory_fraction"]) == (2, True, 0.6)
    launch = config.with_name("grpo ahead-launch.sh").read_text()
    assert verl.ONE_STEP_OFF_ENTRY in launch and "--gpus-per-node 8" in launch
    # the file's own name, space and all, reaches verl as one argument
    command = shlex.split(next(line for line in launch.splitlines() if line.startswith("exec ")))
    assert command[command.index("--config-name") + 1] == "grpo ahead"
    again, plan_again, scenario_again = imported(cli, job, config, out="ahead-again", name="grpo ahead")
    assert plan_again["calls"] == calls and scenario_again["dataflow"] == scenario["dataflow"]
    assert again["time_per_iter_s"] == pytest.approx(result["time_per_iter_s"], rel=1e-12)


def test_one_step_off_on_nodes_of_their_own_syncs_the_weights_by_a_broadcast(cli, job, one_step_off_yaml, verl_check):
    """The trainer's node and the rollout's, given nodes of 8 GPUs (verl's config gives only each
    pool's size): the rollout on node 1, its weights sent each step as verl's NCCL checkpoint
    engine sends them, gathered from the trainer's FSDP shards and broadcast from its first GPU
    across the nodes: the 8-way all-gather, then the model's bf16 bytes over the inter-node link
    once, with its latency. Written back, the launch script names the node size to read it again.
    The role-level torch.compile this entry's examples turn off is said as not read, as beside the
    synchronous trainer (the same FSDP engine)."""
    from realbench.cost import comm
    from realbench.plan import load_scenario

    pools = ("trainer.n_gpus_per_node=8", "rollout.n_gpus_per_node=8", "actor_rollout_ref.rollout.n=8")
    os.chdir(job)
    code, stdout, err = cli("import", "verl", one_step_off_yaml, *ONE_STEP_OFF, *pools,
                            "actor_rollout_ref.actor.use_torch_compile=False", "--gpus-per-node", 8,
                            "--out", "apart", "--json", "--force")
    assert code == 0, err
    result = json.loads(stdout)
    assert [u.split(":")[0] for u in result["unread_by_engine"]] == ["actor_rollout_ref.actor.use_torch_compile=False"]
    plan = yaml.safe_load(Path(result["plan"]).read_text())
    assert (plan["calls"]["actor_gen"]["mesh"], plan["calls"]["actor_train"]["mesh"]) == ("n1", "n0")
    scenario = load_scenario(result["scenario"])
    assert (scenario.cluster.nodes, scenario.cluster.gpus_per_node) == (2, 8)
    code, out, err = cli("estimate", "--scenario", result["scenario"], "--plan", result["plan"], "--json")
    estimate = json.loads(out)
    c, model = scenario.cluster, scenario.models["actor"]
    nbytes = model.n_params * 2
    expected = comm.all_gather(c, 8, nbytes, False, 8) + nbytes / c.inter_bw + c.inter_latency_s
    assert estimate["calls"]["actor_gen"]["realloc_s"] == pytest.approx(expected, rel=1e-9)
    config = job / "apart" / "apart.yaml"
    code, _, err = cli("export", "--plan", result["plan"], "--format", "verl", "--out", config)
    assert code == 0, err
    assert "realbench import verl apart.yaml --gpus-per-node 8" in config.with_name("apart-launch.sh").read_text()
    checked = verl_check("validate", config)
    assert checked["ok"] and (checked["pools"], checked["rollout_pool"]) == ({"trainer_pool": [8]}, [8]), checked
    code, stdout, err = cli("import", "verl", config, "--gpus-per-node", 8, "--out", "apart-again", "--json", "--force")
    assert code == 0, err
    assert json.loads(stdout)["time_per_iter_s"] == pytest.approx(result["time_per_iter_s"], rel=1e-12)
    assert yaml.safe_load(Path(json.loads(stdout)["plan"]).read_text())["calls"] == plan["calls"]


@pytest.mark.parametrize("overrides, key, says", [
    # verl's own example split (shell/grpo_3b_gsm8k_fsdp2_2_6.sh): 6 GPUs are no aligned block
    (("trainer.n_gpus_per_node=6", "rollout.n_gpus_per_node=2"), "rollout.n_gpus_per_node",
     "2 after the trainer's 6 on one node: realbench places each on an aligned power-of-two block"),
    # its 2-node one (dapo_7b_math_fsdp2_4_12.sh): each node split
    (("trainer.nnodes=2", "trainer.n_gpus_per_node=6", "rollout.nnodes=2", "rollout.n_gpus_per_node=2"),
     "rollout.n_gpus_per_node", "2 on 2 node(s) beside the trainer's 6 on 2: realbench places a pool across nodes "
                                "on whole nodes"),
    (("trainer.n_gpus_per_node=4", "rollout.n_gpus_per_node=4", "--gpus-per-node", "2"), "trainer.n_gpus_per_node",
     "4 on 1 node(s) beside the rollout's 4 on 1: realbench places a pool across nodes on whole nodes (of 2 GPUs"),
    (("actor_rollout_ref.hybrid_engine=True",), "actor_rollout_ref.hybrid_engine",
     "True: the one-step-off trainer serves the rollout from its own pool"),
    (("trainer.use_v1=False",), "trainer.use_v1", "False: the one-step-off entry point runs its own trainer"),
    (("algorithm.adv_estimator=gae", "critic.model.path=ckpt", "critic.ppo_micro_batch_size_per_gpu=1"),
     "algorithm.adv_estimator", "'gae': realbench reads verl's one-step-off trainer without a critic"),
    (("rollout.nnodes=0",), "rollout.nnodes", "0: verl needs it above 0"),
    (("reward.reward_model.enable=True", "reward.reward_model.model_path=ckpt", "reward.reward_model.rollout.name=vllm"),
     "reward.reward_model.enable", "True: realbench reads verl's one-step-off trainer with a reward function"),
    (("actor_rollout_ref.model.lora_rank=8",), "actor_rollout_ref.model.lora_rank",
     "8: realbench reads verl's one-step-off trainer for a whole actor")])
def test_what_one_step_off_runs_that_realbench_cannot_place_or_price_is_refused_by_name(cli, job, one_step_off_yaml,
                                                                                        overrides, key, says):
    os.chdir(job)
    code, _, err = cli("import", "verl", one_step_off_yaml, *ONE_STEP_OFF, *overrides, "--out", "refused-ahead")
    assert code == 2 and err.count("\n") == 1 and f"{key}: {says}" in err, err
    assert not (job / "refused-ahead").exists()


def test_the_synchronous_trainer_refuses_the_one_step_off_settings_and_search_offers_one_step_off_its_pools(
        cli, job, one_step_off_yaml, verl_check):
    """The synchronous trainer's config: a rollout apart from the actor's GPUs, or a node size, is
    the one-step-off entry's (refused by name). A scenario whose generation runs one step ahead is
    searched inside verl on its one-step-off pools only (the node's halves), every plan of its
    space written as a configuration; its best passes verl's own checks. Two steps ahead, or a
    plan whose generation shares the trainer's GPUs, verl cannot run."""
    import random

    from realbench.plan import load_scenario

    os.chdir(job)
    code, _, err = cli("import", "verl", "grpo_qwen_fsdp.yaml", "actor_rollout_ref.hybrid_engine=false", "--out", "x")
    assert code == 2 and "actor_rollout_ref.hybrid_engine: False: verl's synchronous trainer serves the rollout" in err
    code, _, err = cli("import", "verl", "grpo_qwen_fsdp.yaml", "--gpus-per-node", 8, "--out", "x")
    assert code == 2 and "--gpus-per-node: verl's configuration gives the node size" in err, err
    result, plan, _ = imported(cli, job, one_step_off_yaml, *ONE_STEP_OFF, out="ahead-search", name="ahead")
    scenario = load_scenario(result["scenario"])
    rng, groups = random.Random(0), list(verl.plan_groups(scenario))
    assert groups
    for group in groups:
        assert {o.mesh.label(8) for o in group["actor_gen"]} == {"n0:4-7"}
        assert {o.mesh.label(8) for o in group["actor_train"] + group["ref_inf"]} == {"n0:0-3"}
        for _ in range(5):
            options = {name: rng.choice(opts) for name, opts in group.items()}
            assert verl.space_problem(scenario, options) is None
            _, written = verl.to_config(scenario, options, {"actor": "a", "ref": "a"})
            assert (written["rollout.n_gpus_per_node"], written["trainer.n_gpus_per_node"]) == (4, 4)
    best = job / "ahead-search" / "best.yaml"
    code, out, err = cli("search", "--scenario", result["scenario"], "--engine", "verl", "--method", "mcmc",
                         "--time-budget", 3, "--out", best, "--json")
    assert code == 0, err
    found = json.loads(out)
    assert found["compared"]["name"] == "verl's default configuration" and found["speedup"] >= 1
    code, _, err = cli("export", "--plan", best, "--format", "verl", "--out", job / "ahead-search" / "best-verl.yaml")
    assert code == 0, err
    assert verl_check("validate", job / "ahead-search" / "best-verl.yaml")["ok"]
    path = Path(result["plan"])
    swapped = {**plan, "calls": {**plan["calls"], "actor_gen": {**plan["calls"]["actor_gen"], "mesh": "n0:0-3"},
                                 "actor_train": {**plan["calls"]["actor_train"], "mesh": "n0:4-7"},
                                 "ref_inf": {**plan["calls"]["ref_inf"], "mesh": "n0:4-7"}}}
    path.write_text(yaml.safe_dump(swapped))
    code, _, err = cli("export", "--plan", path, "--format", "verl", "--out", job / "ahead-search" / "swapped.yaml")
    assert code == 2 and "calls.actor_gen.mesh: verl's one-step-off trainer runs generation on a pool of its own" in err
    two = scenario.with_staleness(2)
    assert verl.space_problem_of_scenario(two) == ("max_staleness", "2: realbench writes verl's synchronous trainer "
                                                   "and its one-step-off entry point (generation one step ahead: "
                                                   "max_staleness 1)")


# -- a mixture of experts ------------------------------------------------------------------------------
# Qwen3-30B-A3B (128 experts, 8 a token) on 16 GPUs under Megatron tp 2 x pp 2: the experts over 4 GPUs
# of a stage, each whole (etp 1); the rollout's replicas of tp 2 x data_parallel_size 4 GPUs, the
# experts over all 8 (expert_parallel_size = tp x dp, as verl asserts)
MOE_MEGATRON = """\
hydra:
  searchpath: [pkg://verl.trainer.config]
defaults:
  - ppo_trainer
  - override model_engine: megatron
  - _self_
trainer: {nnodes: 2, n_gpus_per_node: 8}
data: {train_batch_size: 64, max_prompt_length: 512, max_response_length: 2048}
algorithm: {adv_estimator: grpo}
actor_rollout_ref:
  model: {path: moe}
  actor:
    ppo_mini_batch_size: 16
    ppo_micro_batch_size_per_gpu: 4
    use_kl_loss: true
    megatron:
      tensor_model_parallel_size: 2
      pipeline_model_parallel_size: 2
      expert_model_parallel_size: 4
      expert_tensor_parallel_size: 1
      param_offload: true
      optimizer_offload: true
      override_transformer_config: {recompute_granularity: full, recompute_method: uniform, recompute_num_layers: 1}
  rollout: {name: vllm, n: 8, tensor_model_parallel_size: 2, data_parallel_size: 4, expert_parallel_size: 8,
            log_prob_micro_batch_size_per_gpu: 4}
  ref: {log_prob_micro_batch_size_per_gpu: 8}
reward:
  custom_reward_function: {path: scoring/reward.py}
"""
# a critic (PPO) beside it: the job's dense checkpoint, or the mixture of experts with the actor's layout
# (verl's Megatron state is process-global)
MOE_PPO = ("algorithm.adv_estimator=gae", "critic.ppo_micro_batch_size_per_gpu=4",
           "critic.megatron.tensor_model_parallel_size=2", "critic.megatron.pipeline_model_parallel_size=2")
DENSE_CRITIC = (*MOE_PPO, "critic.model.path=ckpt")
MOE_CRITIC = (*MOE_PPO, "critic.model.path=moe", "critic.megatron.expert_model_parallel_size=4",
              "critic.megatron.expert_tensor_parallel_size=1")


@pytest.fixture(scope="module")
def moe_job(job):
    """The job folder with Qwen3-30B-A3B's hub config (the catalogue's copy) in a checkpoint folder
    (its config alone, which is what realbench prices) and the Megatron config above."""
    from realbench.models import catalogue

    (job / "moe").mkdir(exist_ok=True)
    (job / "moe" / "config.json").write_text(json.dumps(catalogue.config("qwen3-30b-a3b")))
    (job / "grpo moe megatron.yaml").write_text(MOE_MEGATRON)
    return job


def test_a_megatron_moe_configs_expert_layouts_read_as_verl_builds_them(cli, moe_job):
    """16 GPUs, Megatron tp 2 x pp 2: dp 4; expert_model_parallel_size 4 with each expert whole
    (expert_tensor_parallel_size 1): ep 4, etp 1, folded out of a stage's dp x tp = 8 GPUs (two copies
    of every expert a stage); the reference's block follows the actor's (ref/megatron_ref.yaml). The
    rollout: replicas of tp 2 x data_parallel_size 4 = 8 GPUs, the experts over expert_parallel_size
    8 = tp x dp, each whole: the generation's 8 tp groups (dp 8), tp 2, ep 8, etp 1. 512 rows (64
    prompts x 8), 4 optimizer steps: 32 rows a GPU a step in micro-batches of 4 (8); the reference's
    128 in 8s (16); a replica's 64 rows decode together (1)."""
    _, plan, scenario = imported(cli, moe_job, "grpo moe megatron.yaml", name="moe")
    layout = {"mesh": "n0-1", "dp": 4, "tp": 2, "pp": 2, "ep": 4, "etp": 1}
    assert plan["calls"] == {
        "actor_gen": {"mesh": "n0-1", "dp": 8, "tp": 2, "pp": 1, "micro_batches": 1, "ep": 8, "etp": 1,
                      "memory_fraction": 0.5},
        "actor_train": {**layout, "micro_batches": 8, "activation_checkpointing": True, "zero": 1,
                        "offload_params": True, "offload_optimizer": True},
        # (the reference's param_offload follows the actor's: ref/megatron_ref.yaml)
        "ref_inf": {**layout, "micro_batches": 16, "offload_params": True},
        "reward_inf": {"mesh": "n0-1", "dp": 16, "tp": 1, "pp": 1, "micro_batches": 1}}
    # etp null is tp's (Megatron's default): each expert split over the tp pair, the experts over 2
    # GPUs (ep x etp = 4 of a stage's 8); left out of the plan, as tp's
    _, plan, _ = imported(cli, moe_job, "grpo moe megatron.yaml",
                          "actor_rollout_ref.actor.megatron.expert_model_parallel_size=2",
                          "actor_rollout_ref.actor.megatron.expert_tensor_parallel_size=null", name="moe-etp")
    assert {k: plan["calls"]["actor_train"].get(k) for k in ("ep", "etp")} == {"ep": 2, "etp": None}


@pytest.mark.parametrize("overrides, experts, critic_experts", [
    ((), [4, 1], None),
    (("actor_rollout_ref.actor.megatron.expert_model_parallel_size=2",
      "actor_rollout_ref.actor.megatron.expert_tensor_parallel_size=null"), [2, None], None),
    # a dense critic takes no experts (its block at verl's defaults); a critic with experts the actor's layout
    (DENSE_CRITIC, [4, 1], [1, None]),
    (MOE_CRITIC, [4, 1], [4, 1]),
    # the rollout's experts over a replica's tp GPUs alone (data_parallel_size 1), SGLang's too
    (("actor_rollout_ref.rollout.data_parallel_size=1", "actor_rollout_ref.rollout.expert_parallel_size=2",
      "actor_rollout_ref.rollout.name=sglang"), [4, 1], None),
])
def test_an_exported_moe_plan_passes_verls_own_checks_and_reads_back_the_same(cli, moe_job, verl_check, overrides,
                                                                               experts, critic_experts):
    """The plan of a Megatron MoE config written as verl's configuration: verl composes it, validates
    it and builds its engine and rollout config dataclasses (RolloutConfig asserts expert_parallel_size
    = tp x dp) with the plan's expert layouts (each engine's expert_model_parallel_size and
    expert_tensor_parallel_size, the rollout's data_parallel_size and expert_parallel_size: the same
    keys back); imported again, the same plan and estimate."""
    first, plan, _ = imported(cli, moe_job, "grpo moe megatron.yaml", *overrides, out="first", name="moe")
    out = moe_job / "exported" / "moe config.yaml"
    out.parent.mkdir(exist_ok=True)
    code, _, err = cli("export", "--plan", first["plan"], "--format", "verl", "--out", out, "--force")
    assert code == 0, err
    checked = verl_check("validate", out)
    assert checked["ok"], checked
    critic = critic_experts is not None
    assert (checked["experts"], checked["ref_experts"], checked["critic_experts"]) == (experts, experts, critic_experts)
    gen = plan["calls"]["actor_gen"]
    assert (checked["rollout_tp"], checked["rollout_dp"], checked["rollout_ep"]) == \
        (gen["tp"], gen["ep"] // gen["tp"], gen["ep"])
    for name in ("actor_train", "ref_inf", *(("critic_train", "critic_inf") if critic else ())):
        layout = critic_experts if name.startswith("critic") else experts
        assert (plan["calls"][name].get("ep", 1), plan["calls"][name].get("etp")) == \
            (layout[0], layout[1] if layout[1] not in (None, 2) else None), name
    again, plan_again, _ = imported(cli, moe_job, out, out="again", name="moe")
    assert plan_again["calls"] == plan["calls"]
    assert again["time_per_iter_s"] == pytest.approx(first["time_per_iter_s"], rel=1e-12)


R_EP, R_DP = "actor_rollout_ref.rollout.expert_parallel_size", "actor_rollout_ref.rollout.data_parallel_size"
A_EP, A_ETP = "actor_rollout_ref.actor.megatron.expert_model_parallel_size", \
    "actor_rollout_ref.actor.megatron.expert_tensor_parallel_size"


@pytest.mark.parametrize("overrides, key, says", [
    # what verl itself refuses (RolloutConfig.__post_init__): expert_parallel_size other than tp x dp
    ((f"{R_EP}=4",), R_EP, "4: verl asserts expert_parallel_size == tensor_model_parallel_size x data_parallel_size "
                           "(2 x 4 = 8)"),
    # what realbench does not price: vLLM's experts split by tp over tp x dp GPUs, SGLang's data-parallel
    # attention; a replica of tp x dp GPUs astride nodes
    ((f"{R_EP}=1",), R_DP, "4 without expert parallelism"),
    (("actor_rollout_ref.rollout.name=sglang",), R_DP, "4 with SGLang"),
    ((f"{R_DP}=3", f"{R_EP}=6"), R_DP, "a replica of tp x dp = 6 GPUs fits a node or spans whole nodes of 8"),
    # experts that do not split so (realbench.plan.options.expert_problem), named by verl's key
    ((f"{A_EP}=3",), A_EP, "the 128 experts of moe do not split over ep 3"),
    ((f"{A_EP}=8", f"{A_ETP}=2"), A_EP, "ep x etp = 8 x 2 does not divide a pipeline stage's dp x sp x tp = 8"),
    ((f"{A_EP}=0",), A_EP, "0: a parallel size is a whole number of GPUs, 1 or more"),
    # verl's Megatron state is process-global: the reference's and a critic with experts take the actor's
    (("actor_rollout_ref.ref.megatron.expert_model_parallel_size=2",),
     "actor_rollout_ref.ref.megatron.expert_model_parallel_size", "process-global, the actor's (4) wins"),
    ((*MOE_PPO, "critic.model.path=moe"), "critic.megatron.expert_model_parallel_size",
     "process-global, the actor's (4) wins"),
    # a model without experts has none to lay out (Megatron needs num_moe_experts for expert parallelism)
    (("actor_rollout_ref.model.path=ckpt",), A_EP, "4: expert parallelism splits a mixture of experts' routed "
                                                   "experts; the actor's model (ckpt) has none"),
    ((*DENSE_CRITIC, "critic.megatron.expert_model_parallel_size=4"), "critic.megatron.expert_model_parallel_size",
     "the critic's model (ckpt) has none"),
])
def test_expert_layouts_verl_or_realbench_cannot_run_are_refused_by_name(cli, moe_job, overrides, key, says):
    assert_import_refused(cli, moe_job, "grpo moe megatron.yaml", overrides, key, says)


# Megatron TransformerConfig fields a job sets through override_transformer_config (verl hands them to
# Megatron-Bridge's provider over its own): fused kernels on and the router's numerics and losses are
# priced as realbench prices the layer and carried; the block's own layout set again, equal, is read
TC = "+actor_rollout_ref.actor.megatron.override_transformer_config"
KERNELS_AND_ROUTER = (f"{TC}.apply_rope_fusion=true", f"{TC}.moe_permute_fusion=true", f"{TC}.moe_grouped_gemm=true",
                      f"{TC}.moe_aux_loss_coeff=0.001",
                      f"{TC}.moe_token_dispatcher_type=alltoall", f"{TC}.sequence_parallel=true",
                      f"{TC}.tensor_model_parallel_size=2",
                      # (the reference's block, an interpolation of the actor's: given a field, that field alone,
                      # as Hydra composes it)
                      "+actor_rollout_ref.ref.megatron.override_transformer_config.apply_rope_fusion=true",
                      # (Hydra's own settings: where it runs, and verl's own search path)
                      "hydra.run.dir=outputs/moe", "hydra.searchpath=[pkg://verl.trainer.config]")


def test_megatrons_fused_kernels_and_router_settings_are_priced_as_set_and_carried_to_verl(cli, moe_job, verl_check):
    """The same plan and estimate with the fields as without; written back, the fused kernels and the
    router's settings are in the actor's override_transformer_config (the block's tp and sequence
    parallelism written from the plan, not again), which verl composes and validates; read again,
    the same plan."""
    plain, plain_plan, _ = imported(cli, moe_job, "grpo moe megatron.yaml", out="plain", name="moe")
    first, plan, _ = imported(cli, moe_job, "grpo moe megatron.yaml", *KERNELS_AND_ROUTER, out="first", name="moe")
    assert plan["calls"] == plain_plan["calls"]
    assert first["time_per_iter_s"] == pytest.approx(plain["time_per_iter_s"], rel=1e-12)
    out = moe_job / "exported" / "moe kernels.yaml"
    out.parent.mkdir(exist_ok=True)
    code, _, err = cli("export", "--plan", first["plan"], "--format", "verl", "--out", out, "--force")
    assert code == 0, err
    written = yaml.safe_load(out.read_text())["actor_rollout_ref"]["actor"]["megatron"]["override_transformer_config"]
    assert {k: v for k, v in written.items() if not k.startswith("recompute")} == {
        "apply_rope_fusion": True, "moe_permute_fusion": True, "moe_grouped_gemm": True,
        "moe_aux_loss_coeff": 0.001, "moe_token_dispatcher_type": "alltoall"}
    assert yaml.safe_load(out.read_text())["actor_rollout_ref"]["ref"]["megatron"]["override_transformer_config"] == \
        {"apply_rope_fusion": True}
    assert verl_check("validate", out)["ok"]
    _, again, _ = imported(cli, moe_job, out, out="again", name="moe")
    assert again["calls"] == plan["calls"]


@pytest.mark.parametrize("overrides, key, says", [
    ((f"{TC}.apply_rope_fusion=false",), "override_transformer_config.apply_rope_fusion",
     "False: the unfused kernels are not priced"),
    ((f"{TC}.moe_router_dtype=fp32",), "override_transformer_config.moe_router_dtype", "the router's scores in fp32"),
    ((f"{TC}.moe_router_load_balancing_type=sinkhorn",), "override_transformer_config.moe_router_load_balancing_type",
     "'sinkhorn': realbench prices aux_loss, seq_aux_loss, global_aux_loss, none"),
    ((f"{TC}.moe_token_dispatcher_type=flex",), "override_transformer_config.moe_token_dispatcher_type",
     "'flex': realbench prices alltoall"),
    ((f"{TC}.tensor_model_parallel_size=4",), "override_transformer_config.tensor_model_parallel_size",
     "4 overrides the engine block's tensor_model_parallel_size (2)"),
    ((f"{TC}.num_layers_in_first_pipeline_stage=23",), "override_transformer_config.num_layers_in_first_pipeline_stage",
     "stages of unequal layer counts"),
    ((f"{TC}.moe_enable_deepep=true",), "override_transformer_config.moe_enable_deepep", "DeepEP's dispatch kernels"),
    ((f"{TC}.moe_layer_freq=2",), "override_transformer_config.moe_layer_freq",
     "a Megatron TransformerConfig field verl passes through"),
    # a key verl has nowhere is named first, before one it passes on unpriced: a configuration of another release
    ((f"{TC}.moe_enable_deepep=true", "actor_rollout_ref.actor.megatron.grad_offload=true"),
     "actor_rollout_ref.actor.megatron.grad_offload", "verl 0.9.1 has no such setting"),
])
def test_megatron_fields_realbench_does_not_price_are_refused_by_name(cli, moe_job, overrides, key, says):
    assert_import_refused(cli, moe_job, "grpo moe megatron.yaml", overrides, key, says)


def test_verls_own_rollout_config_refuses_the_expert_parallel_size_realbench_refuses(moe_job, verl_check):
    """RolloutConfig.__post_init__ (verl/workers/config/rollout.py:294-297) refuses the rollout's
    expert_parallel_size 4 beside tp 2 x data_parallel_size 4, as realbench does, and accepts 8."""
    os.chdir(moe_job)
    refused = verl_check("validate", "grpo moe megatron.yaml", f"{R_EP}=4")
    assert not refused["ok"] and "expert_parallel_size must be equal to" in refused["error"], refused
    assert verl_check("validate", "grpo moe megatron.yaml")["ok"]


def test_verls_search_offers_the_expert_layouts_its_engines_have(moe_job, verl_check):
    """Inside verl a mixture of experts' experts are laid out by Megatron only (FSDP shards them as
    any weight: ep 1), one layout a group (process-global), and its rollout's over replicas of tp x
    data_parallel_size GPUs that fit a node or span whole ones, each expert whole. By hand, on the 16
    GPUs: Megatron tp 2 alone (dp 8) offers the experts over 1, 2, 4 or 8 GPUs split over the tp pair
    (ep x 2 dividing 16), or over 1 to 16 whole (etp 1); the rollout of tp 2 (8 replicas) over 2, 4,
    8 or 16 GPUs (2 x a divisor of 8), none; an SGLang rollout over its tp GPUs alone (tp 2, 4, 8 beyond
    the 4 KV heads, each head on 2 GPUs as SGLang serves it, or 16 over both nodes). Random plans of
    the groups with experts are written as configurations verl's own checks accept."""
    import random

    from realbench.engines import import_config
    from realbench.plan import load_scenario

    os.chdir(moe_job)
    scenario = load_scenario(str(import_config("verl", "grpo moe megatron.yaml", [], "space", overwrite=True)[0]))
    groups = list(verl.plan_groups(scenario))
    trained = [o.strategy for g in groups for o in g["actor_train"]]
    assert all((s.ep, s.etp) == (1, 0) for s in trained if s.zero >= 2)
    layouts = {(s.ep, s.etp) for s in trained if (s.zero, s.tp, s.pp, s.sp) in ((0, 2, 1, 1), (1, 2, 1, 1))}
    assert layouts == {(ep, 0) for ep in (1, 2, 4, 8)} | {(ep, 1) for ep in (1, 2, 4, 8, 16)}
    for g in groups:  # (one layout a group: the actor's, its reference's)
        assert len({(o.strategy.ep, o.strategy.etp) for o in g["actor_train"] + g["ref_inf"]}) == 1
    rollouts = {(o.strategy.tp, o.strategy.ep) for o in groups[0]["actor_gen"]}
    assert {ep for tp, ep in rollouts if tp == 2} == {1, 2, 4, 8, 16}
    sglang = load_scenario(str(import_config("verl", "grpo moe megatron.yaml", [
        "actor_rollout_ref.rollout.name=sglang", f"{R_DP}=1", f"{R_EP}=2"], "space-sglang", overwrite=True)[0]))
    assert {(o.strategy.tp, o.strategy.ep) for o in next(verl.plan_groups(sglang))["actor_gen"]
            if o.strategy.ep > 1} == {(t, t) for t in (2, 4, 8, 16)}  # (tp 8: each of the 4 KV heads on 2 GPUs;
    # tp 16: a replica over both nodes, as SGLang serves one across nodes)
    rng = random.Random(0)
    for k, g in enumerate(rng.sample([g for g in groups if g["actor_train"][0].strategy.ep > 1], 3)):
        options = {name: rng.choice(opts) for name, opts in g.items()}
        options["actor_gen"] = next(o for o in g["actor_gen"] if o.strategy.ep > o.strategy.tp)
        assert verl.space_problem(scenario, options) is None
        engine, settings = verl.to_config(scenario, options, {"actor": str(moe_job / "moe"),
                                                               "ref": str(moe_job / "moe")})
        path = moe_job / "space" / f"random {k}.yaml"
        for file, text, _ in verl.config_files(path, engine, settings):
            file.write_text(text)
        checked = verl_check("validate", path)
        assert checked["ok"], checked
        s, gen = options["actor_train"].strategy, options["actor_gen"].strategy
        assert checked["experts"] == [s.ep, s.etp or None]
        assert (checked["rollout_dp"], checked["rollout_ep"]) == (gen.ep // gen.tp, gen.ep)
