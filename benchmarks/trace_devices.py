"""Several devices on salus-sim: a generated multi-device trace with and without the engine's
moves (defragmentation) and introspective packing, per policy.

A 400-job trace (`benchmarks.trace_gen`, arrivals 4x as dense as the 100-job trace's, so that
four devices are as loaded as one is there) replays on salus-sim with 4 devices of 16 GiB
(Note [Simulated devices] in src/tools/simulator.cc), and, for scale, on 1 device. Packed
compute-bound jobs interfere (`--interference`, default 0.3: each iteration 30% slower per
other iteration beside it on its device, beyond sharing compute), which is what introspective
packing detects. Rows: every policy with the engine's moves on, then off
(`--no-defragment`), and PACK with introspection off (`{"introspect": false}`). The table
gives average JCT, makespan, average queuing, the devices' mean utilization and the moves.

    .venv/bin/python -m benchmarks.trace_devices --sim build/bin/salus-sim [--jobs 400] \\
        [--devices 4] [--capacity 16GiB] [--interference 0.3] [--out DIR]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

from benchmarks.driver import common

FIELDS = ["policy", "devices", "moves", "introspect", "finished", "avg_jct_min", "makespan_min",
          "avg_queuing_min", "mean_utilization", "migrations", "pairs_kept", "pairs_apart",
          "pairs_moved"]


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m benchmarks.trace_devices",
                                description=__doc__.split("\n\n")[0])
    p.add_argument("--sim", type=Path, default=common.BIN / "salus-sim")
    p.add_argument("--jobs", type=int, default=400)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--devices", type=int, default=4)
    p.add_argument("--capacity", default="16GiB", help="each device's memory")
    p.add_argument("--interference", type=float, default=0.3)
    p.add_argument("--policies", default="fifo,srtf,pack,fair")
    p.add_argument("--out", type=Path, default=None,
                   help="output folder (default results/trace-devices-<timestamp>/)")
    return p


def replay(args: argparse.Namespace, trace: Path, policy: str, devices: int, moves: bool,
           introspect: bool) -> dict[str, Any]:
    tag = f"sim-{policy}-{devices}-{'moves' if moves else 'nomoves'}"
    tag += "" if introspect else "-nointrospect"
    out = args.out / tag
    cmd = [str(args.sim), "--trace", str(trace), "--policy", policy, "--capacity",
           args.capacity, "--out", str(out), "--devices", str(devices),
           "--interference", f"{args.interference:g}"]
    if not moves:
        cmd.append("--no-defragment")
    if not introspect:
        cmd += ["--policy-options", json.dumps({"introspect": False})]
    subprocess.run(cmd, check=True, capture_output=True, text=True)
    s = json.loads((out / "summary.json").read_text())
    dv = s.get("devices", {})
    # One device: salus-sim reports no busy time (its output is what it was before devices),
    # so the cell stays blank.
    util = dv.get("utilization")
    return {
        "policy": policy, "devices": devices, "moves": moves, "introspect": introspect,
        "finished": s["finished"], "avg_jct_min": s["avg_jct_s"] / 60,
        "makespan_min": s["makespan_s"] / 60, "avg_queuing_min": s["avg_queuing_s"] / 60,
        "mean_utilization": sum(util) / len(util) if util else "",
        "migrations": dv.get("migrations", {}).get("finished", 0),
        "pairs_kept": dv.get("pairs", {}).get("kept", 0),
        "pairs_apart": dv.get("pairs", {}).get("apart", 0),
        "pairs_moved": dv.get("pairs", {}).get("moved", 0),
    }


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    if not args.sim.exists():
        raise SystemExit(f"trace_devices: no {args.sim}: build salus-sim or pass --sim")
    args.out = common.out_dir("trace-devices", args.out)
    clock = common.Stopwatch()
    trace = args.out / f"trace-{args.jobs}.csv"
    subprocess.run([sys.executable, "-m", "benchmarks.trace_gen", "--jobs", str(args.jobs),
                    "--seed", str(args.seed), "--interarrival", f"{60.0 / args.devices:g}",
                    "--out", str(trace)], check=True, capture_output=True, text=True)
    policies = [p.strip() for p in args.policies.split(",") if p.strip()]
    results = []
    for policy in policies:
        results.append(replay(args, trace, policy, 1, True, True))
        results.append(replay(args, trace, policy, args.devices, True, True))
        results.append(replay(args, trace, policy, args.devices, False, True))
        if policy == "pack":
            results.append(replay(args, trace, policy, args.devices, True, False))
    common.write_csv(args.out / "summary.csv", results, FIELDS)
    sections = [
        f"{args.jobs} generated jobs (seed {args.seed}, mean interarrival "
        f"{60.0 / args.devices:g} s), devices of {args.capacity}, interference "
        f"{args.interference:g}. Times in minutes of trace time; utilization is the mean over "
        "devices of the time each had an iteration running, over the makespan.",
        "",
        common.md_table(results, FIELDS),
    ]
    common.write_report(args.out, "trace-devices: several devices, moves and introspection",
                        args, sections, clock())
    print(common.md_table(results, FIELDS))
    print(f"trace_devices: wrote {args.out}/report.md ({clock():.1f} s)", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
