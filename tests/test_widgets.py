"""Widgets driven from Python: set values, click buttons, assert state and plots."""

import math

import pytest

pytest.importorskip("ipywidgets")

from realbench.widgets import PlanViewer, SearchDashboard  # noqa: E402


def test_search_dashboard_races_methods_and_hands_the_best_plan_to_the_viewer():
    dash = SearchDashboard(scenario="ppo-tiny-2cpu", methods=("mcmc", "random"), budget_s=1.5)
    viewer = PlanViewer()
    dash.listeners.append(viewer.listen)
    dash.run_button.click()
    assert dash.running and dash.stop_button.disabled is False and dash.run_button.disabled
    results = dash.wait(60)
    assert set(results) == {"mcmc", "random"} and not dash.running
    for method, source in dash.sources.items():
        best = source.data["best"]
        assert len(best) >= 1 and all(a >= b for a, b in zip(best, best[1:]))  # best time never rises
        assert best[-1] == pytest.approx(results[method].best_time_s)
    assert set(dash.baselines) == {"symmetric", "heuristic"}
    assert "done" in dash.status.value and "<table>" in dash.table.value
    assert dash.run_button.disabled is False and dash.stop_button.disabled
    best = min(r.best_time_s for r in results.values())
    assert viewer.estimate is not None and viewer.estimate.time_per_iter_s == pytest.approx(best)
    assert "best plan of" in viewer.title.value and len(viewer.body.children) == 1
    # a CPU scenario is searched on this machine's cached profile, as `realbench search` does
    assert dash._profile is not None and dash._profile.device.processes == 2
    assert set(viewer.estimate.cost_source.values()) == {"profile"}


def test_search_dashboard_without_a_profile_costs_with_the_analytic_model():
    dash = SearchDashboard(scenario="ppo-tiny-2cpu", methods=("mcmc",), budget_s=0.5, profile=None)
    assert dash.start()
    results = dash.wait(60)
    est = dash._estimators["mcmc"]
    assert dash._profile is None and set(est.estimate(results["mcmc"].best_choice).cost_source.values()) == {"analytic"}


def test_the_zero_box_offers_the_engines_sharding_to_the_search():
    """Ticked, the dashboard searches the scenario with zero offered (search --zero): its option
    sets hold sharded strategies; unticked, none."""
    dash = SearchDashboard(scenario="ppo-tiny-2cpu", methods=("mcmc",), budget_s=0.5, profile=None)
    dash.zero_box.value = True
    assert dash.start()
    dash.wait(60)
    assert dash.scenario.offer_zero
    assert any(o.strategy.zero for opts in dash._estimators["mcmc"].options for o in opts)
    dash.zero_box.value = False
    assert dash.start()
    dash.wait(60)
    assert not any(o.strategy.zero for opts in dash._estimators["mcmc"].options for o in opts)


def test_stop_button_ends_the_searches_early_with_the_best_plan_so_far():
    dash = SearchDashboard(scenario="ppo-tiny-2cpu", methods=("tpe",), budget_s=120)
    assert dash.start()
    import time

    time.sleep(1.0)
    dash.stop_button.click()
    results = dash.wait(30)
    assert results["tpe"].seconds < 30 and math.isfinite(results["tpe"].best_time_s)


@pytest.mark.parametrize("field, value, words", [
    ("budget_box", -1.0, "budget"), ("scenario_box", "no-such-scenario", "unknown scenario"),
    ("methods_box", (), "at least one"), ("seed_box", -3, "seed"), ("startup_box", -1, "start-up trials")])
def test_bad_widget_values_are_shown_inline(field, value, words):
    dash = SearchDashboard(scenario="ppo-tiny-2cpu", budget_s=1)
    getattr(dash, field).value = value
    assert dash.start() is False and not dash.running
    assert words in dash.status.value and "Traceback" not in dash.status.value


