"""Allocations against a real daemon: the administrator (this process's user over the ipc
socket, `daemon.admin_endpoint`) grants a share with a token; a client that presents the token
acts as the allocation, whose class, priority and memory budget its sessions get; revoking it
closes its sessions and its token stops working. Ordinary users (`daemon.endpoint`) may not
grant, revoke or list.

No test asserts a duration: waits have limits only to turn a hang into a failure.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import urllib.request

import pytest
from mlp_job import code_of
from salus_daemon import CTL, Daemon
from test_daemon import mlp_feeds, mlp_session, wait_for

import salus

MiB = 1 << 20
BUDGET = 256 * MiB
TOKEN = "t" * 40
OTHER_TOKEN = "u" * 40


@pytest.fixture(autouse=True)
def _no_inherited_token(monkeypatch: pytest.MonkeyPatch) -> None:
    """A token in the test's own environment would turn the administrator into a user."""
    monkeypatch.delenv("SALUS_ALLOCATION_TOKEN", raising=False)


def error_of(fn) -> salus.SalusError:  # noqa: ANN001
    with pytest.raises(salus.SalusError) as e:
        fn()
    return e.value


def metrics(daemon: Daemon) -> str:
    url = f"http://127.0.0.1:{daemon.metrics_port}/metrics"
    return urllib.request.urlopen(url, timeout=10).read().decode()


def series(text: str, name: str, allocation: str) -> float | None:
    """The value of `name`{allocation="<allocation>",pod="..."} in the metrics, or None."""
    pattern = rf'^{name}\{{allocation="{re.escape(allocation)}",pod="(?:[^"\\]|\\.)*"\}} (\S+)$'
    m = re.search(pattern, text, re.MULTILINE)
    return None if m is None else float(m.group(1))


def test_only_the_administrator_grants_revokes_and_lists(daemon: Daemon) -> None:
    with salus.connect(daemon.endpoint) as user, salus.connect(daemon.admin_endpoint) as admin:
        assert user.server["role"] == "user" and admin.server["role"] == "admin"
        for call in (lambda: user.grant_allocation("a1", TOKEN),
                     lambda: user.revoke_allocation("a1"),
                     user.list_allocations):
            e = error_of(call)
            assert e.code == "PERMISSION_DENIED"
            assert "administrator" in e.message
        assert admin.list_allocations() == []
        assert admin.grant_allocation("a1", TOKEN) is True
        assert admin.grant_allocation("a1", TOKEN) is False  # the same again: fine
        assert admin.grant_allocation("a1", "") is False     # an empty token keeps it
        assert [a["id"] for a in admin.list_allocations()] == ["a1"]
        assert "token" not in admin.list_allocations()[0]
        assert code_of(lambda: admin.revoke_allocation("nope")) == "NOT_FOUND"


@pytest.mark.parametrize("kwargs, field", [
    ({"id": "Bad_Id"}, "id"),
    ({"id": ""}, "id"),
    ({"token": "short"}, "token"),
    ({"priority": 101}, "priority"),
    ({"max_priority": 101}, "max_priority"),
    ({"max_priority": -1}, "max_priority"),
    ({"priority": 9, "max_priority": 5}, "priority"),
], ids=["id-case", "id-empty", "token-short", "priority", "max-priority", "max-negative",
        "over-ceiling"])
def test_bad_grants_are_refused_naming_the_field(daemon: Daemon, kwargs: dict,
                                                 field: str) -> None:
    args = {"id": "a1", "token": TOKEN, **kwargs}
    with salus.connect(daemon.admin_endpoint) as admin:
        e = error_of(lambda: admin.grant_allocation(**args))
        assert e.code == "INVALID_ARGUMENT"
        assert f"allocation.{field}:" in e.message
        assert admin.list_allocations() == []


def test_token_reuse_and_another_token_for_an_id_are_refused(daemon: Daemon) -> None:
    with salus.connect(daemon.admin_endpoint) as admin:
        assert admin.grant_allocation("a1", TOKEN)
        e = error_of(lambda: admin.grant_allocation("a2", TOKEN))
        assert e.code == "INVALID_ARGUMENT" and "allocation.token:" in e.message
        e = error_of(lambda: admin.grant_allocation("a1", OTHER_TOKEN))
        assert e.code == "INVALID_ARGUMENT" and "allocation.token:" in e.message
        assert [a["id"] for a in admin.list_allocations()] == ["a1"]


