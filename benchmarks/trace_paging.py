"""Paging and swapping on salus-sim: a job trace with and without overcommit and swapping.

Each (policy, overcommit, swap fraction) replays the trace on salus-sim (virtual clock, the model of
src/tools/simulator.h; Note [Simulated paging] in simulator.cc for the copy path): overcommit 1
is the replay without paging, above 1 admits jobs while the persistent memory of all admitted
ones is within overcommit x capacity and pages to host memory what does not fit resident, each
copy taking bytes / --host-bandwidth-gbps on one copy path. The table gives average JCT,
makespan, page-ins and what was copied. Paging can only matter when the jobs in the system
at once need more persistent memory than the device has: `peak_sum_p_gib` is the most
persistent memory of jobs submitted and not yet finished at any moment of each replay (so a
value above the capacity at overcommit 1 means jobs contended for memory there).

    .venv/bin/python -m benchmarks.trace_paging --sim build/bin/salus-sim \\
        [--trace benchmarks/traces/paper-100.csv] [--capacity 16GiB] [--out DIR] \\
        [--overcommits 1,1.5] [--swap-fractions 0,0.5]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

from benchmarks.driver import common
from benchmarks.driver.trace import load_jobs

FIELDS = ["policy", "overcommit", "swap", "capacity", "finished", "refused", "avg_jct_min",
          "makespan_min", "avg_queuing_min", "page_ins", "page_outs", "gb_copied",
          "copy_busy_s", "jobs_swapped", "swap_gb_copied", "peak_sum_p_gib"]
GIB = 1 << 30
GB = 10**9  # link bandwidths and copied volumes are quoted in decimal gigabytes


def _floats(text: str) -> list[float]:
    return [float(v) for v in text.split(",") if v.strip()]


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m benchmarks.trace_paging",
                                description=__doc__.split("\n\n")[0])
    p.add_argument("--sim", type=Path, default=common.BIN / "salus-sim",
                   help="the salus-sim binary")
    p.add_argument("--trace", type=Path, default=common.TRACES / "paper-100.csv")
    p.add_argument("--capacity", default="16GiB", help="device memory at trace scale")
    p.add_argument("--policies", default="srtf,fair", help="comma-separated")
    p.add_argument("--overcommits", type=_floats, default=[1.0, 1.5],
                   help="comma-separated; 1 is the replay without paging")
    p.add_argument("--host-bandwidth-gbps", type=float, default=25.0,
                   help="GB/s (1e9 bytes) between device and host memory; 25 is a PCIe 4.0 "
                   "x16 link's practical rate")
    p.add_argument("--paging-quantum-ms", type=float, default=1000.0)
    p.add_argument("--swap-fractions", type=_floats, default=[0.0],
                   help="comma-separated fractions of E training jobs may swap; 0 is none")
    p.add_argument("--swap-overlap", type=float, default=0.5,
                   help="fraction of an iteration that swap copies hide behind")
    p.add_argument("--turnaround", type=float, default=0.0,
                   help="seconds from a reply to the client's next request (0: back to back)")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--out", type=Path, default=None,
                   help="output folder (default results/trace-paging-<timestamp>/)")
    return p


def peak_sum_p(rows: list[dict[str, Any]], persistent: dict[str, int]) -> int:
    """The most persistent memory of jobs submitted and not yet finished at any moment."""
    events: list[tuple[float, int]] = []
    for r in rows:
        if r["status"] != "finished":
            continue
        p = persistent[r["job_id"]]
        events += [(r["submit_s"], p), (r["finish_s"], -p)]
    # A job leaving at the moment another arrives frees its memory first.
    events.sort(key=lambda e: (e[0], e[1]))
    now = peak = 0
    for _, delta in events:
        now += delta
        peak = max(peak, now)
    return peak


def replay(args: argparse.Namespace, policy: str, overcommit: float, swap: float,
           persistent: dict[str, int]) -> dict[str, Any]:
    out = args.out / f"sim-{policy}-{overcommit:g}-swap{swap:g}"
    cmd = [str(args.sim), "--trace", str(args.trace), "--policy", policy,
           "--capacity", args.capacity, "--out", str(out), "--seed", str(args.seed),
           "--turnaround", f"{args.turnaround:g}", "--overcommit", f"{overcommit:g}",
           "--host-bandwidth-gbps", f"{args.host_bandwidth_gbps:g}",
           "--paging-quantum-ms", f"{args.paging_quantum_ms:g}",
           "--swap-fraction", f"{swap:g}", "--swap-overlap", f"{args.swap_overlap:g}"]
    subprocess.run(cmd, check=True, capture_output=True, text=True)
    summary = json.loads((out / "summary.json").read_text())
    with (out / "jobs.jsonl").open() as f:
        rows = [json.loads(line) for line in f]
    paging = summary.get("paging", {})  # absent without paging
    swapping = summary.get("swapping", {})  # absent without swapping
    return {
        "policy": policy, "overcommit": overcommit, "swap": swap, "capacity": args.capacity,
        "finished": summary["finished"], "refused": summary["refused"],
        "avg_jct_min": summary["avg_jct_s"] / 60, "makespan_min": summary["makespan_s"] / 60,
        "avg_queuing_min": summary["avg_queuing_s"] / 60,
        "page_ins": paging.get("page_ins", 0), "page_outs": paging.get("page_outs", 0),
        "gb_copied": paging.get("copied_bytes", 0) / GB,
        "copy_busy_s": paging.get("copy_busy_s", 0.0),
        "jobs_swapped": swapping.get("jobs_swapped", 0),
        "swap_gb_copied": swapping.get("copied_bytes", 0) / GB,
        "peak_sum_p_gib": peak_sum_p(rows, persistent) / GIB,
        "wall_s": summary.get("wall_s", float("nan")),
    }


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    if not args.sim.exists():
        raise SystemExit(f"trace_paging: no {args.sim}: build salus-sim or pass --sim")
    if any(o < 1 for o in args.overcommits):
        raise SystemExit("trace_paging: every overcommit must be >= 1")
    if any(not 0 <= f < 1 for f in args.swap_fractions):
        raise SystemExit("trace_paging: every swap fraction must be in [0, 1)")
    args.out = common.out_dir("trace-paging", args.out)
    clock = common.Stopwatch()
    jobs = load_jobs(args.trace, 0)
    persistent = {j.job_id: j.persistent_bytes for j in jobs}
    policies = [p.strip() for p in args.policies.split(",") if p.strip()]
    results = [replay(args, p, o, f, persistent) for p in policies for o in args.overcommits
               for f in args.swap_fractions]
    common.write_csv(args.out / "summary.csv", results, [*FIELDS, "wall_s"])
    capacity = common.parse_bytes(args.capacity)
    sections = [
        f"Trace `{args.trace.name}`, {len(jobs)} jobs, on salus-sim at {args.capacity}: "
        f"persistent memory of all jobs {sum(persistent.values()) / GIB:.1f} GiB, largest "
        f"job {max(persistent.values()) / GIB:.1f} GiB; copy path {args.host_bandwidth_gbps:g} "
        f"GB/s, one copy at a time; paging quantum {args.paging_quantum_ms:g} ms; client "
        f"turnaround {args.turnaround:g} s; swap copies hide behind {args.swap_overlap:g} of "
        "an iteration.",
        "",
        "Times in minutes of trace time. `gb_copied`: GB (1e9 bytes) copied both ways; "
        "`copy_busy_s`: seconds the copy path was busy paging; `swap`: the fraction of E "
        "training jobs may swap; `jobs_swapped`: jobs that ran at a swap point; "
        "`swap_gb_copied`: GB the swaps copied; `peak_sum_p_gib`: the most persistent "
        f"memory of jobs in the system at once (capacity {capacity / GIB:.1f} GiB).",
        "",
        common.md_table(results, FIELDS),
    ]
    common.write_report(args.out,
                        "trace-paging: a trace with and without overcommit and swapping", args,
                        sections, clock())
    print(common.md_table(results, FIELDS))
    print(f"trace_paging: wrote {args.out}/report.md ({clock():.1f} s)", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
