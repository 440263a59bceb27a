"""Scenarios: a dataflow, the models its calls run, the cluster, batch and lengths.

File form (`realbench.scenario/1`):

    schema: realbench.scenario/1
    name: my-ppo
    algorithm: ppo
    cluster: {nodes: 2, gpus_per_node: 8, device: h100}     # or device: {name: ..., ...}
                                                             # memory_fraction: 0.9 (usable by plans)
                                                             # attention: flash (or materialized: priced
                                                             # as Megatron-LM's 2021 kernels)
    models:
      actor: llama-7b                                        # a preset ...
      critic: {arch: llama-7b, value_head: true}             # ... with overrides
      tiny: {name: t, n_layers: 2, hidden: 64, ...}          # ... or a full spec
      ref: {path: ckpt/}                                     # ... or a Hugging Face folder
      reward: {path: ckpt/, value_head: true}                # (a fresh value head on its decoder)
    dataflow: {algorithm: ppo, prompts: 512, prompt_len: 256, gen_len: 768}
    # or: dataflow: {calls: [{name: ..., model: ..., kind: ..., ...}], dataset_keys: [prompts]}
    training: {temperature: 1.0}                             # how the models train (realbench.plan.training)
"""

from __future__ import annotations

import difflib
import inspect
import math
from functools import cached_property
from typing import Any, Literal, Optional, Union

from pathlib import Path

from pydantic import ConfigDict, Field, ValidationInfo, field_validator, model_validator

from realbench.dataflow import ALGORITHMS, CallDef, CallKind, Dataflow, build_algorithm
from realbench.dataflow.lengths import parse_gen_len
from realbench.errors import ConfigError
from realbench.hardware import LINKS, ClusterSpec, get_device
from realbench.models import PRESETS, FunctionSpec, ModelSpec, get_model, unknown_model
from realbench.models.hf import CHECKPOINT_KEYS, spec_from_checkpoint_entry
from realbench.plan.data import DataSpec
from realbench.models.rewards import FUNCTION_KEYS, GIVEN, function_spec, load_function, missing_arguments
from realbench.plan.mesh import Option
from realbench.plan.options import enumerate_options
from realbench.schema import SCENARIO_SCHEMA, DerivedValues, read_document, refuse_unknown_keys, validate_model
from realbench.plan.training import TrainingSpec


