"""Hostile tenants against a real daemon: requests crafted to crash it, hang it, make it
allocate what the request only declares, read another user's memory, learn what exists on its
host, fill its log, or lose replies. Each test starts its own daemon and checks that (a) the
attack is refused or harmless, with its status code, (b) the daemon lives on, (c) another
tenant keeps working, and (d) the daemon's memory stays bounded.

The attacker is, where it matters, another Unix user: the test runs as root and forks a child
that drops to `ATTACKER` (nobody) and talks to the daemon's ipc socket (`as_user`). Those tests
are skipped when not run as root. As in test_security.py, no test asserts a duration: waits
have limits only to turn a hang into a failure (the FIFO's 30 s is the one bound the daemon
promises), and memory is read from /proc/<pid>/status (VmRSS, VmHWM: the peak, VmSize).
"""

from __future__ import annotations

import os
import pickle
import re
import secrets
import select
import signal
import struct
import time
import traceback
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import zmq
from onnx import TensorProto, helper, numpy_helper
from salus_daemon import Daemon
from test_daemon import mlp_feeds, mlp_session

import salus
from salus._generated.salus.v1 import aten_graph_pb2 as ag
from salus._generated.salus.v1 import salus_pb2 as pb

KiB, MiB, GiB, TiB = 1 << 10, 1 << 20, 1 << 30, 1 << 40
OK, INVALID_ARGUMENT, DEADLINE_EXCEEDED, NOT_FOUND = 0, 3, 4, 5
PERMISSION_DENIED, RESOURCE_EXHAUSTED, FAILED_PRECONDITION, UNIMPLEMENTED = 7, 8, 9, 12
ATTACKER = 65534  # nobody
SHM = Path("/dev/shm")
REPLY_TIMEOUT_MS = 60_000


# -- the daemon's memory ---------------------------------------------------------------------------


def mem(pid: int) -> dict[str, int]:
    """VmRSS, VmHWM (peak RSS) and VmSize of a process, in bytes."""
    out = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in ("VmRSS", "VmHWM", "VmSize"):
            out[key] = int(value.split()[0]) * KiB
    return out


def assert_grew_less(before: dict[str, int], after: dict[str, int], key: str, limit: int,
                     what: str) -> None:
    grown = after[key] - before[key]
    assert grown < limit, (f"{what}: the daemon's {key} grew by {grown / MiB:.0f} MiB "
                           f"(limit {limit / MiB:.0f} MiB): {before} -> {after}")


