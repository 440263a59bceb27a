"""Run verl's own code on a configuration, with verl's Python (its pins conflict with realbench's:
`make engines` builds `.venv-verl` with verl 0.9.1). Standalone: imports verl, Hydra and
OmegaConf only, never realbench.

    .venv-verl/bin/python realbench/engines/verl/check.py defaults
        every key of verl's composed ppo_trainer config and its default value, per model_engine
        (dp: FSDP, megatron), interpolations unresolved: realbench/engines/verl/verl-0.9.1.json
    .venv-verl/bin/python realbench/engines/verl/check.py fused forward|train entropy|none
        the peak memory of verl's fused kernels (FSDP's use_fused_kernels, torch backend) on 2048
        tokens, in bytes a logit of one of its chunks (realbench.engines.verl.FUSED_*_BYTES)
    .venv-verl/bin/python realbench/engines/verl/check.py validate CONFIG.yaml [overrides...]
        composes CONFIG.yaml (a Hydra primary config whose defaults list names ppo_trainer) with
        the overrides as `python -m verl.trainer.main_ppo --config-path --config-name` does, then
        runs the checks verl runs before it starts training: validate_config
        (verl/utils/config.py) and the __post_init__ checks of the actor, rollout, engine and
        reward model dataclasses (verl/workers/config/), with a reward model the V1 trainer's
        resource pools (PPOTrainer._init_resource_pool_mgr, verl/trainer/ppo/v1/trainer_base.py),
        and with a top-level `rollout` block (the one-step-off entry point's config) what that
        entry point runs before it trains (its pools and its trainer's construction);
        prints one JSON line: {"ok": true, ...} or {"ok": false, "error": "..."} (exit status 1)
    .venv-verl/bin/python realbench/engines/verl/check.py count STEPS.json
        verl's dynamic batching (rearrange_micro_batches) on each step's rows: the micro-batches
        it forms and their tokens (realbench.engines.verl.packer is checked against it)
    .venv-verl/bin/python realbench/engines/verl/check.py partitions CASES.json
        verl's largest differencing method (karmarkar_karp) on each case [values, k]: the parts,
        largest first (realbench.engines.verl.packer.partition is checked against it)
    .venv-verl/bin/python realbench/engines/verl/check.py serve
        each line read, {"argv": one command's arguments above, "cwd": the folder it runs from},
        answered with a line {"status": exit status, "result": its JSON line}, until the input
        ends: verl imported once for many checks (importing it takes longer than any one check)
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

# run as a script, this file's folder comes first on the path, and realbench's modules beside it
# (settings.py, reader.py, ...) would shadow any package of their names
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != Path(__file__).resolve().parent]


def _leaves(node, prefix: str = "") -> dict:
    out = {}
    if isinstance(node, dict) and (node or not prefix):
        for key, value in node.items():
            out.update(_leaves(value, f"{prefix}{key}."))
    else:
        out[prefix[:-1]] = node
    return out


def defaults() -> dict:
    import verl
    from hydra import compose, initialize_config_dir, initialize_config_module
    from omegaconf import OmegaConf

    with initialize_config_module("verl.trainer.config", version_base=None):
        tables = {engine: _leaves(OmegaConf.to_container(compose("ppo_trainer", overrides=[f"model_engine={engine}"]),
                                                         resolve=False))
                  for engine in ("dp", "megatron")}
    # the one-step-off entry point's config (verl/experimental/one_step_off_policy/config), composed as
    # its main_ppo composes it: from the folder above verl's package, where its searchpath
    # (file://verl/trainer/config) points; kept as what it adds to ppo_trainer and changes in it
    package = Path(verl.__file__).resolve().parent
    here = os.getcwd()
    os.chdir(package.parent)
    try:
        with initialize_config_dir(str(package / "experimental" / "one_step_off_policy" / "config"), version_base=None):
            composed = {engine: _leaves(OmegaConf.to_container(
                compose("one_step_off_ppo_trainer", overrides=[f"model_engine={engine}"]), resolve=False))
                for engine in ("dp", "megatron")}
    finally:
        os.chdir(here)
    one_step_off = {engine: {k: v for k, v in composed[engine].items() if tables[engine].get(k, _ABSENT) != v}
                    for engine in composed}
    return {"verl": verl.__version__, "keys": tables, "one_step_off": one_step_off}


_ABSENT = object()


def _vllm_lora_rank_check() -> dict:
    """verl's validate_config checks a LoRA rank against vLLM's allowed ranks through its vLLM
    rollout package (verl/utils/config.py:205-215), whose import needs vLLM, a GPU build. Without
    vLLM, that package's utils module is stood in for by verl's own `get_vllm_max_lora_rank`, taken
    from its source file (verl/workers/rollout/vllm_rollout/utils.py; with vLLM absent it uses its
    own list of ranks): verl's check runs, not a copy of it."""
    import ast
    import importlib.util
    import types
    from typing import Literal, get_args

    if importlib.util.find_spec("vllm") is not None:
        return {}
    path = Path(importlib.util.find_spec("verl").origin).parent / "workers" / "rollout" / "vllm_rollout" / "utils.py"
    tree = ast.parse(path.read_text())
    function = next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "get_vllm_max_lora_rank")
    namespace = {"Literal": Literal, "get_args": get_args}
    exec(compile(ast.Module([function], []), str(path), "exec"), namespace)
    package = types.ModuleType("verl.workers.rollout.vllm_rollout")
    package.__path__ = []
    utils = types.ModuleType("verl.workers.rollout.vllm_rollout.utils")
    utils.get_vllm_max_lora_rank = namespace["get_vllm_max_lora_rank"]
    return {package.__name__: package, utils.__name__: utils}


