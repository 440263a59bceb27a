"""Local estimates are calibrated by default: this machine's profile is taken once, cached,
reused, refused when it is another machine's, refreshed on request, and skipped with
`--profile none` (realbench.runtime.profile_cache)."""

import json

import pytest

from realbench.runtime import profile_cache as cache
from realbench.cache import CACHE_ENV
from realbench.runtime.profile_cache import cache_path, machine_identity, machine_profile
from realbench.hardware.profile import ModelProfile
from realbench.models import get_model

ESTIMATE = ("estimate", "--scenario", "ppo-tiny-2cpu", "--baseline", "symmetric", "--json")


@pytest.fixture
def own_cache(tmp_path, monkeypatch):
    monkeypatch.setenv(CACHE_ENV, str(tmp_path))
    return tmp_path


def cached_files(folder):
    return sorted((folder / "profiles").glob("*.json"))


def seeded(session_cache, processes=2):
    """This machine's profile, copied from the session's cache (measured there once) into the
    test's own: what a cache holds after a first use."""
    import shutil
    from pathlib import Path

    path = cache_path(*machine_identity(processes))
    path.parent.mkdir(parents=True, exist_ok=True)
    shutil.copy(Path(session_cache) / "profiles" / path.name, path)
    return path


def _measuring(monkeypatch, result) -> list:
    """The profiler replaced by one that records its requests and returns `result` (the session's
    real measurements: what the cache does with a measurement is tested here, the measuring itself
    by the session's profile and the refresh below). Returns the requests."""
    measured = []

    def profile_machine(request, on_progress=None):
        measured.append(request)
        return result
    monkeypatch.setattr("realbench.runtime.profiler.profile_machine", profile_machine)
    return measured


def _sessions_profile(machine_profile_cache):
    """The session's profile for 2 processes, read as the cache reads it, and the test's own cache
    left empty again."""
    path = seeded(machine_profile_cache)
    real = machine_profile(2, [get_model("llama-tiny")])
    path.unlink()
    return real


def test_a_cpu_scenario_is_costed_with_this_machines_profile_measured_once(cli, own_cache, machine_profile_cache,
                                                                           monkeypatch):
    measured = _measuring(monkeypatch, _sessions_profile(machine_profile_cache))
    code, out, err = cli(*ESTIMATE)
    assert code == 0, err
    assert len(measured) == 1 and measured[0].nproc == 2  # (the quick request, for the scenario's shapes)
    [path] = cached_files(own_cache)
    assert path == cache_path(*machine_identity(2))
    identity, torch_version = machine_identity(2)
    assert f"{identity.cores}cores" in path.name and "2proc" in path.name and torch_version in path.name
    assert f"no profile of this machine for 2 processes yet: measuring one (once), cached at {path}" in err
    first = json.loads(out)
    assert set(first["cost_source"].values()) == {"profile"}
    saved = path.read_text()
    assert json.loads(saved)["device"]["cores"] == identity.cores

    code, out, err = cli(*ESTIMATE)  # reused: nothing measured, nothing said, the same estimate
    assert code == 0 and err == ""
    assert path.read_text() == saved
    assert json.loads(out)["time_per_iter_s"] == first["time_per_iter_s"]

    code, out, err = cli(*ESTIMATE, "--profile", "none")  # opted out: the analytic model
    assert code == 0 and err == ""
    assert set(json.loads(out)["cost_source"].values()) == {"analytic"}
    assert json.loads(out)["time_per_iter_s"] != first["time_per_iter_s"]

    # a GPU scenario keeps the presets and measures nothing
    code, out, err = cli("estimate", "--scenario", "sft-7b-8gpu", "--baseline", "symmetric", "--json")
    assert code == 0 and err == "" and set(json.loads(out)["cost_source"].values()) == {"analytic"}
    assert cached_files(own_cache) == [path] and len(measured) == 1


