"""The `training:` section of a scenario: how the models train, with TRL's names and defaults.

    training:
      learning_rate: 1.0e-6          # every trained model's optimizer (AdamW) ...
      lr_scheduler_type: linear      # constant | constant_with_warmup | linear | cosine (transformers')
      max_grad_norm: 1.0
      critic: {learning_rate: 5.0e-6}  # ... and a trained model's own values, by its role
      beta: 0.0                      # the KL coefficient (DPO: its beta)
      epsilon: 0.2                   # the ratio's clip range; epsilon_high its upper side (DAPO)
      loss_type: dapo                # grpo | dr_grpo | dapo | bnpo; RLOO: rloo (TRL's RLOOTrainer)
      temperature: 1.0               # sampling; top_p, top_k, max_new_tokens

Defaults are TRL's (GRPOConfig, RLOOConfig, DPOConfig and transformers' TrainingArguments;
where they depend on the algorithm, `beta` and `loss_type`, they are listed in `DEFAULTS`), except
PPO's `num_iterations` and `temperature`, which are every algorithm's 1 and 1.0 where TRL's
PPOConfig has num_ppo_epochs 4 and temperature 0.7 (the README's settings table says where
realbench follows TRL and where not). Every setting is used by some algorithms only (`USED_BY`): one set to another value
than its default for an algorithm that would ignore it is refused by name, as is an unknown key
(with the closest valid one).
"""

from __future__ import annotations

import math
from typing import Any, Literal, Optional, get_args, get_origin

from pydantic import BaseModel, ConfigDict, Field, model_validator

from realbench.dataflow.core import LogitsPath, OldLogprobs
from realbench.errors import ConfigError
from realbench.schema import refuse_unknown_keys

GENERATION = ("ppo", "grpo", "rloo", "remax")  # algorithms that sample responses
POLICY_GRADIENT = GENERATION


class OptimizerSettings(BaseModel):
    """A trained model's optimizer: AdamW with decoupled weight decay (not on norms, biases or
    the embedding unless `weight_decay_embeddings`), the global gradient norm clipped to
    `max_grad_norm` (0: no clipping), and the learning rate scheduled over the run's optimizer
    updates: linear warm-up over `warmup_steps` (or `warmup_ratio` of them), then constant
    (constant_with_warmup), linear to 0 or a half cosine to 0; `constant` has no warm-up
    (transformers' schedules of those names: a warm-up given with `constant`, which transformers
    would ignore, is refused)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    learning_rate: float = Field(default=1e-6, gt=0)
    lr_scheduler_type: Literal["constant", "constant_with_warmup", "linear", "cosine"] = "linear"
    warmup_steps: int = Field(default=0, ge=0)
    warmup_ratio: float = Field(default=0.0, ge=0, lt=1)
    weight_decay: float = Field(default=0.0, ge=0)
    weight_decay_embeddings: bool = False
    adam_beta1: float = Field(default=0.9, ge=0, lt=1)
    adam_beta2: float = Field(default=0.999, ge=0, lt=1)
    adam_epsilon: float = Field(default=1e-8, gt=0)
    max_grad_norm: float = Field(default=1.0, ge=0)

    @model_validator(mode="before")
    @classmethod
    def _known(cls, v: Any) -> Any:
        refuse_unknown_keys(cls, v)
        _check_warmup(v)
        return v

    def warmup(self, total_updates: int) -> int:
        if self.lr_scheduler_type == "constant":
            return 0
        return self.warmup_steps or math.ceil(self.warmup_ratio * total_updates)

    @property
    def needs_total_updates(self) -> bool:
        """Whether the rate depends on the run's length (a decay, or a warm-up given as a ratio)."""
        return self.lr_scheduler_type in ("linear", "cosine") or bool(self.warmup_ratio)

    def learning_rate_at(self, update: int, total_updates: int) -> float:
        """The learning rate of optimizer update `update` (0-based) of `total_updates`, as
        transformers' get_scheduler computes it."""
        warm = self.warmup(total_updates)
        if update < warm:
            return self.learning_rate * update / max(1, warm)
        if self.lr_scheduler_type in ("constant", "constant_with_warmup"):
            return self.learning_rate
        progress = (update - warm) / max(1, total_updates - warm)
        if self.lr_scheduler_type == "linear":
            return self.learning_rate * max(0.0, 1.0 - progress)
        return self.learning_rate * max(0.0, 0.5 * (1.0 + math.cos(math.pi * progress)))


