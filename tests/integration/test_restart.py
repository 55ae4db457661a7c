"""A daemon restart loses no job: a drain writes a snapshot of the sessions, a daemon started
with --restore takes them up, and the clients carry on where they were (docs/operations.md,
Restarts). Real daemons, real sockets; the comparison is bit for bit."""

from __future__ import annotations

import subprocess
import threading
import time
from pathlib import Path

import numpy as np
import pytest
from salus_daemon import CTL, MODELS, Daemon

import salus

ITERATIONS = 6
RESTART_AT = 3  # iterations before the drain
ADAM = {"type": "adam", "lr": 0.01}


def feeds(i: int, batch: int = 16) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(100 + i)
    return {"x": rng.standard_normal((batch, 784), dtype=np.float32),
            "labels": rng.integers(0, 10, batch).astype(np.int64)}


def train_session(client: salus.Client, name: str = "mlp-restart") -> salus.Session:
    return client.create_session(model=MODELS / "mlp.onnx", mode="train",
                                 inputs={"x": (16, 784), "labels": (16,)}, loss="loss",
                                 optimizer=ADAM, name=name, iterations=ITERATIONS)


def everything(session: salus.Session) -> dict[str, np.ndarray]:
    return session.read_state(sorted(session.state_specs))


def drain_with_snapshot(daemon: Daemon, snapshot: Path) -> None:
    """Drains `daemon` writing a snapshot to `snapshot`, and waits for it to exit."""
    with salus.connect(daemon.admin_endpoint) as admin:
        admin.drain(snapshot=snapshot)
    assert daemon.proc.wait(60) == 0


def test_training_across_a_drain_and_restore_is_bit_identical(daemon_factory,  # noqa: ANN001
                                                                tmp_path: Path) -> None:
    reference = daemon_factory()
    with salus.connect(reference.endpoint) as c:
        s = train_session(c)
        ref_losses = [float(s.run(feeds(i), ["loss"])["loss"]) for i in range(ITERATIONS)]
        ref_state = everything(s)

    first = daemon_factory()
    snapshot = tmp_path / "snapshot"
    with salus.connect(first.endpoint, reconnect=60) as c:
        s = train_session(c)
        losses = [float(s.run(feeds(i), ["loss"])["loss"]) for i in range(RESTART_AT)]
        # Submitted as the drain starts: either it runs before the snapshot is read, or it is
        # refused while the daemon drains and sent again to the restarted daemon.
        pending = s.submit(feeds(RESTART_AT), ["loss"])
        drain_with_snapshot(first, snapshot)
        assert any("event: snapshot " in line and '"sessions":1' in line for line in first.log), \
            "".join(first.log[-20:])

        def carry_on() -> None:
            losses.append(float(pending.result()["loss"]))
            # Sent while no daemon is there: it waits in the socket for the restarted one.
            losses.append(float(s.run(feeds(RESTART_AT + 1), ["loss"])["loss"]))

        sender = threading.Thread(target=carry_on)
        sender.start()
        second = daemon_factory("--restore", str(snapshot), after=first)
        sender.join(60)
        assert not sender.is_alive()
        for i in range(RESTART_AT + 2, ITERATIONS):
            losses.append(float(s.run(feeds(i), ["loss"])["loss"]))
        assert losses == ref_losses
        state = everything(s)
        assert state.keys() == ref_state.keys()
        for name, value in ref_state.items():
            assert np.array_equal(state[name], value), name
        listed = {x["session_id"]: x for x in c.sessions()}
        assert listed[s.id]["iterations_done"] == ITERATIONS
        assert listed[s.id]["name"] == "mlp-restart"
    # Taken up once: the snapshot is retired, so a later start does not bring it back.
    assert not (snapshot / "snapshot.pb").exists()
    assert (snapshot / "snapshot.restored.pb").exists()
    assert second.proc.poll() is None