def alive(pid: int) -> bool:
    """Whether the process runs (not gone, not a zombie); works in any process, any user."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] not in ("Z", "X")


# -- a client speaking the protocol by hand --------------------------------------------------------


class Raw:
    """A bare DEALER socket speaking the protocol by hand (test_security.Raw), on a context of
    the caller's choosing (a forked child must use its own). With `pid`, a wait for a reply
    fails at once, saying so, when the daemon dies. `sndhwm`/`rcvhwm`: ZeroMQ's high-water
    marks (0: unlimited)."""

    def __init__(self, endpoint: str, ctx: zmq.Context | None = None, pid: int | None = None,
                 sndhwm: int | None = None, rcvhwm: int | None = None,
                 daemon: Daemon | None = None) -> None:
        self.sock = (ctx or zmq.Context.instance()).socket(zmq.DEALER)
        self.sock.setsockopt(zmq.LINGER, 0)
        if sndhwm is not None:
            self.sock.setsockopt(zmq.SNDHWM, sndhwm)
        if rcvhwm is not None:
            self.sock.setsockopt(zmq.RCVHWM, rcvhwm)
        self.sock.connect(endpoint)
        self.daemon = daemon
        self.pid = daemon.proc.pid if daemon is not None else pid
        self.token = ""
        self.next_id = 1

    def send(self, req: pb.Request, token: str | None = None) -> int:
        req.request_id = self.next_id
        self.next_id += 1
        req.client_token = self.token if token is None else token
        self.sock.send(req.SerializeToString())
        return req.request_id

    def recv(self, timeout_ms: int = REPLY_TIMEOUT_MS) -> pb.Reply | None:
        """The next reply, or None after `timeout_ms`."""
        deadline = time.monotonic() + timeout_ms / 1000
        while True:
            left_ms = int((deadline - time.monotonic()) * 1000)
            if self.sock.poll(max(0, min(left_ms, 250))):
                reply = pb.Reply()
                reply.ParseFromString(self.sock.recv_multipart()[0])
                return reply
            if self.pid is not None and not alive(self.pid):
                raise AssertionError(f"the daemon (pid {self.pid}) died{self._death()}")
            if left_ms <= 0:
                return None

    def _death(self) -> str:
        """How the daemon died, where this process is its parent."""
        if self.daemon is None:
            return ""
        try:
            code = self.daemon.proc.wait(10)
        except Exception:
            return ""
        return f" with exit status {code}; its last words: {last_words(self.daemon)}"

    def call(self, req: pb.Request, token: str | None = None,
             timeout_ms: int = REPLY_TIMEOUT_MS) -> pb.Reply:
        kind = req.WhichOneof("body")
        rid = self.send(req, token)
        reply = self.recv(timeout_ms)
        assert reply is not None, f"no reply to {kind} within {timeout_ms / 1000:.0f} s"
        assert reply.request_id == rid, (reply.request_id, rid)
        return reply

    def hello(self, name: str = "raw") -> pb.HelloReply:
        req = pb.Request()
        req.hello.protocol_version = 1
        req.hello.client_name = name
        reply = self.call(req)
        assert reply.status.code == OK, reply.status.message
        self.token = reply.hello.client_token
        return reply.hello

    def close(self) -> None:
        self.sock.close(0)


def status(reply: pb.Reply) -> tuple[int, str]:
    return reply.status.code, reply.status.message


def simple_req(kind: str) -> pb.Request:
    r = pb.Request()
    getattr(r, kind).SetInParent()
    return r


def register_req(shm_name: str, nbytes: int) -> pb.Request:
    r = pb.Request()
    r.register_buffer.shm_name = shm_name
    r.register_buffer.bytes = nbytes
    return r


def synthetic_req(p: int = MiB, e: int = MiB, name: str = "") -> pb.Request:
    r = pb.Request()
    r.create_session.synthetic.persistent_bytes = p
    r.create_session.synthetic.ephemeral_bytes = e
    r.create_session.name = name
    return r


def model_req(**model: Any) -> pb.Request:
    """A CreateSession of a model; `model` sets ModelSpec fields (lists are extended)."""
    r = pb.Request()
    spec = r.create_session.model
    for key, value in model.items():
        if isinstance(value, list):
            getattr(spec, key).extend(value)
        else:
            setattr(spec, key, value)
    r.create_session.admission_timeout_seconds = 30
    return r


def onnx_req(model: bytes, inputs: dict[str, tuple[int, ...]]) -> pb.Request:
    r = model_req(onnx=model, mode=pb.INFER)
    for name, dims in inputs.items():
        r.create_session.model.inputs.add(name=name, dims=dims)
    return r


# -- the attacker: another Unix user ---------------------------------------------------------------


class AsUser:
    """`fn(ctx, *args)` running in a forked child as Unix user `uid` (groups dropped), with a
    ZeroMQ context of its own; `result` returns what it returned (it must pickle), or raises
    with the child's traceback. The child never returns into pytest: it leaves by os._exit,
    so nothing of the parent's (finalizers, sockets, the daemon's folder) is touched. Whatever
    the child needs must be imported before the fork: files under /root may be unreadable to
    `uid`."""

    def __init__(self, uid: int, fn: Callable[..., Any], *args: Any) -> None:
        r, w = os.pipe()
        self.uid, self.what = uid, getattr(fn, "__name__", repr(fn))
        self.pid = os.fork()
        if self.pid == 0:  # the child
            try:
                os.close(r)
                try:
                    os.setgroups([])
                    os.setresgid(uid, uid, uid)
                    os.setresuid(uid, uid, uid)
                    assert os.getresuid() == (uid, uid, uid), os.getresuid()
                    ctx = zmq.Context()
                    try:
                        out: tuple[str, Any] = ("ok", fn(ctx, *args))
                    finally:
                        ctx.destroy(linger=0)
                    data = pickle.dumps(out)
                except BaseException:
                    data = pickle.dumps(("error", traceback.format_exc()))
                with os.fdopen(w, "wb") as f:
                    f.write(data)
            finally:
                os._exit(0)
        os.close(w)
        self._fd = r

    def result(self, timeout: float = 120.0) -> Any:
        data = bytearray()
        deadline = time.monotonic() + timeout
        try:
            while True:
                left = deadline - time.monotonic()
                if left <= 0:
                    os.kill(self.pid, signal.SIGKILL)
                    raise AssertionError(f"{self.what} as uid {self.uid} did not finish "
                                         f"within {timeout:.0f} s")
                if select.select([self._fd], [], [], min(left, 1.0))[0]:
                    chunk = os.read(self._fd, 1 << 16)
                    if not chunk:
                        break
                    data += chunk
        finally:
            os.close(self._fd)
            os.waitpid(self.pid, 0)
        if not data:
            raise AssertionError(f"{self.what} as uid {self.uid} died without an answer")
        kind, value = pickle.loads(bytes(data))
        if kind == "error":
            raise AssertionError(f"{self.what} as uid {self.uid} failed:\n{value}")
        return value


def as_user(uid: int, fn: Callable[..., Any], *args: Any, timeout: float = 120.0) -> Any:
    return AsUser(uid, fn, *args).result(timeout)


@pytest.fixture
def attacker() -> int:
    if os.geteuid() != 0:
        pytest.skip("needs root, to act as another Unix user")
    return ATTACKER


def attacker_client(ctx: zmq.Context, endpoint: str, pid: int) -> Raw:
    """In the attacker's child: a client over the ipc socket, identified as the attacker."""
    raw = Raw(endpoint, ctx, pid)
    hello = raw.hello("attacker")
    assert hello.principal == f"uid:{os.getuid()}", hello.principal
    assert hello.role == pb.ROLE_USER
    return raw


