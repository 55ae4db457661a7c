"""Multi-tenant security against a real daemon: clients see only their own sessions and
buffers, tokens (not connections) are identities, Drain needs the administrator, CURVE admits
only listed keys on a remote endpoint, quotas refuse what exceeds them and nothing else, and a
client flooding the daemon neither loses replies nor stops another from training.

Loopback tcp clients (`daemon.endpoint`) are ordinary users; the daemon's own Unix user over
ipc (`daemon.admin_endpoint`) is the administrator. No test asserts a duration: waits have
limits only to turn a hang into a failure.
"""

from __future__ import annotations

import json
import os
import subprocess
import threading
from pathlib import Path

import numpy as np
import pytest
import zmq
from mlp_job import code_of
from salus_daemon import CTL, SERVER, Daemon, free_port
from test_daemon import FEED_BYTES, mlp_feeds, mlp_session, wait_for

import salus
from salus._generated.salus.v1 import salus_pb2 as pb

MiB = 1 << 20
REPLY_TIMEOUT_MS = 60_000
# How long a refused CURVE peer is given to (not) answer: the daemon drops its handshake, so
# this only bounds the wait for the DEADLINE_EXCEEDED we expect.
REFUSED_WAIT_S = 2.0

UNAUTHENTICATED, NOT_FOUND, PERMISSION_DENIED, RESOURCE_EXHAUSTED = 16, 5, 7, 8


def synthetic(client: salus.Client, p: int = MiB, e: int = MiB, t: float = 0.0,
              **kw: object) -> salus.Session:
    return client.create_session(
        synthetic={"persistent_bytes": p, "ephemeral_bytes": e, "iteration_seconds": t},
        **kw)  # type: ignore[arg-type]


class Raw:
    """A bare DEALER socket speaking the protocol by hand: what a hostile client can send."""

    def __init__(self, endpoint: str, routing_id: bytes | None = None) -> None:
        self.sock = zmq.Context.instance().socket(zmq.DEALER)
        self.sock.setsockopt(zmq.LINGER, 0)
        if routing_id is not None:
            self.sock.setsockopt(zmq.ROUTING_ID, routing_id)
        self.sock.connect(endpoint)
        self.token = ""
        self.next_id = 1

    def send(self, req: pb.Request, frames: list[bytes] | None = None,
             token: str | None = None) -> int:
        req.request_id = self.next_id
        self.next_id += 1
        req.client_token = self.token if token is None else token
        self.sock.send_multipart([req.SerializeToString(), *(frames or [])])
        return req.request_id

    def recv(self, timeout_ms: int = REPLY_TIMEOUT_MS) -> pb.Reply | None:
        if not self.sock.poll(timeout_ms):
            return None
        reply = pb.Reply()
        reply.ParseFromString(self.sock.recv_multipart()[0])
        return reply

    def call(self, req: pb.Request, frames: list[bytes] | None = None,
             token: str | None = None, timeout_ms: int = REPLY_TIMEOUT_MS) -> pb.Reply:
        rid = self.send(req, frames, token)
        reply = self.recv(timeout_ms)
        assert reply is not None, f"no reply to {req.WhichOneof('body')}"
        assert reply.request_id == rid
        return reply

    def hello(self) -> pb.HelloReply:
        req = pb.Request()
        req.hello.protocol_version = 1
        req.hello.client_name = "raw"
        reply = self.call(req)
        assert reply.status.code == 0, reply.status.message
        self.token = reply.hello.client_token
        return reply.hello

    def close(self) -> None:
        self.sock.close(0)


def run_req(session_id: int, fetches: list[str] | None = None) -> pb.Request:
    r = pb.Request(session_id=session_id)
    r.run_iteration.SetInParent()
    r.run_iteration.fetches.extend(fetches or [])
    return r


def close_req(session_id: int) -> pb.Request:
    r = pb.Request(session_id=session_id)
    r.close_session.SetInParent()
    return r


def create_req(p: int = MiB, e: int = MiB, t: float = 0.0) -> pb.Request:
    r = pb.Request()
    r.create_session.synthetic.persistent_bytes = p
    r.create_session.synthetic.ephemeral_bytes = e
    r.create_session.synthetic.iteration_seconds = t
    return r