def test_search_dashboard_passes_the_sampler_settings_and_shows_evaluations_per_second(monkeypatch):
    import re

    import realbench.search.optuna_search as optuna_search

    made = []
    real = optuna_search.make_sampler

    def spy(method, seed, multi_objective, x0=None, settings=None):
        sampler = real(method, seed, multi_objective, x0, settings)
        made.append((method, sampler))
        return sampler
    monkeypatch.setattr(optuna_search, "make_sampler", spy)
    dash = SearchDashboard(scenario="ppo-tiny-2cpu", methods=("mcmc", "tpe"), budget_s=1.0)
    dash.startup_box.value, dash.multivariate_box.value = 3, False
    assert dash.start()
    results = dash.wait(60)
    [(method, sampler)] = made
    assert method == "tpe" and sampler._n_startup_trials == 3 and sampler._multivariate is False
    # one row per method: its plans so far and plans per second, from its latest event
    rows = dict((m, (int(n.replace(",", "")), float(r.replace(",", "")))) for m, n, r in
                re.findall(r"<tr><td>(\w+)</td><td>([\d,]+)</td><td>([\d,.]+)</td></tr>", dash.rates.value))
    assert set(rows) == {"mcmc", "tpe"}
    for m, (plans, rate) in rows.items():
        e = dash.latest[m]
        assert plans == e.evaluations == results[m].evaluations and rate == pytest.approx(e.evaluations / e.seconds, abs=0.5)
    assert dash.rates in dash.widget.children[3].children


def test_plan_viewer_compares_two_plans():
    from realbench.cost import Estimator
    from realbench.cost.baselines import BASELINES
    from realbench.plan import load_scenario

    scenario = load_scenario("ppo-7b-7b-16gpu")
    est = Estimator(scenario)
    sym, heur = (est.options_of(BASELINES[k](est)) for k in ("symmetric", "heuristic"))
    viewer = PlanViewer()
    viewer.show(scenario, sym, "symmetric")
    assert "symmetric" in viewer.title.value and f"{viewer.estimate.time_per_iter_s:.4g}" in viewer.title.value
    # memory per device against two lines: the device's 80 GiB and the 72 GiB plans may use
    from bokeh.models import Span

    spans = {m.name: m.location for m in viewer.body.children[0]._model.references() if isinstance(m, Span)
             and m.name in ("capacity", "usable")}
    assert spans == {"capacity": 80.0, "usable": 72.0}
    viewer.compare(heur, names=("symmetric", "heuristic"))
    doc_model = viewer.body.children[0]
    titles = [m.title.text for m in doc_model._model.references() if getattr(m, "title", None) is not None
              and hasattr(m.title, "text")]
    assert any(t.startswith("mesh map") for t in titles) and any(t.startswith("time per iteration") for t in titles)


# -- dataflow editor -------------------------------------------------------------------------------------------
def test_dataflow_editor_add_remove_save_load(tmp_path):
    from realbench.widgets import DataflowEditor

    ed = DataflowEditor("ppo-tiny-cpu")
    seen = []
    ed.listeners.append(seen.append)
    assert len(ed.scenario.dataflow.calls) == 6 and len(ed.graph.children) == 1
    ed.name_box.value, ed.model_box.value, ed.kind_box.value = "critic_score", "critic", "inference"
    ed.inputs_box.value, ed.outputs_box.value = "seqs", "scores"
    ed.seqs_box.value, ed.len_box.value = 8, 16
    ed.add_button.click()
    assert "critic_score" in ed.scenario.dataflow.call_names and seen[-1] is ed.scenario
    assert ("actor_gen", "critic_score") in ed.scenario.dataflow.graph.edges  # a data edge on "seqs"
    before = ed.scenario
    ed.name_box.value, ed.model_box.value, ed.outputs_box.value = "orphan", "nobody", "other"  # unknown model
    ed.add_button.click()
    assert "unknown model" in ed.status.value and ed.scenario is before  # the valid one stays
    ed.remove_box.value = "critic_score"
    ed.remove_button.click()
    assert "critic_score" not in ed.scenario.dataflow.call_names
    path = tmp_path / "mine.yaml"
    ed.path_box.value = str(path)
    ed.save_button.click()
    assert path.exists() and "saved" in ed.status.value
    path.write_text(path.read_text())
    ed.save_button.click()  # exists, overwrite not ticked: refused, file kept
    assert "exists" in ed.status.value
    other = DataflowEditor("grpo-tiny-cpu")
    other.path_box.value = str(path)
    other.load_button.click()
    assert other.scenario.dataflow.call_names == ed.scenario.dataflow.call_names
    other.path_box.value = str(tmp_path / "missing.yaml")
    other.load_button.click()
    assert "no such file" in other.status.value