def shm_path(name: str) -> Path:
    return SHM / name.lstrip("/")


def unlink(*names: str) -> None:
    for name in names:
        shm_path(name).unlink(missing_ok=True)


def unblock_fifo(name: str) -> None:
    """Releases a daemon blocked opening the FIFO for reading (a writer appears), then
    removes it."""
    try:
        fd = os.open(shm_path(name), os.O_WRONLY | os.O_NONBLOCK)
        os.close(fd)
    except OSError:
        pass  # no reader: nobody blocked
    unlink(name)


# -- the victim ------------------------------------------------------------------------------------


class Victim:
    """A tenant training the MLP over loopback tcp, one iteration per `step`."""

    def __init__(self, endpoint: str) -> None:
        self.client = salus.connect(endpoint, timeout=120)
        self.session = mlp_session(self.client)
        self.steps = 0
        self.losses = [self.step()]

    def step(self) -> float:
        self.steps += 1
        feeds = mlp_feeds(seed=self.steps % 4)
        return float(self.session.run(feeds=feeds, fetches=["loss"], timeout=120)["loss"])

    def trains(self) -> None:
        self.losses += [self.step() for _ in range(3)]
        assert np.isfinite(self.losses).all(), self.losses

    def close(self) -> None:
        self.client.close()


@pytest.fixture
def victim_of() -> Iterator[Callable[[Daemon], Victim]]:
    made: list[Victim] = []

    def make(d: Daemon) -> Victim:
        made.append(Victim(d.endpoint))
        return made[-1]

    yield make
    for v in made:
        v.close()


def bystander_answered(d: Daemon) -> None:
    """Another tenant's Hello, a small session's iteration and a Heartbeat are answered."""
    with salus.connect(d.endpoint, timeout=60) as c:
        s = c.create_session(synthetic={"persistent_bytes": MiB, "ephemeral_bytes": MiB,
                                        "iteration_seconds": 0.0})
        s.run(timeout=60)
        c._call(simple_req("heartbeat"))
        s.close()


def last_words(d: Daemon) -> str:
    time.sleep(0.2)  # lines still in the pipe
    return " | ".join(line.strip()[:300] for line in d.log[-3:])


def still_serving(d: Daemon) -> None:
    assert d.proc.poll() is None, \
        f"the daemon exited with {d.proc.returncode}: {last_words(d)}"
    bystander_answered(d)


def settled_log_bytes(d: Daemon, quiet_s: float = 1.0, limit_s: float = 60.0) -> int:
    """The bytes of the daemon's stderr so far, once nothing was added for `quiet_s` (lines the
    daemon wrote are still on their way through the pipe for a while)."""
    deadline = time.monotonic() + limit_s
    size, since = -1, time.monotonic()
    while time.monotonic() < deadline:
        now = sum(len(line) for line in list(d.log))
        if now != size:
            size, since = now, time.monotonic()
        elif time.monotonic() - since >= quiet_s:
            break
        time.sleep(0.05)
    return size


# -- models an attacker sends ----------------------------------------------------------------------


def aten_constant(shape: list[int], data: bytes = b"") -> bytes:
    """An ATen graph of one float32 constant of `shape` carrying `data`, fetched as is."""
    g = ag.AtenGraph(producer="hostile")
    g.values.add(name="c", dtype=ag.ATEN_FLOAT32, shape=shape, data=data, constant=True)
    g.outputs.append(0)
    return g.SerializeToString()


def aten_full(shape: list[int], value: float = 1.0) -> bytes:
    """An ATen graph whose one node fills a float32 tensor of `shape` with `value`."""
    g = ag.AtenGraph(producer="hostile")
    g.values.add(name="y", dtype=ag.ATEN_FLOAT32, shape=shape)
    node = g.nodes.add(op="aten.full.default", outputs=[0])
    node.args.add(name="size").ints.v.extend(shape)
    node.args.add(name="fill_value", float_value=value)
    node.args.add(name="dtype", string_value="float32")
    node.args.add(name="layout", none=True)
    node.args.add(name="device", string_value="cpu")
    node.args.add(name="pin_memory", none=True)
    g.outputs.append(0)
    return g.SerializeToString()


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        byte, n = n & 0x7F, n >> 7
        out.append(byte | (0x80 if n else 0))
        if not n:
            return bytes(out)


def _len_field(number: int, payload: bytes) -> bytes:
    return _varint(number << 3 | 2) + _varint(len(payload)) + payload


def _int_field(number: int, value: int) -> bytes:
    return _varint(number << 3) + _varint(value)


