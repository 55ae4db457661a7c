"""Several devices in one daemon (`--device cpu:2`): placement, pinning, waiting for any device,
and per-device views, against a real daemon process."""

from __future__ import annotations

import re
import subprocess
import urllib.request

import mlp_job
import numpy as np
import pytest
from mlp_job import create
from salus_daemon import CTL, SERVER, Daemon

import salus

STEPS = 4


def feeds(job: int, step: int) -> dict[str, np.ndarray]:
    return mlp_job.feeds(job, step, seed=500)


def losses(s: salus.Session, job: int, steps: int = STEPS) -> list[float]:
    return [float(s.run(feeds=feeds(job, i), fetches=["loss"])["loss"]) for i in range(steps)]


def one_session_per_device(daemon_factory) -> tuple[Daemon, int]:  # noqa: ANN001
    """A cpu:2 daemon whose arenas each hold one training session, and that session's P + E."""
    probe_daemon = daemon_factory()
    with salus.connect(probe_daemon.endpoint) as c:
        probe = create(c, "probe")
        info = next(s for s in c.sessions() if s["session_id"] == probe.id)
        need = info["persistent_bytes"] + info["ephemeral_bytes"]
    probe_daemon.stop()
    capacity = (need * 3 // 2 // 256) * 256  # one fits, two do not
    return daemon_factory("--device", "cpu:2", memory=f"{capacity}B", policy="pack"), need


def alone_losses(daemon_factory, steps: int = STEPS) -> list[list[float]]:  # noqa: ANN001
    """Jobs 0 and 1 trained one after the other on a one-device daemon."""
    with salus.connect(daemon_factory().endpoint) as c:
        out = []
        for job in range(2):
            s = create(c, f"ref{job}")
            out.append(losses(s, job, steps))
            s.close()
        return out


def metric_lines(daemon: Daemon, name: str) -> list[str]:
    text = urllib.request.urlopen(
        f"http://127.0.0.1:{daemon.metrics_port}/metrics", timeout=10).read().decode()
    return [ln for ln in text.splitlines() if re.match(rf"^{re.escape(name)}[{{ ]", ln)]


def test_sessions_spread_over_devices_and_train_as_alone(daemon_factory) -> None:  # noqa: ANN001
    expected = alone_losses(daemon_factory)
    d, _ = one_session_per_device(daemon_factory)
    with salus.connect(d.endpoint) as c:
        a, b = create(c, "a"), create(c, "b")
        assert a.state == "ADMITTED" and b.state == "ADMITTED"
        assert {a.device, b.device} == {"cpu:0", "cpu:1"}
        listed = {s["session_id"]: s["device"] for s in c.sessions()}
        assert listed == {a.id: a.device, b.id: b.device}
        assert [losses(a, 0), losses(b, 1)] == expected
        stats = c.stats()
        assert stats["device"] == "cpu:2"
        assert [x["device"] for x in stats["devices"]] == ["cpu:0", "cpu:1"]
        assert stats["capacity_bytes"] == sum(x["capacity_bytes"] for x in stats["devices"])
        memmap = c.memory_map()
        assert [m["device"] for m in memmap["devices"]] == ["cpu:0", "cpu:1"]
        assert all(len(m["lanes"]) == 1 for m in memmap["devices"])
    capacity = metric_lines(d, "salus_mem_capacity_bytes")
    assert [ln.split("{")[1].split("}")[0] for ln in capacity] == ['device="cpu:0"',
                                                                  'device="cpu:1"']


def test_pinning_and_waiting_for_any_device(daemon_factory) -> None:  # noqa: ANN001
    d, _ = one_session_per_device(daemon_factory)
    with salus.connect(d.endpoint) as c:
        with pytest.raises(salus.SalusError) as err:
            create(c, "nowhere", device="cpu:7")
        assert err.value.code == "INVALID_ARGUMENT"
        assert "cpu:7" in err.value.message and "cpu:0, cpu:1" in err.value.message
        one = create(c, "one", device="cpu:1")
        assert one.device == "cpu:1"
        zero = create(c, "zero")
        assert zero.device == "cpu:0"
        # Both devices are full: an unpinned session waits for any device, a pinned one for
        # its own.
        waiting = create(c, "waiting")
        pinned = create(c, "pinned", device="cpu:1")
        states = {s["name"]: (s["state"], s["device"]) for s in c.sessions()}
        assert states["waiting"] == ("WAITING", "")
        assert states["pinned"] == ("WAITING", "cpu:1")
        # cpu:0 frees first: the unpinned one takes it; the pinned one keeps waiting.
        zero.close()
        states = {s["name"]: (s["state"], s["device"]) for s in c.sessions()}
        assert states["waiting"] == ("ADMITTED", "cpu:0")
        assert states["pinned"] == ("WAITING", "cpu:1")
        losses(waiting, 3)
        one.close()
        losses(pinned, 4)
        states = {s["name"]: (s["state"], s["device"]) for s in c.sessions()}
        assert states["pinned"][1] == "cpu:1"
        # A session that waits for any device gives up at its admission timeout.
        late = create(c, "late", admission_timeout=0.2)
        with pytest.raises(salus.SalusError) as err:
            late.run(feeds=feeds(5, 0), fetches=["loss"], timeout=30)
        assert err.value.code == "DEADLINE_EXCEEDED"


def test_a_waiting_session_gets_in_by_moving_one_mid_training(daemon_factory) -> None:  # noqa: ANN001
    alone = daemon_factory()
    with salus.connect(alone.endpoint) as c:
        s = create(c, "ref")
        expected = losses(s, 0)
    _, need = one_session_per_device(daemon_factory)
    capacity = (need * 3 // 2 // 256) * 256
    d = daemon_factory("--device", "cpu:2", "--paging-quantum-ms", "0", memory=f"{capacity}B",
                       policy="fair")
    with salus.connect(d.endpoint) as c:
        a = create(c, "a")
        assert a.device == "cpu:0"
        got = [float(a.run(feeds=feeds(0, i), fetches=["loss"])["loss"]) for i in range(2)]
        # cpu:0 has no room for w beside a; cpu:1 has room for a: the engine moves a there.
        w = create(c, "w", device="cpu:0")
        assert w.state == "WAITING"
        losses(w, 9)
        got += [float(a.run(feeds=feeds(0, i), fetches=["loss"])["loss"]) for i in range(2, STEPS)]
        assert got == expected
        info = {s["name"]: s for s in c.sessions()}
        assert (info["a"]["device"], info["a"]["migrations"]) == ("cpu:1", 1)
        assert info["w"]["device"] == "cpu:0"
    moved = [ln for ln in metric_lines(d, "salus_sched_migrations_total") if "finished" in ln]
    assert moved and moved[0].endswith(" 1")


@pytest.mark.parametrize("device", ["cpu:0", "cpu:x", "cpu:2,cpu:2", "gpu", "cpu,cuda:0"])
def test_bad_device_lists_are_refused_at_startup(device: str) -> None:
    r = subprocess.run([str(SERVER), "--device", device, "--listen", "tcp://127.0.0.1:0"],
                       capture_output=True, text=True, timeout=30)
    assert r.returncode != 0
    assert "device" in r.stderr and device.split(",")[-1].split(":")[0] in r.stderr


def test_sessions_packed_on_one_device_spread_to_an_idle_one(daemon_factory) -> None:  # noqa: ANN001
    d = daemon_factory("--device", "cpu:2", "--paging-quantum-ms", "0", policy="fair")
    with salus.connect(d.endpoint) as c:
        # Memory-first placement puts b beside a on cpu:0 (best fit). The engine looks for a
        # spreading move at most once per 10 ms, so the test trains until one was made (a bound
        # on rounds, not on time), then two rounds more on the devices they ended on.
        a, b = create(c, "a"), create(c, "b")
        got: list[list[float]] = [[], []]

        def moved() -> bool:
            return sum(s["migrations"] for s in c.sessions()) > 0

        rounds_after = None
        for i in range(400):
            for job, s in enumerate((a, b)):
                got[job].append(float(s.run(feeds=feeds(job, i), fetches=["loss"])["loss"]))
            if rounds_after is None and moved():
                rounds_after = 2
            elif rounds_after is not None:
                rounds_after -= 1
                if rounds_after == 0:
                    break
        assert rounds_after == 0, "no spreading move in 400 rounds"
        info = {s["name"]: s for s in c.sessions()}
        # Nothing waited and cpu:1 had no session: the engine moved one there, once.
        assert {info["a"]["device"], info["b"]["device"]} == {"cpu:0", "cpu:1"}
        assert info["a"]["migrations"] + info["b"]["migrations"] == 1
    assert got == alone_losses(daemon_factory, len(got[0]))


def test_an_administrator_moves_a_session_mid_training(daemon_factory) -> None:  # noqa: ANN001
    expected = alone_losses(daemon_factory)[0]
    d = daemon_factory("--device", "cpu:2", policy="fair")
    with salus.connect(d.endpoint) as c, salus.connect(d.admin_endpoint) as admin:
        a = create(c, "a")
        assert a.device == "cpu:0"
        got = [float(a.run(feeds=feeds(0, i), fetches=["loss"])["loss"]) for i in range(2)]
        with pytest.raises(salus.SalusError) as err:
            c.move_session(a.id, "cpu:1")  # a user, not the administrator
        assert err.value.code == "PERMISSION_DENIED"
        assert admin.move_session(a.id, "cpu:1") == ("cpu:0", "cpu:1")
        got += [float(a.run(feeds=feeds(0, i), fetches=["loss"])["loss"]) for i in range(2, STEPS)]
        assert got == expected
        info = next(s for s in c.sessions() if s["session_id"] == a.id)
        assert (info["device"], info["migrations"]) == ("cpu:1", 1)
        for session, device, code, words in [
                (a.id, "cpu:7", "INVALID_ARGUMENT", "cpu:0, cpu:1"),
                (a.id, "cpu:1", "FAILED_PRECONDITION", "already"),
                (a.id + 1, "cpu:0", "NOT_FOUND", str(a.id + 1))]:
            with pytest.raises(salus.SalusError) as err:
                admin.move_session(session, device)
            assert err.value.code == code and words in err.value.message, err.value
        r = subprocess.run([str(CTL), "--endpoint", d.admin_endpoint, "move", str(a.id), "cpu:0"],
                           capture_output=True, text=True, timeout=30)
        assert r.returncode == 0, r.stderr
        assert f"moving session {a.id} from cpu:1 to cpu:0" in r.stdout
        a.run(feeds=feeds(0, 0), fetches=["loss"])  # runs where it went
        info = next(s for s in c.sessions() if s["session_id"] == a.id)
        assert (info["device"], info["migrations"]) == ("cpu:0", 2)
