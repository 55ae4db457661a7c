"""`srtf` (Figure 8): a long training job preempted by shorter arrivals under SRTF.

The model's iteration time alone is measured first; then a long job of about --long seconds
starts at 0, and --shorts short jobs of about --short seconds each arrive every --gap seconds.
All declare their iteration counts, so SRTF knows their remaining time. Each short arrival
should preempt the long job at its next iteration boundary and run to completion before the
long job resumes. Outputs: every iteration's start and end (iterations.csv), the timeline plot,
and the switch gaps the daemon measured (the idle time of the lane between one session's
iteration and the next session's), set against the gaps between one job's own consecutive
iterations, which include the client's round trip.
"""

from __future__ import annotations

import argparse
import time
from typing import Any

from tqdm import tqdm

from benchmarks.driver import common


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", default="resnet", choices=sorted(common.MODEL_SPECS))
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--long", type=float, default=40.0, help="seconds of work of the long job")
    p.add_argument("--short", type=float, default=6.0, help="seconds of work of each short job")
    p.add_argument("--shorts", type=int, default=3, help="number of short jobs")
    p.add_argument("--gap", type=float, default=9.0, help="seconds between short arrivals")


def smoke(args: argparse.Namespace) -> None:
    args.long, args.short, args.shorts, args.gap = 4.0, 0.8, 2, 1.2
    args.batch = min(args.batch, 16)


def run(args: argparse.Namespace) -> list[str]:
    import salus

    spec = common.MODEL_SPECS[args.model]
    feeds = spec.feeds(args.batch, seed=args.seed)
    records: list[common.IterationRecord] = []
    with common.device(args, "srtf") as endpoint:
        it_s = common.calibrate(endpoint, args.model, args.batch)
        n_long = max(2, round(args.long / it_s))
        n_short = max(1, round(args.short / it_s))
        jobs = [("long", 0.0, n_long)] + [
            (f"short{k + 1}", args.gap * (k + 1), n_short) for k in range(args.shorts)]
        clients = {j: salus.connect(endpoint, timeout=None, name=j) for j, _, _ in jobs}
        bar = tqdm(total=n_long + n_short * args.shorts, desc="srtf", unit="it")
        try:
            t0 = time.monotonic()

            def job(name: str, at: float, n: int) -> Any:
                def body() -> None:
                    time.sleep(max(0.0, t0 + at - time.monotonic()))
                    s = common.open_model_session(clients[name], args.model, args.batch,
                                                  iterations=n, name=name)
                    for i in range(n):
                        records.append(common.timed_run(s, feeds, [], name, i, t0))
                        bar.update(1)
                    s.close()
                return body

            errors = common.run_threads([job(*j) for j in jobs])
            # Closed only once every thread is done with its socket (see fairness.py).
            for c in clients.values():
                c.close()
        finally:
            bar.close()
        if errors:
            raise errors[0]
    records.sort(key=lambda r: r.start_s)
    common.write_csv(args.out / "iterations.csv", [r.row() for r in records],
                     common.ITERATION_FIELDS)
    switches, same = [], []
    for prev, cur in zip(records, records[1:], strict=False):
        (same if prev.job == cur.job else switches).append(cur.switch_gap_s * 1e3)
    per_job = []
    for name, at, n in jobs:
        mine = [r for r in records if r.job == name]
        per_job.append({"job": name, "arrival_s": at, "iterations": n,
                        "first_start_s": min(r.start_s for r in mine),
                        "finish_s": max(r.end_s for r in mine),
                        "jct_s": max(r.end_s for r in mine) - at,
                        "preempted_s": _preempted(mine, records)})
    common.write_csv(args.out / "jobs.csv", per_job)
    gaps = [{"kind": "switch (another job's iteration next)", "count": len(switches),
             "median_ms": common.median(switches), "p95_ms": common.percentile(switches, 95),
             "max_ms": max(switches, default=float("nan"))},
            {"kind": "same job's next iteration", "count": len(same),
             "median_ms": common.median(same), "p95_ms": common.percentile(same, 95),
             "max_ms": max(same, default=float("nan"))}]
    common.write_csv(args.out / "switch_gaps.csv", gaps)
    _plot(args.out / "timeline.png", records, [j for j, _, _ in jobs])
    return [
        f"Model `{args.model}` (training, batch {args.batch}); one iteration alone takes "
        f"{it_s * 1e3:.1f} ms (median). Long job: {n_long} iterations; {args.shorts} short "
        f"jobs of {n_short} iterations, one every {args.gap:g} s. Policy SRTF.",
        "",
        common.md_table(per_job, list(per_job[0].keys())),
        "",
        "Gaps between consecutive iterations on the lane, as the daemon measured them:",
        "",
        common.md_table(gaps, list(gaps[0].keys())),
        "",
        "Paper (Figure 8): each shorter job preempts the long one at an iteration boundary and "
        "the switch itself costs well under a millisecond.",
        "",
        "![timeline](timeline.png)",
    ]


def _preempted(mine: list[common.IterationRecord], records: list[common.IterationRecord]) -> float:
    """Seconds of other jobs' iterations inside this job's lifetime."""
    lo, hi = min(r.start_s for r in mine), max(r.end_s for r in mine)
    job = mine[0].job
    return sum(r.run_s for r in records if r.job != job and lo <= r.start_s < hi)


def _plot(path: Any, records: list[common.IterationRecord], names: list[str]) -> None:
    plt = common.plt_figure()
    fig, ax = plt.subplots(figsize=(8, 0.6 * len(names) + 1.5))
    for y, name in enumerate(names):
        bars = [(r.start_s, r.run_s) for r in records if r.job == name]
        ax.broken_barh(bars, (y - 0.4, 0.8), color=f"C{y}")
    ax.set_yticks(range(len(names)))
    ax.set_yticklabels(names)
    ax.invert_yaxis()
    ax.set_xlabel("time (s)")
    ax.set_title("which job's iteration runs when (SRTF)")
    ax.grid(axis="x", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