def test_a_token_client_acts_for_the_allocation(daemon: Daemon) -> None:
    with salus.connect(daemon.admin_endpoint) as admin:
        assert admin.grant_allocation("a1", TOKEN, memory_bytes=BUDGET,
                                      latency_class="interactive", priority=7, max_priority=10)
        # Over loopback tcp, and over the administrator's own ipc socket: never an
        # administrator once it presents a token.
        with salus.connect(daemon.endpoint, allocation_token=TOKEN) as c, \
                salus.connect(daemon.admin_endpoint, allocation_token=TOKEN) as c_ipc:
            for client in (c, c_ipc):
                assert client.server["principal"] == "alloc:a1"
                assert client.server["role"] == "user"
                assert client.allocation == "a1"
                assert "alloc:a1" in client.server["client_id"]
            e = error_of(c_ipc.drain)
            assert e.code == "PERMISSION_DENIED" and "alloc:a1" in e.message
            assert code_of(c_ipc.list_allocations) == "PERMISSION_DENIED"
            # The class is the allocation's; priority 0 takes its priority.
            s = c.create_session(synthetic={"persistent_bytes": MiB, "ephemeral_bytes": MiB},
                                 latency_class="batch", name="default")
            s.run()
            # A priority of its own, within the allocation's ceiling.
            s3 = c_ipc.create_session(synthetic={"persistent_bytes": MiB,
                                                 "ephemeral_bytes": MiB},
                                      priority=3, name="own")
            listed = {x["name"]: x for x in c.sessions()}
            assert set(listed) == {"default"}  # one client sees only its own sessions
            assert listed["default"]["latency_class"] == "interactive"
            assert listed["default"]["priority"] == 7
            assert listed["default"]["allocation"] == "a1"
            mine = {x["name"]: x for x in c_ipc.sessions()}
            assert mine["own"]["priority"] == 3
            assert mine["own"]["latency_class"] == "interactive"
            # Above the ceiling: refused like the max_priority quota, naming the allocation.
            e = error_of(lambda: c.create_session(
                synthetic={"persistent_bytes": MiB, "ephemeral_bytes": MiB}, priority=11))
            assert e.code == "RESOURCE_EXHAUSTED"
            assert "allocation a1 max_priority=10" in e.message
            # The administrator sees the allocation of each session, and its usage.
            by_name = {x["name"]: x for x in admin.sessions()}
            assert by_name["default"]["allocation"] == by_name["own"]["allocation"] == "a1"
            (a1,) = admin.list_allocations()
            assert a1 == {"id": "a1", "memory_bytes": BUDGET, "latency_class": "interactive",
                          "priority": 7, "max_priority": 10, "pod": "", "used_bytes": 4 * MiB,
                          "sessions": 2, "clients": 2}
            s3.close()
            s.close()
        assert admin.list_allocations()[0]["used_bytes"] == 0


def test_budget_refuses_a_session_over_it_while_the_first_keeps_training(
        daemon: Daemon) -> None:
    with salus.connect(daemon.admin_endpoint) as admin:
        assert admin.grant_allocation("a1", TOKEN, memory_bytes=BUDGET)
        # The pod name arrives later: an update with an empty token keeps the token.
        assert not admin.grant_allocation("a1", "", memory_bytes=BUDGET, pod='ns/pod"1')
        with salus.connect(daemon.endpoint, allocation_token=TOKEN) as first_proc, \
                salus.connect(daemon.endpoint, allocation_token=TOKEN) as second_proc:
            feeds = mlp_feeds()
            s = mlp_session(first_proc)
            held = s.persistent_bytes + s.ephemeral_bytes
            assert 0 < held < BUDGET
            losses = [float(s.run(feeds=feeds, fetches=["loss"])["loss"])]
            # Another process of the same pod: the budget is theirs together.
            e = error_of(lambda: second_proc.create_session(
                synthetic={"persistent_bytes": BUDGET - held, "ephemeral_bytes": MiB}))
            assert e.code == "RESOURCE_EXHAUSTED"
            assert f"allocation a1 memory_bytes={BUDGET} reached" in e.message
            # Nothing changed: the first session trains on, and what fits is still admitted.
            for _ in range(3):
                losses.append(float(s.run(feeds=feeds, fetches=["loss"])["loss"]))
            assert losses[-1] < losses[0]
            fits = second_proc.create_session(
                synthetic={"persistent_bytes": BUDGET - held - MiB, "ephemeral_bytes": MiB})
            fits.run()
            (a1,) = admin.list_allocations()
            assert a1["used_bytes"] == BUDGET and a1["sessions"] == 2 and a1["clients"] == 2
            text = metrics(daemon)
            assert '{allocation="a1",pod="ns/pod\\"1"}' in text  # the label value escaped
            assert series(text, "salus_alloc_memory_budget_bytes", "a1") == BUDGET
            assert series(text, "salus_alloc_used_bytes", "a1") == BUDGET
            assert series(text, "salus_alloc_sessions", "a1") == 2
            assert series(text, "salus_alloc_iterations_total", "a1") == 5
            assert "# TYPE salus_alloc_iterations_total counter" in text
            fits.close()
            s.close()


