"""The benchmark driver at its smallest scale: every experiment runs end to end on real
daemons (or salus-sim) and writes a report, tables and plots whose numbers make sense."""

from __future__ import annotations

import csv
import math
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks.driver import common, fairness

REPO = Path(__file__).resolve().parents[2]
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def drive(tmp_path: Path, *argv: str) -> Path:
    out = tmp_path / argv[0]
    res = subprocess.run([sys.executable, "-m", "benchmarks.driver", *argv, "--smoke",
                          "--out", str(out)], cwd=REPO, capture_output=True, text=True,
                         timeout=120)
    assert res.returncode == 0, res.stderr[-3000:]
    assert (out / "report.md").read_text().startswith(f"# {argv[0]}:")
    for png in out.glob("*.png"):
        assert png.read_bytes()[:8] == PNG_MAGIC
    return out


def rows(path: Path) -> list[dict[str, str]]:
    with path.open(newline="") as f:
        return list(csv.DictReader(f))


def num(v: str) -> float:
    return float(v)


@pytest.fixture(autouse=True)
def _built(bin_dir: Path) -> None:
    for b in ("salus-server", "salus-sim", "salus-run"):
        if not (bin_dir / b).exists():
            pytest.fail(f"{bin_dir / b} is missing: run scripts/build first")


def test_trace_sim(tmp_path: Path) -> None:
    out = drive(tmp_path, "trace", "--sim")
    summary = {r["policy"]: r for r in rows(out / "summary.csv")}
    assert set(summary) == {"fifo", "srtf", "pack", "fair"}
    for r in summary.values():
        assert int(r["finished"]) == 100 and int(r["refused"]) == 0
        assert num(r["makespan_min"]) > num(r["avg_jct_min"]) > num(r["avg_queuing_min"]) >= 0
    # Shortest-remaining-first must beat first-come-first-served on average completion time.
    assert num(summary["srtf"]["avg_jct_min"]) < num(summary["fifo"]["avg_jct_min"])
    assert (out / "jct_cdf.png").exists()


def test_trace_daemon(tmp_path: Path) -> None:
    out = drive(tmp_path, "trace")
    summary = {r["policy"]: r for r in rows(out / "summary.csv")}
    assert set(summary) == {"fifo", "srtf", "pack", "fair"}
    for r in summary.values():
        assert int(r["finished"]) == 8, r
        assert num(r["makespan_min"]) >= num(r["p95_jct_min"]) > 0
    jobs = rows(out / "jobs.csv")
    # FIFO runs one job at a time: its jobs never overlap.
    fifo = sorted((num(j["finish_s"]) - num(j["jct_s"]) + num(j["queuing_s"]), num(j["finish_s"]))
                  for j in jobs if j["policy"] == "fifo")
    # (Client-side times carry the reply latency: allow 20 ms of replay time, in trace s;
    # jobs that overlapped would overlap by whole synthetic iterations of >= 50 ms.)
    slack = 0.02 * 3000
    assert all(a[1] <= b[0] + slack for a, b in zip(fifo, fifo[1:], strict=False))


def test_fairness(tmp_path: Path) -> None:
    out = drive(tmp_path, "fairness")
    phases = rows(out / "phases.csv")
    assert sorted({p["layout"] for p in phases}) == ["lanes", "single-lane"]
    for layout in ("lanes", "single-lane"):
        mine = [p for p in phases if p["layout"] == layout]
        assert [p["present"] for p in mine] == ["A", "A+B", "A+B+C", "A+B", "A"]
        three = mine[2]
        assert all(num(three[f"{j}_it_s"]) > 0 for j in "ABC"), three
        # Jobs not yet arrived or already gone ran nothing in their phase.
        assert num(mine[0]["B_it_s"]) == 0 and num(mine[0]["C_it_s"]) == 0
        assert num(mine[4]["C_it_s"]) == 0
    assert (out / "throughput.png").exists()


def test_srtf(tmp_path: Path) -> None:
    out = drive(tmp_path, "srtf")
    jobs = {j["job"]: j for j in rows(out / "jobs.csv")}
    assert set(jobs) == {"long", "short1", "short2"}
    for name in ("short1", "short2"):
        assert num(jobs[name]["finish_s"]) < num(jobs["long"]["finish_s"])
    assert num(jobs["long"]["preempted_s"]) > 0
    gaps = {g["kind"].split()[0]: g for g in rows(out / "switch_gaps.csv")}
    assert int(gaps["switch"]["count"]) >= 2
    assert 0 <= num(gaps["switch"]["median_ms"]) < 1000


def test_hyperparam(tmp_path: Path) -> None:
    out = drive(tmp_path, "hyperparam")
    gains = rows(out / "gain.csv")
    assert [g["model"] for g in gains] == ["resnet", "espcn"]
    for g in gains:
        assert num(g["fifo_makespan_s"]) > 0 and num(g["pack_makespan_s"]) > 0
        assert math.isclose(num(g["gain"]), num(g["fifo_makespan_s"]) / num(g["pack_makespan_s"]),
                            rel_tol=1e-3)
    jobs = rows(out / "jobs.csv")
    for model in ("resnet", "espcn"):
        # FIFO runs one job at a time (the next starts only after the previous ended; the
        # client-side start estimate carries a few milliseconds of reply latency).
        fifo = sorted((num(j["first_start_s"]), num(j["jct_s"])) for j in jobs
                      if j["model"] == model and j["policy"] == "fifo")
        assert all(a[1] <= b[0] + 0.05 for a, b in zip(fifo, fifo[1:], strict=False)), fifo
        # PACK puts both jobs on the device at once.
        pack = sorted((num(j["first_start_s"]), num(j["jct_s"])) for j in jobs
                      if j["model"] == model and j["policy"] == "pack")
        assert pack[1][0] < pack[0][1], pack


def test_inference(tmp_path: Path) -> None:
    out = drive(tmp_path, "inference")
    (s,) = rows(out / "summary.csv")
    assert int(s["admitted_at_once"]) == 6 == int(s["sessions"])
    assert int(s["devices_with_salus"]) == 1
    requests = rows(out / "requests.csv")
    assert len({r["session"] for r in requests}) >= 4
    assert all(num(r["latency_ms"]) >= num(r["run_ms"]) > 0 for r in requests)


def test_overhead(tmp_path: Path) -> None:
    out = drive(tmp_path, "overhead")
    table = rows(out / "overhead.csv")
    assert [r["model"] for r in table] == ["mlp", "lenet5", "resnet", "espcn", "vae"]
    for r in table:
        assert num(r["in_process_ms"]) > 0 and num(r["daemon_ms"]) > 0
        assert num(r["daemon_staged_ms"]) > 0 and num(r["daemon_shared_ms"]) > 0
        assert num(r["daemon_ms"]) >= num(r["daemon_run_ms"]) * 0.9
    # The daemon compiles the same executable as salus-run: the same P and E.
    for s in rows(out / "samples.csv"):
        assert s["P_bytes"] == s["P_daemon"] and s["E_bytes"] == s["E_daemon"]


def test_jain_index() -> None:
    assert fairness.jain([1.0, 1.0, 1.0]) == pytest.approx(1.0)
    assert fairness.jain([1.0, 0.0, 0.0]) == pytest.approx(1 / 3)


def test_parse_bytes() -> None:
    assert common.parse_bytes("16GiB") == 16 << 30
    assert common.parse_bytes("512MiB") == 512 << 20
    with pytest.raises(ValueError):
        common.parse_bytes("lots")
