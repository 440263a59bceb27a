"""Engines whose settings are global (OpenRLHF's one DeepSpeed strategy, AReaL's allocations):
nearly every plan is its own group, so their plans are listed whole, as per call the options used
and per plan a row of their indices (`PlanTable`), and priced in batches (realbench.search.engine)."""

from __future__ import annotations

from dataclasses import replace
from typing import Callable, Iterator, Optional

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


# the shares of each GPU's memory a search offers an engine's rollout server (vLLM's
# gpu_memory_utilization, SGLang's mem_fraction_static): verl's default is 0.5, OpenRLHF's 0.95,
# AReaL's 0.9, their examples 0.4 to 0.9
SEARCHED_MEMORY_FRACTIONS = (0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9)


def served_shares(scenario: Scenario, generation: Option, fits: Optional[Callable[[Option], bool]] = None
                  ) -> list[Option]:
    """`generation` at the shares of each GPU's memory a search offers its server
    (SEARCHED_MEMORY_FRACTIONS and the scenario's own): for each count of sequences its KV cache
    lets it decode together (cost.calls.serving_slots), the least share that gives it, where the server starts
    (cost.calls.serving_cache_problem) and `fits` accepts it. A larger share with the same slots
    takes the same time and holds more memory; every count is offered, since fewer slots can be
    faster (the waves of a replica's rows over its slots)."""
    from realbench.cost.calls import serving_cache_problem, serving_slots

    call = scenario.dataflow.call("actor_gen")
    model, cluster = scenario.model_of(call), scenario.cluster
    out: dict[int, Option] = {}
    for share in sorted({*SEARCHED_MEMORY_FRACTIONS, *([call.memory_fraction] if call.memory_fraction else [])}):
        o = with_share(generation, share)
        if serving_cache_problem(call, model, cluster, o.strategy) is not None or (fits is not None and not fits(o)):
            continue
        out.setdefault(serving_slots(call, model, cluster, o), o)
    return list(out.values())


def with_share(generation: Option, share: Optional[float]) -> Option:
    """`generation` with its server taking `share` of each GPU's memory (None: the scenario's)."""
    return Option(generation.mesh, replace(generation.strategy, memory_fraction=share))


def the_jobs_share(options: dict[str, Option]) -> dict[str, Option]:
    """The plan with its generation's share of each GPU's memory left to the scenario: an engine's
    default or example configuration, whose share is the scenario's (engines.priced_as, as_example)."""
    return {n: with_share(o, None) if o.strategy.memory_fraction is not None else o for n, o in options.items()}
