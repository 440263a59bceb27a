"""An OpenRLHF command line read into a scenario and a plan: `read_config` takes a launch script
(the words after `openrlhf.cli.train_ppo_ray`, up to the shell's next command, its variables
expanded as bash expands them: `flags_of`) or a file of flags, and overrides `flag=value`, through
an argument parser built from OpenRLHF's own (the same flags, types, choices and defaults,
abbreviations included). `to_plan` makes the scenario and plan documents of the flags read, each
group of GPUs placed on the cluster's nodes (realbench.engines.placement), on nodes of a size the
command line does not give (`gpus_per_node`).
"""

from __future__ import annotations

import argparse
import difflib
import re
import shlex
from pathlib import Path
from typing import Any

from realbench.engines.batches import even_share, fewest_splits, rounds
from realbench.engines.documents import job_documents, refuse_beyond_positions
from realbench.engines.openrlhf.pricing import GROUP_OF_ONE, _changed, refuse_unpriced
from realbench.engines.openrlhf.settings import (ADAM_OFFLOAD, ESTIMATORS, MEMORY, MODULE, PACKING, RING, SLEEP,
                                                 VERSION, VLLM_MAX_NUM_SEQS, _table)
from realbench.engines.placement import place
from realbench.errors import ConfigError
from realbench.plan.mesh import Mesh


class _Parser(argparse.ArgumentParser):
    def error(self, message):  # argparse's refusal, as realbench's one line
        raise ConfigError(message, source=self.source)


def _parser(source: str) -> _Parser:
    """An argument parser with OpenRLHF's flags, types, choices and defaults (abbreviations
    accepted, as OpenRLHF's own parser accepts them)."""
    p = _Parser(prog=MODULE, add_help=False)
    p.source = source
    types = {"int": int, "float": float, "str": str, None: None}
    for f in _table()["flags"]:
        if f["kind"] == "true":
            p.add_argument(*f["flags"], dest=f["dest"], action="store_true")
        elif f["kind"] == "false":
            p.add_argument(*f["flags"], dest=f["dest"], action="store_false")
        else:
            p.add_argument(*f["flags"], dest=f["dest"], type=types[f["type"]], nargs=f["nargs"], choices=f["choices"],
                           default=f["default"])
    return p


# a shell assignment, NAME=value or an array NAME=( ... ), and a use of a variable: ${NAME[@]}
# (quoted or not), ${NAME} or $NAME
_ASSIGNMENT = re.compile(r"^\s*(?:export\s+|local\s+|readonly\s+)?([A-Za-z_]\w*)=(.*)$")
_USE = re.compile(r'"\$\{(\w+)\[@\]\}"|\$\{(\w+)\[@\]\}|\$\{(\w+)\}|\$(\w+)')


def _uncommented(line: str) -> str:
    return line.split("#")[0].rstrip()  # (a flag's words hold no '#')


def _expanded(text: str, scalars: dict[str, str], arrays: dict[str, list[str]]) -> str:
    """`text` with the script's own variables put in as bash puts them: an array's words (each
    quoted, so that "${ARGS[@]}" stays its words), a value; any other `$...` (the environment's, a
    command's output) as written."""
    def one(m: re.Match) -> str:
        array = m.group(1) or m.group(2)
        if array is not None:
            return " ".join(shlex.quote(w) for w in arrays[array]) if array in arrays else m.group(0)
        name = m.group(3) or m.group(4)
        return scalars.get(name, m.group(0))
    return _USE.sub(one, text)


