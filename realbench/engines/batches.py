"""A GPU's rows of a call in micro-batches, as every engine's reader and writer count them:
realbench's plans split a GPU's rows evenly, so a count an engine forms is priced as the fewest
equal splits at least as many (`fewest_splits`, `rounds`); the rows of a step drawn from the
scenario's response lengths, which the engines' packers pack (`StepRows`: verl's in
realbench.engines.verl.packer, AReaL's in realbench.engines.areal.packer)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional

import numpy as np

from realbench.dataflow.lengths import LengthDistribution
from realbench.errors import ConfigError

DRAWS = 64  # steps drawn (with SEED) from the response lengths
SEED = 0


@dataclass(frozen=True)
class StepRows:
    """A call's rows as an engine's packer sees them: a prompt of `prompt_len` tokens (at its cap)
    and a response drawn from `lengths`, or of `gen_len` tokens each without one. (AReaL's packer
    adds what it forms of them: realbench.engines.areal.packer.StepRows.)"""

    prompt_len: int
    gen_len: int
    lengths: Optional[LengthDistribution] = None

    def tokens(self, rows: int, ranks: int) -> np.ndarray:
        """Each row's tokens, (DRAWS, ranks, rows); (1, 1, rows) where every row is as long."""
        if self.lengths is None:
            return np.full((1, 1, rows), self.prompt_len + self.gen_len, dtype=np.int64)
        u = np.random.default_rng(SEED).random((DRAWS, ranks, rows))
        return self.prompt_len + np.searchsorted(self.lengths.cdf(), u, side="left").astype(np.int64)


def ceil_at_least_one(a: float, b: float) -> int:
    return max(1, math.ceil(a / b))


def rounds(rows: int, at_most: int) -> int:
    """The micro-batches realbench prices for a GPU's `rows` taken at most `at_most` at a time (a
    serving replica's max_num_seqs, a trainer's rows a micro-batch): ceil(rows / at_most), counted
    as the fewest equal splits of the rows at least as many (realbench's plans split a GPU's rows
    evenly)."""
    return fewest_splits(rows, ceil_at_least_one(rows, at_most))


def fewest_splits(rows: int, count: int, multiple: int = 1) -> Optional[int]:
    """The fewest equal splits of a GPU's `rows` at least `count` and a multiple of `multiple`
    (realbench's plans split a GPU's rows evenly); None where no count of splits is one (never
    with `multiple` 1: the rows themselves)."""
    return next((m for m in range(min(count, rows), rows + 1) if rows % m == 0 and m % multiple == 0), None)


def even_share(total: int, parts: int, what: str, flag: str, source: str) -> int:
    if total % parts:
        raise ConfigError(f"{total} {what} do not split evenly over {parts} (realbench's plans split a call's rows "
                          "evenly)", flag, source)
    return total // parts
