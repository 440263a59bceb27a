"""Reallocation throughput (`realbench bench realloc --json`).

On `nproc` local processes, a model is moved between pairs of layouts (training-like to
generation-like and back, across disjoint meshes, between pipeline and tensor parallelism).
For each pair: the bytes moved (received from other ranks, all destinations together), the
seconds (slowest rank, median of repeats), and a plain `dist.broadcast` from rank 0 that delivers
the same bytes in total (bytes / (nproc - 1) to each other rank), measured in the same run; the
messages sent and the bytes that went through a staging copy (all ranks).
`ratio` = broadcast seconds / reallocation seconds (target >= 0.5: the reallocation moves its
bytes at least half as fast as the simplest collective moves as many). The two move the same
bytes: comparing against a broadcast of one destination's bytes would time 3 destinations' worth
against 4 in the train -> generation change, where every rank receives.
`bytes_per_destination` is the most any one rank receives."""

from __future__ import annotations

import statistics
import time

from realbench.models import ModelSpec

TARGET_RATIO = 0.5
MODEL = ModelSpec(name="bench-7m", n_layers=8, hidden=256, n_heads=8, n_kv_heads=4, ffn=688, vocab=512)


def _pairs(nproc: int):
    from realbench.runtime.layout import Layout

    half = nproc // 2
    return [
        ("train tp2pp2 -> gen dp4", Layout.on(range(nproc), nproc // 4, 2, 2), Layout.on(range(nproc), nproc, 1, 1)),
        ("gen dp4 -> train tp2pp2", Layout.on(range(nproc), nproc, 1, 1), Layout.on(range(nproc), nproc // 4, 2, 2)),
        ("pp4 -> tp4", Layout.on(range(nproc), 1, 1, nproc), Layout.on(range(nproc), 1, nproc, 1)),
        ("disjoint meshes tp2 -> tp2", Layout.on(range(half), 1, half, 1), Layout.on(range(half, nproc), 1, half, 1)),
    ]


def _worker(rank, world, repeats):
    import torch
    import torch.distributed as dist

    from realbench.runtime.model import LlamaStage, init_full_weights
    from realbench.runtime.realloc import BoundReallocation, bytes_received, plan_transfers, rank_plan

    full = init_full_weights(MODEL, seed=0)
    plans = [plan_transfers(MODEL, a, b) for _, a, b in _pairs(world)]
    out = []
    for label, a, b in _pairs(world):
        c = a.coord(rank)
        shards = {}
        if c is not None:
            st = LlamaStage(MODEL, a.dims.tp, c.tp, a.dims.pp, c.pp)
            st.load_full(full)
            shards = dict(st.state_dict())  # views of the stage's flat buffer, as a worker's model
        # the destination's tensors exist before the move, as a worker's placed model does
        cb = b.coord(rank)
        dest = {} if cb is None else dict(LlamaStage(MODEL, b.dims.tp, cb.tp, b.dims.pp, cb.pp).state_dict())
        transfers = plans[len(out)]
        plan = rank_plan(MODEL, a, b, rank, transfers)
        move = BoundReallocation(plan, shards, dest)
        received = bytes_received(transfers, MODEL)
        per_dest = max(received.values()) if received else 0
        total = sum(received.values())
        times, bcast = [], []
        buf = torch.zeros(total // 4 // (world - 1))  # to each of the other ranks: `total` in all
        for _ in range(repeats):
            dist.barrier()
            t0 = time.perf_counter()
            move()
            dist.barrier()
            times.append(time.perf_counter() - t0)
            dist.barrier()
            t0 = time.perf_counter()
            dist.broadcast(buf, 0)
            dist.barrier()
            bcast.append(time.perf_counter() - t0)
        # per rank: messages sent, and bytes copied through staging buffers
        counts = torch.tensor([len(plan.sends), move.staged_values * 4], dtype=torch.float64)
        gathered = [torch.zeros_like(counts) for _ in range(world)]
        dist.all_gather(gathered, counts)
        out.append({"pair": label, "bytes": total, "bytes_per_destination": per_dest,
                    "broadcast_bytes": buf.numel() * 4 * (world - 1),
                    "messages": int(sum(g[0] for g in gathered)), "staged_bytes": int(sum(g[1] for g in gathered)),
                    "seconds": statistics.median(times), "broadcast_seconds": statistics.median(bcast)})
    return out


def run(nproc: int = 4, repeats: int = 5) -> dict:
    from realbench.runtime.local import spawn

    rows = spawn(_worker, nproc, repeats)[0]
    for r in rows:
        r["ratio"] = r["broadcast_seconds"] / r["seconds"] if r["seconds"] > 0 else None
    ratios = [r["ratio"] for r in rows if r["ratio"] is not None and r["bytes"] > 0]  # moving nothing says nothing
    return {"benchmark": "realloc", "nproc": nproc, "model": MODEL.name, "params": MODEL.n_params,
            "pairs": rows, "median_ratio": statistics.median(ratios), "min_ratio": min(ratios),
            "target_ratio": TARGET_RATIO, "meets_target": statistics.median(ratios) >= TARGET_RATIO}


QUICK = {"nproc": 4, "repeats": 2}