def flags_of(text: str) -> list[str]:
    """The words of the train_ppo_ray call in a launch script (everything in a file of flags), with
    the variables the script sets before it expanded as bash expands them: `NAME=value`, arrays
    `NAME=( ... )` over one line or several (comments inside), used as $NAME, ${NAME} or
    ${NAME[@]} (OpenRLHF's examples gather their flags in such arrays). A value bash computes (a
    command's output, the environment's) stays as written."""
    lines = text.replace("\\\n", " ").splitlines()
    scalars: dict[str, str] = {}
    arrays: dict[str, list[str]] = {}
    i = 0
    try:
        while i < len(lines):
            line, i = lines[i], i + 1
            if MODULE in _uncommented(line):
                words = shlex.split(_expanded(line, scalars, arrays), comments=True)
                if MODULE not in words:  # (a command run by `bash -c "..."`, srun's say: its string's words)
                    inner = next((w for w in words if MODULE in w), None)
                    words = words if inner is None else shlex.split(inner, comments=True)
                words = words[words.index(MODULE) + 1:] if MODULE in words else words
                break
            m = _ASSIGNMENT.match(line)
            if not m:
                continue
            name, value = m.groups()
            if value.startswith("("):  # (an array: to the line that closes it)
                body = [value[1:]]
                while not _uncommented(body[-1]).endswith(")") and i < len(lines):
                    body, i = body + [lines[i]], i + 1
                inner = "\n".join(map(_uncommented, body)).removesuffix(")")
                arrays[name] = shlex.split(_expanded(inner, scalars, arrays))
            elif "$(" not in value and "`" not in value:  # (a command's output: not run here)
                scalars[name] = " ".join(shlex.split(_expanded(value, scalars, arrays), comments=True))
        else:  # a file of flags
            words = shlex.split(_expanded(text.replace("\\\n", " "), scalars, arrays), comments=True)
    except ValueError as e:
        raise ConfigError(f"not a command line: {e}") from None
    words = [w for w in words if w != "$@"]  # (a launch script passes its own arguments on)
    for i, w in enumerate(words):
        if w in ("&&", "||", ";", "|", "&"):
            return words[:i]
    return words


def _unknown(flag: str, source: str) -> ConfigError:
    names = [n for f in _table()["flags"] for n in f["flags"]]
    close = difflib.get_close_matches(flag.split("=")[0], names, n=1, cutoff=0.75)
    hint = f" (did you mean {close[0]!r}?)" if close else ""
    return ConfigError(f"OpenRLHF {VERSION}'s train_ppo_ray has no such flag{hint}", flag, source)


def read_config(path: str | Path, overrides: list[str] = ()) -> tuple[str, dict[str, Any], set[str]]:
    """("deepspeed", every flag's value as OpenRLHF parses it (dest -> value), the dests changed
    from OpenRLHF's defaults) of a launch script or file of flags, and overrides `flag=value`
    (`--` optional; a store_true flag =true or =false)."""
    source = str(path)
    p = Path(path)
    if not p.is_file():
        raise ConfigError("no such file" if not p.exists() else "not a regular file", source=source)
    try:
        argv = flags_of(p.read_text())
    except (OSError, UnicodeDecodeError) as e:
        raise ConfigError(f"unreadable: {e}", source=source) from None
    except ConfigError as e:
        raise ConfigError(e.message, e.field, source) from None
    table = {n: f for f in _table()["flags"] for n in f["flags"]}
    for o in overrides:
        key, eq, value = o.partition("=")
        flag = "--" + key.lstrip("-")
        if not eq or flag not in table:
            raise (ConfigError("an override is flag=value", o, "overrides") if not eq else _unknown(flag, "overrides"))
        if table[flag]["kind"] != "value":
            if value.lower() not in ("true", "false"):
                raise ConfigError("a switch is =true or =false", o, "overrides")
            argv = [w for w in argv if w != flag] + ([flag] if value.lower() == "true" else [])
        else:  # (a value with spaces, a folder's name say, is one word unless the flag takes several)
            argv += [flag, *(value.split() if table[flag]["nargs"] not in (None, "?") else [value])]
    parser = _parser(source)
    ns, extra = parser.parse_known_args(argv)
    if extra:
        raise _unknown(extra[0], source)
    settings = vars(ns)
    return "deepspeed", settings, _changed(settings)