# -- cluster and profiler --------------------------------------------------------------------------------------
def test_cluster_panel_profiles_in_the_background(tmp_path):
    from realbench.runtime.profiler import ProfileRequest
    from realbench.widgets import ClusterPanel

    panel = ClusterPanel(nodes=2, gpus_per_node=8, device="h100")
    from realbench.plan import load_scenario

    moved = panel.apply(load_scenario("ppo-tiny-cpu"))
    assert (moved.cluster.nodes, moved.cluster.gpus_per_node, moved.cluster.device.name) == (2, 8, "h100")
    panel.out_box.value = str(tmp_path / "p.json")
    got = []
    panel.listeners.append(got.append)
    req = ProfileRequest(nproc=2, batches=(1, 2), lengths=(4, 8), repeats=3, warmup=1, passes=1, call_passes=1)
    assert panel.start_profile(req)
    assert panel.profile_button.disabled
    panel.wait(300)
    assert panel.profile is not None and got == [panel.profile] and (tmp_path / "p.json").exists()
    assert panel.progress.value == panel.progress.max > 10 and len(panel.curves.children) == 1
    assert panel.start_profile(req) is False and "exists" in panel.status.value  # never overwrites
    fresh = ClusterPanel()
    fresh.profile_path.value = str(tmp_path / "p.json")
    assert fresh.profile is not None
    fresh.profile_path.value = str(tmp_path / "nope.json")
    assert "no such file" in fresh.status.value


# -- run monitor -----------------------------------------------------------------------------------------------
def test_run_monitor_shows_live_steps():
    from realbench.cost import Estimator
    from realbench.cost.baselines import BASELINES
    from realbench.plan import load_scenario
    from realbench.widgets import RunMonitor

    scenario = load_scenario("ppo-tiny-2cpu")
    est = Estimator(scenario)
    mon = RunMonitor(steps=3)
    assert mon.start() is False  # no plan yet
    mon.set_plan(scenario, est.options_of(BASELINES["symmetric"](est)), "symmetric")
    assert mon.nproc_box.value == 2 and not mon.run_button.disabled
    mon.nproc_box.value = 3
    assert mon.start() is False and "processes" in mon.status.value
    mon.nproc_box.value = 2
    assert mon.start()
    result = mon.wait(300)
    assert result is not None and result["steps"] == 3, mon.error
    assert mon.metrics.data["step"] == [0, 1, 2] and len(mon.metrics.data["reward"]) == 3
    assert set(mon.calls.data["call"]) == set(scenario.dataflow.call_names)
    assert all(m > 0 for m in mon.calls.data["measured"]) and "done" in mon.status.value
    assert mon.stop_button.disabled
    assert "samples at step 2" in mon.samples.value  # the latest decoded (here: token id) samples
    assert result["calls"]["actor_gen"]["decode"] == "eager"  # compile_box unticked
    # the training form: a bad value is refused inline, a good one is the run's setting
    assert mon.training.boxes["learning_rate"].value == 1e-3  # the scenario's
    mon.training.boxes["epsilon"].value = -0.5
    assert mon.start() is False and "training.epsilon" in mon.status.value
    mon.training.boxes["epsilon"].value = 0.3
    assert mon._with_training(mon.scenario).training.epsilon == 0.3
    mon.save_box.value = str(__import__("pathlib").Path(__file__))  # a file: not a folder to save into
    assert mon.start() is False and "--save-hf" in mon.status.value
    mon.save_box.value = ""
    # stopped during a long run: the processes end at once and the monitor says so
    mon.steps_box.value = 10_000
    assert mon.start() and not mon.stop_button.disabled
    mon.stop_button.click()
    assert mon.wait(60) is None and not mon.running
    assert "stopped" in mon.error and not mon.run_button.disabled


def test_dataflow_editor_sets_the_training_settings():
    from realbench.widgets import DataflowEditor

    ed = DataflowEditor("grpo-tiny-cpu")
    assert ed.training.boxes["beta"].value == 0.0 and ed.training.boxes["loss_type"].value == "dapo"
    ed.training.boxes["beta"].value = 0.04
    ed.training.boxes["loss_type"].value = "dr_grpo"
    assert ed.apply_training() and ed.scenario.training.beta == 0.04 and ed.scenario.training.loss_type == "dr_grpo"
    assert ed.document["training"]["learning_rate"] == 1e-3  # what the scenario had stays
    # where the old log-probabilities come from reaches the train call, and its estimate
    before = ed.scenario.dataflow.call("actor_train")
    assert ed.training.boxes["old_logprobs"].value == "later_steps" == before.old_logprobs
    ed.training.boxes["old_logprobs"].value = "rollout"
    assert ed.apply_training() and ed.scenario.dataflow.call("actor_train").old_logprobs == "rollout"
    ed.training.boxes["top_p"].value = 1.5
    assert not ed.apply_training() and "training.top_p" in ed.status.value
    assert ed.scenario.training.top_p == 1.0  # the last valid scenario stays