def validate(config: str, overrides: list[str]) -> dict:
    from hydra import compose, initialize_config_dir
    from omegaconf import OmegaConf
    from verl.trainer.ppo.utils import need_critic, need_reference_policy
    from verl.utils.config import omega_conf_to_dataclass, validate_config

    path = Path(config).resolve()
    with initialize_config_dir(str(path.parent), version_base=None):
        cfg = compose(path.stem, overrides=overrides)
    OmegaConf.resolve(cfg)
    ref, critic = need_reference_policy(cfg), need_critic(cfg)
    from unittest import mock

    with mock.patch.dict(sys.modules, _vllm_lora_rank_check()):
        validate_config(cfg, use_reference_policy=ref, use_critic=critic)
    arr = cfg.actor_rollout_ref
    rollout = omega_conf_to_dataclass(arr.rollout)  # RolloutConfig.__post_init__: pp, modes
    actor = omega_conf_to_dataclass(arr.actor)  # and its engine's (FSDPEngineConfig / McoreEngineConfig)
    pools = None
    if cfg.reward.reward_model.enable:  # RewardModelConfig and its serving RolloutConfig
        omega_conf_to_dataclass(cfg.reward.reward_model)
        pools = _pools(cfg)
    teacher = None
    if cfg.distillation.enabled:  # DistillationConfig: its teachers, their replicas, the pool they fill
        distillation = omega_conf_to_dataclass(cfg.distillation)
        pools = _pools(cfg)
        teacher = {key: {"model_path": t.model_path, "tp": t.inference.tensor_model_parallel_size,
                         "replicas": t.num_replicas, "name": t.inference.name,
                         "max_num_seqs": t.inference.max_num_seqs,
                         "max_num_batched_tokens": t.inference.max_num_batched_tokens}
                   for key, t in distillation.teacher_models.items()}
    if cfg.get("rollout") is not None:  # the one-step-off entry point's config
        pools = _one_step_off(cfg)
    return {"ok": True, "n_gpus": cfg.trainer.n_gpus_per_node * cfg.trainer.nnodes, "strategy": actor.strategy,
            "rollout_tp": rollout.tensor_model_parallel_size, "ref": ref, "critic": critic,
            # the LoRA settings as verl composed them (a name it does not have fails the composition)
            "lora_rank": arr.model.lora_rank, "lora_alpha": arr.model.lora_alpha,
            "target_modules": OmegaConf.to_container(arr.model.target_modules)
            if OmegaConf.is_config(arr.model.target_modules) else arr.model.target_modules,
            "lora_merge": arr.model.lora.get("merge", False), "lora_adapter_path": arr.model.get("lora_adapter_path"),
            # the old log-probabilities: the rollout's (bypass, which needs them returned) or a forward's
            "bypass_mode": bool(cfg.algorithm.rollout_correction.bypass_mode), "rollout_name": rollout.name,
            # the share of each GPU's memory the rollout's server takes (realbench's memory_fraction)
            "memory_fraction": rollout.gpu_memory_utilization, "free_cache_engine": rollout.free_cache_engine,
            # the context a request to it may take (realbench's max_model_len, vLLM's)
            "max_model_len": rollout.max_model_len,
            "calculate_log_probs": rollout.calculate_log_probs,
            # the weight sync's buffer a GPU, in MB (realbench checks it fits in the KV cache the sync runs without)
            "bucket_mb": rollout.checkpoint_engine.update_weights_bucket_megabytes,
            # how a LoRA actor's adapters are gathered for the sync, and vLLM's CUDA graph mode (carried)
            "layered_summon": rollout.layered_summon, "capture_sizes": _container(rollout.cudagraph_capture_sizes),
            "cudagraph_mode": (_container(rollout.engine_kwargs.get("vllm")) or {}).get("compilation_config", {})
            .get("cudagraph_mode"),
            # the log-probabilities' path as the engines read it: the model's fused kernels (each
            # engine's engine_config.use_fused_kernels, workers/engine_workers.py:114) and their
            # backend; the actor engine config's entropy settings and torch.compile
            "use_fused_kernels": arr.model.use_fused_kernels,
            "fused_backend": arr.model.fused_kernel_options.get("impl_backend"),
            "engine_use_torch_compile": getattr(actor.engine, "use_torch_compile", None),
            "engine_entropy_chunking": actor.engine.entropy_from_logits_with_chunking,
            "engine_entropy_checkpointing": getattr(actor.engine, "entropy_checkpointing", None),
            # the policy loss's mode (carried as given)
            "loss_mode": arr.actor.policy_loss.loss_mode,
            # the chat template's keyword arguments, the user's own (carried)
            "chat_template_kwargs": OmegaConf.to_container(cfg.data.apply_chat_template_kwargs),
            # the reward manager's keyword arguments and FSDP's mixed precision (open dicts, carried)
            "reward_kwargs": OmegaConf.to_container(cfg.reward.get("reward_kwargs") or OmegaConf.create({})),
            "mixed_precision": _container(getattr(actor.engine, "mixed_precision", None)),
            # the scorer: the user's reward function, or with neither it nor a reward model verl's own
            # rule-based scorers (the function its reward manager gets, trainer/ppo/reward.py:124-149)
            "reward_function": cfg.reward.custom_reward_function.path,
            "builtin_scorer": _builtin_scorer(cfg),
            # a user's own settings, carried through realbench (engine_settings)
            "actor_lr": arr.actor.optim.lr, "train_files": OmegaConf.to_container(cfg.data.train_files)
            if OmegaConf.is_config(cfg.data.train_files) else cfg.data.train_files,
            "experiment_name": cfg.trainer.experiment_name,
            # dynamic batching, as composed (realbench's max_tokens): the actor's, the reference's and the
            # critic's budgets a GPU
            "use_dynamic_bsz": arr.actor.use_dynamic_bsz, "ppo_max_token_len_per_gpu": arr.actor.ppo_max_token_len_per_gpu,
            "ref_dynamic_bsz": arr.ref.log_prob_use_dynamic_bsz if ref else None,
            "ref_max_token_len_per_gpu": arr.ref.log_prob_max_token_len_per_gpu if ref else None,
            "critic_budget": cfg.critic.get("ppo_infer_max_token_len_per_gpu") if critic else None,
            # rows packed without padding (realbench's training.padding_free)
            "use_remove_padding": arr.model.use_remove_padding,
            "critic_use_remove_padding": cfg.critic.model.use_remove_padding if critic else None,
            # the offloads as the engines read them (realbench's offload_optimizer and offload_params):
            # the actor's engine config, the critic's block, and a Megatron reference's (which follows
            # the actor's unless set)
            **_offloads(actor, cfg, critic, ref),
            # the FSDP version each engine is built with (the engine config's strategy, which follows
            # the role's: EngineRegistry's backend, workers/engine_workers.py:136-143); the
            # reference's role strategy as composed (its engine's follows it the same way)
            "engine_strategy": actor.engine.strategy,
            "critic_engine_strategy": omega_conf_to_dataclass(cfg.critic).engine.strategy if critic else None,
            "ref_strategy": arr.ref.strategy if ref else None,
            # the Ulysses sequence parallel size each FSDP engine is built with (its engine config's,
            # after the role config's __post_init__: realbench's sp), and its device mesh and sharding
            # (realbench's shard_group: HYBRID_SHARD's fsdp dimension); None for Megatron's or a role not run
            **_ulysses(actor, arr, cfg, critic, ref, omega_conf_to_dataclass,
                       cfg.trainer.n_gpus_per_node * cfg.trainer.nnodes),
            # the context parallel size each Megatron engine is built with (its engine config's: realbench's
            # sp with ring p2p); None under FSDP or for a role not run
            **_context_parallel(actor, arr, cfg, critic, ref, omega_conf_to_dataclass),
            # a mixture of experts' layout: each Megatron engine's expert parallel and expert tensor parallel
            # sizes as built (realbench's ep and etp; etp None: tp's), and the rollout's replicas of tp x
            # data_parallel_size GPUs with expert_parallel_size (RolloutConfig.__post_init__ asserts it is
            # tp x dp where above 1)
            **_experts(actor, arr, cfg, critic, ref, omega_conf_to_dataclass),
            "rollout_dp": rollout.data_parallel_size, "rollout_ep": rollout.expert_parallel_size,
            # on-policy distillation: each teacher as verl resolves it (its key, replicas and server)
            "teachers": teacher,
            # with a reward model: verl's pools of GPUs ({pool: [GPUs a node]}) and the reward model's
            **(pools or {})}


