"""The CLI's file handling: scenarios, validate, and random mutations of valid files."""

import json

import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from realbench.plan import get_builtin, plan_from_options


def test_scenarios_json(cli):
    code, out, err = cli("scenarios", "--json")
    assert code == 0
    rows = json.loads(out)
    names = {r["name"] for r in rows}
    assert {"ppo-7b-7b-16gpu", "ppo-13b-7b-32gpu", "ppo-34b-7b-64gpu", "ppo-70b-7b-128gpu", "grpo-7b-16gpu",
            "remax-7b-16gpu", "dpo-7b-8gpu", "sft-7b-8gpu", "ppo-7b-7b-16gpu-long", "ppo-tiny-cpu"} <= names
    for r in rows:
        assert {"name", "algorithm", "models", "gpus", "plan_space"} <= set(r)
    assert next(r for r in rows if r["name"] == "ppo-70b-7b-128gpu")["gpus"] == 128


def test_scenarios_table_and_dump(cli, tmp_path):
    code, out, _ = cli("scenarios")
    assert code == 0 and "ppo-tiny-cpu" in out
    path = tmp_path / "s.yaml"
    assert cli("scenarios", "--dump", "ppo-tiny-cpu", "--out", path)[0] == 0
    code, out, _ = cli("validate", path)
    assert code == 0 and "valid scenario ppo-tiny-cpu" in out
    # an existing file is not overwritten silently
    code, _, err = cli("scenarios", "--dump", "ppo-tiny-cpu", "--out", path)
    assert code == 2 and "exists" in err


def write_plan(tmp_path, name="ppo-tiny-cpu"):
    s = get_builtin(name)
    plan = plan_from_options(s, {n: o[0] for n, o in s.options.items()})
    path = tmp_path / "plan.yaml"
    plan.save(path)
    return path


def test_validate_plan(cli, tmp_path):
    path = write_plan(tmp_path)
    code, out, _ = cli("validate", path)
    assert code == 0 and "valid plan" in out


def test_validate_errors_are_one_line(cli, tmp_path):
    cases = {
        "missing.yaml": None,
        "garbled.yaml": "a: [1, 2\n",
        "list.yaml": "- 1\n- 2\n",
        "noschema.yaml": "name: x\n",
        "badtype.json": json.dumps({"schema": "realbench.scenario/1", "name": "x", "cluster": "big",
                                    "models": {}, "dataflow": {}}),
        "fraction.yaml": "schema: realbench.scenario/1\nname: x\nalgorithm: sft\nmodels: {actor: llama-7b}\n"
                         "cluster: {nodes: 1, gpus_per_node: 8, device: h100, memory_fraction: 1.5}\n"
                         "dataflow: {algorithm: sft, seqs: 64, seq_len: 512}\n",
    }
    for fname, text in cases.items():
        p = tmp_path / fname
        if text is not None:
            p.write_text(text)
        code, out, err = cli("validate", p)
        assert code == 2, fname
        assert err.count("\n") == 1 and err.startswith("realbench: error: "), (fname, err)
        assert str(p) in err
        if fname == "fraction.yaml":
            assert "cluster.memory_fraction" in err and "1.5" in err


def test_bad_flags_are_one_line(cli):
    code, _, err = cli("estimate", "--scenario", "nope", "--baseline", "symmetric")
    assert code == 2 and err.count("\n") == 1 and "unknown scenario" in err
    code, _, err = cli("frobnicate")
    assert code == 2 and err.count("\n") == 1


# -- random mutations of valid files -----------------------------------------------------------------
VALUES = st.one_of(st.none(), st.booleans(), st.integers(-10**12, 10**12), st.floats(allow_nan=True),
                   st.text(max_size=12), st.lists(st.integers(-3, 3), max_size=3),
                   st.dictionaries(st.text(max_size=4), st.integers(), max_size=2))


def paths(doc, prefix=()):
    yield prefix
    if isinstance(doc, dict):
        for k, v in doc.items():
            yield from paths(v, prefix + (k,))
    elif isinstance(doc, list):
        for i, v in enumerate(doc):
            yield from paths(v, prefix + (i,))


def mutate(doc, path, action, value):
    if not path:
        return value if action == "replace" else doc
    parent = doc
    for p in path[:-1]:
        parent = parent[p]
    key = path[-1]
    if action == "delete":
        if isinstance(parent, dict):
            del parent[key]
        else:
            parent.pop(key)
    elif action == "replace":
        parent[key] = value
    elif action == "rename" and isinstance(parent, dict):
        parent[str(value)[:8] + "_"] = parent.pop(key)
    return doc


def check_clean(cli, path):
    code, out, err = cli("validate", path)
    assert code in (0, 2), err
    if code == 2:
        lines = err.splitlines()
        assert len(lines) == 1 and lines[0].startswith("realbench: error: "), err
        assert "Traceback" not in err


def documents():
    s = get_builtin("ppo-tiny-cpu")
    plan = plan_from_options(s, {n: o[len(o) // 2] for n, o in s.options.items()})
    return {"scenario": s.to_document(), "plan": plan.to_document()}


DOCS = documents()


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(kind=st.sampled_from(sorted(DOCS)), data=st.data(), fmt=st.sampled_from(["yaml", "json"]),
       action=st.sampled_from(["delete", "replace", "rename", "truncate"]), value=VALUES)
def test_mutated_files_fail_cleanly(cli, tmp_path, kind, data, fmt, action, value):
    import copy

    doc = copy.deepcopy(DOCS[kind])
    all_paths = list(paths(doc))
    path = data.draw(st.sampled_from(all_paths))
    text = None
    if action == "truncate":
        full = yaml.safe_dump(doc) if fmt == "yaml" else json.dumps(doc)
        text = full[: data.draw(st.integers(0, len(full)))]
    else:
        doc = mutate(doc, path, action, value)
        try:
            text = yaml.safe_dump(doc) if fmt == "yaml" else json.dumps(doc)
        except (ValueError, TypeError):
            return
    f = tmp_path / f"{kind}.{fmt}"
    f.write_text(text)
    check_clean(cli, f)
