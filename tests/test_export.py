"""realbench export: launch forms for a cluster, run here as two "nodes", and the HTML report."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from realbench.plan import load_plan
from realbench.runtime.local import free_port

VENV_BIN = str(Path(sys.executable).parent)

TWO_NODE_PLAN = {
    "schema": "realbench.plan/1",
    "scenario": "ppo-tiny-2x2cpu",
    "calls": {  # meshes on one node and across both
        "actor_gen": {"mesh": "n0-1", "dp": 4, "tp": 1, "pp": 1},
        "reward_inf": {"mesh": "n0", "dp": 1, "tp": 2, "pp": 1},
        "ref_inf": {"mesh": "n1", "dp": 2, "tp": 1, "pp": 1},
        "critic_inf": {"mesh": "n1", "dp": 1, "tp": 1, "pp": 2, "micro_batches": 2},
        "actor_train": {"mesh": "n0-1", "dp": 2, "tp": 2, "pp": 1},
        "critic_train": {"mesh": "n0-1", "dp": 2, "tp": 1, "pp": 2, "micro_batches": 2},
    },
}


@pytest.fixture(scope="module")
def searched_70b(tmp_path_factory):
    """A searched plan of ppo-70b-7b-128gpu (with its search curve in the plan's origin)."""
    from realbench.cli import main

    path = tmp_path_factory.mktemp("p70") / "ppo-70b.yaml"
    assert main(["search", "--scenario", "ppo-70b-7b-128gpu", "--method", "mcmc", "--time-budget", "3",
                 "--seed", "0", "--out", str(path)]) == 0
    return path


def test_launch_forms_of_a_searched_70b_plan(cli, searched_70b, tmp_path):
    from accelerate.commands.config.config_args import ClusterConfig

    outs = {f: tmp_path / f"plan.{f}" for f in ("accelerate", "torchrun", "slurm")}
    for fmt, out in outs.items():
        code, _, err = cli("export", "--plan", searched_70b, "--format", fmt, "--out", out, "--nodes", 16,
                           "--gpus-per-node", 8, "--steps", 50)
        assert code == 0, err
    launch = tmp_path / "plan-launch.sh"
    for script in (launch, outs["torchrun"], outs["slurm"]):
        assert subprocess.run(["bash", "-n", str(script)]).returncode == 0
        text = script.read_text()
        assert f"--plan {searched_70b}" in text and "--scenario ppo-70b-7b-128gpu" in text and "--steps 50" in text
        assert os.access(script, os.X_OK)
    config = ClusterConfig.from_yaml_file(str(outs["accelerate"]))  # Accelerate's own loader
    assert (config.num_machines, config.num_processes, config.distributed_type.value) == (16, 128, "MULTI_GPU")
    assert "--machine_rank \"$NODE_RANK\"" in launch.read_text()
    torchrun = outs["torchrun"].read_text()
    for k in range(16):
        assert f"  {k}) exec \"${{TORCHRUN:-torchrun}}\" --nnodes 16 --nproc-per-node 8 --node-rank {k} " in torchrun
    sbatch = [line for line in outs["slurm"].read_text().splitlines() if line.startswith("#SBATCH")]
    assert "#SBATCH --nodes=16" in sbatch and "#SBATCH --gpus-per-node=8" in sbatch
    assert "#SBATCH --ntasks-per-node=1" in sbatch
    assert "--node-rank \"$SLURM_NODEID\"" in outs["slurm"].read_text()


@pytest.mark.parametrize("flags, field", [(("--nodes", 2), "--nodes"), (("--gpus-per-node", 4), "--gpus-per-node")])
def test_refuses_a_plan_for_another_cluster(cli, searched_70b, tmp_path, flags, field):
    out = tmp_path / "x.sh"
    code, _, err = cli("export", "--plan", searched_70b, "--format", "torchrun", "--out", out, *flags)
    assert code == 2 and field in err and len(err.strip().splitlines()) == 1
    assert not out.exists()


def test_never_overwrites_silently(cli, searched_70b, tmp_path):
    config, script = tmp_path / "acc.yaml", tmp_path / "acc-launch.sh"
    script.write_text("mine")
    code, _, err = cli("export", "--plan", searched_70b, "--format", "accelerate", "--out", config)
    assert code == 2 and "--force" in err and script.read_text() == "mine" and not config.exists()
    assert cli("export", "--plan", searched_70b, "--format", "accelerate", "--out", config, "--force")[0] == 0
    assert script.read_text() != "mine"


def test_bad_input_is_one_line(cli, tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("schema: realbench.plan/1\nscenario: ppo-tiny-cpu\ncalls: {}\n")
    for argv in (("--plan", bad, "--format", "slurm", "--out", tmp_path / "s.sh"),
                 ("--plan", tmp_path / "missing.yaml", "--format", "html", "--out", tmp_path / "r.html"),
                 ("--plan", bad, "--format", "pdf", "--out", tmp_path / "r.pdf")):
        code, _, err = cli("export", *argv)
        assert code == 2 and len(err.strip().splitlines()) == 1 and "Traceback" not in err


def test_a_plan_searched_on_1024_gpus_validates_estimates_and_exports(cli, tmp_path):
    """At scale: MCMC on ppo-70b-8b-1024gpu (128 nodes of 8) writes a plan that validates,
    fits within the usable memory, beats the symmetric baseline, and exports for 128 nodes."""
    plan = tmp_path / "p1024.yaml"
    code, out, err = cli("search", "--scenario", "ppo-70b-8b-1024gpu", "--method", "mcmc", "--time-budget", 60,
                         "--max-evals", 3000, "--seed", 0, "--out", plan, "--json")
    assert code == 0, err
    found = json.loads(out)
    assert found["best_time_s"] < found["baselines"]["symmetric"]
    code, out, err = cli("validate", plan)
    assert code == 0 and "valid plan" in out, err
    code, out, err = cli("estimate", "--scenario", "ppo-70b-8b-1024gpu", "--plan", plan, "--json")
    e = json.loads(out)
    assert code == 0 and not e["oom"] and e["peak_mem_bytes"] <= e["usable_memory_bytes"] == 72 * 1024**3
    assert e["time_per_iter_s"] == pytest.approx(found["best_time_s"]) and len(e["device_peak_bytes"]) == 1024
    for fmt in ("slurm", "html"):
        out_file = tmp_path / f"p1024.{fmt}"
        code, _, err = cli("export", "--plan", plan, "--format", fmt, "--out", out_file, "--nodes", 128,
                           "--gpus-per-node", 8)
        assert code == 0, err
    assert "#SBATCH --nodes=128" in (tmp_path / "p1024.slurm").read_text()
    assert "ppo-70b-8b-1024gpu" in (tmp_path / "p1024.html").read_text()


# -- the runtime through the exported launchers, two "nodes" on this machine -----------------------------
@pytest.fixture(scope="module")
def two_node_plan(tmp_path_factory):
    path = tmp_path_factory.mktemp("two-node") / "plan.yaml"
    path.write_text(yaml.safe_dump(TWO_NODE_PLAN))
    return path


@pytest.fixture(scope="module")
def single_node_result(two_node_plan):
    from realbench.runtime.launch import run_plan

    _, scenario, options = load_plan(str(two_node_plan))
    return run_plan(scenario, options, nproc=4, steps=3, seed=0)


SRUN_SHIM = """#!/usr/bin/env bash
# stands in for Slurm's srun: runs the task once per node, concurrently, with SLURM_NODEID set
nodes=1
while [[ $1 == --* ]]; do case $1 in --nodes=*) nodes=${1#--nodes=};; esac; shift; done
pids=()
for ((k = 0; k < nodes; k++)); do SLURM_NODEID=$k "$@" & pids+=($!); done
rc=0; for p in "${pids[@]}"; do wait "$p" || rc=$?; done; exit $rc
"""


def _run_nodes(commands: list[tuple[list[str], dict]], cwd: Path) -> list[subprocess.CompletedProcess]:
    procs = [subprocess.Popen(argv, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
             for argv, env in commands]
    out = []
    for p in procs:
        try:
            stdout, _ = p.communicate(timeout=300)
        except subprocess.TimeoutExpired:
            for q in procs:
                q.kill()
            raise
        out.append(subprocess.CompletedProcess(p.args, p.returncode, stdout))
    return out


@pytest.mark.parametrize("fmt", ["torchrun", "slurm", "accelerate"])
def test_two_nodes_through_the_exported_launcher_match_one_node(cli, two_node_plan, single_node_result,
                                                                tmp_path, fmt):
    port = free_port()
    plan = tmp_path / "plan.yaml"
    plan.write_text(two_node_plan.read_text())
    out = tmp_path / ("launch.yaml" if fmt == "accelerate" else "launch.sh")
    cwd = os.getcwd()
    os.chdir(tmp_path)  # scripts carry paths relative to where they are launched, as on a cluster
    try:
        code, _, err = cli("export", "--plan", "plan.yaml", "--format", fmt, "--out", out.name, "--steps", 3,
                           "--port", port, "--nodes", 2, "--gpus-per-node", 2)
    finally:
        os.chdir(cwd)
    assert code == 0, err
    env = {**os.environ, "PATH": VENV_BIN + os.pathsep + os.environ["PATH"], "MASTER_ADDR": "127.0.0.1",
           "MASTER_PORT": str(port), "RUN_DIR": str(tmp_path / "run")}
    if fmt == "slurm":
        shims = tmp_path / "shims"
        shims.mkdir()
        (shims / "srun").write_text(SRUN_SHIM)
        (shims / "scontrol").write_text("#!/usr/bin/env bash\necho 127.0.0.1\n")
        for f in shims.iterdir():
            f.chmod(0o755)
        env.update(PATH=str(shims) + os.pathsep + env["PATH"], SLURM_JOB_NODELIST="node[0-1]", SLURM_JOB_ID="7")
        commands = [(["bash", "launch.sh"], env)]
    else:
        script = "launch.sh" if fmt == "torchrun" else "launch-launch.sh"
        commands = [(["bash", script], {**env, "NODE_RANK": str(k)}) for k in (0, 1)]
    results = _run_nodes(commands, tmp_path)
    for r in results:
        assert r.returncode == 0, r.stdout[-3000:]
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["steps"] == 3 and summary["realloc_bytes"] == single_node_result["realloc_bytes"]
    for got, want in zip(summary["metrics"], single_node_result["metrics"]):
        assert got["reward"] == pytest.approx(want["reward"], rel=1e-6, abs=1e-9)
        assert got["loss"] == pytest.approx(want["loss"], rel=1e-6, abs=1e-9)
    assert set(summary["calls"]) == set(TWO_NODE_PLAN["calls"])


def test_a_job_on_checkpoint_folders_and_data_files_runs_on_two_nodes(cli, tmp_path):
    """The exported torchrun script of a GRPO job (a checkpoint folder, a data file and a reward
    function, named in the scenario relative to it) runs on 2 "nodes" of 2 processes launched
    from another folder: every node finds them through the scenario's path, and node 0 writes the
    trained model."""
    from realbench.cost import Estimator
    from realbench.cost.baselines import symmetric_plan
    from realbench.plan import load_scenario, plan_from_options
    from realbench.examples import tiny_grpo_job

    scenario = tiny_grpo_job(tmp_path / "job", nodes=2)
    est = Estimator(load_scenario(str(scenario)))
    options = est.options_of(symmetric_plan(est))
    assert {o.mesh.nodes for o in options.values()} == {2}  # every call spans both nodes
    plan_from_options(est.scenario, options).save(tmp_path / "job" / "plan.yaml")
    port = free_port()
    cwd = os.getcwd()
    os.chdir(tmp_path)
    try:
        code, _, err = cli("export", "--plan", "job/plan.yaml", "--scenario", "job/grpo-arithmetic.yaml", "--format",
                           "torchrun", "--out", "launch.sh", "--steps", 2, "--port", port, "--save-hf", "trained",
                           "--dtype", "fp32")
        code2, _, err2 = cli("export", "--plan", "job/plan.yaml", "--scenario", "job/grpo-arithmetic.yaml", "--format",
                             "torchrun", "--out", "launch-compiled.sh", "--steps", 2, "--compile-decode")
    finally:
        os.chdir(cwd)
    assert code == 0, err
    text = (tmp_path / "launch.sh").read_text()
    assert "--scenario job/grpo-arithmetic.yaml" in text and "--save-hf trained" in text and "--dtype fp32" in text
    assert "--compile-decode" not in text
    assert code2 == 0, err2
    assert " --compile-decode" in (tmp_path / "launch-compiled.sh").read_text()  # the workers' flag
    env = {**os.environ, "PATH": VENV_BIN + os.pathsep + os.environ["PATH"], "MASTER_ADDR": "127.0.0.1",
           "MASTER_PORT": str(port), "RUN_DIR": str(tmp_path / "run")}
    results = _run_nodes([(["bash", "launch.sh"], {**env, "NODE_RANK": str(k)}) for k in (0, 1)], tmp_path)
    for r in results:
        assert r.returncode == 0, r.stdout[-3000:]
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["steps"] == 2 and all(m["reward"] is not None for m in summary["metrics"])
    assert (tmp_path / "trained" / "actor" / "model.safetensors").is_file()


def test_worker_outside_a_launcher_is_a_clear_error(cli, two_node_plan, tmp_path, monkeypatch):
    for k in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.delenv(k, raising=False)
    code, _, err = cli("worker", "--scenario", "ppo-tiny-2x2cpu", "--plan", two_node_plan, "--steps", 1,
                       "--out", tmp_path)
    assert code == 2 and "torchrun" in err and len(err.strip().splitlines()) == 1



def test_a_worker_ends_its_process_with_its_status_skipping_the_teardown(monkeypatch, capsys):
    """The worker's process ends by os._exit with the run's status once its work returns (the
    interpreter's teardown can abort in gloo: a finished run reported failed); what it printed is
    flushed first."""
    import realbench.cli.worker as worker

    class Ended(Exception):
        pass

    def _exit(code):
        raise Ended(code)

    monkeypatch.setattr(worker, "_work", lambda args: print("summary") or 3)
    monkeypatch.setattr(worker.os, "_exit", _exit)
    with pytest.raises(Ended) as ended:
        worker.run(None)
    assert ended.value.args == (3,) and capsys.readouterr().out == "summary\n"

# -- the HTML report ------------------------------------------------------------------------------------
def test_html_report_renders_in_chromium(cli, searched_70b, tmp_path):
    from PIL import Image
    from playwright.sync_api import sync_playwright

    from browser import launch

    report = tmp_path / "report.html"
    code, _, err = cli("export", "--plan", searched_70b, "--format", "html", "--out", report)
    assert code == 0, err
    text = report.read_text()
    assert "cdn.bokeh.org" not in text  # standalone: bokeh inline, opens without a network
    shot = tmp_path / "report.png"
    with sync_playwright() as p:
        browser = launch(p)
        page = browser.new_page(viewport={"width": 1000, "height": 900})
        errors = []
        page.on("pageerror", lambda e: errors.append(str(e)))
        page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
        page.goto(report.as_uri())
        page.wait_for_function("() => window.Bokeh && Bokeh.documents.length > 0", timeout=30000)
        titles = page.evaluate("""() => Array.from(Bokeh.documents[0].all_models)
            .filter(m => m.title && m.title.text !== undefined && m.renderers).map(m => m.title.text)""")
        page.wait_for_timeout(500)
        page.screenshot(path=str(shot), full_page=True)
        browser.close()
    assert not errors
    heads = ["dataflow", "mesh map", "simulated timeline", "peak memory", "search: best time", "time per iteration"]
    assert all(any(t.startswith(h) for t in titles) for h in heads), titles
    # the plots drew: the colours of generate bars, train bars and reallocations are on the page
    pixels = {c for _, c in Image.open(shot).convert("RGB").getcolors(maxcolors=1 << 24)}
    for color in ("#1f77b4", "#d62728", "#ff7f0e"):
        assert tuple(int(color[i:i + 2], 16) for i in (1, 3, 5)) in pixels, color


@pytest.mark.parametrize("fmt,flag", [("html", ("--compile-decode",)), ("html", ("--dtype", "bf16")),
                                      ("verl", ("--save-hf", "trained")), ("openrlhf", ("--eval-every", 5))])
def test_worker_flags_are_refused_where_no_worker_is_launched(cli, searched_70b, tmp_path, fmt, flag):
    """A report or an engine's configuration starts none of realbench's workers: their settings
    would be dropped, so they are refused by name and nothing is written."""
    out = tmp_path / f"out.{fmt}"
    code, _, err = cli("export", "--plan", searched_70b, "--format", fmt, "--out", out, *flag)
    assert code == 2 and flag[0] in err and f"the {fmt} format does not launch" in err
    assert len(err.strip().splitlines()) == 1 and not out.exists()