def simple_req(kind: str) -> pb.Request:
    r = pb.Request()
    getattr(r, kind).SetInParent()
    return r


def feeds_from_buffer(session_id: int, buffer_id: int) -> pb.Request:
    """An mlp iteration whose x and labels lie in a shared buffer."""
    r = run_req(session_id, ["loss"])
    x = r.run_iteration.feeds.add(name="x", dtype=pb.FLOAT32, shape=[16, 784])
    x.buffer.buffer_id, x.buffer.offset = buffer_id, 0
    y = r.run_iteration.feeds.add(name="labels", dtype=pb.INT64, shape=[16])
    y.buffer.buffer_id, y.buffer.offset = buffer_id, 16 * 784 * 4
    return r


# -- isolation between clients ----------------------------------------------------------------


def test_another_clients_sessions_and_buffers_are_not_found(daemon: Daemon) -> None:
    # A maps a shared buffer, so it speaks over ipc (the daemon must know its Unix user); B is an
    # ordinary user over loopback TCP.
    with salus.connect(daemon.admin_endpoint) as a, salus.connect(daemon.endpoint) as b:
        assert b.server["role"] == "user"
        assert b.server["principal"] == "tcp:127.0.0.1"
        assert "client_token" not in a.server and a._token
        assert a.server["client_id"] != b.server["client_id"]
        feeds = mlp_feeds()
        sa = mlp_session(a)
        first = float(sa.run(feeds=feeds, fetches=["loss"])["loss"])
        buf = a.shared_buffer(FEED_BYTES)
        buf.array((16, 784), np.float32)[:] = feeds["x"]
        buf.array((16,), np.int64, 16 * 784 * 4)[:] = feeds["labels"]

        # B names A's session through the client API (a forged Session) and raw.
        forged = salus.Session(b, pb.CreateSessionReply(session_id=sa.id))
        assert code_of(lambda: forged.run(feeds=feeds, fetches=["loss"])) == "NOT_FOUND"
        assert code_of(lambda: forged.read_state(["fc_w1"])) == "NOT_FOUND"
        assert code_of(forged.close) == "NOT_FOUND"
        raw = Raw(daemon.endpoint)
        try:
            raw.token = b._token
            x, y = feeds["x"].tobytes(), feeds["labels"].tobytes()
            r = run_req(sa.id, ["loss"])
            r.run_iteration.feeds.add(name="x", dtype=pb.FLOAT32, shape=[16, 784])
            r.run_iteration.feeds.add(name="labels", dtype=pb.INT64, shape=[16])
            assert raw.call(r, [x, y]).status.code == NOT_FOUND
            assert raw.call(close_req(sa.id)).status.code == NOT_FOUND
            # A's shared buffer: B cannot unregister it, nor feed its own session from it.
            unreg = pb.Request()
            unreg.unregister_buffer.buffer_id = buf.id
            assert raw.call(unreg).status.code == NOT_FOUND
            sb = mlp_session(b)
            reply = raw.call(feeds_from_buffer(sb.id, buf.id))
            assert reply.status.code == NOT_FOUND, reply.status.message
        finally:
            raw.close()

        # A is unaffected: its session is listed, trains on, and reads its buffer.
        assert sa.id in [s["session_id"] for s in a.sessions()]
        assert sa.id not in [s["session_id"] for s in b.sessions()]
        out = a._call(feeds_from_buffer(sa.id, buf.id))[0].run_iteration
        assert out.outputs[0].name == "loss"
        last = float(sa.run(feeds=feeds, fetches=["loss"])["loss"])
        assert last < first
        assert sb.id != sa.id and daemon.proc.poll() is None


