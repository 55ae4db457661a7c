"""`srtf` (Figure 8): a long training job preempted by shorter arrivals under SRTF.

The model's iteration time alone (it_s) is measured first, on a daemon of its own. A long job
of n_long = --long / it_s iterations starts at 0, and --shorts short jobs of n_short = --short
/ it_s iterations each arrive every --gap seconds. Every job is a thread with its own
connection that runs its iterations one call at a time (the synchronous client), and every
session declares both its iterations (n) and its duration (n x it_s), so SRTF orders them by
their declared lengths. The short jobs' completion times (JCT: the end of the last iteration
less the arrival) are measured three ways, each on a fresh salus-server:

- `solo`: each short job alone (JCT: its own finish less its own start);
- `off`: the whole scenario with anticipation off (`{"max_hold_ms": 0}`): when a short job's
  iteration ends, the long job is the only runnable one while the short job's client turns
  its reply into the next request, so it gets a whole iteration in between;
- `on`: the whole scenario with anticipation on (the daemon's defaults, or --max-hold-ms /
  --min-hold-ms): the lane is held for the short job for a window learned from its own gaps.

Outputs: jobs.csv (one row per mode and job, with each short job's JCT against its solo JCT),
the ratios in report.md (target: with anticipation each short job within 1.2x of solo),
every iteration's start and end (iterations.csv for `on`, iterations-off.csv for `off`), the
timeline plot, and the switch gaps the daemon measured (the idle time of the lane between one
session's iteration and the next session's) against the gaps between one job's own
consecutive iterations, which include the client's round trip (and, with anticipation, the
holds).
"""

from __future__ import annotations

import argparse
import math
import time
from dataclasses import dataclass
from typing import Any

from tqdm import tqdm

from benchmarks.driver import common

TARGET_RATIO = 1.2
JOB_FIELDS = ["mode", "job", "arrival_s", "iterations", "declared_s", "first_start_s",
              "finish_s", "jct_s", "solo_jct_s", "ratio", "preempted_s"]
GAP_FIELDS = ["mode", "kind", "count", "median_ms", "p95_ms", "max_ms"]


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", default="resnet", choices=sorted(common.MODEL_SPECS))
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--long", type=float, default=40.0, help="seconds of work of the long job")
    p.add_argument("--short", type=float, default=6.0, help="seconds of work of each short job")
    p.add_argument("--shorts", type=int, default=3, help="number of short jobs")
    p.add_argument("--gap", type=float, default=9.0, help="seconds between short arrivals")
    p.add_argument("--max-hold-ms", type=float, default=None,
                   help="anticipation on: the daemon's max_hold_ms (default: its own, 2)")
    p.add_argument("--min-hold-ms", type=float, default=None,
                   help="anticipation on: the daemon's min_hold_ms (default: its own, 0); "
                   "equal to --max-hold-ms, a hold ends only when the job comes back")


def smoke(args: argparse.Namespace) -> None:
    # Each short job's declared duration (0.8 s) stays below the long job's less the short's
    # arrival (4 - 2.4 s), so under SRTF no short job can ever rank behind the long one.
    args.long, args.short, args.shorts, args.gap = 4.0, 0.8, 2, 1.2
    args.batch = min(args.batch, 16)


def anticipation_on(args: argparse.Namespace) -> dict[str, float]:
    """The policy options of the `on` mode: only what was given (the daemon's defaults else)."""
    opts: dict[str, float] = {}
    if args.max_hold_ms is not None:
        opts["max_hold_ms"] = args.max_hold_ms
    if args.min_hold_ms is not None:
        opts["min_hold_ms"] = args.min_hold_ms
    for k, v in opts.items():
        if not v >= 0:
            raise SystemExit(f"srtf: --{k.replace('_', '-')} must be >= 0, got {v:g}")
    cap = opts.get("max_hold_ms", 2.0)
    if opts.get("min_hold_ms", 0.0) > cap:
        raise SystemExit(f"srtf: --min-hold-ms ({opts['min_hold_ms']:g}) is above the hold cap "
                         f"({cap:g} ms); give --max-hold-ms too")
    if cap == 0:
        raise SystemExit("srtf: --max-hold-ms 0 turns anticipation off in the `on` run")
    return opts


@dataclass(frozen=True)
class Job:
    name: str
    at: float  # arrival, seconds after the scenario's start
    n: int  # iterations
    declared_s: float  # the declared duration, n x it_s