def test_workbench_wires_the_widgets():
    from realbench.widgets import Workbench

    wb = Workbench("ppo-tiny-2cpu", budget_s=1)
    assert [wb.tabs.get_title(i) for i in range(7)] == ["Dataflow", "Engine", "Cluster", "Calibrate", "Search", "Plan",
                                                        "Run"]
    wb.cluster.nodes_box.value, wb.cluster.gpus_box.value, wb.cluster.device_box.value = 1, 2, "cpu"
    wb.use_cluster.click()
    assert wb.search.scenario_override is wb.editor.scenario and wb.editor.scenario.cluster.n_devices == 2
    wb.search.methods_box.value = ("mcmc",)
    assert wb.search.start()
    wb.search.wait(60)
    assert wb.viewer.estimate is not None and wb.monitor.options is not None and not wb.monitor.run_button.disabled


def test_run_monitor_marks_plan_switches_on_the_step_time_curve():
    from realbench.widgets import RunMonitor

    mon = RunMonitor(steps=3)
    versions = [0, 0, 1, 1, 2]
    summary = {"metrics": [{"step": s, "reward": 0.0, "loss": 0.0} for s in range(5)], "calls": {}, "samples": [],
               "timings": [{"step": s, "seconds": 0.1 * (s + 1), "plan_version": v} for s, v in enumerate(versions)]}
    mon._show(summary)
    assert mon.step_times.data["step"] == [0, 1, 2, 3, 4]
    assert mon.switch_marks.data == {"step": [2, 4], "seconds": [pytest.approx(0.3), pytest.approx(0.5)]}
    assert mon._replan().every == 0  # off unless asked
    mon.replan_box.value, mon.replan_budget_box.value = 3, 2.0
    assert (mon._replan().every, mon._replan().budget_s) == (3, 2.0)


def test_run_monitor_shows_the_staleness_of_asynchronous_plans():
    from realbench.cost import Estimator
    from realbench.plan import get_builtin
    from realbench.widgets import RunMonitor

    mon = RunMonitor(steps=3)
    scenario = get_builtin("grpo-tiny-cpu")
    for staleness, panels in ((0, 3), (1, 4)):  # a fourth panel only for a plan that runs ahead
        s = scenario.with_staleness(staleness)
        est = Estimator(s)
        mon.set_plan(s, est.options_of([int(est.candidates(i)[0]) for i in range(est.n)]))
        assert len(mon._figures(list(s.dataflow.call_names)).children) == panels
    summary = {"metrics": [{"step": k, "reward": 0.0, "loss": 0.0, "staleness": float(k > 0)} for k in range(3)],
               "calls": {}, "samples": [], "timings": [{"step": k, "seconds": 0.1} for k in range(3)]}
    mon._show(summary)
    assert mon.staleness.data == {"step": [0, 1, 2], "staleness": [0.0, 1.0, 1.0]}


def test_run_monitor_compiles_the_decode_steps_when_asked(monkeypatch):
    """The compile box is `realbench run --compile-decode`: it reaches run_plan."""
    from realbench.cost import Estimator
    from realbench.cost.baselines import BASELINES
    from realbench.plan import load_scenario
    from realbench.runtime import launch
    from realbench.widgets import RunMonitor

    seen = []
    monkeypatch.setattr(launch, "run_plan", lambda *a, **kw: seen.append(kw["compile_decode"]) or {"steps": 0})
    scenario = load_scenario("ppo-tiny-2cpu")
    est = Estimator(scenario)
    mon = RunMonitor(steps=1, profile=None)
    mon.set_plan(scenario, est.options_of(BASELINES["symmetric"](est)), "symmetric")
    for ticked in (False, True):
        mon.compile_box.value = ticked
        assert mon.start()
        mon.wait(60)
    assert seen == [False, True]