def test_requests_need_a_live_token(daemon: Daemon) -> None:
    with salus.connect(daemon.admin_endpoint) as a:  # ipc: it maps a shared buffer
        sa = synthetic(a)
        sa.run()
        buf = a.shared_buffer(4096)
        raw = Raw(daemon.endpoint)  # never says Hello
        try:
            reg = pb.Request()
            reg.register_buffer.shm_name, reg.register_buffer.bytes = "/salus-nope", 16
            unreg = pb.Request()
            unreg.unregister_buffer.buffer_id = buf.id
            for token in ("", "made-up-token", a._token[::-1]):
                for name, req in [("create", create_req()), ("run", run_req(sa.id)),
                                  ("close", close_req(sa.id)), ("register", reg),
                                  ("unregister", unreg)]:
                    reply = raw.call(req, token=token)
                    assert reply.status.code == UNAUTHENTICATED, \
                        f"{name} with token {token!r}: {reply.status}"
                    assert reply.status.message
        finally:
            raw.close()
        # Nothing happened to A.
        sa.run()
        assert [s["session_id"] for s in a.sessions()] == [sa.id]


def test_the_token_not_the_connection_is_the_client(daemon: Daemon) -> None:
    first = Raw(daemon.endpoint)
    again = Raw(daemon.endpoint)
    try:
        first.hello()
        reply = first.call(create_req())
        assert reply.status.code == 0, reply.status.message
        sid = reply.create_session.session_id
        # The same token on another connection (same principal): the same client.
        again.token = first.token
        assert again.call(run_req(sid)).status.code == 0
        listed = again.call(simple_req("list_sessions")).list_sessions
        assert [s.session_id for s in listed.sessions] == [sid]
        reply = again.call(create_req())
        assert reply.status.code == 0, reply.status.message
        sid2 = reply.create_session.session_id
        listed = first.call(simple_req("list_sessions")).list_sessions
        assert sorted(s.session_id for s in listed.sessions) == sorted([sid, sid2])
        assert again.call(close_req(sid2)).status.code == 0
    finally:
        first.close()
        again.close()


def test_a_stolen_routing_id_is_not_an_identity(daemon: Daemon) -> None:
    victim_id = b"victim-routing-id"
    victim = Raw(daemon.endpoint, routing_id=victim_id)
    victim.hello()
    reply = victim.call(create_req())
    assert reply.status.code == 0, reply.status.message
    sid = reply.create_session.session_id
    assert victim.call(run_req(sid)).status.code == 0

    def attack(thief: Raw, first_wait_ms: int) -> bool:
        """Requests naming the victim's session, with no token: each refused, if the daemon
        answers the thief at all (whether it did is returned)."""
        reqs = [run_req(sid), close_req(sid), create_req(), simple_req("list_sessions")]
        rids = [thief.send(r) for r in reqs]
        first = thief.recv(first_wait_ms)
        if first is None:
            return False
        replies = [first] + [thief.recv() for _ in rids[1:]]
        assert None not in replies, "some requests got no reply"
        assert [r.request_id for r in replies] == rids  # type: ignore[union-attr]
        for r in replies[:3]:
            assert r.status.code == UNAUTHENTICATED, r.status  # type: ignore[union-attr]
        listed = replies[3].list_sessions.sessions  # type: ignore[union-attr]
        assert sid not in [s.session_id for s in listed]
        return True

    # While the victim is connected the daemon may refuse the duplicate routing id outright
    # (no answer), or hand the id over: then it answers, and refuses.
    thief = Raw(daemon.endpoint, routing_id=victim_id)
    try:
        attack(thief, first_wait_ms=2000)
    finally:
        thief.close()
    # With the victim gone (its client lives on by its lease), the id is free once the daemon
    # sees the disconnect: answered, and refused.
    victim.close()

    def answered_and_refused() -> bool:
        thief = Raw(daemon.endpoint, routing_id=victim_id)
        try:
            return attack(thief, first_wait_ms=1000)
        finally:
            thief.close()

    wait_for(answered_and_refused, "the daemon to answer a connection with the victim's id")
    # The victim comes back on a new connection with its token: its session is intact.
    back = Raw(daemon.endpoint)
    try:
        back.token = victim.token
        assert back.call(run_req(sid)).status.code == 0
        listed = back.call(simple_req("list_sessions")).list_sessions
        assert [s.session_id for s in listed.sessions] == [sid]
    finally:
        back.close()


# -- what a client sees of the others ---------------------------------------------------------