def _container(node):
    from omegaconf import OmegaConf

    return OmegaConf.to_container(node) if OmegaConf.is_config(node) else node


def _builtin_scorer(cfg):
    """The name of the score function verl's reward manager gets where the config names no reward
    function and no reward model (verl's own, by data_source), by verl's own lookup; None else."""
    if cfg.reward.custom_reward_function.path is not None or cfg.reward.reward_model.enable:
        return None
    from verl.utils.reward_score import get_default_compute_score

    return get_default_compute_score(cfg.reward.reward_manager.name).__name__


def _pools(cfg) -> dict:
    """The resource pools the sync V1 trainer asks Ray for, by verl's own code (it raises on a
    reward pool of no GPUs), without starting it: the trainer class's pool method on the config."""
    import importlib

    from verl.trainer.ppo.v1.trainer_base import get_trainer_cls

    importlib.import_module("verl.trainer.ppo.v1.trainer_sync")  # (registers the "sync" trainer)

    trainer = object.__new__(get_trainer_cls(cfg.trainer.v1.trainer_mode))
    trainer.config = cfg
    trainer._init_resource_pool_mgr()
    manager = trainer.resource_pool_manager
    def pool_of(name: str):
        return next((pool for role, pool in manager.mapping.items() if getattr(role, "name", str(role)) == name), None)

    return {"pools": {name: list(spec) for name, spec in manager.resource_pool_spec.items()},
            "reward_pool": pool_of("RewardModel"), "teacher_pool": pool_of("TeacherModel")}


