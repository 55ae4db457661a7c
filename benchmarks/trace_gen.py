"""Seeded generator of paper-like job traces for salus-sim and the benchmark driver.

A trace is CSV: job_id,workload,submit_time_s,iterations. Each job is a training workload
drawn uniformly from the profiles that have a measured iteration time; its duration (alone on
the device) is drawn from a two-part mix — many short jobs (uniform between --short-min and
--short-max seconds) and some long ones (log-uniform between --long-min and --long-max) —
and converted to iterations with the profile's iteration time. Arrivals are a Poisson process
with mean inter-arrival --interarrival seconds. The same arguments and seed always give the
same file.

    python -m benchmarks.trace_gen --jobs 100 --seed 1 --out benchmarks/traces/paper-100.csv
"""

from __future__ import annotations

import argparse
import csv
import math
import sys
from pathlib import Path

import numpy as np

DEFAULT_PROFILES = Path(__file__).resolve().parent / "workloads" / "salus-p100-profiles.csv"


def load_training_profiles(path: Path, max_peak_mb: float | None) -> list[dict[str, str]]:
    with path.open(newline="") as f:
        rows = [r for r in csv.DictReader(f) if r["kind"] == "training" and r["iteration_s"]]
    if max_peak_mb is not None:
        rows = [r for r in rows if float(r["peak_mb"]) <= max_peak_mb]
    if not rows:
        raise SystemExit(f"trace_gen: no training profile with an iteration time in {path}")
    return rows


def generate(
    jobs: int,
    seed: int,
    profiles: list[dict[str, str]],
    interarrival_s: float,
    short_fraction: float,
    short_s: tuple[float, float],
    long_s: tuple[float, float],
) -> list[dict[str, object]]:
    rng = np.random.default_rng(seed)
    t = 0.0
    out: list[dict[str, object]] = []
    for i in range(jobs):
        if i > 0:
            t += float(rng.exponential(interarrival_s))
        prof = profiles[int(rng.integers(len(profiles)))]
        if rng.random() < short_fraction:
            duration = float(rng.uniform(*short_s))
        else:
            duration = math.exp(float(rng.uniform(math.log(long_s[0]), math.log(long_s[1]))))
        iterations = max(1, round(duration / float(prof["iteration_s"])))
        out.append(
            {
                "job_id": f"job{i:05d}",
                "workload": prof["workload"],
                "submit_time_s": f"{t:.3f}",
                "iterations": iterations,
            }
        )
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--jobs", type=int, default=100)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--profiles", type=Path, default=DEFAULT_PROFILES)
    p.add_argument("--interarrival", type=float, default=60.0, help="mean seconds between jobs")
    p.add_argument("--short-fraction", type=float, default=0.9)
    p.add_argument("--short-min", type=float, default=60.0)
    p.add_argument("--short-max", type=float, default=180.0)
    p.add_argument("--long-min", type=float, default=600.0)
    p.add_argument("--long-max", type=float, default=2 * 3600.0)
    p.add_argument(
        "--max-peak-mb", type=float, default=None, help="only workloads whose peak fits this"
    )
    a = p.parse_args(argv)
    if a.jobs < 1 or a.interarrival <= 0 or not 0 <= a.short_fraction <= 1:
        p.error("--jobs must be >= 1, --interarrival > 0, --short-fraction in [0, 1]")
    rows = generate(
        a.jobs,
        a.seed,
        load_training_profiles(a.profiles, a.max_peak_mb),
        a.interarrival,
        a.short_fraction,
        (a.short_min, a.short_max),
        (a.long_min, a.long_max),
    )
    a.out.parent.mkdir(parents=True, exist_ok=True)
    with a.out.open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=["job_id", "workload", "submit_time_s", "iterations"])
        w.writeheader()
        w.writerows(rows)
    print(f"trace_gen: wrote {len(rows)} jobs to {a.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