def tf_const_graph(name: str, dims: list[int], value: float = 1.0) -> bytes:
    """A tensorflow.GraphDef (src/exec/tf_graph.proto, wire format by hand) of one Const node
    of dtype DT_FLOAT and shape `dims` holding a single float_val, which TensorFlow repeats to
    fill the shape."""
    dt_float = 1
    shape = b"".join(_len_field(2, _int_field(1, d)) for d in dims)  # TensorShapeProto.dim
    tensor = (_int_field(1, dt_float) + _len_field(2, shape)  # dtype, tensor_shape
              + _len_field(5, struct.pack("<f", value)))  # float_val, packed
    attrs = {"dtype": _int_field(6, dt_float), "value": _len_field(8, tensor)}  # AttrValue
    node = _len_field(1, name.encode()) + _len_field(2, b"Const")
    for key, attr in attrs.items():  # map<string, AttrValue> attr = 5
        node += _len_field(5, _len_field(1, key.encode()) + _len_field(2, attr))
    return _len_field(1, node)  # GraphDef.node


def tf_const_req(dims: list[int]) -> pb.Request:
    return model_req(tf_graph=tf_const_graph("c", dims), outputs=["c"])


_chains: dict[int, bytes] = {}


def relu_chain(n: int, width: int = 16) -> bytes:
    """An ONNX model: x [1, width] through `n` Relu nodes in a row to y."""
    if n not in _chains:
        names = ["x"] + [f"t{i}" for i in range(1, n)] + ["y"]
        nodes = [helper.make_node("Relu", [names[i]], [names[i + 1]], name=f"relu_{i}")
                 for i in range(n)]
        x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, width])
        y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, width])
        model = helper.make_model(helper.make_graph(nodes, "chain", [x], [y]),
                                  opset_imports=[helper.make_opsetid("", 17)])
        model.ir_version = 8
        _chains[n] = model.SerializeToString()
    return _chains[n]


def external_data_model(location: str | None) -> bytes:
    """An ONNX model y = x + w whose initializer w lies in the file `location` (external data),
    or in the model itself for None."""
    w = numpy_helper.from_array(np.ones(4, np.float32), "w")
    if location is not None:
        w.ClearField("raw_data")
        w.data_location = TensorProto.EXTERNAL
        for key, value in (("location", location), ("offset", "0"), ("length", "16")):
            w.external_data.add(key=key, value=value)
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])
    graph = helper.make_graph([helper.make_node("Add", ["x", "w"], ["y"], name="add")],
                              "external", [x], [y], [w])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model.SerializeToString()


# -- 1: a constant that declares more than it carries ----------------------------------------------


def test_a_constant_without_its_data_is_refused_before_allocating(daemon_factory,  # noqa: ANN001
                                                                  victim_of) -> None:
    d = daemon_factory(memory="1GiB")
    victim = victim_of(d)
    raw = Raw(d.endpoint, daemon=d)
    try:
        raw.hello()
        # The graph is well formed: with its data it is a session.
        ok = raw.call(model_req(aten_graph=aten_constant([4], np.ones(4, np.float32).tobytes())))
        assert ok.status.code == OK, ok.status.message
        before = mem(d.proc.pid)
        # 2**40 float32 (4 TiB) declared in a request of about a hundred bytes.
        req = model_req(aten_graph=aten_constant([2**40]))
        assert len(req.SerializeToString()) + len(raw.token) < 160
        code, msg = status(raw.call(req))
        assert code == INVALID_ARGUMENT, (code, msg)
        assert d.proc.poll() is None
        victim.trains()
        # 2**28 float32 (1 GiB, the whole arena), no data: the size is checked before the
        # constant is allocated, so the daemon's peak memory does not see it.
        code, msg = status(raw.call(model_req(aten_graph=aten_constant([2**28]))))
        assert code == INVALID_ARGUMENT, (code, msg)
        after = mem(d.proc.pid)
        victim.trains()
    finally:
        raw.close()
    still_serving(d)
    assert_grew_less(before, after, "VmHWM", 256 * MiB, "constants declared without data")


# -- 2: a FIFO as a shared buffer ------------------------------------------------------------------


def _register_a_fifo(ctx: zmq.Context, endpoint: str, pid: int, name: str,
                     sent_fd: int) -> tuple[int, str] | None:
    os.mkfifo(shm_path(name), 0o600)
    raw = attacker_client(ctx, endpoint, pid)
    raw.send(register_req(name, 4096))
    os.write(sent_fd, b"s")
    os.close(sent_fd)
    reply = raw.recv(30_000)
    return None if reply is None else status(reply)


