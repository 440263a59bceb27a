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

    the heaviest of g micro-batches of b rows packed without padding (an engine's remove-padding,
    fixed rows in arrival order): the least s with F_b(s)^g >= q, F_b the distribution of the sum of
    b lengths (the b-fold convolution of the lengths' probabilities, by FFT on a grid of at most
    SUM_GRID points: lengths rounded up to the grid, so s errs high, by under b x the grid's step)

With `memory_at: mean` memory takes the expectations too: what one step's own lengths (an
empirical distribution of that step) need.
"""

from __future__ import annotations

import json
import math
import statistics
from dataclasses import dataclass
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

    def memory_heaviest(self, rows: int, groups: int = 1) -> float:
        """The tokens of the heaviest of `groups` sums of `rows` lengths each (packed micro-batches of
        fixed rows) that memory is planned for: its `memory_at` (the least s with F(s)^groups >= q,
        F the sum's distribution), or its expectation. One group of one row: `memory_longest`."""
        key = ("sum", self.memory_at, rows, groups)
        if key not in self._maxima:
            step, cdf = self._sum_cdf(rows)
            if self.memory_at == "mean":
                self._maxima[key] = step * float((1.0 - cdf[:-1] ** groups).sum())
            else:
                self._maxima[key] = step * float(np.searchsorted(cdf ** groups, self.memory_at, side="left"))
        return self._maxima[key]

    def _sum_cdf(self, rows: int) -> tuple[int, np.ndarray]:
        """(w, P(the sum of `rows` lengths <= k w) for k = 0..): each length rounded up to a multiple
        of w, the least step that keeps the sum's support within SUM_GRID points."""
        if rows < 1:
            raise ValueError(f"a sum of {rows} lengths")
        w = max(1, math.ceil(rows * self.max / (SUM_GRID - 1)))
        bins = math.ceil(self.max / w)
        pmf = np.zeros(bins + 1)
        np.add.at(pmf, np.ceil(np.arange(self.max + 1) / w).astype(np.int64), np.diff(self._cdf, prepend=0.0))
        size = 1 << (rows * bins).bit_length()  # > rows * bins: the sum's support, unwrapped
        total = np.fft.irfft(np.fft.rfft(pmf, size) ** rows, size)[:rows * bins + 1]
        cdf = np.cumsum(np.maximum(total, 0.0))
        return w, np.minimum(cdf / cdf[-1], 1.0)

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


SUM_GRID = 1 << 17  # the most points of a sum's distribution (LengthDistribution.memory_heaviest)


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


def slot_occupancy(cdf: np.ndarray, sync_every: int = 1) -> np.ndarray:
    """P(a row holds its decode slot x steps), x = 0.. (realbench.runtime.rollout): a response of
    L tokens takes its first from the prefill and L - 1 decode steps (at least the one that runs
    beside its prefill), then its slot waits for the next refill, every sync_every steps: 0 to
    sync_every - 1 more steps, uniformly."""
    pmf = np.diff(cdf, prepend=0.0)  # P(L = t), t = 0..max
    cap, k = len(cdf) - 1, sync_every
    decoding = np.zeros(cap + k)  # P(L - 1 decode steps, at least 1)
    np.add.at(decoding, np.maximum(np.arange(cap), 1), pmf[1:])
    return np.convolve(decoding, np.full(k, 1.0 / k))[:cap + k]  # then the wait, uniform on 0..k-1


def _renewal(occ: np.ndarray, rows: float, slots: int) -> tuple[float, float, np.ndarray]:
    """(E[makespan], the step T the last row starts, the expected share of the slots busy at
    T + u, u = 0..) of `rows` rows of occupancy `occ` through `slots` slots, each freed slot
    taking the next queued row (list scheduling). Each slot is busy from step 0 until it
    finishes its last row, so with rem_k what slot k has left at T,
        sum of the rows' occupancies W = slots T + sum_k rem_k,  makespan = T + max_k rem_k
    and E[makespan] = rows E[occ] / slots - E[mean_k rem_k] + E[max_k rem_k]: the row just
    started has its whole occupancy left; the others, caught mid-row, the residual of a renewal
    process, P(R = r) = P(occ > r) / E[occ]; slot k is busy while its rest lasts, so the share
    busy at T + u is (P(occ > u) + (slots - 1) P(R > u)) / slots. With no more rows than slots,
    every row has a slot of its own from T = 0: E[the longest occupancy], rows / slots P(occ > u)."""
    survival = 1.0 - np.cumsum(occ)  # P(occ > x)
    if rows <= slots:
        return float((1.0 - (1.0 - survival) ** rows).sum()), 0.0, rows / slots * survival
    mean = float(survival.sum())
    residual_survival = 1.0 - np.cumsum(survival / mean)  # P(R > r)
    last_start = rows * mean / slots - (mean + (slots - 1) * float(residual_survival.sum())) / slots
    longest = float((1.0 - (1.0 - survival) * (1.0 - residual_survival) ** (slots - 1)).sum())
    return last_start + longest, max(0.0, last_start), (survival + (slots - 1) * residual_survival) / slots


def continuous_makespan(cdf: np.ndarray, rows: float, slots: int, sync_every: int = 1) -> float:
    """E[decode steps] of `rows` responses through `slots` slots (`_renewal`)."""
    return _renewal(slot_occupancy(cdf, sync_every), rows, slots)[0]


def continuous_busy(cdf: np.ndarray, rows: float, slots: int, sync_every: int = 1,
                    points: int = 64) -> tuple[list[float], list[float]]:
    """The expected share of the slots busy over continuous batching's decode steps, at points
    given as shares of its makespan (`_renewal`)."""
    total, start, share = _renewal(slot_occupancy(cdf, sync_every), rows, slots)
    steps = np.unique(np.linspace(0, len(share) - 1, min(points, len(share))).astype(int))
    xs = [0.0] + [min(1.0, (start + float(u)) / total) for u in steps]
    return xs, [1.0 if rows > slots else float(share[0])] + [float(share[u]) for u in steps]


@dataclass(frozen=True)
class ContinuousSchedule:
    """What continuous batching does with a replica's rows (see `continuous_schedule`)."""
    steps: float  # decode steps
    rows: float  # the slots a decode step computes, on average
    age: float  # the mean tokens a slot's row has generated when a step runs (its context past the prompt)
    prefills: float  # batched prefills
    prefill_rows: float  # rows per prefill


def computed_slots(busy: np.ndarray, slots: int) -> np.ndarray:
    """The slots a step computes with `busy` rows held: the power of two that holds them (the
    runtime moves the tail's rows down to it), at most `slots`."""
    return np.minimum(slots, 2.0 ** np.ceil(np.log2(np.maximum(busy, 1.0))))


def occupancy_moments(occ: np.ndarray) -> tuple[float, float]:
    """(the mean steps a row holds its slot, the mean age of the row a step computes: length-biased,
    half done) of a slot occupancy (slot_occupancy)."""
    x = np.arange(len(occ), dtype=np.float64)
    mean = float((x * occ).sum())
    return mean, float((x * (x + 1) * occ).sum()) / (2 * mean) if mean else 0.0


def continuous_schedule(cdf: Optional[np.ndarray], rows: float, slots: int, sync_every: int = 1,
                        gen_len: int = 0) -> ContinuousSchedule:
    """The decode steps, slots computed, context and prefills of `rows` responses through `slots`
    slots: lengths by `cdf` (None: every response `gen_len` tokens, each wave of slots ending
    together, when the engine refills every slot at once). Each step computes the slots up to
    the last one held (`computed_slots` of the expected busy ones while the slots drain). Refills: the rows first fill the slots in one
    prefill; then the slots freed between two refills (slots sync_every / E[occ] of them, at
    least one) are prefilled together."""
    if cdf is None:  # a wave's slots all end together, and the next wave fills them at once
        waves = math.ceil(rows / slots)
        decode = max(gen_len - 1, 1)
        last = rows - (waves - 1) * slots
        computed = ((waves - 1) * slots + float(computed_slots(np.array(last), slots))) / waves
        return ContinuousSchedule(waves * decode, computed, gen_len / 2, waves, min(rows, slots))
    occ = slot_occupancy(cdf, sync_every)
    mean, age = occupancy_moments(occ)
    steps, start, share = _renewal(occ, rows, slots)
    tail = computed_slots(slots * share, slots)[:max(0, int(round(steps - start)))]
    computed = (start * slots + float(tail.sum())) / max(start + len(tail), 1e-9)
    first = min(rows, slots)
    if rows <= slots:
        return ContinuousSchedule(steps, computed, age, 1.0, first)
    per_read = min(slots, max(1.0, slots * sync_every / max(mean, 1.0)))
    prefills = 1.0 + (rows - first) / per_read
    return ContinuousSchedule(steps, computed, age, prefills, rows / prefills)


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