class Scenario(DerivedValues):
    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str = Field(min_length=1)
    algorithm: str = "custom"
    description: str = ""
    cluster: ClusterSpec
    models: dict[str, Union[ModelSpec, FunctionSpec]] = Field(min_length=1)
    data: Optional[DataSpec] = None
    training: TrainingSpec = TrainingSpec()
    dataflow: Dataflow
    # the engine that runs this scenario (read from its configuration: realbench import): realbench
    # plans it and writes it back (export --format), its runtime does not run it, and a reward
    # function is the engine's, named, not called here
    engine: Optional[Literal["verl", "openrlhf", "areal"]] = None
    # the serving engine of that engine's rollout (verl's rollout.name, AReaL's rollout backend;
    # OpenRLHF's is vLLM): priced alike (continuous batching), written back as read; None: the
    # engine's default (verl vLLM, AReaL SGLang)
    rollout_server: Optional[Literal["vllm", "sglang"]] = None
    # that engine's settings the user set that change neither time nor memory of a step (names,
    # data files, the learning rate, the logger), flat dotted keys as the engine names them: read
    # from the imported configuration, priced by nothing, written back into the exported one
    # (realbench.engines.carried_settings)
    engine_settings: dict[str, Any] = {}
    # the search also offers data-parallel sharding (zero 1-3: realbench.cost.sharding), as the
    # engines train: plans to price and to compare with theirs, which realbench's runtime does not
    # run (`run` refuses them by name). `realbench search --zero`; realbench's own plans in
    # `bench engines`
    offer_zero: bool = False

    @model_validator(mode="before")
    @classmethod
    def _data(cls, v: Any, info: ValidationInfo) -> Any:
        """Read the data files once: the dataflow's lengths come from them (a percentile of the
        tokenized prompts, `max_new_tokens`), so the plan is costed for the job that will run."""
        if not isinstance(v, dict):
            return v
        # unknown keys first: reading the data needs the other sections (a misspelt `path` of the
        # actor's checkpoint would read as a missing tokenizer)
        refuse_unknown_keys(cls, v)
        for role, entry in v["models"].items() if isinstance(v.get("models"), dict) else ():
            try:
                _check_scorers(entry) if isinstance(entry, list) else check_entry(entry)
            except ConfigError as e:
                raise e.within(f"models.{role}") from None
        v = _max_new_tokens(v)
        if v.get("data") is None or isinstance(v["data"], DataSpec):
            return v
        base = Path((info.context or {}).get("base", "."))
        algorithm = v.get("algorithm") or (v.get("dataflow") or {}).get("algorithm")
        spec = read_data_section(v["data"], base, v.get("models"), algorithm)
        df = v.get("dataflow")
        if isinstance(df, dict) and "algorithm" in df:
            # a length distribution may be given (its cap is max_new_tokens); a number may not
            given = sorted({"prompt_len", "gen_len", "seq_len"} & {k for k in df if not isinstance(df[k], dict)})
            if given:
                raise ConfigError("comes from the data (data.prompt_percentile, data.max_new_tokens); remove it",
                                  f"dataflow.{given[0]}")
            if df["algorithm"] in ("ppo", "grpo", "rloo", "remax"):
                if not spec.max_new_tokens:
                    raise ConfigError("must be given: the generated tokens per response", "data.max_new_tokens")
                df = {**df, "prompt_len": spec.prompt_len, "gen_len": df.get("gen_len", spec.max_new_tokens)}
            else:
                df = {**df, "seq_len": spec.prompt_len + spec.completion_len}
        return {**v, "data": spec, "dataflow": df}

    @field_validator("cluster", mode="before")
    @classmethod
    def _cluster(cls, v: Any) -> Any:
        if isinstance(v, dict) and isinstance(v.get("device"), str):
            try:
                device = get_device(v["device"])
            except ConfigError as e:
                raise e.within("device") from None
            v = {**LINKS.get(v["device"], {}), **v, "device": device}
        return v

    @field_validator("models", mode="before")
    @classmethod
    def _models(cls, v: Any, info: ValidationInfo) -> Any:
        if not isinstance(v, dict):
            return v
        out = {}
        base = Path((info.context or {}).get("base", "."))
        for role, spec in v.items():
            try:
                if isinstance(spec, list):  # a reward model and functions: [model, {function: ...}, ...]
                    out.update(_scorers(role, spec, base))
                    continue
                out[role] = _model_entry(spec, base, role)
            except ConfigError as e:
                raise e.within(str(role)) from None
        return out

    @field_validator("dataflow", mode="before")
    @classmethod
    def _dataflow(cls, v: Any, info: ValidationInfo) -> Any:
        if isinstance(v, dict) and v.get("algorithm") in ALGORITHMS:  # an algorithm's builder and its arguments
            refuse_unknown_keys(algorithm_keys(v["algorithm"]), v)
        elif isinstance(v, dict) and "algorithm" not in v:  # the calls themselves (Dataflow, CallDef)
            refuse_unknown_keys(Dataflow, v, also=("algorithm",))
        lengths = None
        if isinstance(v, dict) and isinstance(v.get("gen_len"), dict):  # response lengths as a distribution
            data = info.data.get("data")
            cap = data.max_new_tokens if isinstance(data, DataSpec) else None
            try:
                gen_len, lengths = parse_gen_len(v["gen_len"], cap, Path((info.context or {}).get("base", ".")))
            except ConfigError as e:
                raise e.within("gen_len") from None
            v = {**v, "gen_len": gen_len}
        staleness = None
        if isinstance(v, dict) and "algorithm" in v:
            args = {k: x for k, x in v.items()
                    if k not in ("algorithm", "max_staleness", "sync_every", "memory_fraction", "max_model_len")}
            staleness = v.get("max_staleness")
            sync_every = v.get("sync_every")
            fraction = v.get("memory_fraction")
            context = v.get("max_model_len")
            if context is not None and (not isinstance(context, int) or isinstance(context, bool) or context < 1):
                raise ConfigError(f"{context!r}: the context a request to the rollout's vLLM server may take "
                                  "must be a whole number of tokens", "max_model_len")
            if fraction is not None and (not isinstance(fraction, (int, float)) or isinstance(fraction, bool)
                                         or not 0 < fraction <= 1):
                raise ConfigError(f"{fraction!r}: the share of each GPU's memory the rollout's serving engine takes "
                                  "must be a number in (0, 1]", "memory_fraction")
            if sync_every is not None and (not isinstance(sync_every, int) or isinstance(sync_every, bool)
                                           or sync_every < 1):
                raise ConfigError(f"{sync_every!r}: the decode steps between the host's reads of which rows ended "
                                  "must be a whole number, at least 1", "sync_every")
            if v["algorithm"] not in ALGORITHMS:
                raise ConfigError(f"unknown algorithm {v['algorithm']!r} (known: {', '.join(ALGORITHMS)})",
                                  "algorithm")
            v = build_algorithm(v["algorithm"], **args)
            if staleness is not None:
                v = {**v.model_dump(), "max_staleness": staleness}
            generation = {k: x for k, x in (("sync_every", sync_every), ("memory_fraction", fraction),
                                            ("max_model_len", context)) if x is not None}
            if generation:
                v = validate_model(Dataflow, v) if isinstance(v, dict) else v
                v = v.with_calls([c.model_copy(update=generation) if c.kind == CallKind.GENERATE else c
                                  for c in v.calls])
        if lengths is not None:
            v = validate_model(Dataflow, v) if isinstance(v, dict) else v
            for c in [c for c in v.calls if c.kind == CallKind.GENERATE]:
                v = v.with_lengths(c.name, lengths)
        models = info.data.get("models") or {}
        v = _reference_from_base(v, models)
        functions = {r for r, m in models.items() if isinstance(m, FunctionSpec)}
        beside = {r for r in models if FUNCTIONS_OF.format(r) in functions}  # reward models with functions
        data = info.data.get("data")
        training = info.data.get("training")
        own = data.tokenizers if isinstance(data, DataSpec) else {}
        iterations = training.num_iterations if isinstance(training, TrainingSpec) else 1
        old_logprobs = training.old_logprobs if isinstance(training, TrainingSpec) else "later_steps"
        padding_free = isinstance(training, TrainingSpec) and training.padding_free
        padded = training.padded_models if padding_free else ()
        logits = training.logits if isinstance(training, TrainingSpec) else {}
        if functions or own or iterations > 1 or old_logprobs != "later_steps" or padding_free or logits:
            v = validate_model(Dataflow, v) if isinstance(v, dict) else v
            calls = []
            for c in v.calls:
                c = _adapted(c, functions - {FUNCTIONS_OF.format(r) for r in beside}, data)
                if c.kind == CallKind.TRAIN and iterations > 1:
                    c = c.model_copy(update={"iterations": iterations})
                if _takes_old_logprobs(c) and old_logprobs != "later_steps":  # (as iterations: the section's wins)
                    c = c.model_copy(update={"old_logprobs": old_logprobs})
                if padding_free and _packs_rows(c):  # (a document's calls may say otherwise: the section wins)
                    c = c.model_copy(update={"padding_free": c.model not in padded})
                if c.name in logits:
                    c = _with_logits(c, logits[c.name], models)
                if c.model in beside and c.kind == CallKind.INFERENCE and set(c.outputs) <= SCORES:
                    # the model's score goes to the functions' call, which adds theirs (weighted)
                    calls.append(c.model_copy(update={"outputs": tuple(f"model_{k}" for k in c.outputs)}))
                    c = c.model_copy(update={"lengths": None})
                    c = CallDef(name=f"{c.name}_functions", model=FUNCTIONS_OF.format(c.model), kind=CallKind.FUNCTION,
                                inputs=(c.inputs[0], *(f"model_{k}" for k in c.outputs)), outputs=c.outputs,
                                seqs=c.seqs, seq_len=c.seq_len)
                calls.append(c)
            v = v.with_calls(calls)
        return v

    @model_validator(mode="after")
    def _check(self) -> "Scenario":
        if self.rollout_server and not self.engine:
            raise ConfigError("the serving engine of an engine's rollout: a scenario of realbench's own runtime "
                              "generates with its own engine (leave it out, or give engine:)", "rollout_server")
        served = [c.name for c in self.dataflow.calls if c.memory_fraction is not None]
        if served and not self.engine:
            raise ConfigError(f"the share of each GPU's memory an engine's serving engine takes (call {served[0]!r}): "
                              "realbench's runtime keeps a cache for every decode slot (leave it out, or give engine:)",
                              "dataflow.memory_fraction")
        if self.training.padding_free and not self.engine:
            raise ConfigError("realbench's runtime pads a micro-batch to its longest row: rows packed without "
                              "padding are an engine's (give engine:, or leave it out)", "training.padding_free")
        if self.training.logits and not self.engine:
            raise ConfigError("how an engine computes the log-probabilities: a scenario of realbench's own runtime "
                              "has its own (leave them out, or give engine:)", "training.logits")
        calls = [c.name for c in self.dataflow.calls]
        for name in self.training.logits:
            if name not in calls:
                raise ConfigError(f"{name!r} is not a call of the dataflow ({', '.join(calls)})", "training.logits")
        for model in self.training.padded_models:
            if model not in self.models:
                raise ConfigError(f"{model!r} is not a model of the scenario ({', '.join(self.models)})",
                                  "training.padded_models")
        if self.engine_settings and not self.engine:
            raise ConfigError("an engine's own settings: a scenario of realbench's own runtime has none (leave "
                              "them out, or give engine:)", "engine_settings")
        # (which keys an engine's settings may hold is the engine module's: realbench.engines.refuse_uncarried,
        # called where they are read: validate, export, search --engine)
        for i, c in enumerate(self.dataflow.calls):
            if c.model not in self.models:
                raise ConfigError(f"call {c.name!r} runs unknown model {c.model!r} "
                                  f"(models: {', '.join(self.models)})", f"dataflow.calls.{i}.model")
            function = isinstance(self.models[c.model], FunctionSpec)
            if function != (c.kind == CallKind.FUNCTION):
                raise ConfigError(f"call {c.name!r} is a {c.kind.value} call of "
                                  f"{'function' if function else 'model'} {c.model!r}: a function only scores "
                                  "(kind: function), a model does not", f"dataflow.calls.{i}.kind")
            if function and self.engine:
                continue
            if function and self.data is None:
                raise ConfigError("a reward function scores text: the scenario needs data files (data:) and a "
                                  "tokenizer", f"models.{c.model}")
            if function:
                for f in self.models[c.model].functions:
                    missing = missing_arguments(load_function(*FunctionSpec.parts(f)), list(self.data.columns))
                    if missing:
                        raise ConfigError(f"{FunctionSpec.short(f)} takes {missing[0]!r}, which no call gives (given: "
                                          f"{', '.join(GIVEN)} and the data's columns "
                                          f"{', '.join(self.data.columns)})", f"models.{c.model}")
        trained = set(self.dataflow.trained_models)
        functions = [m for m in self.models.values() if isinstance(m, FunctionSpec)]
        scorers = functions[0].scorers if functions else int(any(set(c.outputs) & SCORES for c in self.dataflow.calls))
        self.training.check(self.algorithm, trained, scorers)
        if self.training.beta and self.algorithm in ("ppo", "grpo", "rloo", "remax") and not any(
                "ref_logprobs" in c.outputs for c in self.dataflow.calls):
            raise ConfigError(f"{self.training.beta}: a KL penalty to the reference, and the dataflow has none "
                              "(dataflow.with_ref: false): set beta: 0 or keep the reference", "training.beta")
        if self.training.behav_imp_weight_cap is not None and not self.dataflow.max_staleness:
            raise ConfigError("a setting of asynchronous RL (the decoupled objective); this dataflow is synchronous "
                              "(dataflow.max_staleness: 0)", "training.behav_imp_weight_cap")
        for i, c in enumerate(self.dataflow.calls):
            if not c.adapters and getattr(self.models[c.model], "lora", None) is None:
                raise ConfigError(f"model {c.model!r} has no LoRA adapters to switch off", f"dataflow.calls.{i}.adapters")
        for role, m in self.models.items():
            if isinstance(m, ModelSpec) and m.lora is not None and role not in trained:
                raise ConfigError(f"LoRA adapters train, and no call trains {role!r} (trained: "
                                  f"{', '.join(sorted(trained)) or 'none'})", f"models.{role}.lora")
        prompt = min((c.seq_len - c.gen_len for c in self.dataflow.calls if c.kind == CallKind.GENERATE), default=None)
        for role, m in self.models.items():
            vision = getattr(m, "vision", None)
            if vision is not None and vision.image_tokens is None:
                raise ConfigError(f"{m.name} is a vision-language model: say how many image tokens a prompt holds "
                                  f"(the images' share of its tokens; 0: prompts without images)",
                                  f"models.{role}.{IMAGE_TOKENS}")
            if vision is not None and prompt is not None and vision.image_tokens > prompt:
                raise ConfigError(f"{vision.image_tokens} image tokens do not fit a prompt of {prompt} tokens (the "
                                  "prompt holds them)", f"models.{role}.{IMAGE_TOKENS}")
        used = set(self.dataflow.models)
        for role in self.models:
            if role not in used:
                raise ConfigError(f"model {role!r} is used by no call", f"models.{role}")
        if self.data is not None:
            for role, m in self.models.items():
                if isinstance(m, ModelSpec) and m.vocab < self.data.vocab and role not in self.data.tokenizers:
                    raise ConfigError(f"the tokenizer has {self.data.vocab} tokens, the model's vocabulary "
                                      f"{m.vocab}: they do not match", f"models.{role}")
        return self

    # -- derived --------------------------------------------------------------------------------
    def model_of(self, call: CallDef | str) -> ModelSpec:
        c = self.dataflow.call(call) if isinstance(call, str) else call
        return self.models[c.model]

    @cached_property
    def options(self) -> dict[str, list[Option]]:
        """Feasible options per call (shape rules only; memory is the cost model's business)."""
        return {c.name: enumerate_options(c, self.models[c.model], self.cluster, self.offer_zero)
                for c in self.dataflow.calls}

    @property
    def plan_space_size(self) -> int:
        return math.prod(len(o) for o in self.options.values())

    def with_lengths(self, lengths: dict) -> "Scenario":
        """The scenario with these generation calls' response lengths ({call: LengthDistribution}),
        and their sequences' in the calls that process them (`Dataflow.with_lengths`)."""
        flow = self.dataflow
        for name, dist in lengths.items():
            flow = flow.with_lengths(name, dist)
        return self.model_copy(update={"dataflow": flow})

    def with_device(self, device, links: dict) -> "Scenario":
        """The scenario on another device (a DeviceSpec) with these links (ClusterSpec's fields):
        `estimate --device`, `search --device`, a calibrated device file."""
        cluster = validate_model(ClusterSpec, {**self.cluster.model_dump(), **links, "device": device.model_dump()})
        copy = self.model_copy(update={"cluster": cluster})
        copy.__dict__.pop("options", None)  # (option sets hold the cluster)
        return copy

    def with_zero(self, offer: bool = True) -> "Scenario":
        """The scenario whose search offers data-parallel sharding (`offer_zero`)."""
        copy = self.model_copy(update={"offer_zero": offer})
        copy.__dict__.pop("options", None)  # (the cached option sets are the search's space)
        return copy

    def with_staleness(self, max_staleness: int) -> "Scenario":
        """The scenario planned for asynchronous RL with this bound (0: synchronous)."""
        flow = validate_model(Dataflow, {**self.dataflow.model_dump(), "max_staleness": max_staleness})
        return self.model_copy(update={"dataflow": flow})

    def with_old_logprobs(self, mode: str) -> "Scenario":
        """The scenario with its policy's old log-probabilities taken as `mode`
        (training.old_logprobs: realbench.dataflow.core.OldLogprobs)."""
        training = self.training.model_copy(update={"old_logprobs": mode})
        flow = self.dataflow.with_calls([c.model_copy(update={"old_logprobs": mode}) if _takes_old_logprobs(c) else c
                                         for c in self.dataflow.calls])
        return self.model_copy(update={"training": training, "dataflow": flow})

    def with_padding_free(self, packed: bool) -> "Scenario":
        """The scenario whose scoring and training calls pack their rows without padding, or not
        (training.padding_free), every model's alike (no padded_models)."""
        training = self.training.model_copy(update={"padding_free": packed, "padded_models": ()})
        flow = self.dataflow.with_calls([c.model_copy(update={"padding_free": packed}) if _packs_rows(c) else c
                                         for c in self.dataflow.calls])
        copy = self.model_copy(update={"training": training, "dataflow": flow})
        copy.__dict__.pop("options", None)  # (option sets hold the calls)
        return copy

    def without_logits(self) -> "Scenario":
        """The scenario whose calls compute their log-probabilities as realbench prices by default
        (no training.logits: another engine's way of computing them)."""
        if not self.training.logits:
            return self
        training = self.training.model_copy(update={"logits": {}})
        flow = self.dataflow.with_calls([c.model_copy(update={"logits": None}) for c in self.dataflow.calls])
        copy = self.model_copy(update={"training": training, "dataflow": flow})
        copy.__dict__.pop("options", None)  # (option sets hold the calls)
        return copy

    def with_memory_fraction(self, fraction: Optional[float]) -> "Scenario":
        """The scenario whose generation calls' serving engine takes `fraction` of each GPU's memory
        (CallDef.memory_fraction; None: realbench's rollout, which has no max_model_len either)."""
        update = {"memory_fraction": fraction} if fraction is not None else {"memory_fraction": None, "max_model_len": None}
        flow = self.dataflow.with_calls([c.model_copy(update=update)
                                         if c.kind == CallKind.GENERATE else c for c in self.dataflow.calls])
        copy = self.model_copy(update={"dataflow": flow})
        copy.__dict__.pop("options", None)  # (option sets hold the calls)
        return copy

    def to_document(self) -> dict:
        return {"schema": SCENARIO_SCHEMA, **self.model_dump(mode="json", exclude_none=True)}

    def summary(self) -> dict:
        return {"name": self.name, "algorithm": self.algorithm,
                "models": {r: m.name + (" (reward function)" if isinstance(m, FunctionSpec) else
                                        " (value head)" if m.value_head else
                                        f" ({m.vision.image_tokens} image tokens a prompt)" if m.vision else "")
                           for r, m in self.models.items()},
                "gpus": self.cluster.n_devices, "nodes": self.cluster.nodes,
                "device": self.cluster.device.name, "calls": list(self.dataflow.call_names),
                "plan_space": self.plan_space_size,
                "plan_space_log10": round(math.log10(self.plan_space_size), 2),
                "description": self.description}