@pytest.mark.parametrize("field,value,said", [
    ("name", "Another CPU", "name 'Another CPU'"),
    ("cores", 977, "cores 977"),
    ("processes", 3, "processes 3"),
    ("torch", "1.0.0", "torch '1.0.0'"),
    # measured before generation ran by continuous batching: its whole calls are another runtime's
    ("calls", "1", "whole calls measured by runtime version '1'"),
])
def test_a_cached_profile_of_another_machine_is_refused_and_measured_again(own_cache, machine_profile_cache,
                                                                             monkeypatch, field, value, said):
    path = seeded(machine_profile_cache)
    real = machine_profile(2, [get_model("llama-tiny")])  # this machine's: used as it is
    doc = json.loads(path.read_text())
    if field in ("torch", "calls"):
        doc["versions"][field] = value
    else:
        doc["device"][field] = value
    path.write_text(json.dumps(doc))
    measured = _measuring(monkeypatch, real)
    notes = []
    again = machine_profile(2, [get_model("llama-tiny")], note=notes.append)
    assert len(measured) == 1 and measured[0].nproc == 2
    assert len(notes) == 1 and f"the cached profile {path} is another machine's ({said}" in notes[0]
    assert again.device == real.device
    assert json.loads(path.read_text())["device"] == real.device.model_dump()
    machine_profile(2, [get_model("llama-tiny")], note=notes.append)  # now it is this machine's
    assert len(measured) == 1 and len(notes) == 1


def test_realbench_profile_without_out_refreshes_the_cached_profile(cli, own_cache, machine_profile_cache):
    path = seeded(machine_profile_cache)
    before = json.loads(path.read_text())
    code, _, err = cli("profile", "--nproc", 2, "--batches", "1,2", "--lengths", "4,8", "--repeats", 3, "--passes", 1,
                       "--call-passes", 1)
    assert code == 0, err
    assert f"refreshed this machine's cached profile for 2 processes: {path}" in err
    after = json.loads(path.read_text())
    assert after["date"] >= before["date"]
    points = next(iter(after["models"].values()))["ops"]["1"]["block.fwd"]
    assert {(p["batch"], p["length"]) for p in points} == {(1, 4), (1, 8), (2, 4), (2, 8)}  # the request's grid
    code, out, err = cli(*ESTIMATE)  # used as it is: it has the scenario's model
    assert code == 0 and err == "" and set(json.loads(out)["cost_source"].values()) == {"profile"}
    assert json.loads(path.read_text()) == after


def test_a_model_shape_the_cached_profile_lacks_is_measured_and_added(own_cache, machine_profile_cache,
                                                                       monkeypatch):
    tiny = get_model("llama-tiny")
    seeded(machine_profile_cache)
    real = machine_profile(2, [tiny])
    other = tiny.model_copy(update={"name": "wider", "hidden": 96, "n_heads": 4, "n_kv_heads": 2, "ffn": 256})
    # (its measurements: the tiny model's, under the wider shape)
    [entry] = [m for m in real.models.values() if m.matches(tiny)]
    widened = entry.model_copy(update={"hidden": 96, "n_heads": 4, "n_kv_heads": 2, "ffn": 256})
    measured = _measuring(monkeypatch, real.model_copy(update={"models": {"wider": widened}, "collectives": {}}))
    notes = []
    profile = machine_profile(2, [tiny, other], note=notes.append)
    assert len(notes) == 1 and "has no measurements of h96-a4-kv2-f256-v128: measuring them (once)" in notes[0]
    # the missing shape alone, without the collectives the cache has
    assert len(measured) == 1 and not measured[0].collectives and [s.hidden for _, s in measured[0].specs()] == [96]
    assert profile.model_for(other) is not None and profile.model_for(tiny) is not None
    assert profile.collectives  # kept from the first measurement
    notes.clear()
    machine_profile(2, [other], note=notes.append)
    assert notes == [] and len(measured) == 1


def test_the_profile_a_local_run_uses_is_this_machines_for_its_process_count(own_cache, machine_profile_cache):
    from realbench.plan import load_scenario

    seeded(machine_profile_cache)
    scenario = load_scenario("ppo-tiny-cpu")
    profile = cache.scenario_profile(scenario, processes=2)
    assert profile.device.processes == 2 and cached_files(own_cache) == [cache_path(*machine_identity(2))]
    assert cache.scenario_profile(load_scenario("ppo-7b-7b-16gpu")) is None