def _one_step_off(cfg) -> dict:
    """What verl's one-step-off entry point does with the config before it trains, by its own code
    (verl/experimental/one_step_off_policy/main_ppo.py): the rollout pool's size copied into the
    rollout's config, the trainer's pools (create_resource_pool_manager), and the trainer's own
    construction (OneStepOffRayTrainer.__init__: it asserts the rollout is not the actor's hybrid
    engine) without its data loaders."""
    from unittest import mock

    from verl.experimental.one_step_off_policy.ray_trainer import OneStepOffRayTrainer
    from verl.experimental.separation.utils import create_resource_pool_manager, create_role_worker_mapping
    from verl.trainer.ppo.utils import Role

    cfg.actor_rollout_ref.rollout.nnodes = cfg.rollout.nnodes
    cfg.actor_rollout_ref.rollout.n_gpus_per_node = cfg.rollout.n_gpus_per_node
    mapping, _ = create_role_worker_mapping(cfg)
    manager = create_resource_pool_manager(cfg, [*mapping, Role.Rollout])
    with mock.patch.object(OneStepOffRayTrainer, "_create_dataloader", lambda *args, **kwargs: None):
        trainer = OneStepOffRayTrainer(config=cfg, tokenizer=None, role_worker_mapping=dict(mapping),
                                       resource_pool_manager=manager)
    rollout = cfg.actor_rollout_ref.rollout
    return {"pools": {name: list(spec) for name, spec in manager.resource_pool_spec.items()},
            "rollout_pool": [rollout.n_gpus_per_node] * rollout.nnodes, "hybrid_engine": trainer.hybrid_engine,
            "rollout_mode": rollout.mode, "critic_in_use": trainer.use_critic}


