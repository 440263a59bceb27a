"""Engines whose settings are global (OpenRLHF's one DeepSpeed strategy, AReaL's allocations):
nearly every plan is its own group, so their plans are listed whole, as per call the options used
and per plan a row of their indices (`PlanTable`), and priced in batches (realbench.search.engine)."""

from __future__ import annotations

from typing import Callable, Iterator

from realbench.plan.mesh import Option
from realbench.plan.scenario import Scenario


class PlanTable:
    """Plans as rows of option indices, each option of a call kept once."""

    def __init__(self, names: list[str]):
        self.names = list(names)
        self.options: dict[str, list[Option]] = {n: [] for n in self.names}
        self._index: dict[str, dict[Option, int]] = {n: {} for n in self.names}
        self.rows: list[tuple[int, ...]] = []

    def intern(self, name: str, option: Option) -> int:
        """The index of `option` among the call's options (added if new)."""
        k = self._index[name].get(option)
        if k is None:
            k = self._index[name][option] = len(self.options[name])
            self.options[name].append(option)
        return k

    def add(self, row: dict[str, int]) -> None:
        self.rows.append(tuple(row[n] for n in self.names))

    def result(self) -> tuple[dict[str, list[Option]], list[tuple[int, ...]]]:
        return self.options, self.rows


def configurations(plan_table: Callable, scenario: Scenario) -> Iterator[dict[str, Option]]:
    """The plans of an engine's `plan_table`, one dict of options each."""
    options, table = plan_table(scenario)
    for row in table:
        yield {n: options[n][k] for n, k in zip(options, row)}


def group_sizes(cluster) -> list[int]:
    """The GPU counts a group of an engine is placed on: power-of-two blocks inside a node, whole nodes."""
    G = cluster.gpus_per_node
    return [s for s in (2 ** k for k in range(G.bit_length())) if s < G] + [k * G for k in range(1, cluster.nodes + 1)]


def problem_of(settings: Callable, scenario: Scenario, options: dict[str, Option]):
    """(plan key, what the engine cannot do) for the first part of a plan outside an engine's
    space, as its writer `settings` refuses it, or None."""
    from realbench.errors import ConfigError

    try:
        settings(scenario, options)
    except ConfigError as e:
        return e.field or "plan", e.message
    return None