def test_revoke_closes_the_sessions_and_the_token_stops_working(daemon: Daemon) -> None:
    with salus.connect(daemon.admin_endpoint) as admin:
        assert admin.grant_allocation("a1", TOKEN, memory_bytes=BUDGET, pod="ns/p")
        assert admin.grant_allocation("a2", OTHER_TOKEN)
        pod = salus.connect(daemon.endpoint, allocation_token=TOKEN)
        other = salus.connect(daemon.endpoint, allocation_token=OTHER_TOKEN)
        try:
            s = pod.create_session(synthetic={"persistent_bytes": MiB, "ephemeral_bytes": MiB})
            s.run()
            kept = other.create_session(synthetic={"persistent_bytes": MiB,
                                                   "ephemeral_bytes": MiB})
            assert admin.revoke_allocation("a1") == 1
            # The client is gone, and so is its session.
            e = error_of(s.run)
            assert e.code == "UNAUTHENTICATED"
            assert [x["allocation"] for x in admin.sessions()] == ["a2"]
            e = error_of(lambda: salus.connect(daemon.endpoint, allocation_token=TOKEN))
            assert e.code == "UNAUTHENTICATED"
            assert e.message == "unknown allocation token"
            assert [a["id"] for a in admin.list_allocations()] == ["a2"]
            assert code_of(lambda: admin.revoke_allocation("a1")) == "NOT_FOUND"
            wait_for(lambda: series(metrics(daemon), "salus_alloc_sessions", "a1") is None,
                     "the revoked allocation's series to go")
            # The other allocation is untouched.
            kept.run()
            assert series(metrics(daemon), "salus_alloc_sessions", "a2") == 1
        finally:
            pod.close()
            other.close()


def test_an_unknown_token_is_unauthenticated(daemon: Daemon) -> None:
    for endpoint in (daemon.endpoint, daemon.admin_endpoint):
        e = error_of(lambda ep=endpoint: salus.connect(ep, allocation_token="x" * 40))
        assert e.code == "UNAUTHENTICATED"
        assert e.message == "unknown allocation token"


def test_the_token_comes_from_the_environment(daemon: Daemon,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    with salus.connect(daemon.admin_endpoint) as admin:
        assert admin.grant_allocation("a1", TOKEN, pod="ns/pod")
        monkeypatch.setenv("SALUS_ALLOCATION_TOKEN", TOKEN)
        with salus.connect(daemon.endpoint) as c:
            assert c.allocation == "a1"
        # The C++ client (salusctl) reads it too: a user then, not the administrator.
        env = dict(os.environ)
        r = subprocess.run([str(CTL), "--endpoint", daemon.admin_endpoint, "allocations"],
                           capture_output=True, text=True, timeout=60, env=env)
        assert r.returncode != 0 and "PERMISSION_DENIED" in r.stderr
        del env["SALUS_ALLOCATION_TOKEN"]
        r = subprocess.run([str(CTL), "--endpoint", daemon.admin_endpoint, "allocations"],
                           capture_output=True, text=True, timeout=60, env=env, check=True)
        header, row = r.stdout.splitlines()
        assert header.split()[:3] == ["ID", "POD", "BUDGET"]
        assert row.split()[:2] == ["a1", "ns/pod"]
        r = subprocess.run([str(CTL), "--endpoint", daemon.admin_endpoint, "allocations",
                            "--json"], capture_output=True, text=True, timeout=60, env=env,
                           check=True)
        assert json.loads(r.stdout)[0]["id"] == "a1"
