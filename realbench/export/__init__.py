"""Plans leave realbench for a cluster: an Accelerate config and launch command, torchrun command
lines per node, a Slurm batch script, a standalone HTML report, or an engine's configuration and
launch command (verl, OpenRLHF, AReaL: realbench.engines) (`realbench export`)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Optional

from realbench.engines import ENGINES, export_config
from realbench.errors import ConfigError
from realbench.export.launchers import (DEFAULT_PORT, LaunchSpec, accelerate_config, accelerate_script,
                                        slurm_script, torchrun_script)
from realbench.plan import load_plan, load_scenario
from realbench.schema import refuse_existing, write_text

RUNTIME_FORMATS = ("accelerate", "torchrun", "slurm")  # launchers of realbench's runtime
FORMATS = (*RUNTIME_FORMATS, "html", *ENGINES)


def launch_spec(plan_path: str, scenario_arg: Optional[str] = None, nodes: Optional[int] = None,
                gpus_per_node: Optional[int] = None, steps: int = 100, port: int = DEFAULT_PORT,
                **worker: Any) -> LaunchSpec:
    """The launch of a plan file; `nodes`/`gpus_per_node`, when given, must match the plan's cluster."""
    scenario = load_scenario(scenario_arg) if scenario_arg else None
    plan, scenario, _ = load_plan(plan_path, scenario)
    c = scenario.cluster
    if nodes is not None and nodes != c.nodes:
        raise ConfigError(f"the plan is for a cluster of {c.nodes} node(s), not {nodes}", "--nodes")
    if gpus_per_node is not None and gpus_per_node != c.gpus_per_node:
        raise ConfigError(f"the plan is for {c.gpus_per_node} device(s) per node, not {gpus_per_node}",
                          "--gpus-per-node")
    if steps < 1:
        raise ConfigError("must be at least 1", "--steps")
    if scenario_arg:
        ref = scenario_arg
    else:  # what the plan names: a built-in name, or a file relative to the plan's folder
        beside = Path(plan_path).parent / plan.scenario
        ref = os.path.normpath(beside) if beside.is_file() else plan.scenario
    if worker.get("eval_every") and (scenario.data is None or not (scenario.data.eval or scenario.data.eval_size)):
        raise ConfigError("evaluates on held-out rows: give the scenario data.eval or data.eval_size", "--eval-every")
    return LaunchSpec(scenario_name=scenario.name, scenario_ref=ref, plan_path=plan_path, nodes=c.nodes,
                      procs_per_node=c.gpus_per_node, steps=steps, port=port,
                      max_staleness=scenario.dataflow.max_staleness, **worker)


# the settings of the workers a launcher starts, at LaunchSpec's defaults
WORKER_DEFAULTS = {name: LaunchSpec.__dataclass_fields__[name].default
                   for name in ("dtype", "compile_decode", "save_hf", "eval_every")}


def export_plan(fmt: str, plan_path: str, out: str, scenario_arg: Optional[str] = None,
                nodes: Optional[int] = None, gpus_per_node: Optional[int] = None, steps: int = 100,
                port: int = DEFAULT_PORT, master_addr: str = "", overwrite: bool = False, profile_for=None,
                model_paths: Optional[dict[str, str]] = None, **worker: Any) -> list[Path]:
    """Write the plan in format `fmt` to `out` (the Accelerate form and the engines' also write a
    launch script beside it, as <out stem>-launch.sh); returns the files written.
    `profile_for(scenario)` gives the profile the html report's times come from (None: the
    analytic model); `model_paths`: an engine's checkpoint folders by role, over the scenario's."""
    if fmt not in FORMATS:
        raise ConfigError(f"unknown format {fmt!r} (known: {', '.join(FORMATS)})", "--format")
    if fmt == "html" or fmt in ENGINES:  # the runtime workers' settings: nothing here would carry them
        for key, default in WORKER_DEFAULTS.items():
            if worker.get(key, default) != default:
                raise ConfigError(f"sets realbench's workers, which the {fmt} format does not launch (accelerate, "
                                  "torchrun or slurm do)", "--" + key.replace("_", "-"))
    if fmt in ENGINES:
        _, scenario, options = load_plan(plan_path, load_scenario(scenario_arg) if scenario_arg else None)
        return export_config(fmt, scenario, options, out, model_paths or {}, overwrite)
    spec = launch_spec(plan_path, scenario_arg, nodes, gpus_per_node, steps, port, **worker)
    if fmt != "html":  # a launcher of realbench's runtime: only what it runs
        from realbench.plan.plan import refuse_unrunnable

        refuse_unrunnable(*load_plan(plan_path, load_scenario(scenario_arg) if scenario_arg else None)[1:])
    if fmt == "html":
        from realbench.export.html import plan_report_html

        plan, scenario, options = load_plan(plan_path, load_scenario(scenario_arg) if scenario_arg else None)
        profile = profile_for(scenario) if profile_for else None  # the html report's times
        return [write_text(plan_report_html(scenario, options, plan, plan_name=Path(plan_path).name, profile=profile),
                           out, overwrite)]
    if fmt == "torchrun":
        return [write_text(torchrun_script(spec), out, overwrite, mode=0o755)]
    if fmt == "slurm":
        return [write_text(slurm_script(spec), out, overwrite, mode=0o755)]
    import yaml

    script = Path(out).with_name(Path(out).stem + "-launch.sh")
    refuse_existing((out, script), overwrite)
    return [write_text(yaml.safe_dump(accelerate_config(spec, master_addr), sort_keys=False), out, overwrite),
            write_text(accelerate_script(spec, out), script, overwrite, mode=0o755)]