def _check_warmup(v: Any) -> None:
    if not isinstance(v, dict):
        return
    if v.get("warmup_steps") and v.get("warmup_ratio"):
        raise ConfigError("give warmup_steps or warmup_ratio, not both", "warmup_ratio")
    warm = next((k for k in ("warmup_steps", "warmup_ratio") if v.get(k)), None)
    if warm and v.get("lr_scheduler_type") == "constant":
        raise ConfigError("transformers' constant schedule has no warm-up (it would be ignored): use "
                          "lr_scheduler_type: constant_with_warmup", warm)


OPTIMIZER_KEYS = tuple(OptimizerSettings.model_fields)


class TrainingSpec(OptimizerSettings):
    # the algorithm's (`None`: the algorithm's default, `DEFAULTS`)
    beta: Optional[float] = Field(default=None, ge=0)
    epsilon: float = Field(default=0.2, gt=0)
    epsilon_high: Optional[float] = Field(default=None, gt=0)
    num_iterations: int = Field(default=1, ge=1)
    # where the ratio's old (behaviour) log-probabilities come from (realbench.dataflow.core.OldLogprobs)
    old_logprobs: OldLogprobs = "later_steps"
    # the scoring and training calls' rows packed end to end without padding (TRL's padding_free;
    # verl's use_remove_padding, OpenRLHF's --ds.packing_samples, AReaL always): an engine's
    # scenario only, realbench's runtime pads a micro-batch to its longest row
    padding_free: bool = False
    # models whose scoring and training calls keep their padding where padding_free packs the
    # others' (verl's use_remove_padding is per model: actor_rollout_ref.model's, critic.model's)
    padded_models: tuple[str, ...] = ()
    # an engine's scenario: how it computes the log-probabilities of a call's rows over the
    # vocabulary, by call name (realbench.dataflow.core.LogitsPath: verl's fused kernels, its eager
    # entropy); a call not named here is priced as realbench's runtime computes them
    logits: dict[str, LogitsPath] = Field(default_factory=dict)
    loss_type: Optional[Literal["grpo", "dr_grpo", "dapo", "bnpo", "rloo"]] = None  # None: DEFAULTS
    normalize_advantages: bool = False  # RLOO's: whitened over the batch (TRL's RLOOConfig)
    scale_rewards: Literal["group", "batch", "none"] = "group"
    temperature: float = Field(default=1.0, gt=0)
    top_p: float = Field(default=1.0, gt=0, le=1)
    top_k: int = Field(default=0, ge=0)  # 0: off
    max_new_tokens: Optional[int] = Field(default=None, gt=0)
    gamma: float = Field(default=1.0, ge=0, le=1)
    lam: float = Field(default=0.95, ge=0, le=1)
    cliprange_value: float = Field(default=0.2, gt=0)
    whiten_rewards: bool = False
    reward_weights: Optional[tuple[float, ...]] = None
    # asynchronous RL (dataflow.max_staleness > 0), AReaL's: tokens whose behaviour importance
    # weight exp(proximal - behaviour log-prob) exceeds the cap are dropped (None: no cap)
    behav_imp_weight_cap: Optional[float] = Field(default=None, gt=1)
    # a trained model's own optimizer settings, by role (`critic: {learning_rate: ...}`)
    models: dict[str, OptimizerSettings] = Field(default_factory=dict)

    @model_validator(mode="before")
    @classmethod
    def _known(cls, v: Any) -> Any:
        """Keys that are not settings but hold a mapping are a model's own settings."""
        if not isinstance(v, dict):
            return v
        v = dict(v)
        if isinstance(v.get("scale_rewards"), bool):  # TRL takes True / False for group / none
            v["scale_rewards"] = "group" if v["scale_rewards"] else "none"
        own = {k: v.pop(k) for k in list(v) if k not in cls.model_fields and isinstance(v[k], dict)}
        for role, settings in own.items():
            refuse_unknown_keys(OptimizerSettings, settings, f"{role}.")
        refuse_unknown_keys(cls, v)
        _check_warmup(v)
        if v.get("padded_models") and not v.get("padding_free"):
            raise ConfigError("models kept padded where padding_free packs the others' rows: give padding_free: true, "
                              "or leave them out", "training.padded_models")
        return {**v, "models": {**(v.get("models") or {}), **own}} if own else v

    def optimizer(self, role: str) -> OptimizerSettings:
        """The optimizer settings of the model of `role`: its own, else the section's."""
        if role in self.models:
            return self.models[role]
        return OptimizerSettings(**{k: getattr(self, k) for k in OPTIMIZER_KEYS})

    def beta_for(self, algorithm: str) -> float:
        return DEFAULTS["beta"].get(algorithm, 0.0) if self.beta is None else self.beta

    @classmethod
    def choices(cls, key: str) -> tuple:
        """The values a setting of a fixed set takes (its Literal's), for forms."""
        args = get_args(cls.model_fields[key].annotation)
        literal = next((a for a in args if get_origin(a) is Literal), None)  # Optional[Literal[...]]
        return get_args(literal) if literal is not None else args

    def loss_type_for(self, algorithm: str) -> str:
        return DEFAULTS["loss_type"].get(algorithm, "dapo") if self.loss_type is None else self.loss_type

    def check(self, algorithm: str, trained: set[str], reward_scorers: int) -> None:
        """Refuse what the algorithm would ignore, roles that are not trained models, and reward
        weights that do not match the scorers."""
        for key in sorted(self.model_fields_set - {"models"}):
            users = USED_BY.get(key)
            if users is not None and algorithm not in users and getattr(self, key) != type(self).model_fields[key].default:
                raise ConfigError(f"a setting of {', '.join(u.upper() for u in users)}; {algorithm} does not use it",
                                  f"training.{key}")
        for role in self.models:
            if role not in trained:
                raise ConfigError(f"{role!r} is not a trained model (trained: {', '.join(sorted(trained))})",
                                  f"training.{role}")
        if self.reward_weights is not None and len(self.reward_weights) != reward_scorers:
            raise ConfigError(f"{len(self.reward_weights)} weight(s) for {reward_scorers} reward scorer(s) "
                              "(models.reward: the model, then the functions, in order)", "training.reward_weights")
        if self.loss_type == "rloo" and algorithm != "rloo":
            raise ConfigError(f"rloo is RLOO's sequence-level loss (TRL's RLOOTrainer); {algorithm} aggregates token "
                              "losses: grpo, dr_grpo, dapo or bnpo", "training.loss_type")
        if self.epsilon_high is not None and self.epsilon_high < self.epsilon and "epsilon_high" in self.model_fields_set:
            raise ConfigError(f"below epsilon ({self.epsilon}): the upper clip is 1 + epsilon_high",
                              "training.epsilon_high")


