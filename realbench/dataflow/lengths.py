"""Response lengths as a distribution, and what a synchronous generation call pays for them.

`dataflow.gen_len` is a number (every response has that many tokens) or a distribution whose
`max` is the cap (`max_new_tokens`):

    gen_len: {dist: lognormal, mean: 2000, cv: 1.0, max: 16384}
    gen_len: {from: run/lengths.jsonl}            # the lengths a run measured (`realbench run --out`)

A length L takes values 1..max. Its table `cdf[t] = P(L <= t)` (t = 0..max; cdf[0] = 0,
cdf[max] = 1) is all the cost model needs. For the log-normal with mean M and coefficient of
variation C: sigma^2 = ln(1 + C^2), mu = ln M - sigma^2 / 2, and L = min(max, ceil(X)), so
P(L <= t) = Phi((ln t - mu) / sigma) for t < max (the mass above the cap sits at the cap).

A micro-batch of b rows decodes until its longest row ends. Its row lengths are independent,
so at step t (the step that samples token t + 1, t = 0..max-1)

    P(the micro-batch still decodes) = 1 - cdf[t]^b            (some row is longer than t)
    E[rows alive]                    = b (1 - cdf[t])
    E[decode steps] = E[max of b lengths] = sum_t (1 - cdf[t]^b)

and the rows alive in a micro-batch that still decodes are b (1 - cdf[t]) / (1 - cdf[t]^b)
on average. A fixed length has cdf[t] = 0 below the cap: every step runs every row.

Time is priced at these expectations; memory is planned for the step at the quantile q =
`memory_at` (default 0.99) of its draws, since a plan must fit the steps whose responses run longer than
the average one, not only the average step:

    the longest of n rows:  the least t with cdf[t]^n >= q            (P(max <= t) = cdf[t]^n)
    rows of n alive at t:   min(n, n p + z_q sqrt(n p (1 - p))),  p = 1 - cdf[t]
                            (the binomial count's normal bound; z_q the standard normal quantile)

With `memory_at: mean` memory takes the expectations too: what one step's own lengths (an
empirical distribution of that step) need.
"""

from __future__ import annotations

import json
import math
import statistics
from functools import cached_property
from pathlib import Path
from typing import Any, Literal, Optional, Union

import numpy as np
from pydantic import ConfigDict, Field, model_validator

from realbench.errors import ConfigError
from realbench.schema import FileModel, refuse_unknown_keys, validate_model


class LengthDistribution(FileModel):
    """A response-length distribution on 1..max: `fixed` (every response `max` tokens),
    `lognormal` (`mean`, `cv`), or `empirical` (`lengths` with their `counts`)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    dist: Literal["fixed", "lognormal", "empirical"]
    max: int = Field(gt=0)
    mean: Optional[float] = Field(default=None, gt=0)
    cv: Optional[float] = Field(default=None, gt=0)
    lengths: tuple[int, ...] = ()
    counts: tuple[int, ...] = ()
    # memory is planned at this quantile of a step's draws, or at their expectation ("mean")
    memory_at: Union[float, str] = 0.99

    @model_validator(mode="after")
    def _check(self) -> "LengthDistribution":
        q = self.memory_at
        if q != "mean" and (isinstance(q, str) or not 0 < q < 1):
            raise ConfigError(f"{q!r} is neither a quantile between 0 and 1 nor mean", "memory_at")
        if self.dist == "lognormal" and (self.mean is None or self.cv is None):
            raise ConfigError("a lognormal distribution needs mean and cv", "mean" if self.mean is None else "cv")
        if self.dist == "lognormal" and self.mean > self.max:
            raise ConfigError(f"{self.mean:g} is above the cap max = {self.max}", "mean")
        if self.dist == "empirical":
            if not self.lengths or len(self.lengths) != len(self.counts):
                raise ConfigError("an empirical distribution needs lengths and as many counts", "lengths")
            if min(self.lengths) < 1 or max(self.lengths) > self.max or min(self.counts) < 0 or not sum(self.counts):
                raise ConfigError(f"lengths must be in 1..{self.max} with counts >= 0, not all 0", "lengths")
        return self

    # equal by their settings: the arrays computed once and kept on the instance (`_cdf`) would
    # make pydantic's comparison of the instances' dicts ambiguous (numpy's elementwise ==)
    def __eq__(self, other: object) -> bool:
        if not isinstance(other, LengthDistribution):
            return NotImplemented
        return all(getattr(self, f) == getattr(other, f) for f in type(self).model_fields)

    def __hash__(self) -> int:
        return hash(tuple(getattr(self, f) for f in type(self).model_fields))

    @classmethod
    def of(cls, lengths, cap: int, memory_at: Union[float, str] = 0.99) -> "LengthDistribution":
        """The empirical distribution of these response lengths (those above `cap` counted at it)."""
        return cls(dist="empirical", max=cap, **histogram(lengths, cap), memory_at=memory_at)

    def cdf(self) -> np.ndarray:
        """P(L <= t) for t = 0..max (computed once; a copy)."""
        return self._cdf.copy()

    @cached_property
    def _cdf(self) -> np.ndarray:
        t = np.arange(self.max + 1, dtype=np.float64)
        if self.dist == "fixed":
            out = np.zeros(self.max + 1)
        elif self.dist == "lognormal":
            sigma = math.sqrt(math.log1p(self.cv ** 2))
            mu = math.log(self.mean) - sigma ** 2 / 2
            z = (np.log(np.maximum(t, 1e-300)) - mu) / (sigma * math.sqrt(2))
            out = 0.5 * (1 + _erf(z))
            out[0] = 0.0
        else:
            pmf = np.zeros(self.max + 1)
            np.add.at(pmf, np.array(self.lengths), np.array(self.counts, dtype=np.float64))
            out = np.cumsum(pmf / pmf.sum())
        out[-1] = 1.0
        return out

    def expected_max(self, rows: float) -> float:
        """E[the longest of `rows` lengths] (remembered per `rows`: the cost model asks often)."""
        if rows not in self._maxima:
            self._maxima[rows] = expected_max(self._cdf, rows)
        return self._maxima[rows]

    @cached_property
    def _maxima(self) -> dict:
        return {}

    def memory_longest(self, rows: float) -> float:
        """The longest of `rows` lengths that memory is planned for: its `memory_at` (the
        least t with cdf[t]^rows >= q), or its expectation."""
        q = self.memory_at
        if q == "mean":
            return self.expected_max(rows)
        key = (q, rows)
        if key not in self._maxima:
            self._maxima[key] = float(np.searchsorted(self._cdf ** rows, q, side="left"))
        return self._maxima[key]

    def memory_alive(self, rows: float) -> np.ndarray:
        """The rows of `rows` alive at step t (t = 0..max-1) that memory is planned for: the
        binomial count's normal bound at `memory_at`, at most `rows`; or the expectation."""
        p = 1.0 - self._cdf[:-1]
        if self.memory_at == "mean":
            return rows * p
        z = statistics.NormalDist().inv_cdf(self.memory_at)
        return np.minimum(rows, rows * p + z * np.sqrt(rows * p * (1.0 - p)))

    @property
    def expected(self) -> float:
        """E[L] = sum over t of P(L > t)."""
        return float((1.0 - self._cdf[:-1]).sum())

    def short(self) -> str:
        if self.dist == "fixed":
            return str(self.max)
        if self.dist == "lognormal":
            return f"lognormal(mean {self.mean:g}, cv {self.cv:g}, max {self.max})"
        return f"empirical({sum(self.counts)} responses, mean {self.expected:.1f}, max {self.max})"


