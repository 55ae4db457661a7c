"""Does one tenant's flood slow another's training?

A trainer runs the MLP (batch 64) and we take its median iteration time as it sees it, alone
and then while one other client, in a process of its own, does one of:

  cheap    ListSessions and GetStats as fast as it can (64 requests outstanding)
  runs     RunIterations of its own tiny synthetic session as fast as it can (64 outstanding:
           past its in-flight quota, the excess is refused)
  idle     holds many connections open that never say a word
  garbage  sends large envelopes (64 MiB) that do not parse, one after another

Each scenario's ratio to the solo median is the slow-down; the target is at most 1.5x. On a
machine with few cores the flooder, the trainer and the daemon share them: the ratio then
includes plain CPU contention, not only what the daemon lets one client do to another.
device_ratio, the same for the iteration's run time as the daemon measures it, tells them
apart: where it grows as much as the ratio, the cores were busy, not the trainer kept
waiting. daemon_cores and flooder_cores say who kept them busy (CPU seconds per second of the
daemon while the trainer ran, and of the flooding process while it flooded).

    .venv/bin/python benchmarks/security/flood.py [--quick] [--out DIR] [--endpoint EP]

Writes flood.json, flood.csv and report.md to the output folder (default
results/security-flood-<timestamp>/) and prints the table.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import multiprocessing as mp
import os
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
for _p in (REPO, REPO / "adaptors" / "python"):
    if str(_p) not in sys.path:
        sys.path.insert(0, str(_p))

from benchmarks.driver import common  # noqa: E402

TARGET_RATIO = 1.5
BATCH = 64
WINDOW = 64  # a flooder's requests outstanding at most
GARBAGE_MIB = 64  # the daemon reads envelopes up to kMaxEnvelopeBytes (512 MiB)
REPLY_TIMEOUT_MS = 120_000
SCENARIOS = ["solo", "cheap", "runs", "idle", "garbage"]


# -- the flooders (each in a process of its own, so it shares no interpreter with the trainer)
def _hello(sock: Any, pb: Any) -> str:
    req = pb.Request(request_id=1)
    req.hello.protocol_version = 1
    req.hello.client_name = "flood"
    sock.send_multipart([req.SerializeToString()])
    if not sock.poll(REPLY_TIMEOUT_MS):
        raise RuntimeError("no reply to Hello")
    reply = pb.Reply()
    reply.ParseFromString(sock.recv_multipart()[0])
    if reply.status.code != 0:
        raise RuntimeError(f"Hello refused: {reply.status.message}")
    return str(reply.hello.client_token)


def _flood(endpoint: str, kind: str, idle_connections: int, garbage_bytes: int, ready: Any,
           stop: Any, counts: Any, cores: Any) -> None:
    """Floods until `stop`; counts[0] replies, counts[1] of them refusals (code != 0); cores[0]
    the cores this process kept busy while flooding (CPU seconds per second)."""
    import zmq

    from salus._generated.salus.v1 import salus_pb2 as pb

    ctx = zmq.Context.instance()
    if kind == "idle":
        socks = []
        for _ in range(idle_connections):
            s = ctx.socket(zmq.DEALER)
            s.setsockopt(zmq.LINGER, 0)
            s.connect(endpoint)
            socks.append(s)
        ready.set()
        stop.wait()
        for s in socks:
            s.close(0)
        return

    sock = ctx.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.connect(endpoint)
    token = _hello(sock, pb)
    next_id = 2

    def request(fill: str, session_id: int = 0) -> bytes:
        nonlocal next_id
        r = pb.Request(request_id=next_id, session_id=session_id, client_token=token)
        next_id += 1
        getattr(r, fill).SetInParent()
        return r.SerializeToString()

    def take() -> pb.Reply:
        if not sock.poll(REPLY_TIMEOUT_MS):
            raise RuntimeError(f"{kind}: no reply within {REPLY_TIMEOUT_MS} ms")
        reply = pb.Reply()
        reply.ParseFromString(sock.recv_multipart(copy=False)[0].bytes)
        counts[0] += 1
        if reply.status.code != 0:
            counts[1] += 1
        return reply

    session_id = 0
    if kind == "runs":
        r = pb.Request(request_id=next_id, client_token=token)
        next_id += 1
        r.create_session.synthetic.persistent_bytes = common.MIB
        r.create_session.synthetic.ephemeral_bytes = common.MIB
        r.create_session.name = "flood"
        sock.send_multipart([r.SerializeToString()])
        made = take()
        if made.status.code != 0:
            raise RuntimeError(f"the flood session was refused: {made.status.message}")
        session_id = made.create_session.session_id
        counts[0] = counts[1] = 0
    garbage = b"\x00" * garbage_bytes  # tag 0: never parses
    window = 1 if kind == "garbage" else WINDOW
    outstanding = 0
    ready.set()
    cpu0, wall0 = time.process_time(), time.monotonic()
    flip = False
    while not stop.is_set():
        while outstanding < window:
            if kind == "cheap":
                flip = not flip
                sock.send_multipart([request("list_sessions" if flip else "get_stats")])
            elif kind == "runs":
                sock.send_multipart([request("run_iteration", session_id)])
            else:
                sock.send(garbage, copy=False)
            outstanding += 1
        take()
        outstanding -= 1
    cores[0] = (time.process_time() - cpu0) / max(time.monotonic() - wall0, 1e-9)
    while outstanding:
        take()
        outstanding -= 1
    sock.close(0)


# -- the trainer --------------------------------------------------------------------------------
def _train(endpoint: str, iterations: int, warmup: int) -> dict[str, float]:
    import salus

    spec = common.MODEL_SPECS["mlp"]
    feeds = spec.feeds(BATCH, seed=0)
    c = salus.connect(endpoint, timeout=None)
    try:
        s = common.open_model_session(c, "mlp", BATCH, name="trainer")
        for _ in range(warmup):
            s.run(feeds=feeds)
        times, runs = [], []
        for _ in range(iterations):
            t = time.monotonic()
            s.run(feeds=feeds)
            times.append(time.monotonic() - t)
            runs.append(s.last_stats.run_us / 1e6)
        s.close()
    finally:
        c.close()
    return {"median_ms": common.median(times) * 1e3,
            "p95_ms": common.percentile(times, 95) * 1e3,
            "device_median_ms": common.median(runs) * 1e3}


def _cpu_seconds(pid: int | None) -> float | None:
    """User + system CPU seconds of process `pid` (all its threads), from /proc."""
    if pid is None:
        return None
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _train_timed(endpoint: str, args: argparse.Namespace) -> dict[str, Any]:
    """The trainer's figures, and the cores the daemon kept busy meanwhile."""
    cpu0, t0 = _cpu_seconds(args.daemon_pid), time.monotonic()
    row = _train(endpoint, args.iterations, args.warmup)
    seconds, cpu1 = time.monotonic() - t0, _cpu_seconds(args.daemon_pid)
    row["seconds"] = seconds
    row["daemon_cores"] = (cpu1 - cpu0) / seconds if cpu0 is not None and cpu1 is not None \
        else ""
    return row


