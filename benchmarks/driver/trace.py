"""`trace` (Table 1, Figure 7): a job trace under FIFO, SRTF, PACK and FAIR.

With --sim each policy replays the trace on salus-sim (virtual clock, full scale, the
compute-contention model of src/tools/simulator.h); SRTF is also replayed with memory out of
the picture (`srtf-ideal`: a capacity of the sum of every job's P + E, rounded up to a GiB,
plus one GiB, so every job of the trace could be resident at once), which tells how much of
SRTF's gap to the paper is memory: its jobs then wait only for the device, never for
admission. The summary gives each policy's average JCT as a fraction of FIFO's
(`fifo_jct_ratio` = FIFO's average JCT / the policy's). Without it each policy gets its own
salus-server and every job becomes a synthetic session, started by its own thread at its
submit time, that replays the workload profile: time is multiplied by --time-scale and memory
by --memory-scale. A synthetic iteration sleeps, so jobs in different lanes do not contend for
compute on the daemon. Consecutive profile iterations are grouped into one synthetic
iteration of at least --quantum seconds, so that the Python client's round trip does not
dominate. Times in the tables are converted back to trace time (divided by the time scale).
While the jobs run, the daemon's session listing is polled: `max_admitted_seen` is the most
sessions it showed admitted at once.
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import subprocess
import threading
import time
from dataclasses import dataclass, field
from fractions import Fraction
from pathlib import Path
from typing import Any

from tqdm import tqdm

from benchmarks.driver import common

POLICIES = ["fifo", "srtf", "pack", "fair"]
# Table 1 of the paper (minutes): makespan, average JCT.
PAPER = {"fifo": (303.4, 170.6), "srtf": (306.0, 53.4), "pack": (287.4, 145.5),
         "fair": (301.6, 96.6)}
IDEAL = "srtf-ideal"
SUMMARY_FIELDS = ["policy", "capacity", "jobs", "finished", "refused", "makespan_min",
                  "avg_queuing_min", "max_admission_wait_min", "avg_jct_min", "p95_jct_min",
                  "fifo_jct_ratio", "max_admitted_seen", "paper_makespan_min",
                  "paper_avg_jct_min"]


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--sim", action="store_true", help="replay on salus-sim instead of the daemon")
    p.add_argument("--trace", type=Path, default=common.TRACES / "paper-100.csv")
    p.add_argument("--policies", default=",".join(POLICIES), help="comma-separated")
    p.add_argument("--jobs", type=int, default=0, help="only the first N jobs (0: all)")
    p.add_argument("--capacity", default="16GiB", help="device memory at trace scale")
    p.add_argument("--turnaround", type=float, default=0.0,
                   help="sim: seconds from a reply to the client's next request (0: back to "
                   "back)")
    p.add_argument("--time-scale", type=_fraction, default=Fraction(1, 300),
                   help="daemon: seconds of replay per trace second, e.g. 1/60")
    p.add_argument("--memory-scale", type=_fraction, default=Fraction(1, 32),
                   help="daemon: bytes of arena per trace byte, e.g. 1/16")
    p.add_argument("--quantum", type=float, default=0.05,
                   help="daemon: shortest synthetic iteration in seconds")


def _fraction(text: str) -> Fraction:
    f = Fraction(text)
    if f <= 0:
        raise argparse.ArgumentTypeError(f"must be positive, got {text}")
    return f


def smoke(args: argparse.Namespace) -> None:
    if args.sim:
        return  # the simulator replays the whole trace in about a second
    args.jobs = 8
    args.time_scale = Fraction(1, 3000)


@dataclass
class Job:
    job_id: str
    workload: str
    submit_s: float
    iterations: int
    persistent_bytes: int
    ephemeral_bytes: int
    iteration_s: float
    result: dict[str, Any] = field(default_factory=dict)


def load_jobs(trace: Path, limit: int) -> list[Job]:
    with common.PROFILES.open(newline="") as f:
        profiles = {r["workload"]: r for r in csv.DictReader(f)}
    jobs: list[Job] = []
    with trace.open(newline="") as f:
        for row in csv.DictReader(f):
            prof = profiles.get(row["workload"], {})

            def pick(key: str, row: dict[str, str] = row, prof: dict[str, str] = prof) -> float:
                v = row.get(key) or prof.get(key)
                if not v:
                    raise SystemExit(f"{trace}: job {row['job_id']}: no {key} for "
                                     f"workload {row['workload']}")
                return float(v)

            jobs.append(Job(row["job_id"], row["workload"], float(row["submit_time_s"]),
                            int(row["iterations"]), int(pick("persistent_mb") * common.MIB),
                            int(pick("ephemeral_mb") * common.MIB), pick("iteration_s")))
            if limit and len(jobs) >= limit:
                break
    return jobs


def run(args: argparse.Namespace) -> list[str]:
    policies = [p.strip() for p in args.policies.split(",") if p.strip()]
    for p in policies:
        if p not in POLICIES:
            raise SystemExit(f"trace: unknown policy {p!r}")
    if args.endpoint:
        policies = [common.server_policy(args.endpoint)]
    jobs = load_jobs(args.trace, args.jobs)
    # (label, policy, capacity) for each replay.
    runs = [(p, p, args.capacity) for p in policies]
    if args.sim and "srtf" in policies:
        runs.append((IDEAL, "srtf", ideal_capacity(jobs)))
    per_policy: dict[str, list[dict[str, Any]]] = {}
    summaries: list[dict[str, Any]] = []
    with tqdm(total=len(jobs) * len(runs), desc="trace", unit="job") as bar:
        for label, policy, capacity in runs:
            bar.set_postfix_str(label)
            if args.sim:
                rows = _simulate(args, policy, bar, capacity, label)
            else:
                rows = _replay(args, policy, jobs, bar)
            per_policy[label] = rows
            summaries.append(dict(_summary(label, rows), capacity=capacity))
    fifo = next((r["avg_jct_min"] for r in summaries if r["policy"] == "fifo"), math.nan)
    for r in summaries:
        r["fifo_jct_ratio"] = fifo / r["avg_jct_min"] if r["avg_jct_min"] else math.nan
    common.write_csv(args.out / "summary.csv", summaries, SUMMARY_FIELDS)
    all_rows = [dict(r, policy=p) for p, rows in per_policy.items() for r in rows]
    common.write_csv(args.out / "jobs.csv", all_rows,
                     ["policy", "job_id", "workload", "status", "submit_s", "queuing_s",
                      "jct_s", "finish_s", "lane", "state_at_create"])
    _plot_cdf(args.out / "jct_cdf.png", per_policy)
    where = ("salus-sim (virtual clock, compute contention min(1, 1/sum utilization))"
             if args.sim else
             f"salus-server, synthetic sessions; time x{args.time_scale}, memory "
             f"x{args.memory_scale} (capacity {args.capacity} -> "
             f"{_scaled_capacity(args) / common.MIB:.0f} MiB), iterations grouped to "
             f">= {args.quantum} s; times converted back to trace time")
    by = {r["policy"]: r for r in summaries}
    ratios = [f"- FIFO / {label.upper()} average JCT: {by[label]['fifo_jct_ratio']:.2f}x "
              f"({by['fifo']['avg_jct_min']:.1f} / {by[label]['avg_jct_min']:.1f} min"
              f"{', capacity ' + by[label]['capacity'] if label == IDEAL else ''})"
              for label in ("srtf", IDEAL) if label in by and "fifo" in by]
    paper = PAPER["fifo"][1] / PAPER["srtf"][1]
    return [
        f"Trace `{args.trace.name}`, {len(jobs)} jobs, on {where}"
        + (f"; client turnaround {args.turnaround:g} s" if args.sim else "") + ".",
        "",
        "Times in minutes of trace time. Paper: Table 1 (P100, 100 jobs)."
        + (f" `{IDEAL}`: SRTF with every job resident at once (memory out of the picture)."
           if IDEAL in by else ""),
        "",
        common.md_table(summaries, SUMMARY_FIELDS),
        "",
        *ratios,
        *([f"- Paper: FIFO / SRTF average JCT {paper:.2f}x.", ""] if ratios else []),
        "![JCT CDF](jct_cdf.png)",
    ]


def ideal_capacity(jobs: list[Job]) -> str:
    """Room for every job of the trace at once: the sum of P + E rounded up to a GiB, plus one
    GiB (for the arena's alignment of each P and E)."""
    total = sum(j.persistent_bytes + j.ephemeral_bytes for j in jobs)
    return f"{math.ceil(total / (1 << 30)) + 1}GiB"


def _summary(policy: str, rows: list[dict[str, Any]]) -> dict[str, Any]:
    done = [r for r in rows if r["status"] == "finished"]
    jct = [r["jct_s"] / 60 for r in done]
    waits = [r["admission_wait_s"] / 60 for r in done if "admission_wait_s" in r]
    first_submit = min((r["submit_s"] for r in rows), default=0.0)
    makespan = (max(r["finish_s"] for r in done) - first_submit) / 60 if done else float("nan")
    paper = PAPER.get(policy, (float("nan"), float("nan")))
    return {
        "policy": policy, "jobs": len(rows), "finished": len(done),
        "refused": sum(r["status"] != "finished" for r in rows),
        "makespan_min": makespan,
        "avg_queuing_min": sum(r["queuing_s"] for r in done) / 60 / max(len(done), 1),
        "max_admission_wait_min": max(waits) if waits else math.nan,
        "avg_jct_min": sum(jct) / max(len(jct), 1),
        "p95_jct_min": common.percentile(jct, 95),
        # daemon replays only: the most sessions its listing showed admitted at once
        "max_admitted_seen": rows[0].get("max_admitted_seen", "") if rows else "",
        "paper_makespan_min": paper[0], "paper_avg_jct_min": paper[1],
    }


# -- salus-sim ----------------------------------------------------------------------------------
def _simulate(args: argparse.Namespace, policy: str, bar: tqdm, capacity: str,
              label: str) -> list[dict[str, Any]]:
    trace = args.trace
    if args.jobs:
        trace = args.out / "trace.csv"
        lines = args.trace.read_text().splitlines()
        trace.write_text("\n".join(lines[: args.jobs + 1]) + "\n")
    out = args.out / f"sim-{label}"
    cmd = [str(common.BIN / "salus-sim"), "--trace", str(trace), "--policy", policy,
           "--capacity", capacity, "--out", str(out), "--seed", str(args.seed),
           "--turnaround", f"{args.turnaround:g}"]
    subprocess.run(cmd, check=True, capture_output=True, text=True)
    rows = []
    with (out / "jobs.jsonl").open() as f:
        for line in f:
            j = json.loads(line)
            rows.append({"job_id": j["job_id"], "workload": j["workload"],
                         "status": j["status"], "submit_s": j["submit_s"],
                         "queuing_s": j.get("queuing_s", float("nan")),
                         "jct_s": j.get("jct_s", float("nan")),
                         "finish_s": j.get("finish_s", float("nan")), "lane": j.get("lane", ""),
                         "admission_wait_s": j.get("admitted_s", math.nan) - j["submit_s"]})
            bar.update(1)
    return rows


# -- the daemon ---------------------------------------------------------------------------------
def _scaled_capacity(args: argparse.Namespace) -> int:
    return int(common.parse_bytes(args.capacity) * args.memory_scale)


def _replay(args: argparse.Namespace, policy: str, jobs: list[Job],
            bar: tqdm) -> list[dict[str, Any]]:
    import salus

    scale = float(args.time_scale)
    capacity = _scaled_capacity(args)
    with common.device(args, policy, memory=f"{capacity // common.MIB}MiB") as endpoint:
        t0 = time.monotonic() + 0.5  # every thread is started before the first submit
        lock = threading.Lock()

        def one(job: Job) -> None:
            real_iter = job.iteration_s * scale
            group = max(1, math.ceil(args.quantum / real_iter))
            n = max(1, round(job.iterations / group))
            iteration_s = real_iter * job.iterations / n  # the job's total time is kept
            submit = t0 + job.submit_s * scale
            time.sleep(max(0.0, submit - time.monotonic()))
            r: dict[str, Any] = {"job_id": job.job_id, "workload": job.workload,
                                 "submit_s": job.submit_s, "status": "error",
                                 "queuing_s": float("nan"), "jct_s": float("nan"),
                                 "finish_s": float("nan"), "lane": ""}
            c = None
            try:
                c = salus.connect(endpoint, timeout=None, name=job.job_id)
                s = c.create_session(
                    synthetic={"persistent_bytes": int(job.persistent_bytes * args.memory_scale),
                               "ephemeral_bytes": int(job.ephemeral_bytes * args.memory_scale),
                               "iteration_seconds": iteration_s},
                    iterations=n, duration=n * iteration_s, name=job.job_id)
                r["state_at_create"] = s.state
                first_start = None
                for _ in range(n):
                    s.run()
                    if first_start is None:
                        st = s.last_stats
                        assert st is not None
                        first_start = time.monotonic() - st.run_us / 1e6
                        r["lane"] = st.lane
                end = time.monotonic()
                s.close()
                assert first_start is not None
                r.update(status="finished", queuing_s=(first_start - submit) / scale,
                         jct_s=(end - submit) / scale, finish_s=(end - t0) / scale)
            except salus.SalusError as e:
                r["status"] = "refused" if e.code == "RESOURCE_EXHAUSTED" else f"error {e.code}"
            finally:
                if c is not None:
                    c.close()
                with lock:
                    bar.update(1)
            job.result = r

        # The daemon's own listing, polled while the jobs run: how many sessions it has
        # admitted at once (FIFO admits one at a time, whatever the machine's load).
        stop = threading.Event()
        seen = {"max_admitted": 0, "listings": 0}

        def monitor() -> None:
            c = salus.connect(endpoint, timeout=None, name="monitor")
            try:
                while not stop.wait(0.02):
                    others = c.others()  # the jobs' sessions are other clients'
                    seen["listings"] += 1
                    seen["max_admitted"] = max(seen["max_admitted"], others["admitted"])
            finally:
                c.close()

        watcher = threading.Thread(target=monitor, daemon=True)
        watcher.start()
        threads = [threading.Thread(target=one, args=(j,), daemon=True) for j in jobs]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        stop.set()
        watcher.join()
    for j in jobs:
        j.result.update(max_admitted_seen=seen["max_admitted"], listings=seen["listings"])
    return [j.result for j in jobs]


def _plot_cdf(path: Path, per_policy: dict[str, list[dict[str, Any]]]) -> None:
    plt = common.plt_figure()
    fig, ax = plt.subplots(figsize=(6, 4))
    for policy, rows in per_policy.items():
        jct = sorted(r["jct_s"] / 60 for r in rows if r["status"] == "finished")
        if jct:
            ax.step(jct, [(i + 1) / len(jct) for i in range(len(jct))], where="post",
                    label=policy.upper())
    ax.set_xscale("log")
    ax.set_xlabel("job completion time (trace minutes)")
    ax.set_ylabel("fraction of jobs")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