def run(args: argparse.Namespace) -> list[str]:
    on_opts = anticipation_on(args)
    spec = common.MODEL_SPECS[args.model]
    feeds = spec.feeds(args.batch, seed=args.seed)
    with common.device(args, "srtf", policy_options=on_opts) as endpoint:
        it_s = common.calibrate(endpoint, args.model, args.batch)
    n_long = max(2, round(args.long / it_s))
    n_short = max(1, round(args.short / it_s))
    jobs = [Job("long", 0.0, n_long, n_long * it_s)] + [
        Job(f"short{k + 1}", args.gap * (k + 1), n_short, n_short * it_s)
        for k in range(args.shorts)]
    shorts = jobs[1:]
    modes: dict[str, dict[str, Any] | None] = (
        {"endpoint": None} if args.endpoint else {"off": {"max_hold_ms": 0}, "on": on_opts})
    total = n_short * len(shorts) + len(modes) * sum(j.n for j in jobs)
    records: dict[str, list[common.IterationRecord]] = {}
    job_rows: list[dict[str, Any]] = []
    with tqdm(total=total, desc="srtf", unit="it") as bar:
        # Each short job alone on a fresh daemon: what a dedicated device would give it.
        solo: dict[str, float] = {}
        for j in shorts:
            bar.set_postfix_str(f"solo {j.name}")
            with common.device(args, "srtf", policy_options=on_opts) as endpoint:
                alone = Job(j.name, 0.0, j.n, j.declared_s)
                recs = _scenario(endpoint, args, [alone], feeds, bar)
            row = _job_row("solo", alone, recs)
            solo[j.name] = row["jct_s"]
            job_rows.append(row)
        for mode, options in modes.items():
            bar.set_postfix_str(mode)
            with common.device(args, "srtf", policy_options=options) as endpoint:
                recs = _scenario(endpoint, args, jobs, feeds, bar)
            recs.sort(key=lambda r: r.start_s)
            records[mode] = recs
            for j in jobs:
                row = _job_row(mode, j, recs)
                if j.name in solo:
                    row["solo_jct_s"] = solo[j.name]
                    row["ratio"] = row["jct_s"] / solo[j.name]
                job_rows.append(row)
    common.write_csv(args.out / "jobs.csv", job_rows, JOB_FIELDS)
    main_mode = "endpoint" if args.endpoint else "on"
    for mode, recs in records.items():
        name = "iterations.csv" if mode == main_mode else f"iterations-{mode}.csv"
        common.write_csv(args.out / name, [r.row() for r in recs], common.ITERATION_FIELDS)
    gaps = [g for mode, recs in records.items() for g in _gaps(mode, recs)]
    common.write_csv(args.out / "switch_gaps.csv", gaps, GAP_FIELDS)
    ratios = _ratios(job_rows, shorts, list(modes))
    common.write_csv(args.out / "ratios.csv", ratios)
    _plot(args.out / "timeline.png", records, [j.name for j in jobs])

    described = {"off": "anticipation off (`max_hold_ms` 0)",
                 "on": f"anticipation on (`{on_opts or 'daemon defaults'}`)",
                 "endpoint": f"the daemon at {args.endpoint} as it is configured"}
    verdict = ""
    if main_mode in modes:
        worst = max((r[f"{main_mode}_ratio"] for r in ratios), default=float("nan"))
        verdict = (f"Worst short-job ratio with {described[main_mode]}: {worst:.2f}x "
                   f"(target <= {TARGET_RATIO:g}x: "
                   f"{'met' if worst <= TARGET_RATIO else 'not met'}).")
    return [
        f"Model `{args.model}` (training, batch {args.batch}); one iteration alone takes "
        f"{it_s * 1e3:.1f} ms (median). Long job: {n_long} iterations (declared "
        f"{n_long * it_s:.2f} s); {args.shorts} short jobs of {n_short} iterations (declared "
        f"{n_short * it_s:.2f} s each), one every {args.gap:g} s. Policy SRTF; every job is a "
        "synchronous client thread. Modes: "
        + "; ".join(f"`{m}`: {described[m]}" for m in modes)
        + "; `solo`: each short job alone on a fresh daemon.",
        "",
        "Short jobs' JCT against their solo JCT (ratio = JCT / solo JCT):",
        "",
        common.md_table(ratios, list(ratios[0].keys())) if ratios else "(no short jobs)",
        "",
        verdict,
        "",
        "Every job in every mode:",
        "",
        common.md_table(job_rows, JOB_FIELDS),
        "",
        "Gaps between consecutive iterations on the lane, as the daemon measured them:",
        "",
        common.md_table(gaps, GAP_FIELDS),
        "",
        "Paper (Figure 8): each shorter job preempts the long one at an iteration boundary and "
        "the switch itself costs well under a millisecond.",
        "",
        "![timeline](timeline.png)",
    ]