def _scenario(endpoint: str, kind: str, args: argparse.Namespace) -> dict[str, Any]:
    if kind == "solo":
        return {"scenario": kind, **_train_timed(endpoint, args)}
    spawn = mp.get_context("spawn")
    ready, stop = spawn.Event(), spawn.Event()
    counts = spawn.Array("q", [0, 0])
    cores = spawn.Array("d", [0.0])
    flooder = spawn.Process(target=_flood, args=(endpoint, kind, args.idle_connections,
                                                 args.garbage_mib << 20, ready, stop, counts,
                                                 cores),
                            daemon=True)
    flooder.start()
    try:
        if not ready.wait(60):
            raise RuntimeError(f"the {kind} flooder did not start")
        row = {"scenario": kind, **_train_timed(endpoint, args)}
    finally:
        stop.set()
        flooder.join(300)
    if flooder.exitcode != 0:
        raise RuntimeError(f"the {kind} flooder failed (exit {flooder.exitcode})")
    seconds = row.pop("seconds")
    row["flood_replies"] = int(counts[0])
    row["flood_refused"] = int(counts[1])
    row["flood_replies_per_s"] = counts[0] / seconds if seconds > 0 else 0.0
    row["flooder_cores"] = cores[0]
    return row


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="50 iterations per scenario")
    p.add_argument("--iterations", type=int, default=None, help="measured (default 200)")
    p.add_argument("--warmup", type=int, default=10)
    p.add_argument("--idle-connections", type=int, default=200)
    p.add_argument("--garbage-mib", type=int, default=GARBAGE_MIB,
                   help="size of each garbage envelope")
    p.add_argument("--endpoint", default=None, help="a running daemon (default: start one)")
    p.add_argument("--bin", type=Path, default=None,
                   help="folder of salus-server (default: $SALUS_SERVER's, else build/bin)")
    p.add_argument("--scenarios", default=",".join(SCENARIOS))
    p.add_argument("--out", type=Path, default=None)
    args = p.parse_args(argv)
    if args.iterations is None:
        args.iterations = 50 if args.quick else 200
    if args.bin is None and os.environ.get("SALUS_SERVER"):
        args.bin = Path(os.environ["SALUS_SERVER"]).resolve().parent
    if args.bin is not None:
        common.BIN = args.bin
    kinds = [k for k in args.scenarios.split(",") if k]
    if kinds[0] != "solo" or any(k not in SCENARIOS for k in kinds):
        p.error(f"--scenarios: 'solo' first, then any of {', '.join(SCENARIOS[1:])}")
    args.out = common.out_dir("security-flood", args.out)

    watch = common.Stopwatch()
    rows: list[dict[str, Any]] = []
    with contextlib.ExitStack() as stack:
        args.daemon_pid = None  # a daemon given by --endpoint is not measured
        endpoint = args.endpoint
        if not endpoint:
            d = stack.enter_context(common.Daemon("fair", "2GiB", None,
                                                  log_path=args.out / "salus-server.log"))
            endpoint, args.daemon_pid = d.endpoint, d.ready.get("pid")
        for kind in kinds:
            rows.append(_scenario(endpoint, kind, args))
            print(f"{kind}: median {rows[-1]['median_ms']:.2f} ms", flush=True)
    solo, solo_device = rows[0]["median_ms"], rows[0]["device_median_ms"]
    for r in rows:
        r["ratio"] = r["median_ms"] / solo
        r["within_target"] = r["ratio"] <= TARGET_RATIO
        # The iteration's own run time: its growth is contention for the cores, not waiting.
        r["device_ratio"] = r["device_median_ms"] / solo_device

    fields = ["scenario", "median_ms", "p95_ms", "ratio", "within_target", "device_median_ms",
              "device_ratio", "daemon_cores", "flooder_cores", "flood_replies", "flood_refused",
              "flood_replies_per_s"]
    table = common.md_table(rows, fields)
    print(table)
    result = {"model": "mlp", "batch": BATCH, "iterations": args.iterations,
              "cpu_cores": os.cpu_count(), "target_ratio": TARGET_RATIO,
              "idle_connections": args.idle_connections, "garbage_mib": args.garbage_mib,
              "scenarios": rows}
    (args.out / "flood.json").write_text(json.dumps(result, indent=2) + "\n")
    common.write_csv(args.out / "flood.csv", rows, fields)
    common.write_report(args.out, "Security: a flood beside a trainer", args, [
        f"The trainer's MLP iteration (batch {BATCH}) as it sees it, alone and beside each "
        f"flood; target ratio <= {TARGET_RATIO}.", "", table], watch())
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