def test_the_html_report_of_a_local_plan_shows_the_time_estimate_prints(cli, tmp_path):
    plan = tmp_path / "plan.yaml"
    assert cli("estimate", "--scenario", "ppo-tiny-2cpu", "--baseline", "symmetric", "--out", plan)[0] == 0
    times = {}
    for setting in ((), ("--profile", "none")):
        code, out, err = cli("estimate", "--scenario", "ppo-tiny-2cpu", "--plan", plan, "--json", *setting)
        times[setting] = json.loads(out)["time_per_iter_s"]
        report = tmp_path / f"report{len(setting)}.html"
        assert cli("export", "--plan", plan, "--format", "html", "--out", report, *setting)[0] == 0
        assert f"Simulated time per iteration: {times[setting]:.4g} s" in report.read_text()
    assert times[()] != times[("--profile", "none")]


def test_bad_flags_are_refused_before_this_machine_is_profiled(cli, own_cache, tmp_path):
    code, _, err = cli("search", "--scenario", "ppo-tiny-2cpu", "--method", "mcmc", "--time-budget", 1,
                       "--out", tmp_path / "p.yaml", "--storage", f"sqlite:///{tmp_path / 'no' / 'such.db'}")
    assert code == 2 and err.startswith("realbench: error: --storage: cannot open") and err.count("\n") == 1
    code, _, err = cli("estimate", "--scenario", "ppo-tiny-2cpu", "--plan", tmp_path / "missing.yaml")
    assert code == 2 and err.count("\n") == 1
    assert not (own_cache / "profiles").exists()  # nothing was measured


def _an_older_cached_profile(machine_profile_cache, monkeypatch, edit):
    """The session's cached profile, `edit`ed in place of the file as an older version would have
    written it; the profiler replaced by one that records its requests and returns the real
    profile. Returns (the edited document, the real profile, the requests)."""
    path = seeded(machine_profile_cache)
    real = machine_profile(2, [get_model("llama-tiny")])
    doc = json.loads(path.read_text())
    edit(doc)
    path.write_text(json.dumps(doc))
    return doc, real, _measuring(monkeypatch, real)


def test_a_cached_profile_without_whole_calls_gets_them_measured_once(own_cache, machine_profile_cache, monkeypatch):
    """A profile from before whole calls were measured: its shape is measured again (once), its
    entry replaced by one with whole calls, the collectives kept."""
    def drop_calls(doc):
        for m in doc["models"].values():
            del m["calls"]
    doc, real, measured = _an_older_cached_profile(machine_profile_cache, monkeypatch, drop_calls)
    notes = []
    profile = machine_profile(2, [get_model("llama-tiny")], note=notes.append)
    assert len(measured) == 1 and not measured[0].collectives
    assert len(notes) == 1 and "has no whole-call measurements of h64-a4-kv2-f176-v128" in notes[0]
    tiny = get_model("llama-tiny")
    [entry] = [m for m in profile.models.values() if m.matches(tiny)]  # replaced, not added beside
    assert entry.calls
    others = {n for n, m in doc["models"].items() if not ModelProfile.model_validate(m).matches(tiny)}
    assert others <= set(profile.models)  # shapes the session measured for other tests stay
    assert profile.collectives == real.collectives
    machine_profile(2, [get_model("llama-tiny")], note=notes.append)
    assert len(measured) == 1 and len(notes) == 1


def test_a_cached_profile_without_the_exchange_gets_the_collectives_measured_once(own_cache, machine_profile_cache,
                                                                                  monkeypatch):
    """A profile from before the runtime's exchange was measured: the collectives (only) are
    measured once and merged in; the models' entries stay as they were."""
    doc, real, measured = _an_older_cached_profile(machine_profile_cache, monkeypatch,
                                                   lambda doc: doc["collectives"].pop("exchange"))
    notes = []
    profile = machine_profile(2, [get_model("llama-tiny")], note=notes.append)
    assert len(measured) == 1 and measured[0].collectives and measured[0].models == ()
    assert len(notes) == 1 and "has no exchange measurements" in notes[0]
    assert profile.collectives["exchange"] == real.collectives["exchange"]
    assert profile.models == {n: ModelProfile.model_validate(m) for n, m in doc["models"].items()}  # kept
    machine_profile(2, [get_model("llama-tiny")], note=notes.append)
    assert len(measured) == 1 and len(notes) == 1
