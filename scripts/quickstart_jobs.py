"""The quick start's main job: four training jobs share one salus-server.

Starts salus-server on the CPU device (or the one `--device` or $SALUS_DEVICE names, such as
cuda:0), submits four training jobs on real ONNX models from four separate Python processes at
once, under FAIR and then under SRTF, and prints each
job's completion time (JCT) and a table per policy. Each job trains on a fixed, seeded
synthetic batch and reports its first and last loss.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "adaptors" / "python"))
import salus  # noqa: E402

MODELS = REPO / "benchmarks" / "models"
# The daemon: the build's, or salus-server in $SALUS_BIN (binaries built elsewhere).
SERVER = Path(os.environ.get("SALUS_BIN", REPO / "build" / "bin")) / "salus-server"

# name, model file, input shapes, iterations
JOBS = [
    ("mlp", "mlp.onnx", {"x": (64, 784), "labels": (64,)}, 600),
    ("lenet5", "lenet5.onnx", {"x": (32, 1, 28, 28), "labels": (32,)}, 240),
    ("resnet", "resnet.onnx", {"x": (16, 3, 32, 32), "labels": (16,)}, 48),
    ("espcn", "espcn.onnx", {"x": (8, 1, 16, 16), "target": (8, 1, 48, 48)}, 160),
]


def feeds_for(inputs: dict[str, tuple[int, ...]], seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    out = {}
    for name, shape in inputs.items():
        if name == "labels":
            out[name] = rng.integers(0, 10, shape).astype(np.int64)
        else:
            out[name] = rng.standard_normal(shape, dtype=np.float32)
    return out


def run_job(endpoint: str, job: tuple, start: float, queue: mp.Queue) -> None:
    name, model, inputs, iterations = job
    client = salus.connect(endpoint, name=name)
    s = client.create_session(model=MODELS / model, mode="train", inputs=inputs, loss="loss",
                              optimizer={"type": "sgd", "lr": 0.01, "momentum": 0.9},
                              iterations=iterations, name=name)
    feeds = feeds_for(inputs, seed=len(name))
    losses = [float(s.run(feeds=feeds, fetches=["loss"])["loss"]) for _ in range(iterations)]
    s.close()
    client.close()
    queue.put({"job": name, "iterations": iterations, "jct_s": time.monotonic() - start,
               "first_loss": losses[0], "last_loss": losses[-1]})


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def run_policy(policy: str, device: str) -> list[dict]:
    endpoint = f"tcp://127.0.0.1:{free_port()}"
    server = subprocess.Popen(
        [str(SERVER), "--listen", endpoint, "--memory", "2GiB",
         "--policy", policy, "--log-level", "warn", "--device", device],
        stderr=subprocess.PIPE, text=True)
    assert server.stderr is not None
    watchdog = threading.Timer(60, server.kill)  # never wait forever for the ready line
    watchdog.start()
    for line in server.stderr:
        if "event: ready " in line:
            ready = json.loads(line.split("event: ready ", 1)[1])
            print(f"salus-server ready: device {ready['device']}, policy {ready['policy']}, "
                  f"{ready['capacity_bytes'] >> 20} MiB arena, {endpoint}")
            break
    else:
        raise SystemExit(f"salus-server exited with {server.wait()} before it was ready")
    watchdog.cancel()
    # Keep reading its log so the daemon never blocks on a full pipe.
    threading.Thread(target=lambda: [None for _ in server.stderr], daemon=True).start()
    ctx = mp.get_context("spawn")
    queue: mp.Queue = ctx.Queue()
    start = time.monotonic()
    procs = [ctx.Process(target=run_job, args=(endpoint, job, start, queue)) for job in JOBS]
    for p in procs:
        p.start()
    results = [queue.get(timeout=600) for _ in procs]
    for p in procs:
        p.join()
    server.send_signal(signal.SIGTERM)
    if server.wait(timeout=60) != 0:
        raise SystemExit("salus-server did not exit cleanly")
    for p in procs:
        if p.exitcode != 0:
            raise SystemExit(f"a job process failed with exit code {p.exitcode}")
    return sorted(results, key=lambda r: r["jct_s"])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default=os.environ.get("SALUS_DEVICE", "cpu"),
                    help="the daemon's device: cpu (default), cuda:N ($SALUS_DEVICE)")
    args = ap.parse_args()
    tables = {}
    for policy in ("fair", "srtf"):
        print(f"\n==> four training jobs at once under {policy.upper()}")
        tables[policy] = run_policy(policy, args.device)
        for r in tables[policy]:
            print(f"  {r['job']:7} finished after {r['jct_s']:6.2f} s "
                  f"({r['iterations']} iterations, loss {r['first_loss']:.3f} -> "
                  f"{r['last_loss']:.3f})")
    print(f"\n{'policy':7} " + " ".join(f"{j[0] + ' JCT s':>13}" for j in JOBS)
          + f" {'avg JCT s':>10} {'makespan s':>11}")
    for policy, rows in tables.items():
        by_job = {r["job"]: r["jct_s"] for r in rows}
        jcts = list(by_job.values())
        print(f"{policy:7} " + " ".join(f"{by_job[j[0]]:13.2f}" for j in JOBS)
              + f" {sum(jcts) / len(jcts):10.2f} {max(jcts):11.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
