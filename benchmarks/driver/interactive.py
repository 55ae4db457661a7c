"""`interactive`: a latency-sensitive inference service beside batch training jobs.

One inference session (--infer-model, batch 1, mode "infer", latency_class "interactive",
priority --infer-priority) gets requests as a seeded Poisson process of --rate requests per
second for --duration seconds; two training sessions (--train-model at --train-batch, latency
class "batch", priority 0) each train as fast as they can, one call at a time. Every job is a
thread with its own connection; all sessions are created and warmed up (one iteration each)
before the measured window starts. Each scenario gets a fresh salus-server (--policy,
`priority` by default):

- `inference alone`: the inference session, no training;
- `training alone`: the two training sessions, no inference;
- `together`: all three, the inference session in the interactive class (a lane of its own,
  never shared with batch sessions, served by a worker at a higher OS priority);
- `together, inference as batch`: all three, the inference session in the batch class (it
  shares the training sessions' lane; its priority still puts it first at each boundary).

A request's latency runs from its scheduled arrival (the Poisson schedule, the same in every
scenario) to its reply at the client, so a request queued behind a slow previous one counts
its wait. Training throughput is the iterations per second, summed over the two sessions,
that ended inside the window (under PRIORITY and SRTF the two trainers, alike and of
undeclared length, tie, and the earlier admitted one gets nearly every iteration: the sum is
what counts). Targets: p99 latency together within 2x of alone, and at least
0.8 of the training throughput kept.
"""

from __future__ import annotations

import argparse
import math
import threading
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from tqdm import tqdm

from benchmarks.driver import common

TARGET_P99_RATIO = 2.0
TARGET_KEPT = 0.8
TRAINERS = ["train0", "train1"]
SUMMARY_FIELDS = ["scenario", "infer_class", "requests", "p50_ms", "p99_ms", "mean_ms",
                  "max_ms", "p99_ratio", "train_it_s", *[f"{t}_it_s" for t in TRAINERS],
                  "throughput_kept", "infer_lanes", "train_lanes", "infer_class_listed"]
REQUEST_FIELDS = ["scenario", "request", "scheduled_s", "sent_s", "reply_s", "latency_ms",
                  "queue_delay_ms", "run_ms", "lane"]


@dataclass(frozen=True)
class Scenario:
    name: str
    inference: bool
    training: bool
    infer_class: str = "interactive"


SCENARIOS = [
    Scenario("inference alone", True, False),
    Scenario("training alone", False, True),
    Scenario("together", True, True),
    Scenario("together, inference as batch", True, True, "batch"),
]


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--infer-model", default="resnet", choices=sorted(common.MODEL_SPECS))
    p.add_argument("--train-model", default="resnet", choices=sorted(common.MODEL_SPECS))
    p.add_argument("--train-batch", type=int, default=32)
    p.add_argument("--rate", type=float, default=10.0, help="inference requests per second")
    p.add_argument("--duration", type=float, default=30.0, help="seconds of each scenario")
    p.add_argument("--policy", default="priority",
                   choices=["priority", "srtf", "pack", "fair"],
                   help="fifo admits one session at a time, so it cannot share")
    p.add_argument("--policy-options", default="",
                   help='the policy\'s options as JSON, e.g. \'{"max_hold_ms": 0}\'')
    p.add_argument("--infer-priority", type=int, default=1,
                   help="the inference session's priority (training sessions: 0)")
    p.add_argument("--memory", default="4GiB", help="the device's capacity")


def smoke(args: argparse.Namespace) -> None:
    args.duration, args.rate = 2.0, 10.0
    args.train_batch = min(args.train_batch, 8)


@dataclass
class Result:
    requests: list[dict[str, Any]] = field(default_factory=list)
    train_iterations: dict[str, int] = field(default_factory=dict)
    infer_lanes: set[int] = field(default_factory=set)
    train_lanes: set[int] = field(default_factory=set)
    infer_class_listed: str = ""


