import io
import contextlib

import pytest

from realbench.cli import main


@pytest.fixture
def cli():
    """Run the realbench CLI in-process: returns (exit status, stdout, stderr)."""
    def run(*argv):
        out, err = io.StringIO(), io.StringIO()
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                code = main([str(a) for a in argv])
            except SystemExit as e:  # argparse
                code = e.code
        return code, out.getvalue(), err.getvalue()
    return run
