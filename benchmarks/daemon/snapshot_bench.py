"""What a restart that keeps the jobs costs: snapshot and restore time against persistent size.

For each model, a training session (Adam, so its optimizer state is in the snapshot too) runs
two iterations on a salus-server with a state directory; SIGTERM drains it, writing the
snapshot; a new daemon restores it; the session runs on. Reported, medians over rounds:
- snapshot: the daemon's own time to read the state at the iteration boundary and write the
  files (`event: snapshot` "seconds"), against the floor measured in the same run: writing and
  syncing as many bytes to the same directory;
- restore: the daemon's time to verify the files, recompile the sessions and queue their state
  (`event: restored` "seconds"), against a host memcpy of as many bytes (the state's own floor;
  the rest is the model's compile);
- pause: what the job sees, from SIGTERM to its next iteration answered by the new daemon
  (process exit and start included).

With --periodic, instead: the step time of a training loop (loss read every step) on a daemon
writing a snapshot every K iterations in the background (--snapshot-every K), against the same
loop on a daemon that writes none, rounds alternating, and how many snapshots were written.

    .venv/bin/python benchmarks/daemon/snapshot_bench.py [--rounds 3] [--models mlp,resnet18]
    .venv/bin/python benchmarks/daemon/snapshot_bench.py --periodic [--steps 200]

--device cuda:0 runs the daemons on that GPU instead of the CPU.

Needs a built salus-server (build/bin, or $SALUS_SERVER).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "tests" / "integration"))
sys.path.insert(0, str(REPO / "adaptors" / "python"))

from salus_daemon import MODELS, Daemon  # noqa: E402

import salus  # noqa: E402

VOCAB, SEQ, CLASSES, IMAGE, BATCH = 1000, 32, 10, (3, 32, 32), 8
# name -> (data input, whether it takes token ids)
MODELS_USED = {"mlp": ("x", False), "resnet18": ("x", False), "transformer": ("tokens", True),
               "hf_bert": ("tokens", True)}


def feeds(name: str, seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    data, tokens = MODELS_USED[name]
    if name == "mlp":
        x = rng.standard_normal((BATCH, 784), dtype=np.float32)
    elif tokens:
        x = rng.integers(0, VOCAB, (BATCH, SEQ)).astype(np.int64)
    else:
        x = rng.standard_normal((BATCH, *IMAGE), dtype=np.float32)
    return {data: x, "labels": rng.integers(0, CLASSES, BATCH).astype(np.int64)}


def train_session(client: salus.Client, name: str, batch: dict[str, np.ndarray]) -> salus.Session:
    return client.create_session(model=MODELS / f"{name}.onnx", mode="train",
                                 inputs={k: v.shape for k, v in batch.items()}, loss="loss",
                                 optimizer={"type": "adam", "lr": 1e-3}, name=name)


def event(log: list[str], name: str) -> dict:
    tag = f"event: {name} "
    lines = [line for line in log if tag in line]
    if not lines:
        raise RuntimeError(f"no '{name}' event in the daemon's log:\n" + "".join(log[-20:]))
    return json.loads(lines[-1].split(tag, 1)[1])


def write_floor(directory: Path, nbytes: int) -> float:
    data = np.random.default_rng(0).integers(0, 255, nbytes, dtype=np.uint8).tobytes()
    path = directory / "floor.bin"
    start = time.perf_counter()
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]
        os.fsync(fd)
    finally:
        os.close(fd)
    took = time.perf_counter() - start
    path.unlink()
    return took


def memcpy_floor(nbytes: int) -> float:
    src = np.ones(nbytes, dtype=np.uint8)
    dst = np.empty_like(src)
    start = time.perf_counter()
    np.copyto(dst, src)
    return time.perf_counter() - start


DEVICE: tuple[str, ...] = ()  # the daemons' --device flag, when one is given


def one_round(name: str, seed: int) -> dict[str, float]:
    with tempfile.TemporaryDirectory(prefix="salus-snapshot-bench-") as tmp:
        state_dir = Path(tmp) / "state"
        first = Daemon("--state-dir", str(state_dir), *DEVICE, memory="4GiB")
        second = None
        try:
            with salus.connect(first.endpoint, reconnect=120) as c:
                batch = feeds(name, seed)
                s = train_session(c, name, batch)
                for _ in range(2):
                    s.run(batch, ["loss"])
                start = time.perf_counter()
                first.stop(keep_dir=True, timeout=300)
                second = Daemon("--state-dir", str(state_dir), *DEVICE, memory="4GiB",
                                after=first)
                s.run(batch, ["loss"])
                pause = time.perf_counter() - start
                snap = event(first.log, "snapshot")
                restored = event(second.log, "restored")
                nbytes = int(snap["state_bytes"])
                return {"persistent_bytes": s.persistent_bytes, "state_bytes": nbytes,
                        "snapshot_s": snap["seconds"], "write_floor_s": write_floor(Path(tmp),
                                                                                  nbytes),
                        "restore_s": restored["seconds"], "memcpy_floor_s": memcpy_floor(nbytes),
                        "pause_s": pause}
        finally:
            for d in (second, first):
                if d is not None and d.proc.poll() is None:
                    d.stop()


def periodic_round(name: str, every: int, steps: int) -> tuple[float, int]:
    """Mean step time (s) of `steps` steps after 10 of warm-up (a snapshot's cost is spread
    over the steps it delays), and the snapshots written."""
    with tempfile.TemporaryDirectory(prefix="salus-snapshot-bench-") as tmp:
        args = ("--state-dir", str(Path(tmp) / "state"), "--snapshot-every", str(every)) \
            if every else ()
        d = Daemon(*args, *DEVICE, memory="4GiB")
        try:
            with salus.connect(d.endpoint) as c:
                batch = feeds(name, 0)
                s = train_session(c, name, batch)
                for _ in range(10):
                    s.run(batch, ["loss"])
                start = time.perf_counter()
                for _ in range(steps):
                    s.run(batch, ["loss"])
                took = (time.perf_counter() - start) / steps
            return took, sum("event: snapshot " in x for x in d.log)
        finally:
            d.stop()


def periodic(models: list[str], rounds: int, steps: int) -> dict:
    everies = [0, 100, 10, 1]
    print("| model | K | step (mean) | vs none (median of rounds) | snapshots written |")
    print("| --- | ---: | ---: | ---: | ---: |")
    out = {}
    for name in models:
        got: dict[int, list[tuple[float, int]]] = {k: [] for k in everies}
        for _ in range(rounds):
            for k in everies:
                got[k].append(periodic_round(name, k, steps))
        out[name] = {}
        for k in everies:
            step = statistics.median(t for t, _ in got[k])
            # Each round's daemons ran one after another: the ratio within a round.
            ratio = statistics.median(t / b for (t, _), (b, _) in zip(got[k], got[0],
                                                                      strict=True))
            written = statistics.median(n for _, n in got[k])
            out[name][k] = {"step_s": step, "ratio": ratio, "snapshots": written}
            print(f"| {name} | {k or 'none'} | {step * 1e3:.2f} ms | {ratio:.3f}x | "
                  f"{written:g} |", flush=True)
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--models", default=",".join(MODELS_USED))
    p.add_argument("--json", default=str(REPO / "results" / "snapshot_bench.json"))
    p.add_argument("--periodic", action="store_true",
                   help="the step time under periodic snapshots instead")
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--device", help="the daemons' device, e.g. cuda:0 (default: the CPU)")
    args = p.parse_args()
    global DEVICE
    DEVICE = ("--device", args.device) if args.device else ()
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    if args.periodic:
        out = periodic(args.models.split(","), args.rounds, args.steps)
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(out, indent=2))
        return
    results = {}
    print("| model | P | state written | snapshot | write+fsync floor | restore (compile "
          "included) | memcpy floor | job's pause |")
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for name in args.models.split(","):
        rounds = [one_round(name, seed) for seed in range(args.rounds)]
        med = {k: statistics.median(r[k] for r in rounds) for k in rounds[0]}
        results[name] = {"median": med, "rounds": rounds}
        mib = 1 << 20
        print(f"| {name} | {med['persistent_bytes'] / mib:.1f} MiB | "
              f"{med['state_bytes'] / mib:.1f} MiB | {med['snapshot_s'] * 1e3:.1f} ms | "
              f"{med['write_floor_s'] * 1e3:.1f} ms | {med['restore_s'] * 1e3:.1f} ms | "
              f"{med['memcpy_floor_s'] * 1e3:.2f} ms | {med['pause_s']:.2f} s |", flush=True)
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
