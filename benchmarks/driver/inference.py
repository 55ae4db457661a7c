"""`inference` (Figure 10): many inference services with low request rates on one device.

--sessions inference sessions (batch 1) cycle through the reference models; each is a thread
with its own connection that sends requests as a Poisson process of --rate requests per
second for --duration seconds and measures every request's latency at the client. Before
that, each model's latency alone is measured on the same daemon (--baseline requests, Poisson
with mean gap --baseline-gap), which is what a dedicated device per model would give. Without
sharing, the load needs one device per session; with Salus it needs as many as memory and
compute require: max(ceil(sum of P + E / capacity), ceil(sum of rate x service time)).
"""

from __future__ import annotations

import argparse
import math
import time
from typing import Any

import numpy as np
from tqdm import tqdm

from benchmarks.driver import common

MODELS = ["mlp", "lenet5", "resnet", "espcn", "vae"]


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--sessions", type=int, default=42)
    p.add_argument("--rate", type=float, default=2.0, help="requests per second per session")
    p.add_argument("--duration", type=float, default=40.0, help="seconds of shared load")
    p.add_argument("--baseline", type=int, default=40, help="requests per model alone")
    p.add_argument("--baseline-gap", type=float, default=0.1,
                   help="mean seconds between requests alone (Poisson)")
    p.add_argument("--policy", default="pack", choices=["fifo", "srtf", "pack", "fair"],
                   help="fifo admits one session at a time, so it cannot share")
    p.add_argument("--memory", default="4GiB", help="the device's capacity")


def smoke(args: argparse.Namespace) -> None:
    args.sessions, args.duration, args.baseline = 6, 3.0, 5


def _latency_rows(name: str, lat_ms: list[float]) -> dict[str, Any]:
    return {"model": name, "requests": len(lat_ms), "mean_ms": float(np.mean(lat_ms)),
            "median_ms": common.median(lat_ms), "p95_ms": common.percentile(lat_ms, 95),
            "p99_ms": common.percentile(lat_ms, 99)}