def test_users_see_others_only_as_totals_and_the_admin_sees_all(daemon: Daemon) -> None:
    with salus.connect(daemon.endpoint) as a, salus.connect(daemon.endpoint) as b, \
            salus.connect(daemon.admin_endpoint) as admin:
        assert admin.server["role"] == "admin"
        assert admin.server["principal"] == f"uid:{os.getuid()}"
        mine_a = [synthetic(a, 2 * MiB, MiB), synthetic(a, 3 * MiB, MiB)]
        mine_b = [synthetic(b, MiB, 2 * MiB)]
        ids_a = {s.id for s in mine_a}
        ids = sorted(ids_a | {mine_b[0].id})
        assert len(ids) == 3
        # Random, not counted: no one learns how many sessions came before, or guesses one.
        assert all(0 < i < 1 << 53 for i in ids) and ids[-1] - ids[0] > 3, ids

        assert {s["session_id"] for s in b.sessions()} == {mine_b[0].id}
        assert b.others() == {
            "sessions": 2, "waiting": 0, "admitted": 2,
            "persistent_bytes": sum(s.persistent_bytes for s in mine_a),
            "ephemeral_bytes": sum(s.ephemeral_bytes for s in mine_a)}
        assert {s["session_id"] for s in a.sessions()} == ids_a
        assert a.others()["sessions"] == 1

        every = {s["session_id"]: s["client_id"] for s in admin.sessions()}
        assert every == {**{i: a.server["client_id"] for i in ids_a},
                         mine_b[0].id: b.server["client_id"]}
        assert set(admin.others().values()) == {0}

        # Stats and the memory map of an ordinary user name none of another's sessions.
        for s in mine_a + mine_b:
            s.run()
        seen_b = json.dumps(b.stats()) + json.dumps(b.memory_map())
        for i in ids_a:
            assert str(i) not in seen_b, f"B's stats or memory map show A's session {i}"
        assert a.server["client_id"] not in seen_b
        assert str(mine_b[0].id) in json.dumps(b.memory_map())
        assert all(str(i) in json.dumps(admin.memory_map()) for i in ids_a)

        # The administrator may close anyone's session; an ordinary user not even by id.
        with pytest.raises(salus.SalusError) as e:
            b.close_session(mine_a[0].id)
        assert e.value.code == "NOT_FOUND"
        admin.close_session(mine_a[0].id)
        assert {s["session_id"] for s in a.sessions()} == {mine_a[1].id}
        with pytest.raises(salus.SalusError) as e:
            mine_a[0].run()
        assert e.value.code == "NOT_FOUND"
        mine_a[1].run()


# -- draining -------------------------------------------------------------------------------