def test_a_client_the_restart_did_not_keep_gets_a_clear_error(daemon_factory) -> None:  # noqa: ANN001
    first = daemon_factory()
    with salus.connect(first.endpoint, reconnect=60) as c:
        s = train_session(c)
        s.run(feeds(0), ["loss"])
        with salus.connect(first.admin_endpoint) as admin:
            admin.drain()  # no snapshot: the sessions end with the daemon
        assert first.proc.wait(60) == 0
        daemon_factory(after=first)
        with pytest.raises(salus.SalusError) as e:
            s.run(feeds(1), ["loss"])
        assert e.value.code == "ABORTED"
        assert "restarted without this client's sessions" in str(e.value)


def test_without_reconnect_a_draining_daemon_refuses_at_once(daemon: Daemon) -> None:
    with salus.connect(daemon.endpoint, reconnect=0) as c:
        s = train_session(c)
        s.run(feeds(0), ["loss"])
        with salus.connect(daemon.admin_endpoint) as admin:
            admin.drain()
        with pytest.raises(salus.SalusError) as e:
            # Refused while it drains; or, once it is gone, never answered.
            s.run(feeds(1), ["loss"], timeout=5)
        assert e.value.code in ("UNAVAILABLE", "DEADLINE_EXCEEDED")


def snapshot_of_one_session(daemon_factory, tmp_path: Path) -> tuple[Daemon, Path]:  # noqa: ANN001
    d = daemon_factory()
    snapshot = tmp_path / "snapshot"
    with salus.connect(d.endpoint) as c:
        s = train_session(c)
        s.run(feeds(0), ["loss"])
        drain_with_snapshot(d, snapshot)
    return d, snapshot