def _scenario(endpoint: str, args: argparse.Namespace, jobs: list[Job], feeds: dict[str, Any],
              bar: tqdm) -> list[common.IterationRecord]:
    """Runs the jobs, each a thread arriving at its time; returns every iteration."""
    import salus

    records: list[common.IterationRecord] = []
    clients = {j.name: salus.connect(endpoint, timeout=None, name=j.name) for j in jobs}
    t0 = time.monotonic()

    def job(j: Job) -> Any:
        def body() -> None:
            time.sleep(max(0.0, t0 + j.at - time.monotonic()))
            s = common.open_model_session(clients[j.name], args.model, args.batch,
                                          iterations=j.n, duration=j.declared_s, name=j.name)
            for i in range(j.n):
                records.append(common.timed_run(s, feeds, [], j.name, i, t0))
                bar.update(1)
            s.close()
        return body

    errors = common.run_threads([job(j) for j in jobs])
    # Closed only once every thread is done with its socket (see fairness.py).
    for c in clients.values():
        c.close()
    if errors:
        raise errors[0]
    return records


def _job_row(mode: str, j: Job, records: list[common.IterationRecord]) -> dict[str, Any]:
    mine = [r for r in records if r.job == j.name]
    finish = max(r.end_s for r in mine)
    return {"mode": mode, "job": j.name, "arrival_s": j.at, "iterations": j.n,
            "declared_s": j.declared_s, "first_start_s": min(r.start_s for r in mine),
            "finish_s": finish, "jct_s": finish - j.at, "solo_jct_s": "", "ratio": "",
            "preempted_s": _preempted(mine, records)}


def _ratios(job_rows: list[dict[str, Any]], shorts: list[Job],
            modes: list[str]) -> list[dict[str, Any]]:
    by = {(r["mode"], r["job"]): r for r in job_rows}
    out = []
    for j in shorts:
        row: dict[str, Any] = {"job": j.name, "arrival_s": j.at,
                               "solo_jct_s": by[("solo", j.name)]["jct_s"]}
        for m in modes:
            row[f"{m}_jct_s"] = by[(m, j.name)]["jct_s"]
            row[f"{m}_ratio"] = by[(m, j.name)]["ratio"]
        last = modes[-1]
        row[f"{last}_within_{TARGET_RATIO:g}x"] = (
            "yes" if row[f"{last}_ratio"] <= TARGET_RATIO else "no")
        out.append(row)
    return out


def _gaps(mode: str, records: list[common.IterationRecord]) -> list[dict[str, Any]]:
    switches, same = [], []
    for prev, cur in zip(records, records[1:], strict=False):
        (same if prev.job == cur.job else switches).append(cur.switch_gap_s * 1e3)

    def row(kind: str, v: list[float]) -> dict[str, Any]:
        return {"mode": mode, "kind": kind, "count": len(v), "median_ms": common.median(v),
                "p95_ms": common.percentile(v, 95), "max_ms": max(v, default=math.nan)}

    return [row("switch (another job's iteration next)", switches),
            row("same job's next iteration", same)]


def _preempted(mine: list[common.IterationRecord], records: list[common.IterationRecord]) -> float:
    """Seconds of other jobs' iterations inside this job's lifetime."""
    lo, hi = min(r.start_s for r in mine), max(r.end_s for r in mine)
    job = mine[0].job
    return sum(r.run_s for r in records if r.job != job and lo <= r.start_s < hi)


def _plot(path: Any, records: dict[str, list[common.IterationRecord]], names: list[str]) -> None:
    plt = common.plt_figure()
    n = len(records)
    fig, axes = plt.subplots(n, 1, figsize=(8, (0.6 * len(names) + 1.5) * n), sharex=True,
                             squeeze=False)
    for ax, (mode, recs) in zip(axes[:, 0], records.items(), strict=True):
        for y, name in enumerate(names):
            bars = [(r.start_s, r.run_s) for r in recs if r.job == name]
            ax.broken_barh(bars, (y - 0.4, 0.8), color=f"C{y}")
        ax.set_yticks(range(len(names)))
        ax.set_yticklabels(names)
        ax.invert_yaxis()
        ax.set_title(f"which job's iteration runs when (SRTF, anticipation {mode})")
        ax.grid(axis="x", alpha=0.3)
    axes[-1, 0].set_xlabel("time (s)")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
