"""`overhead` (Figure 12): each reference model's training iteration through the daemon,
normalised to the same executable run in-process.

In-process: `salus-run` compiles the model exactly as the daemon does and times --iterations
iterations after --warmup (median). Through the daemon: one training session alone on a fresh
salus-server, the same batch and seeded data sent with every iteration, timed at the client
(the whole round trip: request, scheduling, the iteration, the reply), three times: with
every feed sent in a frame (`stage_from=None`); as a client connects by default, which
copies feeds of 64 KiB or more into shared memory it owns (staged); and read from a shared
buffer the caller filled once, as the in-process batch is (`client.shared_buffer`). All run
with OMP_WAIT_POLICY=PASSIVE. Models are measured in --rounds alternating rounds and the medians
taken, since this machine's other load shifts timings from one minute to the next.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import time
from typing import Any

from tqdm import tqdm

from benchmarks.driver import common

DEFAULT_BATCHES = {"mlp": 64, "lenet5": 64, "resnet": 32, "espcn": 32, "vae": 64}


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--models", default=",".join(f"{m}:{b}" for m, b in DEFAULT_BATCHES.items()),
                   help="comma-separated MODEL:BATCH")
    p.add_argument("--iterations", type=int, default=40)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--rounds", type=int, default=3)


def smoke(args: argparse.Namespace) -> None:
    args.iterations, args.warmup, args.rounds = 5, 1, 1
    args.models = "mlp:16,lenet5:16,resnet:4,espcn:4,vae:16"


def in_process(model: str, batch: int, iterations: int, warmup: int, seed: int,
               device: str = "cpu") -> dict[str, Any]:
    spec = common.MODEL_SPECS[model]
    cmd = [str(common.BIN / "salus-run"), "--model", str(spec.path), *spec.run_args(batch),
           "--mode", "train", "--loss", spec.loss, "--iterations", str(iterations),
           "--warmup", str(warmup), "--seed", str(seed), "--device", device]
    out = subprocess.run(cmd, check=True, capture_output=True, text=True,
                         env=common.salus_env()).stdout
    return dict(json.loads(out))


FEEDS_VIA = ("frames", "staged", "shared")


def through_daemon(endpoint: str, model: str, batch: int, iterations: int, warmup: int,
                   seed: int, via: str = "frames") -> dict[str, Any]:
    import numpy as np

    import salus

    spec = common.MODEL_SPECS[model]
    feeds = spec.feeds(batch, seed=seed)
    stage_from = None if via == "frames" else 64 * 1024
    c = salus.connect(endpoint, timeout=None, name=f"overhead-{model}", stage_from=stage_from)
    try:
        if via == "shared":  # the same batch, placed once in memory the daemon maps
            buf = c.shared_buffer(sum(np.asarray(v).nbytes for v in feeds.values()))
            offset, views = 0, {}
            for name, value in feeds.items():
                arr = np.ascontiguousarray(value)
                views[name] = buf.array(arr.shape, arr.dtype, offset)
                views[name][...] = arr
                offset += arr.nbytes
            feeds = views
        s = common.open_model_session(c, model, batch, name=model)
        wall, run = [], []
        for i in range(warmup + iterations):
            t = time.monotonic()
            s.run(feeds=feeds)
            dt = time.monotonic() - t
            if i >= warmup and s.last_stats is not None:
                wall.append(dt * 1e3)
                run.append(s.last_stats.run_us / 1e3)
        out = {"persistent_bytes": s.persistent_bytes, "ephemeral_bytes": s.ephemeral_bytes,
               "median_ms": common.median(wall), "run_median_ms": common.median(run)}
        s.close()
        return out
    finally:
        c.close()


def run(args: argparse.Namespace) -> list[str]:
    models = []
    for item in args.models.split(","):
        name, _, batch = item.partition(":")
        if name not in common.MODEL_SPECS or not batch.isdigit():
            raise SystemExit(f"overhead: bad --models entry {item!r} (MODEL:BATCH)")
        models.append((name, int(batch)))
    samples: list[dict[str, Any]] = []
    with common.device(args, "fifo") as endpoint, \
            tqdm(total=args.rounds * len(models), desc="overhead", unit="model") as bar:
        for rnd in range(args.rounds):
            for model, batch in models:
                bar.set_postfix_str(model)
                local = in_process(model, batch, args.iterations, args.warmup, args.seed,
                                   args.device)
                remote, staged, shared = (
                    through_daemon(endpoint, model, batch, args.iterations, args.warmup,
                                   args.seed, via) for via in FEEDS_VIA)
                samples.append({"round": rnd, "model": model, "batch": batch,
                                "in_process_ms": local["median_ms"],
                                "daemon_ms": remote["median_ms"],
                                "daemon_run_ms": remote["run_median_ms"],
                                "daemon_staged_ms": staged["median_ms"],
                                "daemon_shared_ms": shared["median_ms"],
                                "P_bytes": local["persistent_bytes"],
                                "E_bytes": local["ephemeral_bytes"],
                                "P_daemon": remote["persistent_bytes"],
                                "E_daemon": remote["ephemeral_bytes"]})
                bar.update(1)
    common.write_csv(args.out / "samples.csv", samples)
    rows = []
    for model, batch in models:
        mine = [s for s in samples if s["model"] == model]
        local = common.median([s["in_process_ms"] for s in mine])
        daemon = common.median([s["daemon_ms"] for s in mine])
        run_ms = common.median([s["daemon_run_ms"] for s in mine])
        staged_ms = common.median([s["daemon_staged_ms"] for s in mine])
        shared_ms = common.median([s["daemon_shared_ms"] for s in mine])
        rows.append({"model": model, "batch": batch, "P_MiB": mine[0]["P_bytes"] / common.MIB,
                     "E_MiB": mine[0]["E_bytes"] / common.MIB, "in_process_ms": local,
                     "daemon_ms": daemon, "daemon_run_ms": run_ms,
                     "normalised": daemon / local, "overhead_pct": (daemon / local - 1) * 100,
                     "daemon_staged_ms": staged_ms,
                     "overhead_staged_pct": (staged_ms / local - 1) * 100,
                     "daemon_shared_ms": shared_ms,
                     "overhead_shared_pct": (shared_ms / local - 1) * 100})
    common.write_csv(args.out / "overhead.csv", rows)
    _plot(args.out / "overhead.png", rows)
    return [
        f"Training iterations, medians over {args.rounds} round(s) of {args.iterations} "
        f"iterations after {args.warmup} warm-up. `daemon_ms` is the client's round trip with "
        "every feed in a frame, `daemon_run_ms` the iteration's run time inside the daemon; "
        "`daemon_staged_ms` the round trip of a default client, which copies feeds of 64 KiB "
        "or more into shared memory it owns; `daemon_shared_ms` the round trip with the feeds "
        "read from a shared buffer the caller filled once.",
        "",
        common.md_table(rows, list(rows[0].keys())),
        "",
        "Paper (Figure 12): under 10% overhead for most CNNs (a P100, iterations of tens to "
        "hundreds of milliseconds).",
        "",
        "![overhead](overhead.png)",
    ]


def _plot(path: Any, rows: list[dict[str, Any]]) -> None:
    plt = common.plt_figure()
    fig, ax = plt.subplots(figsize=(6, 4))
    x = range(len(rows))
    for k, (key, label) in enumerate([("daemon_ms", "frames"), ("daemon_staged_ms", "staged"),
                                      ("daemon_shared_ms", "shared buffer")]):
        ax.bar([i + (k - 1) * 0.27 for i in x], [r[key] / r["in_process_ms"] for r in rows],
               0.27, label=label)
    ax.axhline(1.0, color="k", linewidth=0.8)
    ax.axhline(1.1, color="grey", linestyle="--", linewidth=0.8, label="+10%")
    ax.set_xticks(list(x))
    ax.set_xticklabels([f"{r['model']}\n({r['in_process_ms']:.1f} ms)" for r in rows])
    ax.set_ylabel("iteration time, daemon / in-process")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
