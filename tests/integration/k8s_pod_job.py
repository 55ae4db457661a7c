"""A pod's training job, as a container started with what the device plugin's Allocate
returned: it reaches the daemon through $SALUS_ENDPOINT and presents
$SALUS_ALLOCATION_TOKEN (both read by the client itself), trains the MLP and prints one JSON
line: its allocation, principal, role and losses.

  k8s_pod_job.py --job K --steps N [--name NAME] [--ready FILE] [--hold FILE]

--ready: a file written after the first step; --hold: a file to wait for before the rest."""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from mlp_job import create, feeds  # noqa: E402

import salus  # noqa: E402


def train(session: salus.Session, job: int, steps: int, ready: str = "",
          hold: str = "") -> list[float]:
    out = []
    for i in range(steps):
        batch = feeds(job, i, seed=700)
        out.append(float(session.run(feeds=batch, fetches=["loss"], timeout=300)["loss"]))
        if i == 0 and ready:
            Path(ready).write_text("ready")
        if i == 0 and hold:
            deadline = time.monotonic() + 300
            while not Path(hold).exists() and time.monotonic() < deadline:
                time.sleep(0.05)
    return out


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--job", type=int, required=True)
    p.add_argument("--steps", type=int, default=4)
    p.add_argument("--name", default="pod")
    p.add_argument("--ready", default="")
    p.add_argument("--hold", default="")
    a = p.parse_args()
    with salus.connect(name=a.name) as c:
        s = create(c, a.name)
        losses = train(s, a.job, a.steps, a.ready, a.hold)
        s.close()
        print(json.dumps({"allocation": c.allocation, "principal": c.server["principal"],
                          "role": c.server["role"], "losses": losses}), flush=True)


if __name__ == "__main__":
    main()