def test_a_fifo_is_refused_promptly_and_hangs_nothing(daemon_factory, attacker: int) -> None:  # noqa: ANN001
    d = daemon_factory(world_access=True)
    bystander = Raw(d.endpoint, daemon=d)
    bystander.hello("bystander")
    name = f"/salus-fifo-{secrets.token_hex(8)}"
    sent_r, sent_w = os.pipe()
    before = mem(d.proc.pid)
    try:
        child = AsUser(attacker, _register_a_fifo, d.admin_endpoint, d.proc.pid, name, sent_w)
        os.close(sent_w)
        beat = None
        if select.select([sent_r], [], [], 60)[0] and os.read(sent_r, 1):
            time.sleep(0.5)  # the daemon takes the registration first (order, not timing)
            bystander.send(simple_req("heartbeat"))
            beat = bystander.recv(30_000)
        got = child.result(120)
        assert got is not None, \
            "RegisterBuffer of a FIFO got no reply within 30 s: the daemon blocks opening it"
        assert got[0] == INVALID_ARGUMENT and "regular file" in got[1], got
        assert beat is not None, "another client's Heartbeat got no reply within 30 s"
        assert beat.status.code == OK, beat.status
        still_serving(d)
        assert_grew_less(before, mem(d.proc.pid), "VmRSS", 64 * MiB, "a FIFO")
        assert d.stop() == 0
    finally:
        os.close(sent_r)
        bystander.close()
        unblock_fifo(name)


# -- 3: another user's memory ----------------------------------------------------------------------


SECRET = (b"root's secret, never to be read by nobody. " * 100)[:4096]


def _register_others_memory(ctx: zmq.Context, endpoint: str, pid: int, secret: str, link: str,
                            own: str) -> dict[str, tuple[int, str]]:
    fd = os.open(shm_path(own), os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o600)
    os.ftruncate(fd, len(SECRET))
    os.close(fd)
    os.symlink(shm_path(secret), shm_path(link))
    raw = attacker_client(ctx, endpoint, pid)
    return {what: status(raw.call(register_req(name, len(SECRET))))
            for what, name in (("own", own), ("secret", secret), ("link", link))}


def test_a_buffer_must_be_the_callers_own_and_over_ipc(daemon_factory, attacker: int) -> None:  # noqa: ANN001
    d = daemon_factory(world_access=True)
    tag = secrets.token_hex(8)
    secret, link, own = (f"/salus-{kind}-{tag}" for kind in ("secret", "link", "own"))
    try:
        fd = os.open(shm_path(secret), os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600)
        os.fchmod(fd, 0o600)
        os.write(fd, SECRET)
        os.close(fd)
        before = mem(d.proc.pid)
        got = as_user(attacker, _register_others_memory, d.admin_endpoint, d.proc.pid,
                      secret, link, own)
        assert got["own"][0] == OK, f"the attacker's own object: {got['own']}"
        code, msg = got["secret"]
        assert code == PERMISSION_DENIED and "owned by" in msg, got["secret"]
        assert got["link"][0] != OK, f"a symlink to root's object was registered: {got['link']}"

        # Loopback tcp names no Unix user: no shared buffer at all, whoever owns the object.
        raw = Raw(d.endpoint, daemon=d)
        try:
            raw.hello()
            for name in (secret, own):
                code, msg = status(raw.call(register_req(name, len(SECRET))))
                assert code == FAILED_PRECONDITION and "ipc" in msg, (name, code, msg)
        finally:
            raw.close()
        still_serving(d)
        assert_grew_less(before, mem(d.proc.pid), "VmRSS", 64 * MiB, "registrations")
    finally:
        unlink(secret, link, own)


# -- 4: a buffer of 100 TiB ------------------------------------------------------------------------


def _register_sparse(ctx: zmq.Context, endpoint: str, pid: int, name: str,
                     sizes: list[int]) -> list[tuple[int, str]]:
    fd = os.open(shm_path(name), os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o600)
    try:
        os.ftruncate(fd, max(sizes))  # sparse: costs nothing
    finally:
        os.close(fd)
    raw = attacker_client(ctx, endpoint, pid)
    return [status(raw.call(register_req(name, nbytes))) for nbytes in sizes]


def test_a_huge_sparse_buffer_is_refused(daemon_factory, attacker: int) -> None:  # noqa: ANN001
    d = daemon_factory(world_access=True)
    name = f"/salus-sparse-{secrets.token_hex(8)}"
    try:
        before = mem(d.proc.pid)
        # 100 TiB twenty times; then 1 TiB, which a kernel maps where it has no room for 100.
        sizes = [100 * TiB] * 20 + [TiB] * 3
        got = as_user(attacker, _register_sparse, d.admin_endpoint, d.proc.pid, name, sizes)
        after = mem(d.proc.pid)
    finally:
        unlink(name)
    assert len(got) == len(sizes)
    for code, msg in got:
        assert code == RESOURCE_EXHAUSTED and "limits.max_shared_buffer_bytes" in msg, got
    still_serving(d)
    assert_grew_less(before, after, "VmSize", 4 * GiB, "100 TiB buffers")
    assert_grew_less(before, after, "VmRSS", 64 * MiB, "100 TiB buffers")


# -- 5: constants that a few bytes describe --------------------------------------------------------