SCORES = frozenset({"rewards", "greedy_rewards"})  # what a reward model's calls output
FUNCTIONS_OF = "{}_functions"  # the role of the functions that score beside a reward model
POLICY, REFERENCE = "actor", "ref"  # the roles of the built-in algorithms' policy and reference


def _max_new_tokens(v: dict) -> dict:
    """`training.max_new_tokens` (TRL's max_completion_length) is the generated length: the data's
    `max_new_tokens`, or the dataflow's `gen_len` without data. Given in both places, they agree."""
    training = v.get("training")
    cap = training.get("max_new_tokens") if isinstance(training, dict) else None
    if cap is None:
        return v
    data, df = v.get("data"), v.get("dataflow")
    if isinstance(data, dict):
        if data.get("max_new_tokens") not in (None, cap):
            raise ConfigError(f"{data['max_new_tokens']} here, {cap} in training.max_new_tokens: give one",
                              "data.max_new_tokens")
        return {**v, "data": {**data, "max_new_tokens": cap}}
    if isinstance(df, dict) and "algorithm" in df:
        if isinstance(df.get("gen_len"), dict):  # a distribution: training.max_new_tokens is its cap
            given = df["gen_len"].get("max", cap)
            if given != cap:
                raise ConfigError(f"{given} here, {cap} in training.max_new_tokens: give one", "dataflow.gen_len.max")
            return {**v, "dataflow": {**df, "gen_len": {**df["gen_len"], "max": cap}}}
        if df.get("gen_len") not in (None, cap):
            raise ConfigError(f"{df['gen_len']} here, {cap} in training.max_new_tokens: give one", "dataflow.gen_len")
        return {**v, "dataflow": {**df, "gen_len": cap}}
    return v


