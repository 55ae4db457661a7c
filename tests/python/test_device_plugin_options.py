"""salus-device-plugin's options and its reconcile decisions, with an in-memory daemon (no
processes, no sockets): the real daemon and a fake kubelet are in
tests/integration/test_device_plugin.py."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "adaptors" / "python"))

from salus.device_plugin import plugin  # noqa: E402
from salus.device_plugin.plugin import Options, ResourceSpec, parse_size  # noqa: E402


def test_sizes() -> None:
    assert parse_size("256MiB") == 256 << 20
    assert parse_size("1GiB") == 1 << 30
    assert parse_size("4096") == 4096
    assert parse_size("2G") == 2 << 30
    for bad in ("", "0", "-1MiB", "1.5GiB", "ten"):
        with pytest.raises(ValueError):
            parse_size(bad)


def test_resource_specs() -> None:
    assert ResourceSpec.parse("salus.ai/gpu-memory") == ResourceSpec("salus.ai/gpu-memory")
    assert ResourceSpec.parse("salus.ai/x=interactive:50:80") == ResourceSpec(
        "salus.ai/x", "interactive", 50, 80)
    assert ResourceSpec.parse("salus.ai/gpu-memory").socket_name == "salus-salus.ai_gpu-memory.sock"
    for bad in ("gpu-memory=batch", "salus.ai/x=fast", "salus.ai/x=batch:101",
                "salus.ai/x=batch:a", "salus.ai/x=batch:1:2:3"):
        with pytest.raises(ValueError):
            ResourceSpec.parse(bad)


def test_pod_endpoint_follows_the_socket_dir() -> None:
    o = Options(daemon="ipc:///run/salus/salus.sock", socket_dir="/run/salus",
                container_dir="/var/run/salus")
    assert o.endpoint_in_pod() == "ipc:///var/run/salus/salus.sock"
    with pytest.raises(ValueError, match="not in --socket-dir"):
        Options(daemon="ipc:///tmp/s.sock", socket_dir="/run/salus").endpoint_in_pod()
    with pytest.raises(ValueError, match="--pod-endpoint"):
        Options(daemon="tcp://127.0.0.1:5501").endpoint_in_pod()
    assert Options(daemon="tcp://h:1", pod_endpoint="tcp://h:2").endpoint_in_pod() == "tcp://h:2"


def test_bad_command_lines_are_refused(capsys: pytest.CaptureFixture[str]) -> None:
    for argv in (["--unit", "0"], ["--resource", "nodomain"], ["--reconcile-seconds", "0"],
                 ["--resource", "salus.ai/a", "--resource", "salus.ai/a"]):
        with pytest.raises(SystemExit) as e:
            plugin.parse_args(argv)
        assert e.value.code == 2
    assert "given twice" in capsys.readouterr().err


class FakeDaemon:
    """The administrator's view of a daemon's allocations."""

    def __init__(self) -> None:
        self.allocations: dict[str, dict] = {}
        self.server = {"capacity_bytes": 10 << 20, "role": "admin", "principal": "uid:0"}
        self.down = False

    def __call__(self, endpoint: str, **kw: Any) -> FakeDaemon:
        if self.down:
            raise plugin.salus.SalusError("DEADLINE_EXCEEDED", "no reply")
        return self

    def grant_allocation(self, id: str, token: str, **kw: Any) -> bool:  # noqa: A002
        created = id not in self.allocations
        self.allocations[id] = {"id": id, "token": token, **kw}
        return created

    def revoke_allocation(self, id: str) -> int:  # noqa: A002
        if id not in self.allocations:
            raise plugin.salus.SalusError("NOT_FOUND", id)
        del self.allocations[id]
        return 0

    def list_allocations(self) -> list[dict]:
        if self.down:
            raise plugin.salus.SalusError("UNAVAILABLE", "down")
        return [{k: v for k, v in a.items() if k != "token"} for a in self.allocations.values()]

    def close(self) -> None:
        pass


def make(tmp_path: Path, owners: dict | None) -> tuple[plugin.DevicePlugin, FakeDaemon]:
    fake = FakeDaemon()
    o = Options(unit_bytes=1 << 20, state_file=str(tmp_path / "state.json"), grace_seconds=30,
                pod_resources=str(tmp_path / "none.sock"))
    p = plugin.DevicePlugin(o, connect=fake)
    p.pods_by_unit = lambda: owners  # type: ignore[method-assign]
    p.reconcile()
    return p, fake


def test_reconcile_names_pods_reclaims_and_regrants(tmp_path: Path,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    owners: dict = {}
    p, fake = make(tmp_path, owners)
    assert (p.units, p.healthy) == (10, True)
    spec = p.o.resources[1]
    resp = p.allocate(spec, ["unit-00001", "unit-00002"])
    aid = resp.envs["SALUS_ALLOCATION"]
    assert fake.allocations[aid]["memory_bytes"] == 2 << 20
    assert fake.allocations[aid]["latency_class"] == "interactive"

    owners[(spec.name, "unit-00002")] = "ns/pod"
    p.reconcile()
    assert fake.allocations[aid]["pod"] == "ns/pod"

    # The daemon lost it: granted again with the same token.
    token = fake.allocations.pop(aid)["token"]
    p.reconcile()
    assert fake.allocations[aid]["token"] == token
    # The daemon holds one of ours the plugin does not know: revoked.
    fake.allocations["k8s-stale"] = {"id": "k8s-stale", "pod": ""}
    fake.allocations["other"] = {"id": "other", "pod": ""}
    p.reconcile()
    assert set(fake.allocations) == {aid, "other"}

    # The units go to another pod: the old allocation is superseded at once.
    del owners[(spec.name, "unit-00002")]
    resp2 = p.allocate(spec, ["unit-00002"])
    assert aid not in fake.allocations and resp2.envs["SALUS_ALLOCATION"] in fake.allocations

    # A pod that never appears is revoked after the grace period.
    orphan = p.allocate(p.o.resources[0], ["unit-00009"]).envs["SALUS_ALLOCATION"]
    p.reconcile()
    assert orphan in fake.allocations
    now = plugin.time.time()
    monkeypatch.setattr(plugin.time, "time", lambda: now + 31)
    p.reconcile()
    assert orphan not in fake.allocations


def test_an_unreachable_daemon_marks_units_unhealthy_and_grants_later(tmp_path: Path) -> None:
    p, fake = make(tmp_path, None)
    fake.down = True
    p.daemon.reset()
    p.reconcile()
    assert (p.units, p.healthy) == (10, False)
    resp = p.allocate(p.o.resources[0], ["unit-00000"])  # never refused for a down daemon
    aid = resp.envs["SALUS_ALLOCATION"]
    assert aid not in fake.allocations
    fake.down = False
    p.reconcile()
    assert p.healthy and aid in fake.allocations

    # A restarted plugin reads its allocations back.
    again = plugin.DevicePlugin(p.o, connect=fake)
    assert list(again.ledger.allocations) == [aid]
    assert again.ledger.allocations[aid].token == resp.envs["SALUS_ALLOCATION_TOKEN"]