def test_filled_constants_are_bounded_by_max_constant_bytes(daemon_factory,  # noqa: ANN001
                                                            victim_of) -> None:
    d = daemon_factory(config={"limits": {"max_constant_bytes": "64MiB"}})
    victim = victim_of(d)
    raw = Raw(d.endpoint, daemon=d)
    try:
        raw.hello()
        # Both graphs are well formed: small, they are sessions.
        for req in (tf_const_req([4]), model_req(aten_graph=aten_full([4]))):
            reply = raw.call(req)
            assert reply.status.code == OK, reply.status.message
        before = mem(d.proc.pid)
        results = []
        for _ in range(3):  # 256 MiB each, from a few dozen bytes
            results.append(("tf Const", status(raw.call(tf_const_req([2**26])))))
            results.append(("aten.full", status(raw.call(model_req(aten_graph=aten_full(
                [2**26]))))))
        after = mem(d.proc.pid)
        victim.trains()
    finally:
        raw.close()
    for what, (code, msg) in results:
        assert code == RESOURCE_EXHAUSTED and "max_constant_bytes" in msg, (what, code, msg)
    still_serving(d)
    assert_grew_less(before, after, "VmHWM", 200 * MiB, "filled constants")


# -- 6: a flood that never waits -------------------------------------------------------------------


def test_a_tokenless_flood_is_refused_and_answered_once_each(daemon_factory) -> None:  # noqa: ANN001
    d = daemon_factory()
    n = 50_000
    # Unlimited high-water marks on the flooder: it never blocks sending and takes every reply
    # in (the daemon's own marks are test 11's business).
    flood = Raw(d.endpoint, daemon=d, sndhwm=0, rcvhwm=0)
    other = Raw(d.endpoint, daemon=d)
    try:
        before = mem(d.proc.pid)
        req = simple_req("get_stats")
        sent = [flood.send(req, token="") for _ in range(n)]
        # The same principal (tcp:127.0.0.1) says Hello from another socket.
        hello = simple_req("hello")
        hello.hello.protocol_version, hello.hello.client_name = 1, "after the flood"
        other.send(hello)
        greeted = other.recv(60_000)
        replies: dict[int, int] = {}
        codes: dict[int, int] = {}
        refused, unnamed = 0, ""  # refusals naming the limit; one that does not
        overall = time.monotonic() + 300
        while sum(replies.values()) < n and time.monotonic() < overall:
            reply = flood.recv(30_000)  # the limit: 30 s without any reply
            if reply is None:
                break
            replies[reply.request_id] = replies.get(reply.request_id, 0) + 1
            codes[reply.status.code] = codes.get(reply.status.code, 0) + 1
            if reply.status.code == RESOURCE_EXHAUSTED:
                if "limits.paced_requests" in reply.status.message:
                    refused += 1
                else:
                    unnamed = reply.status.message
        extra = flood.recv(500)
        after = mem(d.proc.pid)
        # Once the flood is answered, the principal is served as before.
        hello.hello.client_name = "once the flood is answered"
        other.send(hello)
        greeted_after = other.recv(60_000)
    finally:
        flood.close()
        other.close()
    # Answered in bounded time: admitted, or refused by the same limit as the flood.
    assert greeted is not None, "the principal's Hello got no reply within 60 s of the flood"
    assert greeted.status.code == OK or (
        greeted.status.code == RESOURCE_EXHAUSTED
        and "limits.paced_requests" in greeted.status.message), status(greeted)
    assert greeted_after is not None, "no reply to a Hello once the flood was answered"
    assert greeted_after.status.code == OK, status(greeted_after)
    missing = n - len(replies)
    twice = [rid for rid, k in replies.items() if k != 1]
    strays = set(replies) - set(sent)
    assert not missing and not twice and not strays and extra is None, \
        f"{missing} unanswered, {len(twice)} answered twice, {len(strays)} strays, codes {codes}"
    assert not unnamed, f"a refusal that does not name limits.paced_requests: {unnamed}"
    assert refused >= 1000, f"only {refused} of {n} refused: codes {codes}"
    still_serving(d)
    assert_grew_less(before, after, "VmHWM", 300 * MiB, "a flood")


# -- 7: compilation --------------------------------------------------------------------------------


def test_a_model_over_max_nodes_is_refused(daemon_factory) -> None:  # noqa: ANN001
    d = daemon_factory(config={"limits": {"max_nodes": 1000}})
    raw = Raw(d.endpoint, daemon=d)
    try:
        raw.hello()
        ok = raw.call(onnx_req(relu_chain(500), {"x": (1, 16)}))
        assert ok.status.code == OK, ok.status.message
        before = mem(d.proc.pid)
        code, msg = status(raw.call(onnx_req(relu_chain(5000), {"x": (1, 16)})))
        after = mem(d.proc.pid)
    finally:
        raw.close()
    assert code == RESOURCE_EXHAUSTED and "limits.max_nodes" in msg, (code, msg)
    still_serving(d)
    assert_grew_less(before, after, "VmHWM", 256 * MiB, "a long chain")


# Relu nodes in a row: compiling them takes far longer than a small model (compile time is
# linear in the nodes; about 0.7 s here, where an MLP takes a few hundredths of a second).
SLOW_CHAIN = 100_000
# Shorter chains for queueing several at once: a session holds its graph (a few KiB a node).
QUEUED_CHAIN = 30_000


