"""Launch forms for a plan on a cluster: an Accelerate config plus its launch command, torchrun
command lines per node, and a Slurm batch script (srun + torchrun).

Each starts `realbench worker` on every process with the plan and scenario by path. Device i of
the plan is global rank i, so node k of the plan must be node rank k of the launcher: every form
uses static rendezvous with explicit node ranks (torchrun --node-rank, Accelerate --machine_rank,
Slurm's SLURM_NODEID) rather than an elastic rendezvous that numbers nodes in arrival order.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass

DEFAULT_PORT = 29500


@dataclass(frozen=True)
class LaunchSpec:
    """What every launch form needs: the machines, and the worker's arguments."""

    scenario_name: str
    scenario_ref: str  # a built-in name or a scenario file path, as the worker will read it
    plan_path: str
    nodes: int
    procs_per_node: int
    steps: int
    port: int = DEFAULT_PORT
    run_dir: str = "realbench-run"
    dtype: str = "auto"
    compile_decode: bool = False
    save_hf: str = ""  # where node 0 writes the trained models, relative to the launch folder
    eval_every: int = 0
    max_staleness: int = 0  # asynchronous RL: the plan's

    @property
    def world(self) -> int:
        return self.nodes * self.procs_per_node

    def worker_args(self, run_dir: str = '"$RUN_DIR"') -> str:
        """`realbench worker ...` arguments (run_dir is left as given: it may be a shell variable).
        The scenario goes by path: every node reads it, and the checkpoint folders and data files
        it names, relative to the scenario file (a shared file system, at the same path)."""
        q = shlex.quote
        extra = f" --dtype {self.dtype}" if self.dtype != "auto" else ""
        extra += " --compile-decode" if self.compile_decode else ""
        extra += f" --save-hf {q(self.save_hf)}" if self.save_hf else ""
        extra += f" --eval-every {self.eval_every}" if self.eval_every else ""
        extra += f" --max-staleness {self.max_staleness}" if self.max_staleness else ""
        return (f"worker --scenario {q(self.scenario_ref)} --plan {q(self.plan_path)} "
                f"--steps {self.steps} --out {run_dir}{extra}")


def _header(spec: LaunchSpec, what: str) -> str:
    return (f"# realbench: {what} for plan {spec.plan_path} (scenario {spec.scenario_name}),\n"
            f"# {spec.nodes} node(s) x {spec.procs_per_node} process(es) = {spec.world} ranks; "
            f"device i of the plan is global rank i.\n")


def torchrun_command(spec: LaunchSpec, node_rank: int | str, master_addr: str = '"$MASTER_ADDR"',
                     master_port: str = '"$MASTER_PORT"') -> str:
    return (f'"${{TORCHRUN:-torchrun}}" --nnodes {spec.nodes} --nproc-per-node {spec.procs_per_node} '
            f"--node-rank {node_rank} --master-addr {master_addr} --master-port {master_port} "
            f"-m realbench {spec.worker_args()}")


def torchrun_script(spec: LaunchSpec) -> str:
    """A bash script with the torchrun command line of every node; run it on each node with
    NODE_RANK set (and MASTER_ADDR, the address of node 0, when there are several nodes)."""
    addr_default = ":-127.0.0.1" if spec.nodes == 1 else ":?set MASTER_ADDR to the address of node 0"
    lines = [
        "#!/usr/bin/env bash",
        _header(spec, "torchrun command lines").rstrip("\n"),
        f"# On node k (0..{spec.nodes - 1}): NODE_RANK=k MASTER_ADDR=<node 0 address> bash <this script>",
        "set -euo pipefail",
        f"NODE_RANK=${{NODE_RANK{':-0' if spec.nodes == 1 else ':?set NODE_RANK to this node index'}}}",
        f"MASTER_ADDR=${{MASTER_ADDR{addr_default}}}",
        f"MASTER_PORT=${{MASTER_PORT:-{spec.port}}}",
        f"RUN_DIR=${{RUN_DIR:-{spec.run_dir}}}",
        'case "$NODE_RANK" in',
    ]
    for k in range(spec.nodes):
        lines.append(f"  {k}) exec {torchrun_command(spec, k)} ;;")
    lines += [f'  *) echo "NODE_RANK must be 0..{spec.nodes - 1}, not $NODE_RANK" >&2; exit 2 ;;', "esac", ""]
    return "\n".join(lines)