def algorithm_keys(algorithm: str) -> tuple[str, ...]:
    """The keys of `dataflow: {algorithm: NAME, ...}`: the builder's arguments, max_staleness and
    the generation calls' sync_every, memory_fraction and max_model_len."""
    return ("algorithm", *inspect.signature(ALGORITHMS[algorithm]).parameters, "max_staleness", "sync_every",
            "memory_fraction", "max_model_len")


# The forms of a `models:` entry that is a mapping, by the key that marks each, and their keys.
ENTRY_FORMS = {
    "path": (*CHECKPOINT_KEYS, "expert_imbalance", "image_tokens"),  # a checkpoint folder, config, hub id, catalogue entry
    "function": FUNCTION_KEYS,  # reward functions
    "arch": ("arch", *ModelSpec.model_fields, "expert_imbalance", "image_tokens"),  # a preset or catalogue entry changed
    "name": tuple(ModelSpec.model_fields),  # a full spec (as a scenario written out holds it)
    "functions": (*FunctionSpec.model_fields, "function"),  # functions, as a scenario written out holds them
}
_SPEC_ONLY = set(ModelSpec.model_fields) - set(CHECKPOINT_KEYS)


def _entry_form(spec: dict) -> str:
    """Which form of ENTRY_FORMS a mapping of `models:` is: by its marking key, else (a mapping
    with none, such as a misspelt `path`) by the marking key closest to one of its keys."""
    if "path" in spec and not set(spec) & _SPEC_ONLY:
        return "path"
    if "function" in spec and "name" not in spec:
        return "function"
    if "arch" in spec:
        return "arch"
    if "functions" in spec or "function" in spec:
        return "functions"
    known = {k for keys in ENTRY_FORMS.values() for k in keys}
    for key in spec:
        close = difflib.get_close_matches(str(key), list(ENTRY_FORMS), n=1, cutoff=0.6) if key not in known else ()
        if close:
            return close[0]
    return "name"


