"""An engine's check script (realbench/engines/*_check.py) in its `serve` mode, for the tests:
the engine imported once for a module's checks (verl takes longer to import than any check)."""

import json
import os
import select
import subprocess
import tempfile
from pathlib import Path


class CheckServer:
    def __init__(self, python: Path, script: Path, timeout_s: float = 300):
        assert Path(python).is_file(), f"the engine's environment is missing: run `make engines` ({python})"
        self.timeout_s = timeout_s
        self.log = tempfile.TemporaryFile(mode="w+")  # (its warnings: a pipe nobody reads would fill)
        self.process = subprocess.Popen([str(python), str(script), "serve"], stdin=subprocess.PIPE,
                                        stdout=subprocess.PIPE, stderr=self.log, text=True, bufsize=1)

    def __call__(self, *args) -> dict:
        """The JSON line the script prints for `args`, run from this process's folder."""
        request = {"argv": [str(a) for a in args], "cwd": os.getcwd()}
        self.process.stdin.write(json.dumps(request) + "\n")
        self.process.stdin.flush()
        ready, _, _ = select.select([self.process.stdout], [], [], self.timeout_s)
        line = self.process.stdout.readline() if ready else ""
        if not line:
            self.log.seek(0)
            raise AssertionError(f"{args[0]}: no answer from the check server: {self.log.read()[-2000:]}")
        return json.loads(line)["result"]

    def close(self) -> None:
        self.process.stdin.close()
        self.process.wait(timeout=60)
        self.log.close()