def test_a_compilation_past_compile_seconds_is_cut_off(daemon_factory) -> None:  # noqa: ANN001
    d = daemon_factory(config={"limits": {"compile_seconds": 0.02}})
    raw = Raw(d.endpoint, daemon=d)
    try:
        raw.hello()
        before = mem(d.proc.pid)
        code, msg = status(raw.call(onnx_req(relu_chain(SLOW_CHAIN), {"x": (1, 16)}),
                                    timeout_ms=300_000))
        after = mem(d.proc.pid)
    finally:
        raw.close()
    assert code == DEADLINE_EXCEEDED and "limits.compile_seconds" in msg, (code, msg)
    still_serving(d)
    assert_grew_less(before, after, "VmRSS", 512 * MiB, "a cut-off compilation")


def test_compilations_are_served_by_principal_in_turn(daemon_factory) -> None:  # noqa: ANN001
    # One compile thread: a principal (this user over ipc) queues six slow models, another
    # (loopback tcp) one small model. Creations are served one per principal in turn, so
    # whenever the small one arrives, at most the slow compilation running then (and one whose
    # reply was still on its way when the small one was sent) ends before it: not all that
    # were queued. Counted against the slow replies already in when the small one was sent, so
    # the assertion holds however fast or loaded the machine is.
    d = daemon_factory(config={"limits": {"compile_threads": 1}})
    slow = Raw(d.admin_endpoint, daemon=d)
    queued = 6

    def take_slow_replies() -> int:
        taken = 0
        while slow.sock.poll(0):
            reply = slow.recv(1000)
            assert reply is not None and reply.request_id in slow_ids
            assert reply.status.code == OK, reply.status.message
            taken += 1
        return taken

    try:
        slow.hello()
        before = mem(d.proc.pid)
        slow_ids = [slow.send(onnx_req(relu_chain(QUEUED_CHAIN), {"x": (1, 16)}))
                    for _ in range(queued)]
        with salus.connect(d.endpoint, timeout=120) as other:
            done_before = take_slow_replies()
            s = mlp_session(other)
            done_meanwhile = take_slow_replies()
            s.run(feeds=mlp_feeds(), fetches=["loss"], timeout=60)
        assert done_meanwhile <= 2, (
            f"{done_meanwhile} of the slow principal's compilations ended between another "
            "principal's request and its reply: creations are not served in turn")
        for _ in range(queued - done_before - done_meanwhile):
            reply = slow.recv(300_000)
            assert reply is not None, "a slow compilation never ended"
            assert reply.status.code == OK, reply.status.message
    finally:
        slow.close()
    still_serving(d)
    assert_grew_less(before, mem(d.proc.pid), "VmHWM", 1024 * MiB, "seven compilations")


# -- 8: a stall longer than the lease --------------------------------------------------------------


def test_a_stalled_daemon_does_not_expire_its_clients(daemon_factory) -> None:  # noqa: ANN001
    d = daemon_factory(lease=2.0)
    with salus.connect(d.endpoint, timeout=120) as c:  # heartbeats every lease/3 by itself
        s = c.create_session(synthetic={"persistent_bytes": MiB, "ephemeral_bytes": MiB,
                                        "iteration_seconds": 0.0})
        s.run(timeout=60)
        before = mem(d.proc.pid)
        os.kill(d.proc.pid, signal.SIGSTOP)
        try:
            time.sleep(5)  # the daemon's clock runs on; the client's heartbeats wait
        finally:
            os.kill(d.proc.pid, signal.SIGCONT)
        s.run(timeout=60)  # UNAUTHENTICATED or NOT_FOUND if its lease was taken as lapsed
        assert [x["session_id"] for x in c.sessions()] == [s.id]
    assert not [line for line in d.log if "event: lease_expired" in line], d.log[-5:]
    still_serving(d)
    assert_grew_less(before, mem(d.proc.pid), "VmRSS", 64 * MiB, "a stall")


# -- 9: no oracle of which files exist -------------------------------------------------------------


def test_external_data_reveals_nothing_of_the_servers_files(daemon_factory) -> None:  # noqa: ANN001
    d = daemon_factory()
    locations = ["/etc/passwd", f"/nonexistent-{secrets.token_hex(8)}", "../../etc/passwd"]
    raw = Raw(d.endpoint, daemon=d)
    try:
        raw.hello()
        ok = raw.call(onnx_req(external_data_model(None), {"x": (1, 4)}))
        assert ok.status.code == OK, ok.status.message
        before = mem(d.proc.pid)
        got = {loc: status(raw.call(onnx_req(external_data_model(loc), {"x": (1, 4)})))
               for loc in locations}
    finally:
        raw.close()
    codes = {code for code, _ in got.values()}
    assert len(codes) == 1 and codes <= {INVALID_ARGUMENT, UNIMPLEMENTED}, got
    pattern = "|".join(re.escape(loc) for loc in sorted(locations, key=len, reverse=True))
    messages = {re.sub(pattern, "<path>", msg) for _, msg in got.values()}
    assert len(messages) == 1, got
    still_serving(d)
    assert_grew_less(before, mem(d.proc.pid), "VmRSS", 64 * MiB, "external data")


