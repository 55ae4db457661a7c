"""Overcommit against a real daemon: training sessions whose persistent memory adds up to more
than the arena take turns on it, paged to host memory and back between their iterations, and
train exactly as they would alone."""

from __future__ import annotations

import pathlib
import re
import subprocess
import sys
import threading
import time
import urllib.request

from mlp_job import create, feeds
from salus_daemon import Daemon

import salus

STEPS = 6
SESSIONS = 3


def train(endpoint: str, job: int, out: dict[int, list[float]]) -> None:
    with salus.connect(endpoint) as c:
        s = create(c, f"job{job}")
        out[job] = [float(s.run(feeds=feeds(job, i), fetches=["loss"])["loss"])
                    for i in range(STEPS)]
        s.close()


def metric(daemon: Daemon, name: str) -> float:
    text = urllib.request.urlopen(
        f"http://127.0.0.1:{daemon.metrics_port}/metrics", timeout=10).read().decode()
    total = 0.0
    for line in text.splitlines():
        m = re.match(rf"^{re.escape(name)}(\{{[^}}]*\}})? (\S+)$", line)
        if m:
            total += float(m.group(2))
    return total


def test_sessions_beyond_the_arena_train_as_they_would_alone(daemon_factory) -> None:  # noqa: ANN001
    alone = daemon_factory()
    with salus.connect(alone.endpoint) as c:
        probe = create(c, "probe")
        info = next(s for s in c.sessions() if s["session_id"] == probe.id)
        p, e = info["persistent_bytes"], info["ephemeral_bytes"]
        probe.close()
    expected: dict[int, list[float]] = {}
    for job in range(SESSIONS):
        train(alone.endpoint, job, expected)

    # Each session fits alone; two never fit at once; all three hold 1.5x the arena.
    capacity = (2 * p // 256) * 256
    assert p + e + 512 <= capacity < 2 * (p + e)
    ratio = SESSIONS * p / capacity + 0.05
    shared = daemon_factory("--overcommit", f"{ratio:.3f}", "--paging-quantum-ms", "0",
                            memory=f"{capacity}B", policy="fair")
    got: dict[int, list[float]] = {}
    threads = [threading.Thread(target=train, args=(shared.endpoint, j, got))
               for j in range(SESSIONS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=300)
    assert sorted(got) == list(range(SESSIONS))
    for job in range(SESSIONS):
        assert got[job] == expected[job], f"job {job}: {got[job]} != {expected[job]}"
    assert metric(shared, "salus_mem_pages_total") > 0
    assert metric(shared, "salus_mem_paging_copied_bytes_total") > 0
    assert metric(shared, "salus_mem_paged_bytes") == 0


KILLED_CLIENT = """
import sys
sys.path.insert(0, sys.argv[2])
import salus
from mlp_job import create, feeds
c = salus.connect(sys.argv[1])
s = create(c, "doomed")
s.run(feeds=feeds(9, 0), fetches=["loss"])
print(s.id, flush=True)
sys.stdin.read()
"""


def test_a_killed_clients_paged_out_state_is_freed(daemon_factory) -> None:  # noqa: ANN001
    alone = daemon_factory()
    with salus.connect(alone.endpoint) as c:
        probe = create(c, "probe")
        info = next(s for s in c.sessions() if s["session_id"] == probe.id)
        p = info["persistent_bytes"]
    capacity = (2 * p // 256) * 256
    # Per-session series on, to see the doomed session's go.
    d = daemon_factory("--overcommit", "2", "--paging-quantum-ms", "0", memory=f"{capacity}B",
                       policy="fair", lease=2, config={"metrics_per_session": True})
    here = str(pathlib.Path(__file__).resolve().parent)
    doomed = subprocess.Popen([sys.executable, "-c", KILLED_CLIENT, d.endpoint, here],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        doomed_id = int(doomed.stdout.readline())
        with salus.connect(d.endpoint) as c:
            s = create(c, "survivor")  # admitted paged out; its first step pages the other out
            s.run(feeds=feeds(1, 0), fetches=["loss"])
            mine = {x["session_id"]: x for x in c.sessions()}
            assert s.id in mine
            assert metric(d, "salus_mem_paged_bytes") >= p
            doomed.kill()
            doomed.wait()
            deadline = time.monotonic() + 30
            while metric(d, "salus_mem_paged_bytes") > 0 and time.monotonic() < deadline:
                time.sleep(0.2)
            assert metric(d, "salus_mem_paged_bytes") == 0
            text = urllib.request.urlopen(
                f"http://127.0.0.1:{d.metrics_port}/metrics", timeout=10).read().decode()
            assert f'session="{doomed_id}"' not in text
            assert f'session="{s.id}"' in text
            s.run(feeds=feeds(1, 1), fetches=["loss"])  # the survivor trains on
    finally:
        doomed.kill()


def test_a_model_too_large_for_the_arena_runs_in_a_smaller_lane(daemon_factory) -> None:  # noqa: ANN001
    """Its executable's swap planner offers smaller lanes; admission grants one that fits and
    training gives the same losses as in a lane of its full E."""
    alone = daemon_factory()
    expected: dict[int, list[float]] = {}
    with salus.connect(alone.endpoint) as c:
        probe = create(c, "probe")
        info = next(s for s in c.sessions() if s["session_id"] == probe.id)
        p, e = info["persistent_bytes"], info["ephemeral_bytes"]
        probe.close()
    train(alone.endpoint, 0, expected)
    capacity = ((p + e * 3 // 4) // 256) * 256  # P fits, the full E does not
    small = daemon_factory(memory=f"{capacity}B", policy="fair")
    got: dict[int, list[float]] = {}
    with salus.connect(small.endpoint) as c:
        s = create(c, "small")
        info = next(x for x in c.sessions() if x["session_id"] == s.id)
        assert info["state"] == "ADMITTED"
        assert info["ephemeral_bytes"] < e
        assert info["persistent_bytes"] + info["ephemeral_bytes"] <= capacity
        got[0] = [float(s.run(feeds=feeds(0, i), fetches=["loss"])["loss"]) for i in range(STEPS)]
    assert got[0] == expected[0]
