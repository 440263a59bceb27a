"""The manual's checkable statements (the README and docs/, read as one by tests/manual.py), and the
front page's numbers, checked against the code: the command table against the
parser, the scenario list, the file examples, and the plan-space counts and optimality
statements of the benchmark section. (Measured numbers are the benchmarks'; the claims about
behaviour are each tested where that behaviour lives.)"""

import math
import re

import pytest
import yaml

from realbench.cli import build_parser
from realbench.cli.reference import subcommands as subcommands_of
from realbench.cost import Estimator
from realbench.plan import BUILTIN, get_builtin, load_scenario
from realbench.plan.scenario import scenario_from_document
from realbench.search import SearchSpace, run_search
from realbench.search.exhaustive import space_size

from manual import MANUAL as README  # the README and the pages of docs/ (tests/manual.py)
from manual import README as FRONT  # the README alone: the front page
from manual import ROOT, section


def subcommands():
    return subcommands_of(build_parser())


def test_the_command_table_names_only_commands_and_flags_that_exist():
    table = section("## The command line")
    rows = re.findall(r"^\| `realbench (\w+)([^`]*)` \|", table, re.M)
    assert len(rows) >= 10
    commands = subcommands()
    for name, usage in rows:
        assert name in commands, name
        parser = commands[name]
        nested = subcommands_of(parser)
        if nested:  # `realbench checkpoint convert ...`: the flags of that action
            parser = nested[usage.split()[0]]
        known = {s for a in parser._actions for s in a.option_strings}
        for flag in re.findall(r"--[a-z][a-z0-9-]*", usage):
            assert flag in known, (name, flag)
    assert set(commands) == {name for name, _ in rows}  # and every command is in the table


def test_the_scenario_list_is_the_built_in_one():
    text = README[README.index("Built-in scenarios:"):]
    text = text[:text.index("\n\n")]
    assert set(re.findall(r"`([a-z0-9.-]+)`", text)) == set(BUILTIN)


def yaml_blocks():
    return [yaml.safe_load(b.replace("  ...\n", "")) for b in re.findall(r"```yaml\n(.*?)```", README, re.S)]


def test_the_three_file_recipe_is_the_example_job(tmp_path):
    """The recipe's scenario validates beside the files `realbench.examples.tiny_grpo_job`
    makes, and is the scenario it writes."""
    from realbench.examples import tiny_grpo_job

    recipe = next(b for b in yaml_blocks() if b.get("name") == "grpo-arithmetic")
    made = tiny_grpo_job(tmp_path)
    assert recipe == yaml.safe_load(made.read_text())
    s = scenario_from_document(recipe, str(made))
    assert s.data.rows == 40 and s.models["reward"].name == "rewards.py:digits"


def test_the_file_examples_are_valid():
    blocks = yaml_blocks()
    scenario = next(b for b in blocks if b.get("name") == "my-ppo")
    assert scenario_from_document(scenario).name == "my-ppo"
    plan = next(b for b in blocks if b.get("schema") == "realbench.plan/1")
    assert plan["schema"] == "realbench.plan/1"
    s = load_scenario(plan["scenario"])
    for call, placement in plan["calls"].items():  # the example placements are options of the scenario
        options = s.options[call]
        assert any(o.mesh.label(s.cluster.gpus_per_node) == placement["mesh"] and (o.strategy.dp, o.strategy.tp, o.strategy.pp,
                   o.strategy.micro_batches) == (placement["dp"], placement["tp"], placement["pp"],
                                                 placement["micro_batches"]) for o in options), call


def exact_rows():
    table = section("## Benchmarks")
    return re.findall(r"^\| ([a-z0-9-]+) \| ([\d,]+) \| ([\d,]+) \| [\d.]+ \|", table, re.M)


@pytest.mark.parametrize("name,pruned,evaluated", exact_rows())
def test_the_plan_space_counts_are_the_pruned_space_and_what_exhaustive_search_evaluates(name, pruned, evaluated):
    est = Estimator(get_builtin(name))
    assert space_size(SearchSpace(est)) == int(pruned.replace(",", ""))
    r = run_search(est, "exhaustive", 600)
    assert r.complete and r.evaluations == int(evaluated.replace(",", ""))


def test_the_exact_table_says_where_the_baseline_is_already_optimal():
    rows = {name: pruned for name, pruned, _ in exact_rows()}
    assert len(rows) >= 3
    text = section("## Benchmarks")
    note = re.search(r"\(On (.*?) the best baseline is already optimal, and on `([a-z0-9-]+)` the optimum\s+is\s+"
                     r"([\d.]+)%\s+faster\s+than\s+it,\s+so\s+only\s+`([a-z0-9-]+)`", text, re.S)
    already, near, gain = set(re.findall(r"`([a-z0-9-]+)`", note.group(1))), note.group(2), float(note.group(3))
    assert already | {near, note.group(4)} == set(rows)
    for name in rows:
        est = Estimator(get_builtin(name))
        r = run_search(est, "exhaustive", 600)
        best_baseline = min(r.baselines.values())
        if name in already:
            assert r.best_time_s == pytest.approx(best_baseline, rel=1e-12), name
        elif name == near:
            assert round((1 - r.best_time_s / best_baseline) * 100, 1) == gain, name
        else:
            assert r.best_time_s < 0.95 * best_baseline, name


