"""`fairness` (Figure 9): three identical training jobs share the device under FAIR.

Job A starts at 0 and leaves at 5T, B runs from T to 4T, C from 2T to 3T: they arrive one by
one and leave in reverse order. Each job is a thread with its own connection that trains the
same real model (same batch, seeded data) back to back while it is present. The plot shows
each job's throughput and the total over time, in windows of --window seconds; the table
gives, per phase, each job's mean throughput and Jain's fairness index over the jobs present.
"""

from __future__ import annotations

import argparse
import time
from typing import Any

from tqdm import tqdm

from benchmarks.driver import common

JOBS = ["A", "B", "C"]


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", default="resnet", choices=sorted(common.MODEL_SPECS))
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--period", type=float, default=15.0, help="T, seconds between arrivals")
    p.add_argument("--window", type=float, default=0.0,
                   help="throughput window in seconds (default T/5)")
    p.add_argument("--single-lane", action="store_true",
                   help="FAIR's single shared lane (policy option single_lane)")


def smoke(args: argparse.Namespace) -> None:
    args.period = 2.0
    args.batch = min(args.batch, 16)


def jain(values: list[float]) -> float:
    """Jain's fairness index: 1 when all equal, 1/n when one takes everything."""
    if not values or sum(values) == 0:
        return float("nan")
    return sum(values) ** 2 / (len(values) * sum(v * v for v in values))


def run(args: argparse.Namespace) -> list[str]:
    import salus

    T = args.period
    window = args.window or T / 5
    spans = {"A": (0.0, 5 * T), "B": (T, 4 * T), "C": (2 * T, 3 * T)}
    options = {"single_lane": True} if args.single_lane else None
    records: list[common.IterationRecord] = []
    spec = common.MODEL_SPECS[args.model]
    feeds = spec.feeds(args.batch, seed=args.seed)
    with common.device(args, "fair", policy_options=options) as endpoint:
        # Compile every job's session before the clock starts, so arrivals are on time.
        clients = {j: salus.connect(endpoint, timeout=None, name=f"fairness-{j}") for j in JOBS}
        sessions = {j: common.open_model_session(clients[j], args.model, args.batch, name=j)
                    for j in JOBS}
        for s in sessions.values():
            s.run(feeds=feeds)  # warm-up, outside the measurement
        bar = tqdm(total=round(5 * T), desc="fairness", unit="s")
        t0 = time.monotonic()

        def job(name: str) -> Any:
            def body() -> None:
                start, stop = spans[name]
                time.sleep(max(0.0, t0 + start - time.monotonic()))
                i = 0
                while time.monotonic() - t0 < stop:
                    records.append(common.timed_run(sessions[name], feeds, [], name, i, t0))
                    i += 1
                    if name == "A":
                        bar.n = min(round(time.monotonic() - t0), bar.total)
                        bar.refresh()
            return body

        try:
            errors = common.run_threads([job(j) for j in JOBS])
        finally:
            bar.close()
            for j in JOBS:
                clients[j].close()
        if errors:
            raise errors[0]
    records.sort(key=lambda r: r.end_s)
    common.write_csv(args.out / "iterations.csv", [r.row() for r in records],
                     common.ITERATION_FIELDS)
    series = _series(records, 5 * T, window)
    common.write_csv(args.out / "throughput.csv", series, ["t_s", *JOBS, "total"])
    phases = _phases(records, T)
    common.write_csv(args.out / "phases.csv", phases)
    _plot(args.out / "throughput.png", series, T, args.model)
    fields = ["phase", "from_s", "to_s", "present", *[f"{j}_it_s" for j in JOBS], "total_it_s",
              "jain"]
    return [
        f"Model `{args.model}` (training, batch {args.batch}), T = {T:g} s, policy FAIR"
        f"{' (single lane)' if args.single_lane else ''}; iterations per second as the "
        "clients saw them.",
        "",
        common.md_table(phases, fields),
        "",
        "Paper (Figure 9): each job present gets an equal share of the device, and the total "
        "stays flat as jobs come and go.",
        "",
        "![throughput](throughput.png)",
    ]


def _series(records: list[common.IterationRecord], end: float,
            window: float) -> list[dict[str, Any]]:
    n = max(1, int(end / window))
    out = []
    for k in range(n):
        lo, hi = k * window, (k + 1) * window
        row: dict[str, Any] = {"t_s": hi}
        for j in JOBS:
            row[j] = sum(1 for r in records if r.job == j and lo <= r.end_s < hi) / window
        row["total"] = sum(row[j] for j in JOBS)
        out.append(row)
    return out


def _phases(records: list[common.IterationRecord], T: float) -> list[dict[str, Any]]:
    present = [["A"], ["A", "B"], ["A", "B", "C"], ["A", "B"], ["A"]]
    out = []
    for k, jobs in enumerate(present):
        # Leave a tenth of T at each edge for arrivals' first iterations and departures.
        lo, hi = k * T + 0.1 * T, (k + 1) * T - 0.1 * T
        span = hi - lo
        row: dict[str, Any] = {"phase": k + 1, "from_s": k * T, "to_s": (k + 1) * T,
                               "present": "+".join(jobs)}
        rates = []
        for j in JOBS:
            rate = sum(1 for r in records if r.job == j and lo <= r.end_s < hi) / span
            row[f"{j}_it_s"] = rate
            if j in jobs:
                rates.append(rate)
        row["total_it_s"] = sum(rates)
        row["jain"] = jain(rates)
        out.append(row)
    return out


def _plot(path: Any, series: list[dict[str, Any]], T: float, model: str) -> None:
    plt = common.plt_figure()
    fig, ax = plt.subplots(figsize=(7, 4))
    t = [r["t_s"] for r in series]
    for j in JOBS:
        ax.plot(t, [r[j] for r in series], label=f"job {j}")
    ax.plot(t, [r["total"] for r in series], "k--", label="total")
    for k in range(1, 5):
        ax.axvline(k * T, color="grey", alpha=0.3)
    ax.set_xlabel("time (s)")
    ax.set_ylabel(f"{model} iterations / s")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
