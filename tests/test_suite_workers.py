"""The suite's own rule for its workers (tests/workers.py), run on a suite of sleeping tests:
under `pytest -n 2` the other tests run two at a time, and none runs while an `alone` one does."""

import json
import os
import subprocess
import sys
from pathlib import Path

TESTS = Path(__file__).resolve().parent

SUITE = {
    "conftest.py": "pytest_plugins = ('workers',)\n",
    "test_first.py": """
import json, os, time, pytest

def spent(name, seconds):
    start = time.time()
    time.sleep(seconds)
    with open(os.environ["SPANS"], "a") as f:
        f.write(json.dumps([name, start, time.time()]) + "\\n")

@pytest.mark.parametrize("i", range(6))
def test_beside(i):
    spent(f"first{i}", 0.5)
""",
    "test_second.py": """
import pytest
from test_first import spent

@pytest.mark.parametrize("i", range(3))
def test_before(i):
    spent(f"before{i}", 0.4)

@pytest.mark.alone
def test_alone():
    spent("alone", 1.5)

@pytest.mark.parametrize("i", range(3))
def test_after(i):
    spent(f"after{i}", 0.4)
""",
}


def test_an_alone_test_runs_while_no_other_does_and_the_others_run_two_at_a_time(tmp_path):
    for name, text in SUITE.items():
        (tmp_path / name).write_text(text)
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_XDIST")}
    env.update(SPANS=str(tmp_path / "spans.jsonl"), PYTHONPATH=os.pathsep.join([str(TESTS), str(tmp_path)]))
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-n", "2", "--dist", "loadfile", "-p", "no:cacheprovider",
                           str(tmp_path)], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    spans = {name: (start, end) for name, start, end in map(json.loads, (tmp_path / "spans.jsonl").read_text().splitlines())}
    assert len(spans) == 13

    def overlap(a, b):
        return spans[a][0] < spans[b][1] and spans[b][0] < spans[a][1]

    assert not [name for name in spans if name != "alone" and overlap(name, "alone")]
    assert any(overlap(f"first{i}", f"before{j}") or overlap(f"first{i}", f"after{j}") for i in range(6) for j in range(3))