def check_entry(spec: Any) -> None:
    """A `models:` entry is a preset name or a mapping of one of ENTRY_FORMS (`_entry_form`), with
    only that form's keys: refuse one it does not have, with the closest one it has. (Checked
    before the data is read, which needs the actor's checkpoint folder.)"""
    if isinstance(spec, (str, ModelSpec, FunctionSpec)):  # a preset name, or a spec from the Python API
        return
    if not isinstance(spec, dict):
        shown = repr(spec)
        raise ConfigError(f"a model's name (a preset, a catalogue entry or a hub id: realbench models lists them) or a "
                          f"mapping ({{path: DIR}}, {{arch: NAME, ...}}, {{function: FILE.py:NAME}} or a full spec), "
                          f"not {shown[:60] + '...' if len(shown) > 60 else shown}")
    refuse_unknown_keys(ENTRY_FORMS[_entry_form(spec)], spec)


def _check_scorers(entries: list) -> None:
    """A list of scorers holds mappings, each of a form of `models:` (`check_entry`)."""
    if not entries or not all(isinstance(e, dict) for e in entries):
        raise ConfigError("a list of scorers holds mappings: a reward model first (optional), then "
                          "{function: ...} entries")
    for i, e in enumerate(entries):
        try:
            check_entry(e)
        except ConfigError as err:
            raise err.within(str(i)) from None


