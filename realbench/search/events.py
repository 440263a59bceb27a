"""The one progress-event stream of every search method.

A search calls `on_event(SearchEvent)` when it improves and at least every `every_s` seconds;
the CLI draws a progress bar from it and the widgets draw live curves from the same events.
A search stops when its time or evaluation budget is spent, when `stop()` returns true (the
widgets' stop button), or on Ctrl-C; it then returns the best plan found so far.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Callable, Optional

import numpy as np


@dataclass(frozen=True)
class SearchEvent:
    method: str
    seconds: float
    evaluations: int
    best_time_s: float  # inf until a plan that fits in memory is found
    current_time_s: float  # the latest evaluated (or current chain) plan's time
    best_choice: Optional[tuple[int, ...]]
    budget_s: float
    done: bool = False
    current_choice: Optional[tuple[int, ...]] = None  # the latest evaluated plan (a study records samples of it)


EventSink = Callable[[SearchEvent], None]


@dataclass
class Tracker:
    """Keeps the best feasible plan, the curve of best time against seconds, and emits events."""

    method: str
    budget_s: float
    max_evaluations: Optional[int] = None
    on_event: Optional[EventSink] = None
    stop: Optional[Callable[[], bool]] = None
    every_s: float = 0.25
    start: float = field(default_factory=time.perf_counter)
    evaluations: int = 0
    best_time: float = math.inf
    best_mem: float = math.inf
    best_choice: Optional[tuple[int, ...]] = None
    curve: list = field(default_factory=list)
    _last_emit: float = 0.0
    _current: float = math.inf
    _current_row: Optional[np.ndarray] = None

    @property
    def elapsed(self) -> float:
        return time.perf_counter() - self.start

    def observe(self, choices: np.ndarray, times: np.ndarray, mems: np.ndarray, feasible: np.ndarray) -> None:
        """Record a batch of evaluated plans."""
        self.evaluations += len(times)
        if len(times):
            self._current, self._current_row = float(times[-1]), choices[-1]
        if feasible.any():
            k = int(np.argmin(np.where(feasible, times, np.inf)))
            if times[k] < self.best_time:
                self.best_time, self.best_mem = float(times[k]), float(mems[k])
                self.best_choice = tuple(int(x) for x in choices[k])
                self.curve.append((self.elapsed, self.best_time))
                self.emit(force=True)
                return
        self.emit()

    def emit(self, force: bool = False, done: bool = False) -> None:
        now = self.elapsed
        if self.on_event is None or not (force or done or now - self._last_emit >= self.every_s):
            return
        self._last_emit = now
        current = None if self._current_row is None else tuple(int(x) for x in self._current_row)
        self.on_event(SearchEvent(self.method, now, self.evaluations, self.best_time, self._current,
                                  self.best_choice, self.budget_s, done, current))

    def should_stop(self) -> bool:
        if self.elapsed >= self.budget_s:
            return True
        if self.max_evaluations is not None and self.evaluations >= self.max_evaluations:
            return True
        return bool(self.stop and self.stop())