def _ulysses(actor, arr, cfg, critic: bool, ref: bool, to_dataclass, world: int) -> dict:
    """The engines' Ulysses sizes, and the device mesh and sharding strategy each FSDP engine builds
    on the trainer's `world` GPUs by verl's own code (create_device_mesh and get_sharding_strategy,
    workers/engine/fsdp/utils.py, in a fake process group of that many ranks); the reference's config
    built as the worker builds it, its log_prob_* keys renamed first (verl/workers/engine_workers.py:545-553)."""
    from omegaconf import open_dict

    if actor.strategy == "megatron":
        return {"ulysses": None, "ref_ulysses": None, "critic_ulysses": None,
                "fsdp_mesh": None, "ref_fsdp_mesh": None, "critic_fsdp_mesh": None}
    ref_block = arr.ref.copy()
    with open_dict(ref_block):
        ref_block.ppo_mini_batch_size = arr.actor.ppo_mini_batch_size
        ref_block.ppo_micro_batch_size = ref_block.pop("log_prob_micro_batch_size", None)
        ref_block.ppo_micro_batch_size_per_gpu = ref_block.pop("log_prob_micro_batch_size_per_gpu", None)
        ref_block.use_dynamic_bsz = ref_block.pop("log_prob_use_dynamic_bsz", False)
        ref_block.ppo_max_token_len_per_gpu = ref_block.pop("log_prob_max_token_len_per_gpu", None)
    engines = {"": actor.engine, "ref_": to_dataclass(ref_block).engine if ref else None,
               "critic_": to_dataclass(cfg.critic).engine if critic else None}
    return {**{f"{role}ulysses": e.ulysses_sequence_parallel_size if e else None for role, e in engines.items()},
            **{f"{role}fsdp_mesh": _fsdp_mesh(world, e.fsdp_size) if e else None for role, e in engines.items()}}


def _fsdp_mesh(world: int, fsdp_size: int) -> dict:
    """The mesh verl's FSDP engine builds for `fsdp_size` on `world` ranks and its sharding strategy."""
    import torch.distributed as dist
    from torch.testing._internal.distributed.fake_pg import FakeStore
    from verl.workers.engine.fsdp.utils import create_device_mesh, get_sharding_strategy

    dist.init_process_group("fake", rank=0, world_size=world, store=FakeStore())
    try:
        mesh = create_device_mesh(world, fsdp_size)
        return {"dims": dict(zip(mesh.mesh_dim_names, mesh.shape)), "sharding": get_sharding_strategy(mesh).name}
    finally:  # (the next check's world may be another)
        dist.destroy_process_group()