def _model_entry(spec: Any, base: Path, role: str) -> Any:
    """One `models:` entry: a preset name, a checkpoint folder, functions, a preset changed, or a
    full spec."""
    check_entry(spec)
    if isinstance(spec, str):
        return named_model(spec, base)
    if isinstance(spec, (ModelSpec, FunctionSpec)):
        return spec
    form = _entry_form(spec)
    if form == "path":
        return with_workload(spec_from_checkpoint_entry({k: x for k, x in spec.items() if k not in WORKLOAD}, base),
                             spec)
    if form == "function":
        return function_spec(spec, base, role)
    if form == "arch":
        if not isinstance(spec["arch"], str):
            raise ConfigError("must be a model's name: a preset or a catalogue entry (realbench models lists them)",
                              "arch")
        named = named_model(spec["arch"], base)
        rest = {k: x for k, x in spec.items() if k != "arch" and k not in WORKLOAD}
        # (a value head on a model whose head is tied to its embedding: a head of its own)
        base_fields = (named.with_value_head() if rest.get("value_head") is True else named).model_dump()
        if {"hidden", "n_heads"} & set(rest) and "head_dim" not in rest and named.head_dim * named.n_heads == named.hidden:
            base_fields.pop("head_dim")  # derived from the shapes given, as it was from the named ones
        return with_workload(validate_model(ModelSpec, {**base_fields, **rest}), spec)
    return validate_model(FunctionSpec if form == "functions" else ModelSpec, spec)


# a model entry's settings of the job's data beside the checkpoint: how unevenly its router spreads
# the tokens (MoESpec.imbalance), the image tokens a prompt holds (VisionSpec.image_tokens)
IMBALANCE, IMAGE_TOKENS = "expert_imbalance", "image_tokens"
WORKLOAD = (IMBALANCE, IMAGE_TOKENS)


def with_workload(spec: ModelSpec, entry: dict) -> ModelSpec:
    """`spec` with the workload settings a `models:` entry gives (WORKLOAD)."""
    return with_image_tokens(with_expert_imbalance(spec, entry.get(IMBALANCE)), entry.get(IMAGE_TOKENS))


def with_image_tokens(spec: ModelSpec, tokens: Any) -> ModelSpec:
    """`spec` with the image tokens a prompt holds (None: as it is), refused where it has no vision
    tower or the value is not a whole number of tokens."""
    if tokens is None:
        return spec
    if spec.vision is None:
        raise ConfigError(f"{spec.name} is a language model: it has no vision tower to take images", IMAGE_TOKENS)
    if isinstance(tokens, bool) or not isinstance(tokens, int) or tokens < 0:
        raise ConfigError(f"{tokens!r}: the language-model tokens a prompt's images take, a whole number (0: prompts "
                          "without images)", IMAGE_TOKENS)
    return spec.model_copy(update={"vision": spec.vision.model_copy(update={"image_tokens": tokens})})


