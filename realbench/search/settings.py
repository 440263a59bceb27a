"""The Optuna samplers' settings a user sets (CLI flags, the search dashboard)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from realbench.errors import ConfigError


@dataclass(frozen=True)
class SamplerSettings:
    """The samplers' key settings. `startup_trials`: trials sampled at random before TPE or GP
    model the results (None: Optuna's default, 10). `multivariate`: TPE models the parameters
    jointly instead of one by one (single objective)."""

    startup_trials: Optional[int] = None
    multivariate: bool = True

    def __post_init__(self):
        if self.startup_trials is not None and self.startup_trials < 0:
            raise ConfigError("must be 0 or more", "--startup-trials")
