"""The packages import downward only: each layer may use the layers below it, never one above
(imports inside functions count too). The README's "Inside" section draws the same layers."""

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent / "realbench"

# bottom to top; a package may import its own modules, those of lower layers, and (top layer
# only) its neighbours
LAYERS = [
    {"errors", "cache"},
    {"schema"},
    {"models", "hardware", "dataflow"},
    {"plan"},
    {"cost"},
    {"engines"},
    {"search", "report", "calibrate"},
    {"runtime", "export"},
    {"bench", "cli", "widgets", "examples", "__main__", "__init__"},
]
LAYER = {name: i for i, names in enumerate(LAYERS) for name in names}


def imported_packages(path: Path) -> set[str]:
    """The realbench packages (first component after `realbench.`) that a file imports."""
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        names = []
        if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "realbench":
            names = [node.module] if node.module != "realbench" else [f"realbench.{a.name}" for a in node.names]
        elif isinstance(node, ast.Import):
            names = [a.name for a in node.names if a.name.split(".")[0] == "realbench"]
        out |= {n.split(".")[1] for n in names if "." in n}
    return out


def package_of(path: Path) -> str:
    rel = path.relative_to(ROOT)
    return rel.parts[0] if len(rel.parts) > 1 else rel.stem


def test_every_package_is_in_a_layer():
    packages = {package_of(p) for p in ROOT.rglob("*.py")}
    assert packages == set(LAYER), packages ^ set(LAYER)


def test_imports_point_down():
    upward = []
    for path in sorted(ROOT.rglob("*.py")):
        own = package_of(path)
        for used in imported_packages(path) - {own}:
            top = LAYER[own] == len(LAYERS) - 1
            if LAYER[used] > LAYER[own] or (LAYER[used] == LAYER[own] and not top):
                upward.append(f"{path.relative_to(ROOT.parent)} imports realbench.{used}")
    assert not upward, "\n".join(upward)


def test_the_plan_is_read_without_the_runtime():
    """Reading a scenario and estimating a plan load
    nothing of realbench.runtime (a fresh interpreter, so no other test's imports count)."""
    import subprocess
    import sys

    code = ("import sys; from realbench.plan import load_scenario; from realbench.cost import Estimator; "
            "e = Estimator(load_scenario('ppo-7b-7b-16gpu')); e.estimate(tuple(int(c[0]) for c in "
            "[e.candidates(i) for i in range(e.n)])); "
            "print(sorted(m for m in sys.modules if m.startswith('realbench.runtime')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]", out