def with_expert_imbalance(spec: ModelSpec, imbalance: Any) -> ModelSpec:
    """`spec` with its experts' load imbalance set (None: as it is), refused where it has no experts
    or the value is not a ratio of at least 1."""
    if imbalance is None:
        return spec
    if spec.moe is None:
        raise ConfigError(f"{spec.name} is dense: it has no experts to spread tokens over", IMBALANCE)
    if isinstance(imbalance, bool) or not isinstance(imbalance, (int, float)) or not imbalance >= 1:
        raise ConfigError(f"{imbalance!r}: the busiest expert-parallel device's tokens over the mean, at least 1",
                          IMBALANCE)
    return spec.model_copy(update={"moe": spec.moe.model_copy(update={"imbalance": float(imbalance)})})


def named_model(name: str, base: Path = Path(".")) -> ModelSpec:
    """A model named by a string: a preset (llama-7b, llama-tiny, ...), a catalogue entry (qwen3-8b) or
    what `{path: NAME}` reads (a folder, a config.json file, a hub id in the local cache)."""
    if name in PRESETS:
        return get_model(name)
    try:
        return spec_from_checkpoint_entry({"path": name}, base)
    except ConfigError as e:
        if "/" in name or (base / name).exists() or e.field:
            raise
        raise unknown_model(name) from None


def _scorers(role: str, entries: list, base: Path) -> dict:
    """`reward: [{path: RM}, {function: ...}, ...]`: the reward model under `role` (first, if
    any) and every function, in order, under `<role>_functions`, which adds the model's score."""
    _check_scorers(entries)
    functions = [e for e in entries if "function" in e]
    models = [e for e in entries if "function" not in e]
    if len(models) > 1 or (models and entries[0] is not models[0]):
        raise ConfigError("a list of scorers holds at most one reward model, first, then functions")
    if not functions:
        raise ConfigError("a list of scorers needs {function: ...} entries (a model alone is not a list)")
    seconds = {e["seconds_per_sample"] for e in functions if "seconds_per_sample" in e}
    if len(seconds) > 1:
        raise ConfigError("give the functions one seconds_per_sample", "seconds_per_sample")
    merged = {"function": [f for e in functions for f in (e["function"] if isinstance(e["function"], list)
                                                           else [e["function"]])],
              **({"seconds_per_sample": seconds.pop()} if seconds else {})}
    if not models:
        return {role: function_spec(merged, base, role)}
    try:
        model = _model_entry(models[0], base, role)
    except ConfigError as e:
        raise e.within("0") from None
    return {role: model, FUNCTIONS_OF.format(role): function_spec(merged, base, role, model_score=True)}


def _with_logits(call: CallDef, path: Any, models: dict) -> CallDef:
    """`call` with the engine's way of computing its log-probabilities (training.logits)."""
    where = f"training.logits.{call.name}"
    if call.kind not in (CallKind.INFERENCE, CallKind.TRAIN):
        raise ConfigError(f"a {call.kind.value} call computes no log-probabilities", where)
    model = models.get(call.model)
    if isinstance(model, FunctionSpec) or getattr(model, "value_head", False):
        raise ConfigError(f"{call.model!r} has a value head, no logits over a vocabulary", where)
    if (call.kind == CallKind.TRAIN) != (path.train_bytes is not None):
        raise ConfigError(f"give train_bytes for a train call's passes, and only for them (this is a "
                          f"{call.kind.value} call)", where)
    return call.model_copy(update={"logits": path})


def _reference_from_base(df: Any, models: dict) -> Any:
    """With a policy trained with LoRA and no reference model given, the reference is the
    policy's base: its calls run the policy with the adapters switched off (TRL and verl do the
    same), so no reference weights are loaded or placed. A reference named in `models` is used."""
    policy = models.get(POLICY)
    if REFERENCE in models or not isinstance(policy, ModelSpec) or policy.lora is None or not df:
        return df
    df = validate_model(Dataflow, df) if isinstance(df, dict) else df
    if not any(c.model == REFERENCE for c in df.calls):
        return df
    return df.with_calls([c.model_copy(update={"model": POLICY, "adapters": False}) if c.model == REFERENCE else c
                          for c in df.calls])


def _adapted(c: CallDef, functions: set[str], data: Optional[DataSpec]) -> CallDef:
    """A call as the models make it run: a function's inference is a function call; a reward
    model with a tokenizer other than the data's scores re-tokenized text, whose width the
    data gave (`DataSpec.rescored_len`). Any other call of such a model needs the policy's
    tokens (per-token log-probabilities, values): refused by name."""
    if c.model in functions and c.kind == CallKind.INFERENCE:
        return c.model_copy(update={"kind": CallKind.FUNCTION, "lengths": None})
    if data is not None and c.model in data.tokenizers:
        if c.kind != CallKind.INFERENCE or not set(c.outputs) <= SCORES or c.model not in data.rescored_len:
            raise ConfigError(f"its tokenizer ({data.tokenizers[c.model]}) is not the data's: a reward model can score "
                              f"re-tokenized text, but call {c.name!r} needs the policy's own tokens; give it a "
                              "checkpoint with the policy's tokenizer", f"models.{c.model}")
        # re-tokenized text, padded to the data's width for it (its own length distribution unknown)
        return c.model_copy(update={"seq_len": data.rescored_len[c.model], "lengths": None})
    return c


