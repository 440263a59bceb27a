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


# tests that start processes, by subprocess in one file and by multiprocessing in the other (the
# workers take a file each), beside ones that start none: the first subprocess test, holding the
# lock, waits for one of those to run on the other worker; one test starts a process unlocked, then
# one locked
PROCESS_SUITE = {
    "conftest.py": "pytest_plugins = ('workers',)\n",
    "test_subprocesses.py": """
import json, os, subprocess, sys, time, pytest

def spent(name, start):
    with open(os.environ["SPANS"], "a") as f:
        f.write(json.dumps([name, start, time.time()]) + "\\n")

def record(name, seconds):  # (run by the processes: their own spans)
    start = time.time()
    time.sleep(seconds)
    spent(name, start)

@pytest.mark.parametrize("i", range(3))
def test_a_subprocess(i):
    subprocess.run([sys.executable, "-c", f"from test_subprocesses import record; record('subprocess{i}', 0.6)"],
                   check=True)
    if i == 0:  # (holding the lock: a test that starts no process runs meanwhile on the other worker)
        marker, start = os.environ["SPANS"] + ".plain", time.time()
        while not os.path.exists(marker) and time.time() - start < 60:
            time.sleep(0.05)
        assert os.path.exists(marker)

@pytest.mark.parametrize("i", range(4))
def test_plain(i):
    start = time.time()
    time.sleep(0.4)
    spent(f"plain{i}", start)
""",
    "test_processes.py": """
import multiprocessing, os, subprocess, sys, time, pytest
from test_subprocesses import record, spent
from workers import processes_lock, unlocked

def test_plain_first():
    open(os.environ["SPANS"] + ".plain", "w").close()

@pytest.mark.parametrize("i", range(3))
def test_a_multiprocessing_process(i):
    p = multiprocessing.get_context("spawn").Process(target=record, args=(f"process{i}", 0.6))
    p.start()
    p.join()
    assert p.exitcode == 0

def test_unlocked():
    start = time.time()
    with unlocked():  # (no lock taken)
        subprocess.run([sys.executable, "-c", "pass"], check=True)
    assert processes_lock.held is None
    subprocess.run([sys.executable, "-c", "pass"], check=True)
    assert processes_lock.held is not None  # (kept to the test's end)
    spent("unlocked", start)

@pytest.mark.parametrize("i", range(4))
def test_plain_too(i):
    start = time.time()
    time.sleep(0.4)
    spent(f"plain_too{i}", start)
""",
}


def run_suite(tmp_path, suite: dict[str, str]) -> dict[str, tuple[float, float]]:
    """Run `suite` (file name -> text) under `pytest -n 2 --dist loadfile`: each test's span."""
    for name, text in suite.items():
        (tmp_path / name).write_text(text)
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_XDIST")}
    env.update(SPANS=str(tmp_path / "spans.jsonl"), PYTHONPATH=os.pathsep.join([str(TESTS), str(tmp_path)]))
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-n", "2", "--dist", "loadfile", "-p", "no:cacheprovider",
                           str(tmp_path)], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    return {name: (start, end) for name, start, end in map(json.loads, (tmp_path / "spans.jsonl").read_text().splitlines())}


def test_tests_that_start_processes_run_one_at_a_time_beside_the_others(tmp_path):
    spans = run_suite(tmp_path, PROCESS_SUITE)
    assert len(spans) == 15

    def overlap(a, b):
        return spans[a][0] < spans[b][1] and spans[b][0] < spans[a][1]

    by_subprocess, by_multiprocessing = [f"subprocess{i}" for i in range(3)], [f"process{i}" for i in range(3)]
    assert not [(a, b) for a in by_subprocess for b in by_multiprocessing if overlap(a, b)]


def test_an_alone_test_runs_while_no_other_does_and_the_others_run_two_at_a_time(tmp_path):
    spans = run_suite(tmp_path, SUITE)
    assert len(spans) == 13

    def overlap(a, b):
        return spans[a][0] < spans[b][1] and spans[b][0] < spans[a][1]

    assert not [name for name in spans if name != "alone" and overlap(name, "alone")]
    assert any(overlap(f"first{i}", f"before{j}") or overlap(f"first{i}", f"after{j}") for i in range(6) for j in range(3))
