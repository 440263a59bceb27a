"""The `training:` section of a scenario: how the models train, with TRL's names and defaults.

    training:
      temperature: 1.0        # sampling temperature of generation; the training forward's
                              # log-probabilities (policy, reference, behaviour) use it too, as TRL's

A key the runtime does not know is refused with the closest valid one named, never ignored.
"""

from __future__ import annotations

import difflib
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, model_validator

from realbench.errors import ConfigError


def refuse_unknown_keys(cls: type[BaseModel], value: Any, where: str = "") -> None:
    """One line naming a key `cls` does not have, with the closest one it has."""
    if not isinstance(value, dict):
        return
    known = list(cls.model_fields)
    for key in value:
        if key not in known:
            close = difflib.get_close_matches(str(key), known, n=1, cutoff=0.6)
            hint = f"did you mean {close[0]!r}? " if close else ""
            raise ConfigError(f"unknown setting ({hint}valid: {', '.join(known)})", f"{where}{key}")


class TrainingSpec(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    temperature: float = Field(default=1.0, gt=0)

    @model_validator(mode="before")
    @classmethod
    def _known(cls, v: Any) -> Any:
        refuse_unknown_keys(cls, v)
        return v