# Which algorithms use each setting (the optimizer's: every algorithm).
USED_BY = {
    "beta": ("ppo", "grpo", "rloo", "remax", "dpo"),
    "epsilon": POLICY_GRADIENT, "epsilon_high": POLICY_GRADIENT, "num_iterations": POLICY_GRADIENT,
    "loss_type": POLICY_GRADIENT, "scale_rewards": ("grpo",),
    "temperature": GENERATION, "top_p": GENERATION, "top_k": GENERATION, "max_new_tokens": GENERATION,
    "reward_weights": GENERATION,
    "gamma": ("ppo",), "lam": ("ppo",), "cliprange_value": ("ppo",), "whiten_rewards": ("ppo",),
    "behav_imp_weight_cap": POLICY_GRADIENT, "normalize_advantages": ("rloo",), "old_logprobs": POLICY_GRADIENT,
}

# Defaults that depend on the algorithm: TRL's GRPOConfig beta 0.0, RLOOConfig 0.05, PPOConfig's
# kl_coef 0.05, DPOConfig 0.1 (ReMax, which TRL lacks: as RLOO); the loss of RLOOTrainer (RLOOConfig
# has no loss_type), GRPOConfig's dapo for the others.
DEFAULTS = {"beta": {"grpo": 0.0, "rloo": 0.05, "ppo": 0.05, "remax": 0.05, "dpo": 0.1},
            "loss_type": {"rloo": "rloo"}}