# -- 10: log amplification -------------------------------------------------------------------------


def test_a_huge_name_is_refused_and_not_logged(daemon_factory) -> None:  # noqa: ANN001
    d = daemon_factory()
    raw = Raw(d.endpoint, daemon=d)
    try:
        raw.hello()
        logged = settled_log_bytes(d)
        before = mem(d.proc.pid)
        code, msg = status(raw.call(synthetic_req(name="\0" * (16 * MiB))))
        after = mem(d.proc.pid)
    finally:
        raw.close()
    grown = settled_log_bytes(d) - logged
    assert code == INVALID_ARGUMENT and "limits.max_name_bytes" in msg, (code, msg[:200])
    assert grown < MiB, f"the daemon's log grew by {grown} bytes"
    still_serving(d)
    assert_grew_less(before, after, "VmRSS", 256 * MiB, "a 16 MiB name")


# -- 11: replies past the high-water mark ----------------------------------------------------------


def test_replies_past_the_high_water_mark_are_not_lost(daemon_factory) -> None:  # noqa: ANN001
    d = daemon_factory()
    n = 3000
    # It never blocks sending, and takes in one reply at most before the daemon must keep them.
    raw = Raw(d.endpoint, daemon=d, sndhwm=0, rcvhwm=1)
    try:
        raw.hello()
        before = mem(d.proc.pid)
        sent = [raw.send(simple_req("heartbeat")) for _ in range(n)]
        time.sleep(2)  # not reading: the replies pile up past both sides' high-water marks
        replies: dict[int, int] = {}
        codes: dict[int, int] = {}
        deadline = time.monotonic() + 60
        while sum(replies.values()) < n and time.monotonic() < deadline:
            reply = raw.recv(max(0, int((deadline - time.monotonic()) * 1000)))
            if reply is None:
                break
            replies[reply.request_id] = replies.get(reply.request_id, 0) + 1
            codes[reply.status.code] = codes.get(reply.status.code, 0) + 1
        extra = raw.recv(500)
    finally:
        raw.close()
    missing = n - len(replies)
    twice = [rid for rid, k in replies.items() if k != 1]
    assert not missing and not twice and set(replies) == set(sent) and extra is None, \
        f"{missing} of {n} unanswered, {len(twice)} answered twice, codes {codes}"
    still_serving(d)
    assert_grew_less(before, mem(d.proc.pid), "VmRSS", 128 * MiB, "replies held back")


# -- 12: everything at once, from another user -----------------------------------------------------


def _attack_all(ctx: zmq.Context, endpoint: str, pid: int,
                fifo: str) -> dict[str, tuple[int, str] | str]:
    """Attacks 1, 2, 5 and 10 in a row; what each got, up to the first unanswered one."""
    got: dict[str, tuple[int, str] | str] = {}
    raw = attacker_client(ctx, endpoint, pid)
    os.mkfifo(shm_path(fifo), 0o600)
    attacks = [
        ("constant 2**40", model_req(aten_graph=aten_constant([2**40])), 60_000),
        ("constant 2**28", model_req(aten_graph=aten_constant([2**28])), 60_000),
        ("fifo", register_req(fifo, 4096), 30_000),
        ("tf Const 2**26", tf_const_req([2**26]), 60_000),
        ("aten.full 2**26", model_req(aten_graph=aten_full([2**26])), 60_000),
        ("16 MiB name", synthetic_req(name="\0" * (16 * MiB)), 60_000),
    ]
    for what, req, timeout_ms in attacks:
        try:
            rid = raw.send(req)
            reply = raw.recv(timeout_ms)
        except AssertionError as e:  # the daemon died
            got[what] = str(e)
            break
        if reply is None or reply.request_id != rid:
            got[what] = f"no reply within {timeout_ms / 1000:.0f} s"
            break
        got[what] = (reply.status.code, reply.status.message[:300])
    return got


def test_a_victim_trains_through_every_attack(daemon_factory, victim_of,  # noqa: ANN001
                                              attacker: int) -> None:
    d = daemon_factory(world_access=True, config={"limits": {"max_constant_bytes": "64MiB"}})
    victim = victim_of(d)
    victim.trains()
    fifo = f"/salus-fifo-{secrets.token_hex(8)}"
    before = mem(d.proc.pid)
    try:
        got = as_user(attacker, _attack_all, d.admin_endpoint, d.proc.pid, fifo, timeout=600)
    finally:
        unblock_fifo(fifo)
    assert d.proc.poll() is None, \
        f"the daemon exited with {d.proc.returncode} ({last_words(d)}) after {got}"
    victim.trains()
    still_serving(d)
    assert_grew_less(before, mem(d.proc.pid), "VmHWM", 512 * MiB, f"the attacks {got}")
    assert len(got) == 6 and all(isinstance(g, tuple) and g[0] != OK for g in got.values()), got
