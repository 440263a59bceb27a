"""Shared fixtures. The suite runs on several workers (`make test`): see tests/workers.py for
the rule that keeps a test marked `alone` from running beside any other."""

import contextlib
import fcntl
import io
import os

import pytest

from realbench.cli import main

pytest.register_assert_rewrite("workers")  # (imported here before pytest loads it as a plugin)
from workers import flocked, run_lock_files  # noqa: E402

pytest_plugins = ("workers",)  # the workers' hooks


@pytest.fixture(scope="session", autouse=True)
def machine_profile_cache(tmp_path_factory):
    """The tests never touch the user's profile cache: a session's own (inherited by the
    processes and notebook kernels the tests start), with this machine's quick profiles for 2
    and 4 processes of the tiny models taken once up front, so that no test's output depends on
    whether it happened to be the first to need one. Under xdist the workers share one: the first
    measures it while the others wait for it (their first tests need it), so that nothing else
    runs while it is measured."""
    from dataclasses import replace

    from realbench.cache import CACHE_ENV
    from realbench.runtime.profile_cache import machine_profile, quick_request
    from realbench.models import get_model

    before = os.environ.get(CACHE_ENV)
    shared = run_lock_files() is not None
    root = tmp_path_factory.getbasetemp().parent if shared else tmp_path_factory.mktemp("run")
    os.environ[CACHE_ENV] = str(root / "realbench-cache")
    with flocked(root / "realbench-cache.lock", fcntl.LOCK_EX):
        done = root / "realbench-cache.measured"
        if not done.exists():
            for processes in (2, 4):  # one pass over the whole calls (a user's has three): the tests
                # check what is done with the measurements, not how steady they are; the time counts
                machine_profile(processes, [get_model("llama-tiny")],
                                request=replace(quick_request(processes), call_passes=1))
            done.touch()
    yield os.environ[CACHE_ENV]
    if before is None:
        os.environ.pop(CACHE_ENV, None)
    else:
        os.environ[CACHE_ENV] = before


def run_cli(*argv):
    """Run the realbench CLI in-process: returns (exit status, stdout, stderr)."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = main([str(a) for a in argv])
        except SystemExit as e:  # argparse
            code = e.code
    return code, out.getvalue(), err.getvalue()


@pytest.fixture
def cli():
    return run_cli


@pytest.fixture(scope="module")
def cli_once():
    """The same runner, for module-scoped fixtures (a benchmark run once per file)."""
    return run_cli
