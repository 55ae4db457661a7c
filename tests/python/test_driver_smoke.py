"""The benchmark driver at its smallest scale: every experiment runs end to end on real
daemons (or salus-sim) and writes a report, tables and plots whose numbers make sense."""

from __future__ import annotations

import csv
import math
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks.driver import common, fairness, interactive, trace

REPO = Path(__file__).resolve().parents[2]
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def drive(tmp_path: Path, *argv: str) -> Path:
    out = tmp_path / argv[0]
    # The timeout only guards against a hang; nothing here depends on how fast things run.
    res = subprocess.run([sys.executable, "-m", "benchmarks.driver", *argv, "--smoke",
                          "--out", str(out)], cwd=REPO, capture_output=True, text=True,
                         timeout=900)
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


def positive(v: str) -> bool:
    x = float(v)
    return math.isfinite(x) and x > 0


def finite(v: str) -> bool:
    return math.isfinite(float(v))


@pytest.fixture(autouse=True)
def _built(bin_dir: Path) -> None:
    for b in ("salus-server", "salus-sim", "salus-run"):
        if not (bin_dir / b).exists():
            pytest.fail(f"{bin_dir / b} is missing: run scripts/build first")


# Note [What the smoke tests assert]: the experiments run on a shared 2-core machine whose
# load changes from one second to the next, so no test asserts on wall-clock durations or on
# orderings or overlaps of client-side times that the machine's load can change. They check
# that each experiment runs and writes well-formed outputs, and assert orderings only where
# the scheduler guarantees them: facts the daemon reports (admission states, lanes), orderings
# SRTF guarantees from declared lengths, and the simulator's results (a virtual clock,
# deterministic).


def test_trace_sim(tmp_path: Path) -> None:
    out = drive(tmp_path, "trace", "--sim")
    summary = {r["policy"]: r for r in rows(out / "summary.csv")}
    assert set(summary) == {"fifo", "srtf", "pack", "fair", "srtf-ideal"}
    for r in summary.values():
        assert int(r["finished"]) == 100 and int(r["refused"]) == 0
        assert num(r["makespan_min"]) > num(r["avg_jct_min"]) > num(r["avg_queuing_min"]) >= 0
        assert math.isclose(num(r["fifo_jct_ratio"]),
                            num(summary["fifo"]["avg_jct_min"]) / num(r["avg_jct_min"]),
                            rel_tol=1e-3)
    # Shortest-remaining-first must beat first-come-first-served on average completion time.
    assert num(summary["srtf"]["avg_jct_min"]) < num(summary["fifo"]["avg_jct_min"])
    # With room for every job at once, no job waits for admission, and SRTF orders the whole
    # trace rather than what memory let in.
    ideal = summary["srtf-ideal"]
    jobs = trace.load_jobs(common.TRACES / "paper-100.csv", 0)
    assert common.parse_bytes(ideal["capacity"]) >= sum(
        j.persistent_bytes + j.ephemeral_bytes for j in jobs)
    assert num(ideal["max_admission_wait_min"]) == 0
    assert num(summary["srtf"]["max_admission_wait_min"]) > 0
    assert num(ideal["avg_jct_min"]) <= num(summary["srtf"]["avg_jct_min"])
    report = (out / "report.md").read_text()
    assert "FIFO / SRTF average JCT" in report and "FIFO / SRTF-IDEAL average JCT" in report
    assert {j["policy"] for j in rows(out / "jobs.csv")} == set(summary)
    assert (out / "jct_cdf.png").exists()


def test_trace_daemon(tmp_path: Path) -> None:
    out = drive(tmp_path, "trace")
    summary = {r["policy"]: r for r in rows(out / "summary.csv")}
    assert set(summary) == {"fifo", "srtf", "pack", "fair"}  # no ideal row on the daemon
    for r in summary.values():
        assert int(r["finished"]) == 8, r
        assert positive(r["makespan_min"]) and positive(r["avg_jct_min"])
        assert num(r["makespan_min"]) >= num(r["p95_jct_min"]) > 0
        assert int(r["max_admitted_seen"]) >= 0
    jobs = rows(out / "jobs.csv")
    for j in jobs:
        assert j["status"] == "finished", j
        assert num(j["jct_s"]) >= num(j["queuing_s"]) >= 0 and positive(j["jct_s"])
        assert j["state_at_create"] in ("ADMITTED", "WAITING")
    # FIFO admits one session at a time: the daemon's listing never showed two admitted.
    assert int(summary["fifo"]["max_admitted_seen"]) <= 1
    # Its first job arrives at an empty daemon.
    assert [j["state_at_create"] for j in jobs if j["policy"] == "fifo"][0] == "ADMITTED"