def schedule(rate: float, duration: float, seed: int) -> list[float]:
    """Poisson arrivals in [0, duration): seconds after the window's start."""
    rng = np.random.default_rng(seed)
    out: list[float] = []
    t = float(rng.exponential(1 / rate))
    while t < duration:
        out.append(t)
        t += float(rng.exponential(1 / rate))
    return out


def run(args: argparse.Namespace) -> list[str]:
    import json

    options = json.loads(args.policy_options) if args.policy_options else None
    if args.endpoint:
        args.policy = common.server_policy(args.endpoint)
    arrivals = schedule(args.rate, args.duration, args.seed)
    scenarios = SCENARIOS
    results: dict[str, Result] = {}
    with tqdm(total=len(scenarios), desc="interactive", unit="scenario") as bar:
        for sc in scenarios:
            bar.set_postfix_str(sc.name)
            with common.device(args, args.policy, memory=args.memory,
                               policy_options=options) as endpoint:
                results[sc.name] = _measure(endpoint, args, sc, arrivals)
            bar.update(1)

    requests = [dict(r, scenario=name) for name, res in results.items() for r in res.requests]
    common.write_csv(args.out / "requests.csv", requests, REQUEST_FIELDS)
    summary = _summary(args, results)
    common.write_csv(args.out / "summary.csv", summary, SUMMARY_FIELDS)
    _plot(args.out / "latency_cdf.png", results)

    def verdict(row: dict[str, Any]) -> str:
        p99, kept = row["p99_ratio"], row["throughput_kept"]
        return (f"`{row['scenario']}`: p99 {p99:.2f}x alone (target <= {TARGET_P99_RATIO:g}: "
                f"{'met' if p99 <= TARGET_P99_RATIO else 'not met'}), training throughput "
                f"kept {kept:.2f} (target >= {TARGET_KEPT:g}: "
                f"{'met' if kept >= TARGET_KEPT else 'not met'}).")

    together = [r for r in summary if r["scenario"].startswith("together")]
    return [
        f"Inference: `{args.infer_model}` batch 1, Poisson requests at {args.rate:g}/s "
        f"({len(arrivals)} in {args.duration:g} s, seed {args.seed}), priority "
        f"{args.infer_priority}. Training: two `{args.train_model}` sessions at batch "
        f"{args.train_batch}, priority 0, back to back. Policy {args.policy.upper()}"
        + (f" with `{args.policy_options}`" if args.policy_options else "")
        + f", capacity {args.memory}; a fresh daemon per scenario. Latency: from the "
        "scheduled arrival to the reply, at the client. Lanes as the daemon reported them.",
        "",
        common.md_table(summary, SUMMARY_FIELDS),
        "",
        *[f"- {verdict(r)}" for r in together],
        "",
        "![latency](latency_cdf.png)",
    ]