def run(args: argparse.Namespace) -> list[str]:
    import salus

    names = [MODELS[k % len(MODELS)] for k in range(args.sessions)]
    baseline: dict[str, list[float]] = {}
    service_s: dict[str, float] = {}
    requests: list[dict[str, Any]] = []
    rng = np.random.default_rng(args.seed)
    bar = tqdm(total=len(MODELS) * args.baseline + round(args.sessions * args.rate * args.duration),
               desc="inference", unit="req")
    try:
        with common.device(args, args.policy, memory=args.memory) as endpoint:
            capacity = 0
            # Each model alone, at the same request rate.
            for model in MODELS:
                c = salus.connect(endpoint, timeout=None, name=f"alone-{model}")
                capacity = int(c.server["capacity_bytes"])
                try:
                    s = common.open_model_session(c, model, 1, mode="infer", name=f"alone-{model}")
                    feeds = common.MODEL_SPECS[model].feeds(1, seed=args.seed)
                    s.run(feeds=feeds)  # warm-up
                    lat, run_s = [], []
                    for _ in range(args.baseline):
                        time.sleep(float(rng.exponential(args.baseline_gap)))
                        t = time.monotonic()
                        s.run(feeds=feeds)
                        lat.append((time.monotonic() - t) * 1e3)
                        run_s.append(s.last_stats.run_us / 1e6 if s.last_stats else 0.0)
                        bar.update(1)
                    s.close()
                    baseline[model] = lat
                    service_s[model] = common.median(run_s)
                finally:
                    c.close()

            # All sessions at once.
            clients = [salus.connect(endpoint, timeout=None, name=f"svc{k}")
                       for k in range(args.sessions)]
            sessions = [common.open_model_session(c, m, 1, mode="infer", name=f"svc{k}-{m}")
                        for k, (c, m) in enumerate(zip(clients, names, strict=True))]
            # Each client sees its own session and the others' totals.
            listing, others = clients[0].sessions(), clients[0].others()
            admitted = sum(1 for s in listing if s["state"] != "WAITING") + others["admitted"]
            mem_bytes = sum(s["persistent_bytes"] + s["ephemeral_bytes"] for s in listing) + \
                others["persistent_bytes"] + others["ephemeral_bytes"]
            memmap = clients[0].memory_map()
            t0 = time.monotonic()

            def service(k: int) -> Any:
                r = np.random.default_rng(args.seed * 1000 + k)
                feeds = common.MODEL_SPECS[names[k]].feeds(1, seed=k)

                def body() -> None:
                    next_t = t0 + float(r.exponential(1 / args.rate))
                    while next_t < t0 + args.duration:
                        time.sleep(max(0.0, next_t - time.monotonic()))
                        t = time.monotonic()
                        sessions[k].run(feeds=feeds)
                        end = time.monotonic()
                        st = sessions[k].last_stats
                        requests.append({"session": k, "model": names[k], "sent_s": t - t0,
                                         "latency_ms": (end - t) * 1e3,
                                         "queue_delay_ms": st.queue_delay_us / 1e3 if st else 0,
                                         "run_ms": st.run_us / 1e3 if st else 0,
                                         "lane": st.lane if st else -1})
                        bar.update(1)
                        next_t += float(r.exponential(1 / args.rate))
                return body

            errors = common.run_threads([service(k) for k in range(args.sessions)])
            # Closed only once every thread is done with its socket (see fairness.py).
            for c in clients:
                c.close()
            if errors:
                raise errors[0]
    finally:
        bar.close()

    common.write_csv(args.out / "requests.csv", requests,
                     ["session", "model", "sent_s", "latency_ms", "queue_delay_ms", "run_ms",
                      "lane"])
    rows = []
    for model in MODELS:
        shared = [r["latency_ms"] for r in requests if r["model"] == model]
        if not shared:
            continue
        alone = _latency_rows(model, baseline[model])
        both = _latency_rows(model, shared)
        rows.append({"model": model, "sessions": names.count(model),
                     "alone_mean_ms": alone["mean_ms"], "shared_mean_ms": both["mean_ms"],
                     "added_mean_ms": both["mean_ms"] - alone["mean_ms"],
                     "shared_p95_ms": both["p95_ms"], "shared_p99_ms": both["p99_ms"]})
    common.write_csv(args.out / "latency.csv", rows)
    all_shared = [r["latency_ms"] for r in requests]
    # The baseline weighted by how many sessions run each model.
    alone_mean = float(np.mean([np.mean(baseline[m]) for m in names]))
    added = float(np.mean(all_shared)) - alone_mean
    util = sum(args.rate * service_s[m] for m in names)
    devices_salus = max(math.ceil(mem_bytes / capacity), math.ceil(util), 1)
    summary = [{"sessions": args.sessions, "admitted_at_once": admitted,
                "memory_needed_MiB": mem_bytes / common.MIB, "capacity_MiB": capacity / common.MIB,
                "lanes": len(memmap.get("lanes", [])) if isinstance(memmap, dict) else "",
                "compute_utilization": util, "devices_without_sharing": args.sessions,
                "devices_with_salus": devices_salus,
                "avg_latency_alone_ms": alone_mean,
                "avg_latency_shared_ms": float(np.mean(all_shared)),
                "added_avg_latency_ms": added,
                "p99_shared_ms": common.percentile(all_shared, 99)}]
    common.write_csv(args.out / "summary.csv", summary)
    _plot(args.out / "latency_cdf.png", baseline, requests)
    return [
        f"{args.sessions} inference sessions (batch 1) over {', '.join(MODELS)}, Poisson "
        f"requests at {args.rate:g}/s each for {args.duration:g} s; policy "
        f"{args.policy.upper()}, capacity {args.memory}.",
        "",
        common.md_table(summary, list(summary[0].keys())),
        "",
        common.md_table(rows, list(rows[0].keys())) if rows else "",
        "",
        "Paper (Figure 10): 42 models on 1 GPU instead of 42, with under 5 ms added average "
        "latency.",
        "",
        "![latency](latency_cdf.png)",
    ]


def _plot(path: Any, baseline: dict[str, list[float]], requests: list[dict[str, Any]]) -> None:
    plt = common.plt_figure()
    fig, ax = plt.subplots(figsize=(6, 4))
    for k, model in enumerate(MODELS):
        shared = sorted(r["latency_ms"] for r in requests if r["model"] == model)
        if shared:
            ax.step(shared, np.arange(1, len(shared) + 1) / len(shared), where="post",
                    color=f"C{k}", label=f"{model} shared")
        alone = sorted(baseline.get(model, []))
        if alone:
            ax.step(alone, np.arange(1, len(alone) + 1) / len(alone), where="post",
                    color=f"C{k}", linestyle=":", label=f"{model} alone")
    ax.set_xscale("log")
    ax.set_xlabel("request latency (ms)")
    ax.set_ylabel("fraction of requests")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, ncol=2)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
