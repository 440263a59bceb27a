"""The profile cache: local estimates are calibrated by default.

The analytic CPU preset is 10-20x off on a real machine (numpy-sized matmuls, Python overheads,
gloo), so `realbench run`, `estimate` and `search` of a CPU scenario, the run monitor and
`make demo` cost plans with a profile of this machine. One profile is kept per machine identity:

    device kind, processor name, usable cores, torch version, process count

(the process count matters: N processes share the cores, and tp and collective groups go up to
N). The file lives under the user's cache folder (`platformdirs.user_cache_dir("realbench")`, or
`$REALBENCH_CACHE_DIR`), named after that identity. When there is none, a quick profile is taken
once (`quick_request`: one pass over the grid, under a minute on 2 cores for 4 processes), with
progress, and saved; the scenario's model shapes are measured too, and shapes the cached file
lacks are measured and added later. A cached file whose recorded identity differs from this
machine's (a copied cache folder, a torch upgrade read through an old name) is not used: it is
measured again and replaced. `realbench profile` without `--out` refreshes the cached profile
with a full measurement; `--profile none` opts out (the analytic model).

GPU scenarios keep the presets (`realbench bench fidelity` checks them against published
measurements): a CUDA machine's profile is passed with `--profile FILE`.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Callable, Iterable, Optional

from realbench.cache import cache_folder
from realbench.hardware.profile import (COLLECTIVES, DeviceInfo, Profile, load_profile, shape_key, shares_cores,
                                        this_machine)


def machine_identity(processes: int, device: str = "cpu") -> tuple[DeviceInfo, str]:
    """This machine as a profile records it, and the torch version."""
    import torch

    return this_machine(device, processes, 1), torch.__version__


def cache_path(identity: DeviceInfo, torch_version: str) -> Path:
    slug = re.sub(r"[^a-z0-9]+", "-", identity.name.lower()).strip("-")[:48] or "unknown"
    torch_slug = re.sub(r"[^A-Za-z0-9.+]+", "-", torch_version)
    return cache_folder() / "profiles" / (f"{identity.kind}-{slug}-{identity.cores}cores-torch{torch_slug}-"
                                          f"{identity.processes}proc.json")


def quick_request(processes: int, models: Iterable = ("llama-tiny",), device: str = "cpu", collectives: bool = True):
    """A profile taken without asking: one pass, fewer repeats, the default grid."""
    from realbench.runtime.profiler import ProfileRequest

    return ProfileRequest(models=tuple(models), repeats=5, warmup=2, passes=1, nproc=processes, device=device,
                          collectives=collectives)


def _mismatch(profile: Profile, identity: DeviceInfo, torch_version: str) -> Optional[str]:
    """What differs between a cached profile and this machine (None: it is this machine's)."""
    got = profile.device
    for field in ("kind", "name", "cores", "processes"):
        if getattr(got, field) != getattr(identity, field):
            return f"{field} {getattr(got, field)!r}, this machine {getattr(identity, field)!r}"
    if profile.versions.get("torch") != torch_version:
        return f"torch {profile.versions.get('torch')!r}, this machine {torch_version!r}"
    from realbench.hardware.profile import CALLS_VERSION

    if profile.versions.get("calls") != CALLS_VERSION:
        return (f"whole calls measured by runtime version {profile.versions.get('calls', '1')!r}, this one's "
                f"{CALLS_VERSION!r}")
    return None


def shape_named(models: Iterable) -> list:
    """The model specs among `models` (reward functions are not models), each named by the shape
    a profile matches on, so that names cannot collide, each as a language model."""
    from realbench.models import ModelSpec

    def named(spec):
        *shape, variant = shape_key(spec)
        return "h{}-a{}-kv{}-f{}-v{}".format(*shape) + (f"-{variant}" if variant else "")

    # (as a language model: a profile measures generation too, which a value head's model does not run)
    return [spec.with_value_head(False).model_copy(update={"name": named(spec)}) for spec in models
            if isinstance(spec, ModelSpec)]


def machine_profile(processes: int, models: Iterable = (), device: str = "cpu", refresh: bool = False,
                    request=None, on_progress: Optional[Callable[[int, int], None]] = None,
                    note: Callable[[str], None] = lambda line: None) -> Profile:
    """This machine's cached profile for `processes` processes, with every shape in `models`
    (ModelSpecs) measured: read from the cache, or measured (once) and saved there. `request`
    replaces the quick request when measuring from scratch (refresh: always measure)."""
    from realbench.runtime.profiler import profile_machine

    identity, torch_version = machine_identity(processes, device)
    path = cache_path(identity, torch_version)
    cached, explained = None, False
    if path.exists() and not refresh:
        try:
            cached = load_profile(str(path))
        except Exception as e:  # our own file, unreadable: measured again below
            note(f"the cached profile {path} cannot be read ({str(e).splitlines()[0]}): measuring this machine again")
            explained = True
        else:
            why = _mismatch(cached, identity, torch_version)
            if why:
                note(f"the cached profile {path} is another machine's ({why}): measuring this machine again")
                cached, explained = None, True
    specs = [spec for _, spec in quick_request(processes, shape_named(models)).specs()]  # one per shape
    if cached is None:
        if not explained and not refresh:
            note(f"no profile of this machine for {processes} processes yet: measuring one (once), cached at {path}")
        profile = profile_machine(request or quick_request(processes, specs or ["llama-tiny"], device), on_progress)
    else:
        profile = cached
    # shapes the profile lacks (a given request may lack the scenario's), or whose whole calls it
    # does not have (a profile from before they were measured, or split into micro-batches)
    contended = shares_cores(device, processes, identity.cores)
    missing = [s for s in specs if profile.model_for(s) is None or not profile.model_for(s)[1].has_whole_calls(contended)]
    # collectives the profile lacks (the runtime's exchange, in profiles from before it)
    lacking = [k for k in COLLECTIVES if k not in profile.collectives] if profile.collectives else []
    if cached is not None and not missing and not lacking:
        return cached
    if lacking and cached is not None:
        note(f"the cached profile of this machine has no {', '.join(lacking)} measurements: measuring the "
             f"collectives (once), added to {path}")
        extra = profile_machine(quick_request(processes, [], device), on_progress)
        profile = profile.model_copy(update={"collectives": {**profile.collectives, **extra.collectives}})
    if missing:
        if cached is not None:
            what = "measurements" if any(cached.model_for(s) is None for s in missing) else "whole-call measurements"
            note(f"the cached profile of this machine has no {what} of {', '.join(s.name for s in missing)}: "
                 f"measuring them (once), added to {path}")
        extra = profile_machine(quick_request(processes, missing, device, collectives=False), on_progress)
        kept = {n: m for n, m in profile.models.items() if not any(m.matches(s) for s in missing)}
        profile = profile.model_copy(update={"models": {**kept, **extra.models}})
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".tmp{os.getpid()}")
    profile.save(tmp, overwrite=True)
    os.replace(tmp, path)  # whole files only: another process may be reading it
    return profile


