"""`realbench lab`: JupyterLab on the notebooks (quickstart, dataflow, profiling, search, runs,
export) and the tutorials."""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path

from realbench.cli import log, non_negative_int
from realbench.errors import ConfigError


def default_folder() -> Path:
    """The repository's folder that holds notebooks/ and tutorials/ (an editable install), else
    the current folder."""
    here = Path(__file__).resolve().parents[2]
    return here if (here / "notebooks").is_dir() else Path.cwd()


def lab_command(folder: Path, port: int, no_browser: bool, token: str | None, ip: str) -> list[str]:
    cmd = [sys.executable, "-m", "jupyterlab", f"--ServerApp.root_dir={folder}", f"--ServerApp.ip={ip}"]
    notebooks = folder / "notebooks" / "01-quickstart.ipynb"
    if notebooks.exists():
        cmd.append(f"--LabApp.default_url=/lab/tree/notebooks/{notebooks.name}")
    if port:
        cmd.append(f"--ServerApp.port={port}")
    if no_browser:
        cmd.append("--no-browser")
    if token is not None:
        cmd.append(f"--IdentityProvider.token={token}")
    if hasattr(os, "geteuid") and os.geteuid() == 0:  # containers often run as root; JupyterLab refuses it
        cmd.append("--allow-root")
    return cmd


def add_parser(sub) -> None:
    p = sub.add_parser("lab", help="start JupyterLab on the notebooks and tutorials")
    p.add_argument("--dir", help="folder to serve (default: the one holding notebooks/ and tutorials/)")
    p.add_argument("--port", type=non_negative_int, default=0, help="port (default: JupyterLab's choice)")
    p.add_argument("--ip", default="127.0.0.1", help="the address JupyterLab listens on")
    p.add_argument("--no-browser", action="store_true", help="do not open a browser (print the address)")
    p.add_argument("--token", help="access token (default: JupyterLab makes one and prints the URL)")
    p.add_argument("--print-command", action="store_true", help="print the command instead of running it")
    p.set_defaults(handler=run)


def run(args) -> int:
    folder = Path(args.dir) if args.dir else default_folder()
    if not folder.is_dir():
        raise ConfigError("is not a folder", "--dir", str(folder))
    if importlib.util.find_spec("jupyterlab") is None:
        raise ConfigError("JupyterLab is not installed (pip install 'realbench[lab]')")
    cmd = lab_command(folder.resolve(), args.port, args.no_browser, args.token, args.ip)
    if args.print_command:
        print(" ".join(cmd))
        return 0
    log(f"JupyterLab on {folder.resolve()}")
    os.execv(sys.executable, cmd)
    return 0  # not reached
