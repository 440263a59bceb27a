"""What realbench's commands use of an engine, whichever it is (`Engine`): each engine's package
(realbench.engines.verl, .openrlhf, .areal) makes one of its parts, and the commands, the search
and the benchmarks reach an engine through it (realbench.engines.ENGINES, engine_module), never
through a particular package. The names are the package's own in lower case (`version` is its
VERSION, `pricing_gaps` its PRICING_GAPS); what only some engines have is optional."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Optional


def as_it_is(scenario):
    """A scenario as an engine that runs every job realbench plans runs it: itself."""
    return scenario


@dataclass(frozen=True, eq=False, kw_only=True)
class Engine:
    name: str  # as the commands name it (`realbench import verl ...`, a scenario's `engine`)
    title: str  # as a report names it (OpenRLHF)
    version: str  # the release it reads and writes (pip install <name>==<version>)
    check: Path  # its check script, run by path with the engine's own Python (`make engines`, the tests)

    # its configuration read into a scenario and a plan (the package's reader)
    read_config: Callable  # (path, overrides) -> (its training engine, the settings resolved, the keys given)
    to_plan: Callable  # (training engine, settings, given, name, device, source=, [gpus_per_node=]) -> documents
    model_paths: dict[str, str]  # where each role's checkpoint folder is set
    read_problem: Optional[Callable] = None  # (scenario, options) -> (key, why): beyond its keys, or None
    unread: Optional[Callable] = None  # (training engine, settings, given) -> the settings it does not read
    adapter_path: Optional[str] = None  # where an actor's adapter folder is set (verl's)
    role_sections: dict[str, str] = field(default_factory=dict)  # a role's section -> its call (AReaL's)
    node_size_key: Optional[str] = None  # the setting giving the node size, where import takes no --gpus-per-node
    takes_node_size: bool = False  # whether its configuration leaves the node size to the user (a command line)
    # the keys a refusal of its rollout server names: the context a request may take and the share of
    # each GPU's memory, one for every server, or by the server (AReaL's)
    max_model_len: Optional[str] = None
    server_context: Optional[dict[str, str]] = None
    memory_key: Optional[str] = None
    server_memory: Optional[dict[str, str]] = None

    # a plan written as its configuration (the package's writer)
    to_config: Callable  # (scenario, options, model paths) -> (training engine, settings)
    config_files: Callable  # (path, training engine, settings, node_size=) -> [(path, text, mode)]
    known_keys: Callable  # (training engine) -> the settings its written configuration holds
    flatten: Optional[Callable] = None  # its written settings as flat dotted keys, where they are nested (AReaL's)

    # its space (the package's space)
    space_problem: Callable  # (scenario, options) -> (plan key, why) outside its space, or None
    space_problem_of_scenario: Callable  # (scenario) -> (key, why) it cannot run of the job, or None
    default_plan: Callable  # (scenario, settings=None) -> the plan of its default configuration
    example_of: Callable  # (scenario) -> {source, settings, memory_fraction}: its example for the job
    job_of: Callable = as_it_is  # (scenario) -> the job as it runs it (AReaL scores with a function)
    plan_groups: Optional[Callable] = None  # (scenario) -> its plans by what their calls share (verl's)
    plan_table: Optional[Callable] = None  # (scenario) -> its plans listed whole (OpenRLHF's, AReaL's)

    # how realbench prices it (the package's pricing)
    memory_fraction: float  # its rollout server's share of each GPU where a scenario gives none
    padding_free: bool  # whether it packs rows without padding by default
    padding_settable: bool = True  # whether a configuration can say otherwise
    old_logprobs: tuple[str, ...]  # the ways it takes the old log-probabilities (training.old_logprobs)
    old_logprobs_how: str
    read: set[str]  # the settings realbench reads into the scenario and plan
    neutral: tuple[str, ...]  # those (by prefix) that change neither time nor memory: carried
    captured: tuple[str, ...]  # of those, the ones realbench reads into the scenario's models
    carried_values: dict[str, tuple] = field(default_factory=dict)  # read settings carried at these values
    open_sections: tuple[str, ...] = ()  # sections whose keys are the user's own
    required: dict[str, str]  # carried settings a plan may need otherwise
    pricing_gaps: tuple[str, ...]  # what is not priced, said wherever one of its plans is read or written
    # (scenario, options) -> those of pricing_gaps a plan meets (None: all of them, always)
    gaps_of: Optional[Callable] = None