def test_fairness(tmp_path: Path) -> None:
    out = drive(tmp_path, "fairness")
    phases = rows(out / "phases.csv")
    assert sorted({p["layout"] for p in phases}) == ["lanes", "single-lane"]
    T = 1.5  # fairness.smoke's period
    spans = {"A": (0.0, 5 * T), "B": (T, 4 * T), "C": (2 * T, 3 * T)}  # fairness._measure
    for layout in ("lanes", "single-lane"):
        mine = [p for p in phases if p["layout"] == layout]
        assert [p["present"] for p in mine] == ["A", "A+B", "A+B+C", "A+B", "A"]
        for p in mine:
            rates = [num(p[f"{j}_it_s"]) for j in "ABC"]
            assert all(math.isfinite(x) and x >= 0 for x in rates), p
            assert math.isclose(num(p["total_it_s"]), sum(
                num(p[f"{j}_it_s"]) for j in p["present"].split("+")), rel_tol=1e-3, abs_tol=1e-6)
            n = len(p["present"].split("+"))
            if num(p["total_it_s"]) > 0:
                assert 1 / n - 1e-6 <= num(p["jain"]) <= 1 + 1e-6, p
        # Jobs not yet arrived ran nothing in the phase (they sleep until their arrival).
        assert num(mine[0]["B_it_s"]) == 0 and num(mine[0]["C_it_s"]) == 0
        assert num(mine[1]["C_it_s"]) == 0
        its = rows(out / f"iterations-{layout}.csv")
        for r in its:
            # No job sends before its arrival (it sleeps until then).
            start = spans[r["job"]][0]
            assert start <= num(r["sent_s"]) <= num(r["end_s"]), r
        lanes = {j: {r["lane"] for r in its if r["job"] == j} for j in "ABC"}
        lanes = {j: v for j, v in lanes.items() if v}  # a job that ran nothing has none
        assert all(len(v) == 1 for v in lanes.values()), lanes
        if layout == "single-lane":
            # One shared lane: every job's iterations ran on it.
            assert len(set().union(*lanes.values())) == 1, lanes
        else:
            # A lane per session (memory allows): no two jobs shared one.
            assert len(set().union(*lanes.values())) == len(lanes), lanes
    assert (out / "throughput.png").exists()


def test_srtf(tmp_path: Path) -> None:
    # A hold ends only when the short job's next request, or its close, arrives.
    out = drive(tmp_path, "srtf", "--min-hold-ms", "60000", "--max-hold-ms", "60000")
    jobs = {(j["mode"], j["job"]): j for j in rows(out / "jobs.csv")}
    assert set(jobs) == {("solo", "short1"), ("solo", "short2"), ("off", "long"),
                         ("off", "short1"), ("off", "short2"), ("on", "long"),
                         ("on", "short1"), ("on", "short2")}
    for (mode, name), j in jobs.items():
        assert positive(j["jct_s"]) and positive(j["finish_s"]) and positive(j["declared_s"])
        assert int(j["iterations"]) > 0 and num(j["preempted_s"]) >= 0
        if mode != "solo" and name != "long":
            assert positive(j["solo_jct_s"]) and positive(j["ratio"])
            assert num(j["solo_jct_s"]) == pytest.approx(num(jobs[("solo", name)]["jct_s"]),
                                                        rel=1e-4)
            assert num(j["ratio"]) == pytest.approx(num(j["jct_s"]) / num(j["solo_jct_s"]),
                                                    rel=1e-3)
        else:
            assert j["ratio"] == "" and j["solo_jct_s"] == ""
    long = jobs[("on", "long")]
    on_its = rows(out / "iterations.csv")
    for name in ("short1", "short2"):
        short = jobs[("on", name)]
        # The guarantee's premise: the short job's declared duration is below the long one's
        # less the short's arrival (a session's device time never exceeds its wall time), so
        # SRTF ranks a present short job before the long one. With holds that end only when
        # the short job comes back (or is done), the long job gets no iteration while it is
        # present: a long iteration sent after the short's first reply runs only once the
        # short job is done, so if there is one, the short job finishes first. (Whether there
        # is one depends on how fast the long job ran; with the smoke's margins there are
        # dozens.)
        assert num(short["declared_s"]) < num(long["declared_s"]) - num(short["arrival_s"])
        first_reply = min(num(r["end_s"]) for r in on_its if r["job"] == name)
        if any(num(r["sent_s"]) > first_reply for r in on_its if r["job"] == "long"):
            assert num(short["finish_s"]) < num(long["finish_s"]), (short, long)
            assert num(long["preempted_s"]) > 0
    ratios = rows(out / "ratios.csv")
    assert [r["job"] for r in ratios] == ["short1", "short2"]
    assert all(positive(r["off_ratio"]) and positive(r["on_ratio"]) for r in ratios)
    report = (out / "report.md").read_text()
    assert ("| job | arrival_s | solo_jct_s | off_jct_s | off_ratio | on_jct_s | on_ratio |"
            in report)
    gaps = {(g["mode"], g["kind"].split()[0]): g for g in rows(out / "switch_gaps.csv")}
    assert set(gaps) == {(m, k) for m in ("off", "on") for k in ("switch", "same")}
    for mode in ("off", "on"):
        its = rows(out / ("iterations.csv" if mode == "on" else f"iterations-{mode}.csv"))
        assert {r["job"] for r in its} == {"long", "short1", "short2"}
        assert all(num(r["switch_gap_ms"]) >= 0 and num(r["run_ms"]) > 0 for r in its)
        # Three jobs' iterations in any order hold at least two changes of job.
        assert int(gaps[(mode, "switch")]["count"]) >= 2
        assert int(gaps[(mode, "switch")]["count"]) + int(gaps[(mode, "same")]["count"]) == (
            len(its) - 1)
        assert 0 <= num(gaps[(mode, "switch")]["median_ms"]) <= num(
            gaps[(mode, "switch")]["max_ms"])


