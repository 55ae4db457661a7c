"""`fairness` (Figure 9): three identical training jobs share the device under FAIR.

Job A starts at 0 and leaves at 5T, B runs from T to 4T, C from 2T to 3T: they arrive one by
one and leave in reverse order. Each job is a thread with its own connection that trains the
same real model (same batch, seeded data) back to back while it is present. Each job's session
is created when it arrives and closed when it leaves. By default the experiment runs twice:
FAIR with a lane per session, and FAIR with one shared lane. The plot shows each job's
throughput and the total over time, in windows of --window seconds; the table gives, per
phase, each job's mean throughput and Jain's fairness index over the jobs present.
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
    p.add_argument("--layout", default="both", choices=["lanes", "single-lane", "both"],
                   help="FAIR with a lane per session, with one shared lane, or both in turn")


def smoke(args: argparse.Namespace) -> None:
    # mlp iterates in milliseconds, so even a short phase on a loaded machine holds many.
    args.period, args.model, args.batch = 1.5, "mlp", 16


def jain(values: list[float]) -> float:
    """Jain's fairness index: 1 when all equal, 1/n when one takes everything."""
    if not values or sum(values) == 0:
        return float("nan")
    return sum(values) ** 2 / (len(values) * sum(v * v for v in values))


LAYOUTS = {"lanes": None, "single-lane": {"single_lane": True}}


def run(args: argparse.Namespace) -> list[str]:
    layouts = ["lanes", "single-lane"] if args.layout == "both" else [args.layout]
    if args.endpoint:
        layouts = ["endpoint"]
    T = args.period
    window = args.window or T / 5
    fields = ["layout", "phase", "from_s", "to_s", "present", *[f"{j}_it_s" for j in JOBS],
              "total_it_s", "jain"]
    all_phases: list[dict[str, Any]] = []
    all_series: dict[str, list[dict[str, Any]]] = {}
    with tqdm(total=round(5 * T) * len(layouts), desc="fairness", unit="s") as bar:
        for k, layout in enumerate(layouts):
            bar.set_postfix_str(layout)
            records = _measure(args, LAYOUTS.get(layout), bar, k * round(5 * T))
            records.sort(key=lambda r: r.end_s)
            common.write_csv(args.out / f"iterations-{layout}.csv", [r.row() for r in records],
                             common.ITERATION_FIELDS)
            all_series[layout] = _series(records, 5 * T, window)
            common.write_csv(args.out / f"throughput-{layout}.csv", all_series[layout],
                             ["t_s", *JOBS, "total"])
            all_phases += [dict(p, layout=layout) for p in _phases(records, T)]
    common.write_csv(args.out / "phases.csv", all_phases, fields)
    _plot(args.out / "throughput.png", all_series, T, args.model)
    return [
        f"Model `{args.model}` (training, batch {args.batch}), T = {T:g} s, policy FAIR. Each "
        "job's session is created when it arrives and closed when it leaves. `lanes`: FAIR's "
        "default, a lane per session where memory allows (the lanes run side by side and "
        "share the CPU); `single-lane`: one shared lane, where FAIR's pick (least service "
        "since the membership changed) alone decides who runs. Iterations per second as the "
        "clients saw them; the edges of each phase (a tenth of T) are left out.",
        "",
        common.md_table(all_phases, fields),
        "",
        "Paper (Figure 9): each job present gets an equal share of the device, and the total "
        "stays flat as jobs come and go.",
        "",
        "![throughput](throughput.png)",
    ]


def _measure(args: argparse.Namespace, options: dict[str, Any] | None, bar: tqdm,
             bar_base: int) -> list[common.IterationRecord]:
    import salus

    T = args.period
    spans = {"A": (0.0, 5 * T), "B": (T, 4 * T), "C": (2 * T, 3 * T)}
    records: list[common.IterationRecord] = []
    feeds = common.MODEL_SPECS[args.model].feeds(args.batch, seed=args.seed)
    with common.device(args, "fair", policy_options=options) as endpoint:
        clients = {j: salus.connect(endpoint, timeout=None, name=f"fairness-{j}") for j in JOBS}
        t0 = time.monotonic()

        def job(name: str) -> Any:
            def body() -> None:
                start, stop = spans[name]
                time.sleep(max(0.0, t0 + start - time.monotonic()))
                s = common.open_model_session(clients[name], args.model, args.batch, name=name)
                i = 0
                while time.monotonic() - t0 < stop:
                    records.append(common.timed_run(s, feeds, [], name, i, t0))
                    i += 1
                    if name == "A":
                        bar.n = bar_base + min(round(time.monotonic() - t0), round(5 * T))
                        bar.refresh()
                s.close()
            return body

        errors = common.run_threads([job(j) for j in JOBS])
        # Not in a `finally`: a socket must not be closed under a thread still using it
        # (after Ctrl-C, leaving the `with` stops the daemon and the threads end with it).
        for c in clients.values():
            c.close()
        if errors:
            raise errors[0]
    return records


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


def _plot(path: Any, all_series: dict[str, list[dict[str, Any]]], T: float,
          model: str) -> None:
    plt = common.plt_figure()
    n = len(all_series)
    fig, axes = plt.subplots(n, 1, figsize=(7, 3.2 * n), sharex=True, squeeze=False)
    for ax, (layout, series) in zip(axes[:, 0], all_series.items(), strict=True):
        t = [r["t_s"] for r in series]
        for j in JOBS:
            ax.plot(t, [r[j] for r in series], label=f"job {j}")
        ax.plot(t, [r["total"] for r in series], "k--", label="total")
        for k in range(1, 5):
            ax.axvline(k * T, color="grey", alpha=0.3)
        ax.set_title(f"FAIR, {layout}")
        ax.set_ylabel(f"{model} iterations / s")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    axes[-1, 0].set_xlabel("time (s)")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