def histogram(lengths, cap: int) -> dict[str, tuple[int, ...]]:
    """{lengths: the distinct values, counts: how often each occurs}, a length above `cap` counted
    at it (the cap bounds what a run may generate)."""
    values, counts = np.unique(np.minimum(np.asarray(lengths, dtype=np.int64), cap), return_counts=True)
    return {"lengths": tuple(int(v) for v in values), "counts": tuple(int(k) for k in counts)}


def _erf(z: np.ndarray) -> np.ndarray:
    return np.vectorize(math.erf, otypes=[np.float64])(z)


def still_decoding(cdf: np.ndarray, rows: float) -> np.ndarray:
    """P(some row of `rows` is longer than t), t = 0..max-1."""
    return 1.0 - cdf[:-1] ** rows


def expected_max(cdf: np.ndarray, rows: float) -> float:
    """E[the longest of `rows` independent lengths] = the decode steps of a micro-batch."""
    return float(still_decoding(cdf, rows).sum())


def alive_rows(cdf: np.ndarray, rows: float) -> np.ndarray:
    """E[rows of `rows` alive at step t], t = 0..max-1."""
    return rows * (1.0 - cdf[:-1])


def read_lengths_file(path: Path, call: Optional[str] = None) -> list[int]:
    """The response lengths in a `lengths.jsonl` of `realbench run --out` (a line per step:
    {"step": k, "<generation call>": [lengths]}): those of `call`, or of every generation call."""
    try:
        lines = path.read_text().splitlines()
    except OSError as e:
        raise ConfigError(f"cannot read it ({e.strerror or e})", "from", str(path)) from None
    out: list[int] = []
    for k, line in enumerate(x for x in lines if x.strip()):
        try:
            row = json.loads(line)
            lists = [v for name, v in row.items() if name != "step" and (call is None or name == call)]
            out.extend(int(n) for v in lists for n in v)
        except (ValueError, TypeError, AttributeError):
            raise ConfigError(f"line {k + 1} is not a step of response lengths", "from", str(path)) from None
    if not out:
        raise ConfigError("holds no response lengths" + (f" of call {call!r}" if call else ""), "from", str(path))
    return out


def parse_gen_len(value: Any, cap: Optional[int], base: Path) -> tuple[int, Optional[LengthDistribution]]:
    """`dataflow.gen_len` as given: a number, or a distribution (a mapping). Returns the cap (the
    generated width) and the distribution (None for a number). `cap`: the data's max_new_tokens,
    which a distribution's `max` may not exceed and defaults to."""
    if not isinstance(value, dict):
        return value, None
    v = dict(value)
    if "from" in v:  # the lengths a run measured
        refuse_unknown_keys(("from", "call", "max", "memory_at"), v)
    else:  # a distribution (a key close to one of the other form's is pointed to it)
        refuse_unknown_keys(LengthDistribution, v, also=("from", "call"))
    if cap is not None and isinstance(v.get("max"), int) and v["max"] > cap:
        raise ConfigError(f"{v['max']} is above max_new_tokens ({cap}), the cap", "max")
    if "from" in v:
        path = Path(str(v.pop("from")))
        path = path if path.is_absolute() else base / path
        call = v.pop("call", None)
        lengths = read_lengths_file(path, call)
        top = v.get("max", cap or max(lengths))
        v = {**v, "dist": "empirical", "max": top, **histogram(lengths, top)}
    if cap is not None:
        v.setdefault("max", cap)
    dist = validate_model(LengthDistribution, v)
    return dist.max, dist