def test_interactive(tmp_path: Path) -> None:
    out = drive(tmp_path, "interactive")
    summary = {r["scenario"]: r for r in rows(out / "summary.csv")}
    assert list(summary) == ["inference alone", "training alone", "together",
                             "together, inference as batch"]
    requests = rows(out / "requests.csv")
    # The Poisson schedule is seeded: every scenario with inference sends the same requests.
    expected = len(interactive.schedule(10.0, 2.0, 1))
    assert expected > 0
    for name in ("inference alone", "together", "together, inference as batch"):
        r = summary[name]
        mine = [q for q in requests if q["scenario"] == name]
        assert int(r["requests"]) == len(mine) == expected
        assert [int(q["request"]) for q in mine] == list(range(expected))
        for q in mine:
            # From the scheduled arrival: at least the daemon's run of it.
            assert num(q["reply_s"]) >= num(q["sent_s"]) >= num(q["scheduled_s"]) >= 0
            assert num(q["latency_ms"]) >= num(q["run_ms"]) > 0
        assert positive(r["p50_ms"]) and num(r["p99_ms"]) >= num(r["p50_ms"])
        assert r["infer_class_listed"] == r["infer_class"]
    for name in ("training alone", "together", "together, inference as batch"):
        r = summary[name]
        assert finite(r["train_it_s"]) and num(r["train_it_s"]) >= 0
        assert num(r["train_it_s"]) == pytest.approx(
            num(r["train0_it_s"]) + num(r["train1_it_s"]), rel=1e-3, abs=1e-9)
    for name in ("together", "together, inference as batch"):
        r = summary[name]
        assert positive(r["p99_ratio"])
        assert finite(r["throughput_kept"]) and num(r["throughput_kept"]) >= 0
    assert summary["together"]["infer_class"] == "interactive"
    assert summary["together, inference as batch"]["infer_class"] == "batch"
    # The daemon's lanes: an interactive session never shares a lane with batch sessions;
    # under PRIORITY every batch session shares the one batch lane.
    inter, batch = summary["together"], summary["together, inference as batch"]
    assert "+" not in inter["infer_lanes"] and "+" not in batch["infer_lanes"]
    assert set(inter["infer_lanes"].split("+")).isdisjoint(inter["train_lanes"].split("+"))
    if batch["train_lanes"]:  # the trainers ran at least once in the window
        assert batch["infer_lanes"] == batch["train_lanes"]
    assert (out / "report.md").read_text().count("target") >= 2


def test_hyperparam_different_models_at_once(tmp_path: Path) -> None:
    out = drive(tmp_path, "hyperparam", "--models", "mlp:8+lenet5:8", "--policies", "fifo,pack")
    [gain] = rows(out / "gain.csv")
    assert (gain["model"], gain["batch"]) == ("mlp+lenet5", "8+8")
    assert positive(gain["fifo_makespan_s"]) and positive(gain["pack_makespan_s"])
    jobs = rows(out / "jobs.csv")
    for policy in ("fifo", "pack"):
        mine = sorted((j for j in jobs if j["policy"] == policy), key=lambda j: int(j["job"]))
        assert [j["model"] for j in mine] == ["mlp", "lenet5"], mine
    # PACK puts the two models on the device at once, FIFO one after the other.
    pack = [j for j in jobs if j["policy"] == "pack"]
    assert [j["state_at_create"] for j in pack] == ["ADMITTED", "ADMITTED"], pack
    fifo = [j for j in jobs if j["policy"] == "fifo"]
    assert sorted(j["state_at_create"] for j in fifo) == ["ADMITTED", "WAITING"], fifo