@pytest.mark.parametrize("damage", ["flip", "truncate", "manifest"])
def test_a_damaged_snapshot_is_refused_whole(daemon_factory, tmp_path: Path,  # noqa: ANN001
                                             damage: str) -> None:
    d, snapshot = snapshot_of_one_session(daemon_factory, tmp_path)
    (state_file,) = snapshot.glob("state-*.bin")
    manifest = snapshot / "snapshot.pb"
    if damage == "flip":
        data = bytearray(state_file.read_bytes())
        data[len(data) // 2] ^= 0x01
        state_file.write_bytes(bytes(data))
        said = "is damaged: its SHA-256"
    elif damage == "truncate":
        state_file.write_bytes(state_file.read_bytes()[:-4])
        said = "(truncated?)"
    else:  # the manifest (a newer format is the unit test's: tests/unit/server/snapshot_test.cc)
        data = bytearray(manifest.read_bytes())
        data[10] ^= 0x40
        manifest.write_bytes(bytes(data))
        said = "snapshot manifest"
    with pytest.raises(RuntimeError) as e:
        daemon_factory("--restore", str(snapshot), after=d)
    assert said in str(e.value)
    assert "does not start" in str(e.value)
    # Told to, it starts without the snapshot's sessions, and leaves the snapshot alone.
    empty = daemon_factory("--restore", str(snapshot), "--discard-invalid-snapshot")
    with salus.connect(empty.admin_endpoint) as admin:
        assert admin.sessions() == []
    assert manifest.exists()


def test_salusctl_drain_writes_a_snapshot_and_a_state_dir_restores_it(  # noqa: ANN201
        daemon_factory, tmp_path: Path):  # noqa: ANN001
    state_dir = tmp_path / "state"
    d = daemon_factory("--state-dir", str(state_dir))
    with salus.connect(d.endpoint, reconnect=60) as c:
        s = train_session(c)
        s.run(feeds(0), ["loss"])
        before = everything(s)
        # SIGTERM drains, and with a state directory writes the snapshot there.
        assert d.stop(keep_dir=True) == 0
        assert (state_dir / "snapshot.pb").exists()
        again = daemon_factory("--state-dir", str(state_dir), after=d)
        after = everything(s)
        for name, value in before.items():
            assert np.array_equal(after[name], value), name
        # salusctl drain --snapshot names the directory (made absolute for the daemon).
        out = subprocess.run([str(CTL), "--endpoint", again.admin_endpoint, "drain", "--snapshot",
                              str(tmp_path / "ctl")], capture_output=True, text=True, check=True)
        assert "snapshot" in out.stdout or "written" in out.stdout
        assert again.proc.wait(60) == 0
        assert (tmp_path / "ctl" / "snapshot.pb").exists()


def test_a_client_of_an_allocation_comes_back_with_its_budget(daemon_factory,  # noqa: ANN001
                                                              tmp_path: Path) -> None:
    token = "t" * 40
    first = daemon_factory()
    with salus.connect(first.admin_endpoint) as admin:
        admin.grant_allocation("pod-a", token, memory_bytes=256 << 20)
    with salus.connect(first.endpoint, allocation_token=token, reconnect=60) as c:
        assert c.allocation == "pod-a"
        s = train_session(c)
        s.run(feeds(0), ["loss"])
        before = everything(s)
        drain_with_snapshot(first, tmp_path / "snapshot")
        second = daemon_factory("--restore", str(tmp_path / "snapshot"), after=first)
        after = everything(s)
        for name, value in before.items():
            assert np.array_equal(after[name], value), name
        s.run(feeds(1), ["loss"])
        with salus.connect(second.admin_endpoint) as admin:
            (a,) = admin.list_allocations()
            assert a["id"] == "pod-a" and a["sessions"] == 1 and a["used_bytes"] > 0
            assert [x["allocation"] for x in admin.sessions()] == ["pod-a"]
            # The plugin granting it again (same token) finds it there.
            admin.grant_allocation("pod-a", token, memory_bytes=256 << 20)
    # The snapshot's files are the daemon user's alone.
    for f in (tmp_path / "snapshot").iterdir():
        assert f.stat().st_mode & 0o077 == 0, f


def test_after_a_crash_the_job_resumes_from_the_last_snapshot_and_is_told(  # noqa: ANN201
        daemon_factory, tmp_path: Path):  # noqa: ANN001
    reference = daemon_factory()
    with salus.connect(reference.endpoint) as c:
        s = train_session(c)
        ref_losses = [float(s.run(feeds(i), ["loss"])["loss"]) for i in range(ITERATIONS)]
        ref_state = everything(s)

    state_dir = tmp_path / "state"
    first = daemon_factory("--state-dir", str(state_dir), "--snapshot-every", "2")
    with salus.connect(first.endpoint, reconnect=60) as c:
        s = train_session(c)
        losses = [float(s.run(feeds(i), ["loss"])["loss"]) for i in range(ITERATIONS - 1)]
        assert losses == ref_losses[:-1]
        # Snapshots are written in the background while it serves; then it dies at once.
        deadline = time.monotonic() + 60
        while sum("event: snapshot " in line for line in first.log) < 2:
            assert time.monotonic() < deadline, "".join(first.log[-20:])
            time.sleep(0.05)
        first.proc.kill()
        first.proc.wait()
        second = daemon_factory("--state-dir", str(state_dir), after=first)
        assert any("event: restored " in line and '"complete":false' in line
                   for line in second.log), "".join(second.log[-20:])
        # The next iteration would train a state it was not meant for: it does not run, and
        # the job is told where the session is.
        with pytest.raises(salus.SessionRewound) as e:
            s.run(feeds(ITERATIONS - 1), ["loss"])
        at = e.value.iteration
        assert 2 <= at <= ITERATIONS - 1, e.value
        # Sent again from there, the batches give what a run without the crash gave.
        again = [float(s.run(feeds(i), ["loss"])["loss"]) for i in range(at, ITERATIONS)]
        assert again == ref_losses[at:]
        state = everything(s)
        for name, value in ref_state.items():
            assert np.array_equal(state[name], value), name