def _context_parallel(actor, arr, cfg, critic: bool, ref: bool, to_dataclass) -> dict:
    if actor.strategy != "megatron":
        return {"context_parallel": None, "ref_context_parallel": None, "critic_context_parallel": None}
    return {"context_parallel": actor.megatron.context_parallel_size,
            "ref_context_parallel": arr.ref.megatron.context_parallel_size if ref else None,
            "critic_context_parallel": to_dataclass(cfg.critic).megatron.context_parallel_size if critic else None}


def _experts(actor, arr, cfg, critic: bool, ref: bool, to_dataclass) -> dict:
    """Each Megatron engine's (expert_model_parallel_size, expert_tensor_parallel_size) as its engine
    config holds them (the reference's block following the actor's); None under FSDP or for a role not run."""
    if actor.strategy != "megatron":
        return {"experts": None, "ref_experts": None, "critic_experts": None}

    def pair(engine) -> list:
        return [engine.expert_model_parallel_size, engine.expert_tensor_parallel_size]

    return {"experts": pair(actor.megatron), "ref_experts": pair(arr.ref.megatron) if ref else None,
            "critic_experts": pair(to_dataclass(cfg.critic).megatron) if critic else None}


def _offloads(actor, cfg, critic: bool, ref: bool) -> dict:
    megatron = actor.strategy == "megatron"
    engine = actor.megatron if megatron else actor.fsdp_config
    block = cfg.critic.get("megatron" if megatron else "fsdp", {}) if critic else {}
    return {"param_offload": engine.param_offload, "optimizer_offload": engine.optimizer_offload,
            "critic_param_offload": block.get("param_offload") if critic else None,
            "critic_optimizer_offload": block.get("optimizer_offload") if critic else None,
            "ref_megatron_param_offload": cfg.actor_rollout_ref.ref.megatron.param_offload
            if megatron and ref else None}


def count(path: str) -> dict:
    """verl's own dynamic batching (rearrange_micro_batches, verl/utils/seqlen_balancing.py) on
    each step of a JSON file {"budget": tokens, "divided_by": n or null, "steps": [[a row's tokens,
    ...], ...]}: one rank's rows a step (no data-parallel group), each row its tokens of attention
    mask in a padded batch. Returns the micro-batches it forms and the tokens each holds."""
    import torch
    from tensordict import TensorDict
    from verl.utils.seqlen_balancing import rearrange_micro_batches

    job = json.loads(Path(path).read_text())
    counts, tokens = [], []
    for rows in job["steps"]:
        width = max(rows)
        mask = (torch.arange(width)[None, :] < torch.tensor(rows)[:, None]).long()
        batch = TensorDict({"input_ids": torch.zeros_like(mask), "attention_mask": mask}, batch_size=[len(rows)])
        micro_batches, _ = rearrange_micro_batches(batch, max_token_len=job["budget"],
                                                   num_batches_divided_by=job.get("divided_by"))
        counts.append(len(micro_batches))
        tokens.append(sorted(int(m["attention_mask"].sum()) for m in micro_batches))
    return {"counts": counts, "tokens": tokens}


def partitions(path: str) -> dict:
    """verl's own largest differencing method (karmarkar_karp, verl/utils/seqlen_balancing.py,
    equal_size False, as its dynamic batching calls it) on each case of a JSON file [[values, k],
    ...]: each partition's parts in verl's order (largest first), each part's indices sorted."""
    from verl.utils.seqlen_balancing import karmarkar_karp

    cases = json.loads(Path(path).read_text())
    return {"partitions": [[sorted(p) for p in karmarkar_karp(values, k, equal_size=False)] for values, k in cases]}