def test_hyperparam(tmp_path: Path) -> None:
    out = drive(tmp_path, "hyperparam")
    gains = rows(out / "gain.csv")
    assert [g["model"] for g in gains] == ["resnet", "espcn"]
    for g in gains:
        assert positive(g["fifo_makespan_s"]) and positive(g["pack_makespan_s"])
        assert math.isclose(num(g["gain"]), num(g["fifo_makespan_s"]) / num(g["pack_makespan_s"]),
                            rel_tol=1e-3)
        assert math.isclose(num(g["gain_always"]),
                            num(g["fifo_makespan_s"]) / num(g["pack_always_makespan_s"]),
                            rel_tol=1e-3)
    jobs = rows(out / "jobs.csv")
    makespans = rows(out / "makespan.csv")
    for model in ("resnet", "espcn"):
        for j in jobs:
            if j["model"] == model:
                assert positive(j["jct_s"]) and num(j["jct_s"]) >= num(j["first_start_s"]) >= 0
        # Every job's session was created before any ran: FIFO admits exactly one of them,
        # the others wait; PACK admits both, each on a lane of its own (memory allows).
        fifo = [j for j in jobs if j["model"] == model and j["policy"] == "fifo"]
        assert sorted(j["state_at_create"] for j in fifo) == ["ADMITTED", "WAITING"], fifo
        pack = [j for j in jobs if j["model"] == model and j["policy"] == "pack"]
        assert [j["state_at_create"] for j in pack] == ["ADMITTED", "ADMITTED"], pack
        assert len({j["lane_at_create"] for j in pack}) == 2, pack
        # A job runs on one lane, and FIFO's two jobs never on the same one at once.
        assert all("+" not in j["lane"] for j in fifo + pack)
        got = {m["policy"]: int(m["admitted_at_once"]) for m in makespans if m["model"] == model}
        assert got == {"fifo": 1, "pack": 2, "pack-always": 2}


def test_inference(tmp_path: Path) -> None:
    out = drive(tmp_path, "inference")
    (s,) = rows(out / "summary.csv")
    # All six sessions are created before any runs, and PACK admits them all (memory allows).
    assert int(s["admitted_at_once"]) == 6 == int(s["sessions"])
    assert int(s["devices_with_salus"]) >= 1 and int(s["devices_without_sharing"]) == 6
    assert positive(s["avg_latency_alone_ms"]) and positive(s["avg_latency_shared_ms"])
    requests = rows(out / "requests.csv")
    # The Poisson schedules are seeded, so which sessions send requests is fixed.
    assert len({r["session"] for r in requests}) >= 4
    assert all(num(r["latency_ms"]) >= num(r["run_ms"]) > 0 for r in requests)
    # PACK gives each session a lane of its own: one lane per session, none shared.
    lanes = {k: {r["lane"] for r in requests if r["session"] == k}
             for k in {r["session"] for r in requests}}
    assert all(len(v) == 1 for v in lanes.values()), lanes
    assert len(set().union(*lanes.values())) == len(lanes), lanes


def test_overhead(tmp_path: Path) -> None:
    out = drive(tmp_path, "overhead")
    table = rows(out / "overhead.csv")
    assert [r["model"] for r in table] == ["mlp", "lenet5", "resnet", "espcn", "vae"]
    for r in table:
        assert positive(r["in_process_ms"]) and positive(r["daemon_ms"])
        assert positive(r["daemon_staged_ms"]) and positive(r["daemon_shared_ms"])
        # Each round trip contains the daemon's run of that iteration, so their medians keep
        # the order (the slack only covers the CSV's rounding).
        assert num(r["daemon_ms"]) >= num(r["daemon_run_ms"]) * 0.999
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


def test_security_flood(tmp_path: Path) -> None:
    out = tmp_path / "flood"
    res = subprocess.run([sys.executable, "benchmarks/security/flood.py", "--iterations", "5",
                          "--warmup", "2", "--idle-connections", "20", "--garbage-mib", "1",
                          "--out", str(out)], cwd=REPO, capture_output=True, text=True,
                         timeout=900)
    assert res.returncode == 0, res.stderr[-3000:]
    table = {r["scenario"]: r for r in rows(out / "flood.csv")}
    assert list(table) == ["solo", "cheap", "runs", "idle", "garbage"]
    assert all(positive(r["median_ms"]) and positive(r["device_median_ms"])
               for r in table.values())
    # Every flood reached the daemon and was answered: lists and stats, its own iterations,
    # and each garbage envelope refused.
    for kind in ("cheap", "runs", "garbage"):
        assert int(table[kind]["flood_replies"]) > 0, table[kind]
    assert int(table["garbage"]["flood_refused"]) == int(table["garbage"]["flood_replies"])