def test_random_plans_of_the_7b_scenario_do_not_beat_the_symmetric_baseline():
    """"among 100,000 random plans of ppo-7b-7b-16gpu none beats the symmetric baseline"."""
    import numpy as np

    text = section("## Benchmarks")
    count = int(re.search(r"among ([\d,]+) random plans of\s+`ppo-7b-7b-16gpu` none beats the symmetric", text)
                .group(1).replace(",", ""))
    est = Estimator(get_builtin("ppo-7b-7b-16gpu"))
    space = SearchSpace(est)
    symmetric = run_search(est, "random", 1, max_evaluations=1).baselines["symmetric"]
    rng = np.random.default_rng(0)
    best = math.inf
    for start in range(0, count, 25_000):
        C = np.stack([rng.choice(c, size=min(25_000, count - start)) for c in space.pruned], axis=1)
        t, _, ok = space.objective(C)
        best = min(best, t[ok].min() if ok.any() else math.inf)
    assert best > symmetric


def test_the_settings_table_has_every_training_setting_and_says_where_trl_differs():
    from realbench.plan.training import TrainingSpec

    start = README.index("| key | default | used by | what it does | against TRL |")
    rows = README[start:README.index("\n\n", start)].splitlines()[2:]
    named = {k for row in rows for k in re.findall(r"`(\w+)`", row.split("|")[1])}
    assert named == set(TrainingSpec.model_fields) - {"models", "weight_decay_embeddings"}
    for row in rows:  # five cells, the last saying how it compares with TRL
        cells = [c.strip() for c in row.strip("|").split("|")]
        assert len(cells) == 5 and cells[4], row


# -- the front page (README.md): at most 200 lines, and each number it shows is the code's ------------

def test_the_front_page_is_short_and_its_links_lead_somewhere():
    assert len(FRONT.splitlines()) <= 200
    links = re.findall(r"\]\(([^)#]+)\)", FRONT)
    assert len(links) >= 15
    for link in links:
        assert (ROOT / link).exists(), link


def test_the_pictures_plan_is_what_its_caption_says():
    """docs/assets/plan.png is the HTML report of docs/assets/plan.yaml; the caption's numbers are
    its estimate and the symmetric baseline's."""
    from realbench.cost.baselines import symmetric_plan
    from realbench.plan import load_plan

    caption = re.search(r"\*A plan of `([a-z0-9-]+)`(.*?)\*", FRONT, re.S)
    scenario, options = load_plan(ROOT / "docs" / "assets" / "plan.yaml")[1:]
    assert scenario.name == caption.group(1)
    est = Estimator(scenario)
    result = est.estimate(est.choice_of(options))
    said = re.search(r"in ([\d.]+) s\. Estimated ([\d.]+) s an iteration against the symmetric plan's ([\d.]+) s",
                     caption.group(2).replace("\n", " "))
    assert float(said.group(1)) == round(result.realloc_s, 1)
    assert float(said.group(2)) == round(result.time_per_iter_s, 2)
    assert float(said.group(3)) == round(est.estimate(symmetric_plan(est)).time_per_iter_s, 2)
    assert (options["actor_gen"].strategy.tp, options["actor_train"].strategy.pp) == (4, 4)
    assert {options["reward_inf"].mesh.label(8), options["ref_inf"].mesh.label(8)} == {"n0", "n1"}


def test_the_catalogue_count_and_the_families_table_are_the_codes():
    from realbench.models import catalogue
    from realbench.models.families import families

    assert f"a catalogue of {len(catalogue.names())} hub configs" in FRONT
    table = section("## Models: priced and run", FRONT)
    said = {}
    for first, priced, run in re.findall(r"^\| ([a-z0-9_, ]+?)(?: \(.*?\))? \| (yes|no) \| (.*?) \|$", table, re.M):
        for family in first.split(", "):
            said[family] = (priced == "yes", run)
    assert set(said) == set(families())
    for family, f in families().items():
        assert said[family][0], family
        assert said[family][1].startswith("yes") == f.runs or (said[family][1].startswith("without") and f.runs), family


def test_the_coverage_table_is_the_measured_runs_json():
    import json

    from realbench.bench.tables import coverage_table

    measured = json.loads((ROOT / "docs" / "measurements" / "data" / "bench-coverage.json").read_text())
    assert coverage_table(measured, refusals=0) in FRONT
    total = sum(e["rl_jobs"] for e in measured["engines"].values())
    assert measured["share_priced"] == pytest.approx(sum(e["priced"] for e in measured["engines"].values()) / total)


def test_every_refused_example_is_counted_by_a_feature_the_readme_lists_as_not_priced():
    """The README's list of refusals is the measured run's, each refusal's feature is the one its
    key and message name (coverage.feature_of), and none is "other": every example refused is
    refused for something the list names."""
    import json

    from realbench.bench.coverage import feature_of
    from realbench.bench.tables import coverage_features_list

    measured = json.loads((ROOT / "docs" / "measurements" / "data" / "bench-coverage.json").read_text())
    assert coverage_features_list(measured) in FRONT
    refused = [r for r in measured["rows"] if r["status"] == "refused"]
    assert refused and all(r["feature"] == feature_of(r["reason"]) != "other" for r in refused)
    assert sum(sum(e["refused_features"].values()) for e in measured["engines"].values()) == len(refused)


def test_the_front_pages_command_list_is_the_parsers():
    listed = re.search(r"`realbench ([a-z |\n]+)`: every command", FRONT).group(1)
    assert [w for w in re.split(r"[\s|]+", listed) if w] == list(subcommands())