def test_drain_needs_the_administrator(daemon: Daemon) -> None:
    with salus.connect(daemon.endpoint) as user:
        s = synthetic(user)
        with pytest.raises(salus.SalusError) as e:
            user.drain()
        assert e.value.code == "PERMISSION_DENIED" and e.value.message
        raw = Raw(daemon.endpoint)
        try:
            raw.hello()
            assert raw.call(simple_req("drain")).status.code == PERMISSION_DENIED
            assert raw.call(simple_req("drain"), token="").status.code == PERMISSION_DENIED
        finally:
            raw.close()
        s.run()  # still serving
        assert daemon.proc.poll() is None
    r = subprocess.run([str(CTL), "--endpoint", daemon.endpoint, "drain"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode != 0 and daemon.proc.poll() is None
    subprocess.run([str(CTL), "--endpoint", daemon.admin_endpoint, "drain"], check=True,
                   capture_output=True, timeout=60)
    assert daemon.proc.wait(60) == 0


# -- CURVE on a remote endpoint ----------------------------------------------------------------


def keygen(folder: Path, name: str) -> tuple[Path, Path]:
    """`salusctl keygen`: (secret key file, public key file)."""
    prefix = folder / name
    subprocess.run([str(CTL), "keygen", str(prefix)], check=True, capture_output=True,
                   timeout=30)
    secret, public = prefix.with_suffix(".key"), prefix.with_suffix(".pub")
    assert secret.exists() and public.exists()
    assert zmq.curve_public(salus.read_curve_key(secret)) == salus.read_curve_key(public)
    return secret, public


def refused(endpoint: str, **keys: object) -> bool:
    """Whether a client with these keys gets no answer to its Hello."""
    try:
        salus.connect(endpoint, timeout=REFUSED_WAIT_S, **keys).close()  # type: ignore[arg-type]
    except salus.SalusError as e:
        assert e.code == "DEADLINE_EXCEEDED", e
        return True
    return False


@pytest.fixture
def no_curve_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(salus.client.ENV_SERVER_KEY, raising=False)
    monkeypatch.delenv(salus.client.ENV_SECRET_KEY, raising=False)


def test_curve_admits_listed_keys_only(daemon_factory, tmp_path: Path,  # noqa: ANN001
                                       no_curve_env: None,
                                       monkeypatch: pytest.MonkeyPatch) -> None:
    server_key, server_pub = keygen(tmp_path, "server")
    alice_key, alice_pub = keygen(tmp_path, "alice")
    root_key, root_pub = keygen(tmp_path, "root")
    mallory_key, _ = keygen(tmp_path, "mallory")
    listed = tmp_path / "clients.txt"
    listed.write_text(f"# who may connect\n{salus.read_curve_key(alice_pub).decode()}\n\n")
    remote = f"tcp://127.0.0.1:{free_port()}"
    d = daemon_factory("--listen-remote", remote, config={"security": {"curve": {
        "secret_key_file": str(server_key),
        "client_keys_file": str(listed),
        "admin_keys": [salus.read_curve_key(root_pub).decode()]}}})

    with salus.connect(remote, server_key=server_pub, secret_key=alice_key) as alice:
        assert alice.server["role"] == "user"
        assert alice.server["principal"] == "curve:" + salus.read_curve_key(alice_pub).decode()
        assert alice.public_key == salus.read_curve_key(alice_pub).decode()
        s = synthetic(alice, iterations=3)
        for _ in range(3):
            s.run()
        s.close()
    # Keys as Z85 strings, and from the environment.
    with salus.connect(remote, server_key=salus.read_curve_key(server_pub).decode(),
                       secret_key=salus.read_curve_key(alice_key)) as alice:
        assert alice.server["role"] == "user"
    monkeypatch.setenv(salus.client.ENV_SERVER_KEY, str(server_pub))
    monkeypatch.setenv(salus.client.ENV_SECRET_KEY, str(alice_key))
    with salus.connect(remote) as alice:
        assert alice.server["principal"].startswith("curve:")
    monkeypatch.delenv(salus.client.ENV_SERVER_KEY)
    monkeypatch.delenv(salus.client.ENV_SECRET_KEY)

    assert refused(remote)  # plain tcp to a CURVE endpoint
    assert refused(remote, server_key=server_pub, secret_key=mallory_key)  # not listed
    assert refused(remote, server_key=server_pub)  # a throw-away key
    # The wrong server key: the handshake fails on the client's side.
    assert refused(remote, server_key=alice_pub, secret_key=alice_key)
    # The loopback tcp and ipc endpoints beside it are unaffected.
    with salus.connect(d.endpoint) as plain:
        assert plain.server["role"] == "user"

    with salus.connect(remote, server_key=server_pub, secret_key=root_key) as root:
        assert root.server["role"] == "admin"
        root.drain()
    assert d.proc.wait(60) == 0


def test_curve_client_keys_listed_in_the_config(daemon_factory, tmp_path: Path,  # noqa: ANN001
                                               no_curve_env: None) -> None:
    server_key, server_pub = keygen(tmp_path, "server")
    bob_key, bob_pub = keygen(tmp_path, "bob")
    mallory_key, _ = keygen(tmp_path, "mallory")
    remote = f"tcp://127.0.0.1:{free_port()}"
    daemon_factory("--listen-remote", remote, config={"security": {"curve": {
        "secret_key_file": str(server_key),
        "client_keys": [salus.read_curve_key(bob_pub).decode()], "open": False}}})
    with salus.connect(remote, server_key=server_pub, secret_key=bob_key) as bob:
        assert bob.server["role"] == "user"
        synthetic(bob).run()
    assert refused(remote, server_key=server_pub, secret_key=mallory_key)


def test_curve_open_mode_admits_any_key(daemon_factory, tmp_path: Path,  # noqa: ANN001
                                        no_curve_env: None) -> None:
    server_key, server_pub = keygen(tmp_path, "server")
    remote = f"tcp://127.0.0.1:{free_port()}"
    daemon_factory("--listen-remote", remote, config={"security": {"curve": {
        "secret_key_file": str(server_key),
        "open": True}}})
    with salus.connect(remote, server_key=server_pub) as anyone:  # a throw-away key
        assert anyone.server["role"] == "user"
        assert anyone.server["principal"] == f"curve:{anyone.public_key}"
        synthetic(anyone).run()
    assert refused(remote)  # still CURVE: plain tcp gets nothing


def test_a_public_tcp_endpoint_without_keys_is_refused_at_startup() -> None:
    r = subprocess.run([str(SERVER), "--listen", f"tcp://0.0.0.0:{free_port()}",
                        "--memory", "64MiB"], capture_output=True, text=True, timeout=60)
    assert r.returncode != 0
    assert "curve" in r.stderr.lower(), r.stderr


# -- quotas -----------------------------------------------------------------------------------

QUOTAS = {"sessions": 2, "persistent_bytes": "8MiB", "requests_in_flight": 4,
          "shared_buffers": 1, "max_priority": 10}


def exhausted(fn, limit: str) -> None:  # noqa: ANN001
    with pytest.raises(salus.SalusError) as e:
        fn()
    assert e.value.code == "RESOURCE_EXHAUSTED", e.value
    assert limit in e.value.message, e.value.message


def test_quotas_refuse_the_excess_and_nothing_else(daemon_factory) -> None:  # noqa: ANN001
    d = daemon_factory(config={"quotas": QUOTAS})
    with salus.connect(d.endpoint) as bystander:
        theirs = synthetic(bystander)
        theirs.run()

        with salus.connect(d.endpoint) as c:  # sessions
            s1, s2 = synthetic(c), synthetic(c)
            exhausted(lambda: synthetic(c), "quota sessions=2")
            s1.run()
            s2.run()
            s1.close()
            synthetic(c).run()

        with salus.connect(d.endpoint) as c:  # priority
            exhausted(lambda: synthetic(c, priority=11), "quota max_priority=10")
            synthetic(c, priority=10).close()
            synthetic(c, priority=-50).close()  # lowering one's own share is always allowed

        with salus.connect(d.endpoint) as c:  # persistent bytes
            big = synthetic(c, p=6 * MiB)
            exhausted(lambda: synthetic(c, p=4 * MiB), "persistent_bytes")
            big.run()
            assert len(c.sessions()) == 1
            big.close()
            synthetic(c, p=4 * MiB).run()

        with salus.connect(d.endpoint) as c:  # requests in flight
            slow = synthetic(c, t=1.0)
            # Submitted at once, far faster than an iteration of 1 s: the first 4 are taken.
            pending = [slow.submit() for _ in range(10)]
            results: list[tuple[str, str]] = []
            for p in pending:
                try:
                    p.result(timeout=120)
                    results.append(("OK", ""))
                except salus.SalusError as e:
                    results.append((e.code, e.message))
            codes = [code for code, _ in results]
            assert codes[:4] == ["OK"] * 4, results
            assert set(codes) == {"OK", "RESOURCE_EXHAUSTED"}, results
            assert all("requests_in_flight" in m for code, m in results if code != "OK"), results
            slow.run(timeout=120)  # once they are done, it runs again
            assert len(c.sessions()) == 1

        with salus.connect(d.admin_endpoint, stage_from=None) as c:  # shared buffers (ipc)
            first = c.shared_buffer(4096)
            exhausted(lambda: c.shared_buffer(4096), "shared_buffers")
            first.close()
            c.shared_buffer(4096).close()

        theirs.run()  # the bystander noticed nothing
        assert [s["session_id"] for s in bystander.sessions()] == [theirs.id]
        theirs.close()


def test_clients_per_principal(daemon_factory) -> None:  # noqa: ANN001
    d = daemon_factory(lease=1.0, config={"quotas": {"clients_per_principal": 2}})
    first = salus.connect(d.endpoint)
    second = salus.connect(d.endpoint)
    exhausted(lambda: salus.connect(d.endpoint), "clients_per_principal")
    second.close()  # its lease lapses, then its place is free

    def admitted() -> bool:
        try:
            salus.connect(d.endpoint).close()
        except salus.SalusError as e:
            assert e.code == "RESOURCE_EXHAUSTED", e
            return False
        return True

    wait_for(admitted, "the closed client's lease to lapse")
    synthetic(first).run()
    first.close()
    # Another principal (the daemon's user over ipc) has its own count.
    with salus.connect(d.admin_endpoint) as admin:
        assert admin.server["role"] == "admin"


# -- a flood ------------------------------------------------------------------------------------


def test_a_flood_loses_no_reply_and_does_not_stop_training(daemon_factory) -> None:  # noqa: ANN001
    d = daemon_factory(config={"quotas": {"requests_in_flight": 4}})
    stop = threading.Event()
    tally: dict[str, int] = {}
    problems: list[str] = []

    def flood() -> None:
        raw = Raw(d.endpoint)
        rng = np.random.default_rng(7)
        try:
            raw.hello()
            made = raw.call(create_req(MiB, MiB, 0.002))
            assert made.status.code == 0, made.status.message
            sid = made.create_session.session_id
            sent: dict[int, str] = {}
            replies: dict[int, int] = {}
            garbage_sent = garbage_replies = 0
            window = 64  # requests outstanding at most, so the socket never blocks

            def take(timeout_ms: int) -> bool:
                nonlocal garbage_replies
                reply = raw.recv(timeout_ms)
                if reply is None:
                    return False
                if reply.request_id == 0:
                    garbage_replies += 1
                else:
                    replies[reply.request_id] = replies.get(reply.request_id, 0) + 1
                    key = f"{sent.get(reply.request_id, '?')}:{reply.status.code}"
                    tally[key] = tally.get(key, 0) + 1
                return True

            while not stop.is_set():
                outstanding = len(sent) - len(replies) + garbage_sent - garbage_replies
                if outstanding >= window:
                    take(REPLY_TIMEOUT_MS)
                    continue
                kind = ["list_sessions", "get_stats", "garbage", "run"][rng.integers(4)]
                if kind == "garbage":
                    # Tag 0 never parses: answered as an unreadable envelope, request id 0.
                    raw.sock.send_multipart([b"\x00" + rng.bytes(int(rng.integers(1, 512)))])
                    garbage_sent += 1
                else:
                    req = run_req(sid) if kind == "run" else simple_req(kind)
                    sent[raw.send(req)] = kind
                while raw.sock.poll(0):
                    take(0)
            while len(replies) < len(sent) or garbage_replies < garbage_sent:
                if not take(REPLY_TIMEOUT_MS):
                    problems.append(f"lost replies: {len(sent) - len(replies)} of {len(sent)}, "
                                    f"{garbage_sent - garbage_replies} of {garbage_sent} garbage")
                    return
            if take(500):
                problems.append("a reply too many")
            twice = [rid for rid, n in replies.items() if n != 1]
            strays = [rid for rid in replies if rid not in sent]
            if twice or strays or garbage_replies != garbage_sent:
                problems.append(f"replies not one per request: {twice[:5]} {strays[:5]}")
            tally["garbage"] = garbage_sent
        except BaseException as e:  # reported by the test
            problems.append(repr(e))
        finally:
            raw.close()

    flooder = threading.Thread(target=flood, daemon=True)
    flooder.start()
    try:
        with salus.connect(d.endpoint) as trainer:
            s = mlp_session(trainer)
            feeds = mlp_feeds()
            losses = [float(s.run(feeds=feeds, fetches=["loss"], timeout=120)["loss"])
                      for _ in range(30)]
            s.close()
    finally:
        stop.set()
        flooder.join(300)
    assert not flooder.is_alive(), "the flooder hung"
    assert not problems, problems
    assert losses[-1] < losses[0], losses
    # The flood reached every kind of reply: answers, refusals of the excess, and garbage.
    assert tally.get("list_sessions:0") and tally.get("get_stats:0") and tally.get("run:0"), tally
    assert tally.get(f"run:{RESOURCE_EXHAUSTED}"), tally
    assert tally.get("garbage"), tally
    assert d.proc.poll() is None