def slurm_script(spec: LaunchSpec, job_name: str = "", time_limit: str = "04:00:00") -> str:
    """An sbatch script: one srun task per node, each running torchrun for that node's processes;
    node 0 of the allocation is the rendezvous host."""
    name = job_name or f"realbench-{spec.scenario_name}"
    inner = torchrun_command(spec, '"$SLURM_NODEID"')
    return "\n".join([
        "#!/usr/bin/env bash",
        f"#SBATCH --job-name={name}",
        f"#SBATCH --nodes={spec.nodes}",
        "#SBATCH --ntasks-per-node=1",
        f"#SBATCH --gpus-per-node={spec.procs_per_node}",
        "#SBATCH --exclusive",
        f"#SBATCH --time={time_limit}",
        "#SBATCH --output=realbench-%j.out",
        _header(spec, "Slurm batch script").rstrip("\n"),
        "# Submit from the folder that holds the plan: sbatch <this script>",
        "set -euo pipefail",
        'MASTER_ADDR=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)',
        f"MASTER_PORT=${{MASTER_PORT:-{spec.port}}}",
        f'RUN_DIR=${{RUN_DIR:-{spec.run_dir}-$SLURM_JOB_ID}}',
        "export MASTER_ADDR MASTER_PORT RUN_DIR",
        f"srun --nodes={spec.nodes} --ntasks-per-node=1 --kill-on-bad-exit=1 bash -c {shlex.quote('exec ' + inner)}",
        "",
    ])


def accelerate_config(spec: LaunchSpec, master_addr: str = "") -> dict:
    """An Accelerate config (the keys `accelerate config` writes) for the plan's machines. The
    launch command overrides machine_rank per node and main_process_ip when not given here."""
    cfg = {
        "compute_environment": "LOCAL_MACHINE",
        "debug": False,
        "distributed_type": "MULTI_GPU",
        "downcast_bf16": "no",
        "gpu_ids": "all",
        "machine_rank": 0,
        "main_training_function": "main",
        "mixed_precision": "no",
        "num_machines": spec.nodes,
        "num_processes": spec.world,
        "rdzv_backend": "static",
        "same_network": True,
        "use_cpu": False,
        "main_process_port": spec.port,
    }
    if master_addr or spec.nodes == 1:
        cfg["main_process_ip"] = master_addr or "127.0.0.1"
    return cfg


def accelerate_script(spec: LaunchSpec, config_path: str) -> str:
    """The launch command of every node for the Accelerate config at `config_path`."""
    addr_default = ":-127.0.0.1" if spec.nodes == 1 else ":?set MASTER_ADDR to the address of node 0"
    return "\n".join([
        "#!/usr/bin/env bash",
        _header(spec, "Accelerate launch").rstrip("\n"),
        f"# On node k (0..{spec.nodes - 1}): NODE_RANK=k MASTER_ADDR=<node 0 address> bash <this script>",
        "set -euo pipefail",
        f"NODE_RANK=${{NODE_RANK{':-0' if spec.nodes == 1 else ':?set NODE_RANK to this node index'}}}",
        f"MASTER_ADDR=${{MASTER_ADDR{addr_default}}}",
        f"RUN_DIR=${{RUN_DIR:-{spec.run_dir}}}",
        f'exec "${{ACCELERATE:-accelerate}}" launch --config_file {shlex.quote(config_path)} '
        f'--machine_rank "$NODE_RANK" --main_process_ip "$MASTER_ADDR" -m realbench {spec.worker_args()}',
        "",
    ])