def _rows_within(L: int, budget: int) -> int:
    """Rows a micro-batch of OpenRLHF's dynamic batching holds: first fit in arrival order
    (get_minimum_num_micro_batch_size, utils/seqlen_balancing.py:234-246) of rows of L tokens
    each (realbench reads an OpenRLHF job's rows at their cap) within `budget` tokens (already
    times ring attention and DeepSpeed's tp, :237): floor(budget / L), one where a row alone is
    longer (first fit opens a micro-batch for it all the same)."""
    return max(1, budget // L)


def to_plan(engine: str, s: dict[str, Any], given: set[str], name: str, device: str, source: str = "",
            gpus_per_node: int = 8) -> tuple[dict, dict]:
    """(scenario document, plan document) of OpenRLHF's parsed flags `s` and the dests changed,
    on nodes of `gpus_per_node` GPUs (the command line does not say: only a group's GPU count
    matters to Ray's placement)."""
    refuse_unpriced(s, given, source)
    estimator = s["algo.advantage.estimator"]
    if estimator not in ESTIMATORS:
        raise ConfigError(f"{estimator!r}: realbench plans {', '.join(ESTIMATORS)} (PPO, GRPO, RLOO)",
                          "--algo.advantage.estimator", source)
    algorithm = ESTIMATORS[estimator]
    # OpenRLHF builds a reference only for a KL coefficient above 0 (cli/train_ppo_ray.py:93-103)
    reference = s["algo.kl.init_coef"] > 0
    n = int(s["rollout.n_samples_per_prompt"])
    if (algorithm != "ppo" and n < 2) or n < 1:
        raise ConfigError(f"{n}: {GROUP_OF_ONE}" if n == 1 else f"{n}: samples a prompt, 1 or more",
                          "--rollout.n_samples_per_prompt", source)
    engines, rollout_tp = s["vllm.num_engines"], int(s["vllm.tensor_parallel_size"])
    if not engines:
        raise ConfigError("is not set: OpenRLHF generates with vLLM engines only (samples_generator.py:195-241)",
                          "--vllm.num_engines", source)
    if s["rollout.max_new_tokens"] is None:
        raise ConfigError("is not set: realbench prices a fixed response budget (OpenRLHF's default fills each "
                          "prompt to --data.max_len)", "--rollout.max_new_tokens", source)
    gen_len = int(s["rollout.max_new_tokens"])
    prompt_len = int(s["data.max_len"]) - gen_len
    if prompt_len < 1:
        raise ConfigError(f"{s['data.max_len']} leaves no room for prompts of --rollout.max_new_tokens {gen_len}",
                          "--data.max_len", source)
    L = prompt_len + gen_len
    # (vLLM's max_model_len: cli/train_ppo_ray.py:53-74; vLLM refuses one beyond the checkpoint's positions)
    refuse_beyond_positions(L, s["actor.model_name_or_path"], "--data.max_len", source,
                            "vLLM refuses before it starts (OpenRLHF gives it as max_model_len, train_ppo_ray.py:53-74)")
    T, zero = int(s["ds.tensor_parallel_size"]), int(s["ds.zero_stage"])
    if T > 1 and zero == 3:
        raise ConfigError("3 with --ds.tensor_parallel_size > 1: DeepSpeed's AutoTP trains under ZeRO 0 to 2 "
                          "(deepspeed.ai/tutorials/autotp-training)", "--ds.zero_stage", source)
    forward_zero = 3 if zero == 3 else 0  # the eval config (deepspeed_utils.py:78-118)
    if zero == 3 and int(s["ds.zpg"]) > 1:  # (read under stage 3 only: deepspeed runtime/zero/stage3.py:261-267)
        raise ConfigError(f"{s['ds.zpg']} with --ds.zero_stage 3: ZeRO++'s hierarchical partitioning keeps a second "
                          "copy of the weights' shards in groups of this many GPUs and gathers the backward's from it "
                          "(zero_hpz_partition_size); realbench does not price it", "--ds.zpg", source)
    ring = int(s[RING])
    if ring < 1:
        raise ConfigError(f"{ring}: a ring attention group is 1 GPU or more", f"--{RING}", source)
    host_adam = bool(s[ADAM_OFFLOAD])
    sleep = bool(s[SLEEP]) and not host_adam  # (beside CPU Adam the sleep moves nothing)
    if sleep and zero == 0:
        raise ConfigError("with --ds.zero_stage 0: DeepSpeed offloads the states of its ZeRO optimizers only "
                          "(runtime/zero/stage3.py:3571, stage_1_and_2.py:2921)", f"--{SLEEP}", source)
    if host_adam and zero == 0:
        raise ConfigError("with --ds.zero_stage 0: DeepSpeed's CPU Adam runs under its ZeRO optimizers (stage 0's "
                          "bf16 wrapper keeps fp32 copies on the GPU, runtime/fp16/unfused_optimizer.py:77)",
                          f"--{ADAM_OFFLOAD}", source)
    critic = algorithm == "ppo"
    reward_fn = s["reward.remote_url"]
    if reward_fn and not str(reward_fn).endswith(".py"):
        raise ConfigError(f"{reward_fn!r}: a remote reward server's time is not on the plan's GPUs; realbench reads a "
                          "reward model or a reward function file (.py)", "--reward.remote_url", source)
    if not reward_fn and not s["reward.model_name_or_path"]:
        raise ConfigError("OpenRLHF needs a scorer: a reward model (--reward.model_name_or_path) or a reward function "
                          "(--reward.remote_url FILE.py)", "--reward.model_name_or_path", source)
    width = lambda role: int(s[f"{role}.num_nodes"]) * int(s[f"{role}.num_gpus_per_node"])  # noqa: E731
    per_node = gpus_per_node
    # the asynchronous trainer (trainer/ppo_trainer_async.py): generation runs up to async_queue_size
    # batches ahead of training (a Ray queue of that size), on vLLM's own GPUs: under colocate_all only
    # the DeepSpeed models share the actor's (cli/train_ppo_ray.py:711-712, 75)
    staleness = int(s["train.async_queue_size"]) if s["train.async_enable"] else 0
    colocated = bool(s["train.colocate_all"])  # the DeepSpeed models on the actor's placement group
    hybrid = colocated and not staleness  # and vLLM there too
    with_ref, with_reward = bool(s["train.colocate_actor_ref"]), bool(s["train.colocate_critic_reward"]) and critic
    if staleness and s["vllm.enable_sleep"]:
        raise ConfigError("OpenRLHF's asynchronous trainer keeps vLLM awake (cli/train_ppo_ray.py:714-715)",
                          "--vllm.enable_sleep", source)
    W_a = width("actor")
    if reference and (colocated or with_ref) and (s["ref.num_nodes"], s["ref.num_gpus_per_node"]) != (s["actor.num_nodes"],
                                                                                        s["actor.num_gpus_per_node"]):
        raise ConfigError("a reference colocated with the actor has the actor's nodes and GPUs per node "
                          "(cli/train_ppo_ray.py:41-46)", "--ref.num_gpus_per_node", source)
    if with_reward and not reward_fn and (s["reward.num_nodes"], s["reward.num_gpus_per_node"]) != (
            s["critic.num_nodes"], s["critic.num_gpus_per_node"]):
        raise ConfigError("a reward model colocated with the critic has the critic's nodes and GPUs per node "
                          "(cli/train_ppo_ray.py:109-117)", "--reward.num_gpus_per_node", source)
    if hybrid and engines * rollout_tp != W_a:
        raise ConfigError(f"{engines} engines x tp {rollout_tp} != the actor's {W_a} GPUs: the hybrid engine puts a "
                          "vLLM worker on every actor GPU (cli/train_ppo_ray.py:56-64)", "--vllm.num_engines", source)
    groups = [("actor", W_a)]
    if reference and not (colocated or with_ref):
        groups.append(("ref", width("ref")))
    if critic and not (colocated and not with_reward):
        groups.append(("critic", width("critic")))
    if not reward_fn and not with_reward and not colocated:
        groups.append(("reward", width("reward")))
    if not hybrid:
        groups.append(("vllm", engines * rollout_tp))
    meshes, nodes = place(groups, per_node)
    A = meshes["actor"]
    at_actor = lambda size: Mesh(A.node, max(1, size // per_node), A.gpu, min(size, per_node))  # noqa: E731
    meshes.setdefault("ref", A)
    meshes.setdefault("vllm", A)
    if critic:
        meshes.setdefault("critic", at_actor(width("critic")))  # hybrid: the first bundles (launcher.py:254-283)
    if not reward_fn:
        meshes.setdefault("reward", meshes["critic"] if with_reward else at_actor(width("reward")))
    for role in ("critic", "reward"):
        if role in meshes and colocated and not with_reward and width(role) > W_a:
            raise ConfigError(f"{width(role)} GPUs: under --train.colocate_all it shares the actor's {W_a}",
                              f"--{role}.num_gpus_per_node", source)

    prompts = int(s["rollout.batch_size"])
    rows = prompts * n
    batch = int(s["train.batch_size"])
    steps = even_share(rows, batch, "samples a step", "--train.batch_size", source)
    epochs = int(s["train.max_epochs"])
    dynamic = bool(s["train.dynamic_batch_enable"])
    infer_tokens = int(s["rollout.max_tokens_per_gpu"] or s["train.max_tokens_per_gpu"])  # :691-697
    micro, infer_micro = int(s["train.micro_batch_size"]), int(s["rollout.micro_batch_size"])

    def dp_of(role: str) -> int:  # (the data-parallel ranks: groups of ring x tp GPUs)
        size = meshes[role].size
        if size % T:
            raise ConfigError(f"{T} does not divide the {role}'s {size} GPUs (utils/deepspeed/deepspeed.py:103-107)",
                              "--ds.tensor_parallel_size", source)
        if size % (T * ring):
            times = f" x --ds.tensor_parallel_size {T} = {T * ring}" if T > 1 else ""
            raise ConfigError(f"{ring}{times} does not divide the {role}'s {size} GPUs "
                              "(utils/deepspeed/deepspeed.py:103-107)", f"--{RING}", source)
        return size // (T * ring)

    groups = {"sp": ring, "ring": "allgather"} if ring > 1 else {}

    def trained(role: str) -> dict:
        dp = dp_of(role)
        per_gpu = even_share(batch, dp, "samples of an optimizer step", "--train.batch_size", source)
        if dynamic:  # first fit of a rank's rows, the largest count over the ranks (replay_buffer.py:116-127)
            m = rounds(per_gpu, _rows_within(L, int(s["train.max_tokens_per_gpu"]) * T * ring))
        else:
            if per_gpu % micro:
                raise ConfigError(f"{micro} does not divide a GPU's {per_gpu} samples of an optimizer step: DeepSpeed "
                                  "needs train_batch_size = micro x accumulation x dp (deepspeed.py:455-456)",
                                  "--train.micro_batch_size", source)
            m = per_gpu // micro
        return {"mesh": meshes[role], "dp": dp, "tp": T, "pp": 1, "micro_batches": m,
                "activation_checkpointing": bool(s["actor.gradient_checkpointing_enable"]), "zero": zero,
                "offload_optimizer": sleep, "host_adam": host_adam, **groups}

    def forward(role: str, z: int) -> dict:
        dp = dp_of(role)
        per_gpu = even_share(rows, dp, "samples", "--rollout.batch_size", source)
        if dynamic:  # the step's rows by first fit, in whole multiples of the actor's ranks, dispatched over the role's
            actor_dp = dp_of("actor")
            chunks = max(actor_dp, -(-rows // _rows_within(L, infer_tokens * T * ring)) // actor_dp * actor_dp)
            m = fewest_splits(per_gpu, -(-chunks // dp))
        else:
            m = rounds(per_gpu, infer_micro)
        return {"mesh": meshes[role], "dp": dp, "tp": T, "pp": 1, "micro_batches": m, "zero": z, **groups}

    calls: dict[str, dict] = {
        "actor_gen": {"mesh": meshes["vllm"], "dp": engines, "tp": rollout_tp, "pp": 1,
                      "micro_batches": rounds(even_share(rows, engines, "samples", "--vllm.num_engines", source),
                                               VLLM_MAX_NUM_SEQS),
                      # (the hybrid engine without --vllm.enable_sleep: vLLM keeps its share of every GPU
                      # while DeepSpeed trains)
                      **({"keeps_memory": True} if hybrid and not s["vllm.enable_sleep"] else {})},
        "actor_train": trained("actor")}
    if reference:
        calls["ref_inf"] = forward("ref", forward_zero)
    if critic:
        calls["critic_train"], calls["critic_inf"] = trained("critic"), forward("critic", forward_zero)
    if reward_fn:  # run in the vLLM engines' actors beside generation (utils/agent.py:285-306)
        calls["reward_inf"] = {"mesh": meshes["vllm"], "dp": meshes["vllm"].size, "tp": 1, "pp": 1, "micro_batches": 1}
    else:
        calls["reward_inf"] = forward("reward", forward_zero)
    for c in calls.values():
        c["mesh"] = c["mesh"].label(per_node)
    actor_path = s["actor.model_name_or_path"]
    models: dict[str, Any] = {"actor": {"path": actor_path}, **({"ref": {"path": actor_path}} if reference else {})}
    if critic:  # the critic defaults to the reward model (cli/train_ppo_ray.py:644-650)
        models["critic"] = {"path": s["critic.model_name_or_path"] or s["reward.model_name_or_path"] or actor_path,
                            "value_head": True}
    models["reward"] = ({"function": f"{reward_fn}:reward_func"} if reward_fn
                        else {"path": s["reward.model_name_or_path"], "value_head": True})
    for entry in models.values():
        if entry.get("path") is None:
            entry.pop("path", None)
    if int(s["ds.lora.rank"]) > 0:
        if critic:
            raise ConfigError(f"{s['ds.lora.rank']} with a critic: OpenRLHF wraps the critic in the same adapters "
                              "(trainer/ray/ppo_critic.py:201-204); realbench reads LoRA on the actor of GRPO and RLOO",
                              "--ds.lora.rank", source)
        if float(s["ds.lora.dropout"]):
            raise ConfigError(f"{s['ds.lora.dropout']}: realbench trains adapters without dropout (0)", "--ds.lora.dropout",
                              source)
        targets = s["ds.lora.target_modules"]
        models["actor"]["lora"] = {"r": int(s["ds.lora.rank"]), "lora_alpha": s["ds.lora.alpha"],
                                   "target_modules": "all-linear" if targets in ("all-linear", ["all-linear"]) else targets}
    return job_documents("openrlhf", name, f"read from the OpenRLHF {VERSION} command line {Path(source).name}",
                         f"OpenRLHF {VERSION} command line", algorithm=algorithm, models=models, prompts=prompts,
                         prompt_len=prompt_len, gen_len=gen_len, steps=steps, group_size=n,
                         cluster={"nodes": nodes, "gpus_per_node": per_node, "device": device}, epochs=epochs,
                         calls=calls, max_staleness=staleness, with_ref=reference, old_logprobs="whole_batch",
                         # (dynamic batching and ring attention turn packing on: cli/train_ppo_ray.py:686-694)
                         rollout_server="vllm", padding_free=bool(s[PACKING]) or dynamic or ring > 1,
                         memory_fraction=s[MEMORY])
