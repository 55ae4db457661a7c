"""`hyperparam` (Figure 11): N training jobs of one model submitted at once, as in a
hyper-parameter search; the makespan under FIFO (one job at a time) against PACK (as many
lanes as memory allows, measuring the packed pairs and unpacking those slower together:
introspective packing) and against PACK that always packs (`pack-always`,
{"introspect": false}).

A --models entry may name several models joined by `+` (`resnet:32+espcn:1`): its jobs then
alternate between them, so different models share the device at once (job k trains the
(k mod n)-th), each job still about --work seconds alone.

For each model (by default a compute-heavy one, resnet at batch 32, and a light one, espcn
at batch 1, whose iterations are short enough that the device idles during the client's round
trip, as the paper's superres_128 leaves a P100 idle) the iteration time alone, as the client
sees it, is measured first and every job gets the iterations that take about --work seconds
alone. Each
job is a thread with its own connection and its own learning rate; all jobs' sessions are
created before any runs, and the daemon's answers (admitted or waiting) give how many it
admitted at once (`admitted_at_once`). Makespan runs from the submission of all jobs to the
last one's end; the gain is FIFO's makespan over PACK's. `max_concurrent_jobs` is the most
jobs whose client-side lifetimes overlapped.
"""

from __future__ import annotations

import argparse
import threading
import time
from typing import Any

from tqdm import tqdm

from benchmarks.driver import common

# The policies compared: the daemon's policy and its options.
POLICIES: dict[str, tuple[str, dict[str, Any] | None]] = {
    "fifo": ("fifo", None), "pack": ("pack", None),
    "pack-always": ("pack", {"introspect": False}),
}

# Figure 11 of the paper: makespan gain of PACK over FIFO.
PAPER_GAIN = {"resnet": ("resnet50_50", 1.07), "espcn": ("superres_128", 2.38)}


DEFAULT_MODELS = "resnet:32,espcn:1"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--models", default=DEFAULT_MODELS,
                   help="comma-separated MODEL:BATCH (default a heavy and a light one), or "
                        "MODEL:BATCH+MODEL:BATCH for jobs of different models at once")
    p.add_argument("--jobs", type=int, default=4, help="jobs per model")
    p.add_argument("--work", type=float, default=5.0, help="seconds each job takes alone")
    p.add_argument("--rounds", type=int, default=3,
                   help="the policies alternate this many times (this machine is shared)")
    p.add_argument("--policies", default="fifo,pack,pack-always",
                   help="comma-separated; pack-always is PACK without introspection")


def smoke(args: argparse.Namespace) -> None:
    args.jobs, args.work, args.rounds = 2, 1.0, 1
    if args.models == DEFAULT_MODELS:  # models named on the command line are kept
        args.models = "resnet:8,espcn:1"


Group = list[tuple[str, int]]  # the (model, batch) of a --models entry, jobs alternating


def _models(text: str) -> list[Group]:
    out = []
    for entry in text.split(","):
        group = []
        for item in entry.split("+"):
            name, _, batch = item.partition(":")
            if name not in common.MODEL_SPECS or not batch.isdigit():
                raise SystemExit(f"hyperparam: bad --models entry {item!r} (MODEL:BATCH)")
            group.append((name, int(batch)))
        out.append(group)
    return out


def _label(group: Group) -> tuple[str, str]:
    """The group's model and batch columns: `resnet+espcn`, `32+1`."""
    return "+".join(m for m, _ in group), "+".join(str(b) for _, b in group)


