"""The rules that let the suite run on several workers (pytest-xdist, `make test`):
* a test marked `alone` reads times it measures (a calibration, a race, a search's time budget),
  so it runs while no other test does; every other test runs beside the others. Each worker takes
  a lock around each test: shared for most, exclusive for `alone` ones, with writers first (a gate
  file), so that an `alone` test waits for the running ones to end and no new one starts meanwhile;
* a test that starts processes (local runs, the profiler, launchers) runs while no other such
  test does, beside tests that start none: two such tests at once put several busy processes on
  every core of this machine, which makes each of them several times slower than alone (their
  ranks wait on one another at every collective). The first process a test starts (subprocess or
  multiprocessing) takes an exclusive lock that the test keeps to its end; `unlocked()` starts
  processes that mostly wait (a notebook's kernel, whose own runs then share the machine).
Without xdist (plain `pytest`) the tests run one at a time anyway."""

import contextlib
import fcntl
import multiprocessing.process
import os
import subprocess
import tempfile
import threading
from pathlib import Path

import pytest

ALONE = "alone"


# the files that take longest here, first: a worker takes a file at a time (--dist loadfile), so
# that the long ones start early and the workers end together
LONGEST_FIRST = ("test_notebooks.py", "test_engines.py", "test_replan.py", "test_runtime_run.py", "test_profile.py",
                 "test_profile_cache.py", "test_async_run.py", "test_rollout.py", "test_search.py", "test_lora.py",
                 "test_runtime_core.py", "test_real_runs.py", "test_algorithm_fidelity.py")


def pytest_configure(config):
    config.addinivalue_line("markers", f"{ALONE}: reads the times it measures, so no other test runs meanwhile")
    if run_lock_files() is not None:  # (under xdist: every way a test starts a process takes the lock)
        subprocess.Popen.__init__ = _taking_the_lock(subprocess.Popen.__init__)
        multiprocessing.process.BaseProcess.start = _taking_the_lock(multiprocessing.process.BaseProcess.start)


def pytest_collection_modifyitems(session, config, items):
    first = {name: k for k, name in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: first.get(item.path.name, len(first)))  # (stable: each file's order kept)


def run_lock_files() -> "tuple[Path, Path] | None":
    """The gate and the lock every worker of this run shares (None: not under xdist)."""
    run = os.environ.get("PYTEST_XDIST_TESTRUNUID")
    if not run:
        return None
    folder = Path(tempfile.gettempdir())
    return folder / f"realbench-tests-{run}.gate", folder / f"realbench-tests-{run}.lock"


class ProcessesLock:
    """The lock a test takes when it first starts a process (`take`), kept until it ends (`end`)."""

    def __init__(self):
        self.path: "Path | None" = None  # (set while a test runs under xdist)
        self.held = None
        self.unlocked = 0
        self.guard = threading.Lock()  # (a test's threads may start processes at once)

    def begin(self, path: Path) -> None:
        self.path = path

    def take(self) -> None:
        with self.guard:
            if self.path is None or self.held is not None or self.unlocked:
                return
            self.held = open(self.path, "a")
            fcntl.flock(self.held, fcntl.LOCK_EX)

    def end(self) -> None:
        with self.guard:
            if self.held is not None:
                fcntl.flock(self.held, fcntl.LOCK_UN)
                self.held.close()
            self.held, self.path = None, None


processes_lock = ProcessesLock()


@contextlib.contextmanager
def unlocked():
    """Processes started inside take no lock (ones that mostly wait)."""
    processes_lock.unlocked += 1
    try:
        yield
    finally:
        processes_lock.unlocked -= 1


def _taking_the_lock(start):
    def started(self, *args, **kwargs):
        processes_lock.take()
        return start(self, *args, **kwargs)
    return started


@contextlib.contextmanager
def flocked(path: Path, mode: int):
    with open(path, "a") as f:
        fcntl.flock(f, mode)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    """Around the test's setup, call and teardown (module fixtures included): shared, or
    exclusive for an `alone` test. The gate is held only while taking the lock (for an `alone`
    test, until it has it), so a waiting `alone` test keeps new tests from starting."""
    files = run_lock_files()
    if files is None:
        yield
        return
    gate, lock = files
    mode = fcntl.LOCK_EX if item.get_closest_marker(ALONE) else fcntl.LOCK_SH
    with open(lock, "a") as held:
        with flocked(gate, fcntl.LOCK_EX):
            fcntl.flock(held, mode)
        processes_lock.begin(lock.with_suffix(".processes"))  # (taken inside the shared lock: no cycle)
        try:
            yield
        finally:
            processes_lock.end()
            fcntl.flock(held, fcntl.LOCK_UN)