def _measure(endpoint: str, args: argparse.Namespace, sc: Scenario,
             arrivals: list[float]) -> Result:
    import salus

    res = Result()
    names = (TRAINERS if sc.training else []) + (["infer"] if sc.inference else [])
    clients = {n: salus.connect(endpoint, timeout=None, name=n) for n in names}
    # Created one after another here, so their admission order is the same every run.
    sessions: dict[str, Any] = {}
    for n in names:
        if n == "infer":
            sessions[n] = common.open_model_session(
                clients[n], args.infer_model, 1, mode="infer", name="infer",
                priority=args.infer_priority, latency_class=sc.infer_class)
        else:
            sessions[n] = common.open_model_session(clients[n], args.train_model,
                                                    args.train_batch, name=n)
    if sc.inference:
        listed = {s["name"]: s for s in clients["infer"].sessions()}
        res.infer_class_listed = str(listed["infer"].get("latency_class", ""))
    window: dict[str, float] = {}
    # Every session is warm once all have passed the barrier: the window starts then.
    start = threading.Barrier(len(names), action=lambda: window.update(t0=time.monotonic()))

    def trainer(n: str, k: int) -> None:
        feeds = common.MODEL_SPECS[args.train_model].feeds(args.train_batch, seed=args.seed + k)
        s = sessions[n]
        s.run(feeds=feeds)  # warm-up
        start.wait()
        end = window["t0"] + args.duration
        done = 0
        while time.monotonic() < end:
            s.run(feeds=feeds)
            if s.last_stats is not None:
                res.train_lanes.add(s.last_stats.lane)
            if time.monotonic() <= end:
                done += 1
        res.train_iterations[n] = done

    def inference() -> None:
        feeds = common.MODEL_SPECS[args.infer_model].feeds(1, seed=args.seed)
        s = sessions["infer"]
        s.run(feeds=feeds)  # warm-up
        start.wait()
        t0 = window["t0"]
        for k, at in enumerate(arrivals):
            time.sleep(max(0.0, t0 + at - time.monotonic()))
            sent = time.monotonic()
            s.run(feeds=feeds)
            reply = time.monotonic()
            st = s.last_stats
            if st is not None:
                res.infer_lanes.add(st.lane)
            res.requests.append({
                "request": k, "scheduled_s": at, "sent_s": sent - t0, "reply_s": reply - t0,
                "latency_ms": (reply - t0 - at) * 1e3,
                "queue_delay_ms": st.queue_delay_us / 1e3 if st else math.nan,
                "run_ms": st.run_us / 1e3 if st else math.nan,
                "lane": st.lane if st else -1})

    def guarded(fn: Any, *a: Any) -> Any:
        def body() -> None:
            try:
                fn(*a)
            except BaseException:
                start.abort()  # the others stop waiting for this one
                raise
        return body

    targets = [guarded(trainer, n, k) for k, n in enumerate(TRAINERS) if n in names]
    if sc.inference:
        targets.append(guarded(inference))
    errors = common.run_threads(targets)
    if not errors:
        for s in sessions.values():
            s.close()
    # Closed only once every thread is done with its socket (see fairness.py).
    for c in clients.values():
        c.close()
    real = [e for e in errors if not isinstance(e, threading.BrokenBarrierError)]
    if real or errors:
        raise (real or errors)[0]
    return res


def _summary(args: argparse.Namespace, results: dict[str, Result]) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    for sc in SCENARIOS:
        res = results.get(sc.name)
        if res is None:
            continue
        lat = [r["latency_ms"] for r in res.requests]
        row: dict[str, Any] = {"scenario": sc.name,
                               "infer_class": sc.infer_class if sc.inference else "",
                               "requests": len(lat), "p99_ratio": "", "throughput_kept": "",
                               "infer_lanes": _lanes(res.infer_lanes),
                               "train_lanes": _lanes(res.train_lanes),
                               "infer_class_listed": res.infer_class_listed}
        if sc.inference:
            row.update(p50_ms=common.median(lat), p99_ms=common.percentile(lat, 99),
                       mean_ms=float(np.mean(lat)), max_ms=max(lat))
        if sc.training:
            for t in TRAINERS:
                row[f"{t}_it_s"] = res.train_iterations.get(t, 0) / args.duration
            row["train_it_s"] = sum(row[f"{t}_it_s"] for t in TRAINERS)
        rows.append(row)
    alone = {r["scenario"]: r for r in rows}
    infer_alone = alone.get("inference alone", {}).get("p99_ms")
    train_alone = alone.get("training alone", {}).get("train_it_s")
    for r in rows:
        if r["scenario"].startswith("together"):
            if infer_alone:
                r["p99_ratio"] = r["p99_ms"] / infer_alone
            if train_alone:
                r["throughput_kept"] = r["train_it_s"] / train_alone
    return rows


def _lanes(lanes: set[int]) -> str:
    return "+".join(str(x) for x in sorted(lanes))


def _plot(path: Any, results: dict[str, Result]) -> None:
    plt = common.plt_figure()
    fig, ax = plt.subplots(figsize=(6, 4))
    for k, (name, res) in enumerate(results.items()):
        lat = sorted(r["latency_ms"] for r in res.requests)
        if lat:
            ax.step(lat, np.arange(1, len(lat) + 1) / len(lat), where="post", color=f"C{k}",
                    label=name)
    ax.set_xscale("log")
    ax.set_xlabel("inference latency from scheduled arrival (ms)")
    ax.set_ylabel("fraction of requests")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