def run(args: argparse.Namespace) -> list[str]:
    models = _models(args.models)
    policies = [p.strip() for p in args.policies.split(",") if p.strip()]
    if any(p not in POLICIES for p in policies):
        raise SystemExit(f"hyperparam: --policies takes {', '.join(POLICIES)}")
    if args.endpoint:
        policies = [common.server_policy(args.endpoint)]
    rows: list[dict[str, Any]] = []
    records: list[dict[str, Any]] = []
    iters: dict[tuple[str, int], int] = {}
    alone_ms: dict[tuple[str, int], float] = {}
    with tqdm(total=args.rounds * len(models) * len(policies) * args.jobs, desc="hyperparam",
              unit="job") as bar:
        for rnd in range(args.rounds):
            for group in models:
                model, batch = _label(group)
                for policy in policies:
                    bar.set_postfix_str(f"round {rnd + 1} {model} {policy}")
                    name, options = POLICIES.get(policy, (policy, None))
                    with common.device(args, name, policy_options=options) as endpoint:
                        for key in group:
                            if key not in iters:
                                it_s = common.calibrate(endpoint, key[0], key[1], iterations=20)
                                iters[key] = max(2, round(args.work / it_s))
                                alone_ms[key] = it_s * 1e3
                        makespan, jobs = _batch(endpoint, group, args.jobs, iters, bar)
                    rows.append({"round": rnd + 1, "model": model, "batch": batch,
                                 "policy": policy, "jobs": args.jobs,
                                 "iterations": "+".join(str(iters[k]) for k in group),
                                 "alone_iteration_ms": "+".join(f"{alone_ms[k]:.3g}"
                                                                for k in group),
                                 "makespan_s": makespan,
                                 "avg_jct_s": sum(j["jct_s"] for j in jobs) / len(jobs),
                                 "admitted_at_once": sum(j["state_at_create"] == "ADMITTED"
                                                         for j in jobs),
                                 "max_concurrent_jobs": _max_concurrent(jobs)})
                    records += [dict(j, round=rnd + 1, policy=policy) for j in jobs]
    common.write_csv(args.out / "makespan.csv", rows)
    common.write_csv(args.out / "jobs.csv", records,
                     ["round", "model", "policy", "job", "lr", "first_start_s", "jct_s", "lane",
                      "state_at_create", "lane_at_create"])
    gains = []
    for group in models:
        model, batch = _label(group)
        paper = PAPER_GAIN.get(model, ("", float("nan")))
        med = {p: common.median([r["makespan_s"] for r in rows
                                 if r["model"] == model and r["policy"] == p]) for p in policies}
        if "fifo" in med and "pack" in med:
            g = {"model": model, "batch": batch, "fifo_makespan_s": med["fifo"],
                 "pack_makespan_s": med["pack"], "gain": med["fifo"] / med["pack"]}
            if "pack-always" in med:
                g["pack_always_makespan_s"] = med["pack-always"]
                g["gain_always"] = med["fifo"] / med["pack-always"]
            gains.append(dict(g, paper_workload=paper[0], paper_gain=paper[1]))
    if gains:
        common.write_csv(args.out / "gain.csv", gains)
        _plot(args.out / "makespan.png", gains)
    return [
        f"{args.jobs} jobs per model submitted at once, each about {args.work:g} s of work "
        "alone; makespan from submission to the last job's end. The policies alternate over "
        f"{args.rounds} round(s); the gain is the ratio of FIFO's median makespan to each "
        "PACK's (gain: introspective PACK; gain_always: PACK that always packs).",
        "",
        common.md_table(rows, list(rows[0].keys())),
        "",
        common.md_table(gains, list(gains[0].keys())) if gains else "",
        "",
        "![makespan](makespan.png)" if gains else "",
    ]


def _batch(endpoint: str, group: Group, n_jobs: int, iters: dict[tuple[str, int], int],
           bar: tqdm) -> tuple[float, list[dict[str, Any]]]:
    import salus

    feeds = {key: common.MODEL_SPECS[key[0]].feeds(key[1], seed=0) for key in group}
    out: list[dict[str, Any]] = []
    # Every job's session exists before any job runs: the daemon's answers to the creations
    # (admitted or waiting, and on which lane) then say how many jobs it put on the device at
    # once, whatever the machine's load.
    created = threading.Barrier(n_jobs)
    t0 = time.monotonic()

    def job(k: int) -> Any:
        key = group[k % len(group)]
        model, batch = key

        def body() -> None:
            lr = 0.01 * (k + 1)
            c = salus.connect(endpoint, timeout=None, name=f"hp{k}")
            try:
                spec_ = common.MODEL_SPECS[model]
                try:
                    s = c.create_session(model=spec_.path, mode="train",
                                         inputs=spec_.shapes(batch), loss=spec_.loss,
                                         optimizer={"type": "sgd", "lr": lr},
                                         iterations=iters[key], name=f"{model}-lr{lr:g}")
                except BaseException:
                    created.abort()
                    raise
                state, lane_at_create = s.state, s.lane
                created.wait()
                lanes: set[int] = set()
                first_start = float("nan")
                for i in range(iters[key]):
                    s.run(feeds=feeds[key])
                    st = s.last_stats
                    assert st is not None
                    lanes.add(st.lane)
                    if i == 0:
                        first_start = time.monotonic() - t0 - st.run_us / 1e6
                end = time.monotonic() - t0
                s.close()
                out.append({"job": k, "model": model, "lr": lr, "first_start_s": first_start,
                            "jct_s": end,
                            "lane": "+".join(str(x) for x in sorted(lanes)),
                            "state_at_create": state, "lane_at_create": lane_at_create})
                bar.update(1)
            finally:
                c.close()
        return body

    errors = common.run_threads([job(k) for k in range(n_jobs)])
    if errors:
        raise errors[0]
    return max(j["jct_s"] for j in out), sorted(out, key=lambda j: j["job"])


def _max_concurrent(jobs: list[dict[str, Any]]) -> int:
    """The most jobs whose [first iteration's start, end] overlap at one moment."""
    events = sorted([(j["first_start_s"], 1) for j in jobs] + [(j["jct_s"], -1) for j in jobs])
    best = cur = 0
    for _, step in events:
        cur += step
        best = max(best, cur)
    return best


def _plot(path: Any, gains: list[dict[str, Any]]) -> None:
    plt = common.plt_figure()
    fig, ax = plt.subplots(figsize=(6, 4))
    x = range(len(gains))
    ax.bar([i - 0.2 for i in x], [g["fifo_makespan_s"] for g in gains], 0.4, label="FIFO")
    ax.bar([i + 0.2 for i in x], [g["pack_makespan_s"] for g in gains], 0.4, label="PACK")
    for i, g in enumerate(gains):
        ax.text(i, max(g["fifo_makespan_s"], g["pack_makespan_s"]), f"{g['gain']:.2f}x",
                ha="center", va="bottom")
    ax.set_xticks(list(x))
    ax.set_xticklabels([f"{g['model']} (batch {g['batch']})" for g in gains])
    ax.set_ylabel("makespan (s)")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