def read_data_section(raw: Any, base: Path, models: Any, algorithm: Any) -> DataSpec:
    """The `data:` section, its paths resolved against `base`, with what reading the files and
    tokenizing them found (rows, widths, truncated rows, tokenizer size)."""
    from realbench.plan.datafiles import Dataset, has_tokenizer, load_tokenizer, prompt_text, same_tokenizer

    if not isinstance(raw, dict):
        raise ConfigError("must be a mapping (train: FILE, fields: {...}, ...)", "data")

    def resolve(p):
        return str((base / Path(p).expanduser()).resolve()) if isinstance(p, str) else p

    raw = dict(raw)
    for key in ("train", "eval"):
        if isinstance(raw.get(key), (list, tuple)):
            raw[key] = [resolve(p) for p in raw[key]]
        elif key in raw:
            raw[key] = resolve(raw[key])
    if raw.get("tokenizer") is not None:
        raw["tokenizer"] = resolve(raw["tokenizer"])
    else:  # the actor's checkpoint folder
        actor = (models or {}).get("actor") if isinstance(models, dict) else None
        if isinstance(actor, dict) and isinstance(actor.get("path"), str):
            raw["tokenizer"] = resolve(actor["path"])
        elif isinstance(actor, ModelSpec) and actor.path:
            raw["tokenizer"] = actor.path
        else:
            raise ConfigError("data needs a tokenizer: give the actor a checkpoint folder ({path: DIR}) or "
                              "data.tokenizer", "data.tokenizer")
    try:
        spec = validate_model(DataSpec, raw)
    except ConfigError as e:
        raise e.within("data") from None
    if spec.rows:  # read before (a scenario written out by realbench)
        return spec
    ds = Dataset(spec, algorithm if isinstance(algorithm, str) else "", spec.tokenizer)
    prompt, completion, truncated = ds.widths()
    tokenizers, rescored = {}, {}
    for role, entry in (models or {}).items() if isinstance(models, dict) else ():
        if isinstance(entry, list) and entry:  # a reward model (first) and functions
            entry = entry[0]
        folder = resolve(entry["path"]) if isinstance(entry, dict) and isinstance(entry.get("path"), str) else None
        if folder is None or folder == spec.tokenizer or not has_tokenizer(folder):
            continue
        theirs = load_tokenizer(folder)
        texts = [prompt_text(r[spec.column(f)]) for r in ds.rows[:8] for f in ds.fields if spec.column(f) in r]
        if not same_tokenizer(ds.tokenizer, theirs, texts):
            tokenizers[role] = folder
            if "prompt" in ds.fields:
                rescored[role] = ds.rescored_width(theirs, spec.max_new_tokens)
    return spec.model_copy(update=dict(rows=len(ds.train), prompt_len=prompt, completion_len=completion,
                                       truncated=truncated, vocab=len(ds.tokenizer), tokenizers=tokenizers,
                                       rescored_len=rescored, columns=tuple(dict.fromkeys(k for r in ds.rows for k in r))))


def _packs_rows(c: CallDef) -> bool:
    """A call whose rows training.padding_free packs: a scoring or training call (generation
    decodes its rows; a function scores text)."""
    return c.kind in (CallKind.TRAIN, CallKind.INFERENCE)


def _takes_old_logprobs(c: CallDef) -> bool:
    """A train call that reads log-probabilities: a policy's (a value model's, PPO's critic, reads
    them for its rewards and ignores the setting)."""
    return c.kind == CallKind.TRAIN and "logprobs" in c.inputs


def scenario_from_document(data: dict, source: str = "") -> Scenario:
    """A scenario from a parsed file; paths in it (checkpoint folders, data files) are relative to
    the file's folder (`source`), or to the working folder when there is no file."""
    body = {k: v for k, v in data.items() if k != "schema"}
    if data.get("schema", SCENARIO_SCHEMA) != SCENARIO_SCHEMA:
        raise ConfigError(f"expected schema {SCENARIO_SCHEMA}, got {data.get('schema')!r}", "schema", source)
    base = Path(source).parent if source else Path(".")
    try:
        return validate_model(Scenario, body, context={"base": str(base)})
    except ConfigError as e:
        raise e.in_file(source) from None


def load_scenario(name_or_path: str) -> Scenario:
    """A built-in scenario by name, or a scenario file."""
    from realbench.plan.builtin import BUILTIN, get_builtin

    if name_or_path in BUILTIN:
        return get_builtin(name_or_path)
    if not any(name_or_path.endswith(s) for s in (".yaml", ".yml", ".json")):
        raise ConfigError(f"unknown scenario {name_or_path!r}: not a built-in name (see `realbench scenarios`) "
                          "nor a .yaml/.json file")
    return scenario_from_document(read_document(name_or_path), name_or_path)