def scenario_profile(scenario, processes: Optional[int] = None, note: Callable[[str], None] = lambda line: None,
                     on_progress: Optional[Callable[[int, int], None]] = None,
                     device_type: str = "cpu") -> Optional[Profile]:
    """The profile a local run or plan of `scenario` is costed with by default: this machine's
    cached profile for CPU scenarios (measured once if needed), None (the presets) for GPU ones
    and for a run on GPUs (`device_type` "cuda": this CPU's profile would not describe it)."""
    if scenario.cluster.device.name != "cpu" or device_type != "cpu":
        return None
    return machine_profile(processes or scenario.cluster.n_devices, scenario.models.values(), "cpu",
                           note=note, on_progress=on_progress)


def resolve_profile(setting, scenario, processes: Optional[int] = None, note: Callable[[str], None] = lambda line: None,
                    on_progress: Optional[Callable[[int, int], None]] = None,
                    device_type: str = "cpu") -> Optional[Profile]:
    """What a widget's or report's `profile` setting means for a scenario: "cached" is
    scenario_profile (this machine's cached profile for a CPU scenario, None for a GPU one); a
    Profile or None is used as it is."""
    if isinstance(setting, str):
        if setting != "cached":
            raise ValueError(f"profile setting {setting!r}: 'cached', a Profile or None")
        return scenario_profile(scenario, processes, note=note, on_progress=on_progress, device_type=device_type)
    return setting