def fused_peak(train: bool, entropy: bool, tokens: int = 2048, vocab: int = 16384, hidden: int = 32) -> dict:
    """The peak memory of verl's fused kernels (FusedLinearForPPO, the torch backend FSDP's
    use_fused_kernels runs) on `tokens` tokens, over what was there before, in bytes a logit of one
    of its chunks: its forward alone, or with `train` its forward and backward (the entropy's
    gradient too with `entropy`, as an update with an entropy term takes it). Measured at torch's
    CPU allocator (the profiler's memory events, summed in order): the same on every machine, where
    the process's resident memory depends on how the C library returns freed pages. A vocabulary of
    16,384 keeps it short: a chunk's logits outweigh the rest there (the hidden states, the labels)
    hundreds of times over (12.02, 20.29 and 28.29 bytes a logit here; 12.00, 20.26 and 28.26 at
    65,536, in four times the time)."""
    import torch
    from torch.profiler import ProfilerActivity, profile
    from verl.utils.experimental.torch_functional import FusedLinearForPPO

    def run(n: int) -> None:
        states = torch.randn(n, hidden, dtype=torch.bfloat16, requires_grad=train)
        kernel = FusedLinearForPPO()
        with torch.set_grad_enabled(train):
            log_probs, entropy_out = kernel(states, weights, labels[:n], temperature=1.0)
            if train:  # (an unused entropy gets no gradient: the kernel skips its terms)
                (log_probs.sum() + (entropy_out.sum() if entropy else 0)).backward()

    torch.manual_seed(0)
    weights = (torch.randn(vocab, hidden) * 0.02).to(torch.bfloat16).requires_grad_(train)
    labels = torch.randint(0, vocab, (tokens,))
    run(64)  # (the kernels' first call allocates what every call reuses)
    weights.grad = None
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        run(tokens)
    events = sorted((e for e in prof.profiler.kineto_results.events() if e.name() == "[memory]"),
                    key=lambda e: e.start_ns())
    held = peak = 0
    for event in events:  # (nbytes: positive where allocated, negative where freed)
        held += event.nbytes()
        peak = max(peak, held)
    chunk = FusedLinearForPPO().chunk_size
    return {"chunk_tokens": chunk, "bytes_per_chunk_logit": peak / (chunk * vocab), "allocations": len(events)}


def serve() -> int:
    """Answer commands read a line each (see the module's doc) until the input ends."""
    import contextlib
    import io

    for line in sys.stdin:
        request, printed = json.loads(line), io.StringIO()
        os.chdir(request["cwd"])
        with contextlib.redirect_stdout(printed):
            status = main(request["argv"])
        lines = printed.getvalue().strip().splitlines()
        sys.stdout.write(json.dumps({"status": status, "result": json.loads(lines[-1]) if lines else None}) + "\n")
        sys.stdout.flush()
    return 0


def main(argv: list[str]) -> int:
    if argv == ["serve"]:
        return serve()
    if argv[:1] == ["fused"] and len(argv) == 3:
        print(json.dumps(fused_peak(argv[1] == "train", argv[2] == "entropy")))
        return 0
    if argv[:1] == ["defaults"]:
        print(json.dumps(defaults(), sort_keys=True, default=str))
        return 0
    if argv[:1] == ["count"] and len(argv) == 2:
        print(json.dumps(count(argv[1])))
        return 0
    if argv[:1] == ["partitions"] and len(argv) == 2:
        print(json.dumps(partitions(argv[1])))
        return 0
    if argv[:1] == ["validate"] and len(argv) >= 2:
        try:
            print(json.dumps(validate(argv[1], argv[2:])))
            return 0
        except Exception as e:  # verl's own refusal, whatever its type: reported as one line
            root = e  # (Hydra's instantiation wraps a dataclass's own refusal: its cause named too)
            while root.__cause__ is not None or root.__context__ is not None:
                root = root.__cause__ or root.__context__
            text = f"{type(e).__name__}: {e}".splitlines()[0]
            if root is not e:
                text += f"; caused by {type(root).__name__}: " + (f"{root}".strip().splitlines() or [""])[0]
            print(json.dumps({"ok": False, "error": text}))
            return 1
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
