"""The client: one DEALER socket to a salus-server.

Requests go out in order on one connection; a session's iterations may be submitted ahead of
collecting them (`Session.submit`). Feeds travel as raw frames, or, from a `SharedBuffer`
(memory shared with a daemon on the same host), without passing through the socket at all.
Large feeds are copied into such a buffer the client owns (staged) when the daemon can map it:
one copy instead of the socket's several.

Hello makes this client on the daemon and returns its secret token, which every later request
carries: the token, not the connection, is who the client is. Over a remote tcp endpoint the
connection is CURVE-encrypted and authenticated: the client needs the server's public key and
a secret key of its own whose public half the daemon admits (docs/operations.md, Security).

A daemon that restarts with a snapshot keeps the client's sessions (docs/operations.md,
Restarts): an iteration it refused while draining is sent again once it is back, so the job
sees a pause, not an error, for up to `reconnect` seconds.

In a pod that a node's device plugin granted an allocation, Hello carries the allocation's
token ($SALUS_ALLOCATION_TOKEN): the client then acts as the allocation (principal
"alloc:<id>"), whose class, priority and memory budget its sessions get.
"""

from __future__ import annotations

import os
import re
import secrets
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import zmq
from zmq.utils import z85

from salus._generated.salus.v1 import salus_pb2 as pb

# The wire protocol's version (CMakeLists.txt's SALUS_PROTOCOL_VERSION; `salus-server
# --version` reports it, and tests/python/test_versions.py holds the two equal).
PROTOCOL_VERSION = 1
DEFAULT_TCP = "tcp://127.0.0.1:5501"
# Each names a Z85 key (40 characters) or a file holding one; see `Client`.
ENV_SERVER_KEY = "SALUS_CURVE_SERVER_KEY"
ENV_SECRET_KEY = "SALUS_CURVE_SECRET_KEY"
# An allocation's token, handed to a pod by the node's device plugin; see `Client`.
ENV_ALLOCATION_TOKEN = "SALUS_ALLOCATION_TOKEN"
# How long (seconds) a client waits for a restarting daemon; see `Client`.
ENV_RECONNECT = "SALUS_RECONNECT_SECONDS"
_Z85_KEY_CHARS = 40  # a 32-byte CURVE key in Z85
_STAGE_ALIGN = 64

_CODE_NAMES = [
    "OK", "CANCELLED", "UNKNOWN", "INVALID_ARGUMENT", "DEADLINE_EXCEEDED", "NOT_FOUND",
    "ALREADY_EXISTS", "PERMISSION_DENIED", "RESOURCE_EXHAUSTED", "FAILED_PRECONDITION",
    "ABORTED", "OUT_OF_RANGE", "UNIMPLEMENTED", "INTERNAL", "UNAVAILABLE", "DATA_LOSS",
    "UNAUTHENTICATED",
]

_DTYPES = {
    np.dtype(np.float32): pb.FLOAT32,
    np.dtype(np.int64): pb.INT64,
    np.dtype(np.int32): pb.INT32,
    np.dtype(np.float64): pb.FLOAT64,
    np.dtype(np.uint8): pb.UINT8,
    np.dtype(np.bool_): pb.BOOL,
}
_NP_DTYPES = {v: k for k, v in _DTYPES.items()}
_LATENCY_CLASSES = {"batch": pb.LATENCY_BATCH, "interactive": pb.LATENCY_INTERACTIVE}
_LATENCY_NAMES = {v: k for k, v in _LATENCY_CLASSES.items()}


class SalusError(Exception):
    """A request failed. `code` is the canonical code name, `message` the server's words."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(f"{code}: {message}")
        self.code = code
        self.message = message


class SessionRewound(SalusError):
    """The daemon restarted from a snapshot it wrote while it served (after a crash): the
    session is at iteration `iteration`, and the iterations this client sent after it are
    lost (nothing of the failed one ran). Send the lost batches again from that iteration, or
    go on from there: the next iteration is `iteration` (docs/operations.md, Restarts)."""

    def __init__(self, message: str, iteration: int) -> None:
        super().__init__("ABORTED", message)
        self.iteration = iteration


_REWOUND = re.compile(r"the session is at iteration (\d+): the iterations this client sent")


@dataclass
class IterationStats:
    iteration: int
    lane: int
    queue_delay_us: float
    run_us: float
    switch_gap_us: float
    # Replied when its fetches were ready, before the iteration ended (submit's
    # reply_when_fetched): run_us is the time up to the reply.
    early: bool = False


def default_endpoint() -> str:
    """The daemon a client talks to when not told (Note [Default endpoint] in
    src/common/endpoints.h, which every client follows): $SALUS_ENDPOINT; else the first ipc
    socket that exists of a daemon the user started ($XDG_RUNTIME_DIR/salus/salus.sock, then
    /tmp/salus-<uid>/salus.sock) and the system service's (/run/salus/salus.sock); else
    tcp://127.0.0.1:5501."""
    env = os.environ.get("SALUS_ENDPOINT", "")
    if env:
        return env
    dirs = []
    if os.environ.get("XDG_RUNTIME_DIR"):
        dirs.append(Path(os.environ["XDG_RUNTIME_DIR"]) / "salus")
    dirs += [Path(f"/tmp/salus-{os.getuid()}"), Path("/run/salus")]
    for d in dirs:
        try:
            if (d / "salus.sock").is_socket():
                return f"ipc://{d / 'salus.sock'}"
        except OSError:
            continue
    return DEFAULT_TCP


def read_curve_key(value: str | bytes | os.PathLike[str]) -> bytes:
    """A CURVE key in Z85: `value` itself when it is 40 characters (and no file of that name
    exists), else the key in the file `value` names. In a file, blank lines and lines that
    start with '#' are ignored, as `salusctl keygen` writes them."""
    if isinstance(value, bytes):
        value = value.decode("ascii")
    text = os.fspath(value).strip()
    if len(text) == _Z85_KEY_CHARS and not Path(text).is_file():
        key, source = text, "the key given"
    else:
        lines = Path(text).read_text().splitlines()
        key = "".join(ln.strip() for ln in lines if ln.strip() and not ln.strip().startswith("#"))
        source = f"key file {text}"
    try:
        if len(z85.decode(key.encode("ascii"))) != 32:
            raise ValueError
    except (ValueError, UnicodeEncodeError):
        raise ValueError(f"{source}: not a {_Z85_KEY_CHARS}-character Z85 CURVE key") from None
    return key.encode("ascii")


def _latency_class(name: str) -> int:
    if name not in _LATENCY_CLASSES:
        raise ValueError(f"latency_class must be 'batch' or 'interactive', got {name!r}")
    return _LATENCY_CLASSES[name]


def _raise_for(status: pb.Status) -> None:
    if status.code != 0:
        name = _CODE_NAMES[status.code] if 0 <= status.code < len(_CODE_NAMES) else "UNKNOWN"
        raise SalusError(name, status.message)


class _Stage:
    """A staging buffer and whether an iteration in flight reads it."""

    def __init__(self, buffer: SharedBuffer) -> None:
        self.buffer = buffer
        self.busy = True


class Client:
    """A connection to one salus-server. Thread-safe: requests are serialised on a lock.

    Feeds of `stage_from` bytes or more are staged: copied into shared memory this client owns
    and the daemon maps, one buffer per iteration in flight (at most `max_staging_buffers`;
    more in flight use frames). When the daemon cannot map one (another host, another user),
    every feed travels in frames from then on; `stage_from=None` never stages.

    CURVE (a daemon's remote tcp endpoint): `server_key` is the daemon's public key,
    `secret_key` this client's own (its public half is derived); each a Z85 string or the path
    of a key file. They default to $SALUS_CURVE_SERVER_KEY and $SALUS_CURVE_SECRET_KEY for tcp
    endpoints. With a server key and no secret key the client makes a key pair for this
    connection, which only a daemon in open mode admits. A daemon that does not admit the key
    never answers: Hello ends in DEADLINE_EXCEEDED after `timeout`.

    `allocation_token` (default $SALUS_ALLOCATION_TOKEN) makes this client act for the
    allocation it names: `allocation` is then its id ("" otherwise). An unknown or revoked
    token is refused with UNAUTHENTICATED.

    `reconnect` (default $SALUS_RECONNECT_SECONDS, else 300): how long an iteration the daemon
    refused because it drains waits for the daemon to come back (a restart that restores its
    snapshot) before it is sent again; past it, or when the daemon came back without this
    client's sessions, the iteration fails with a clear error. None or 0: fail at once."""

    def __init__(self, endpoint: str | None = None, timeout: float | None = 30.0,
                 name: str = "python", stage_from: int | None = 64 * 1024,
                 max_staging_buffers: int = 4,
                 server_key: str | bytes | os.PathLike[str] | None = None,
                 secret_key: str | bytes | os.PathLike[str] | None = None,
                 allocation_token: str | None = None,
                 reconnect: float | None = None) -> None:
        self.endpoint = endpoint or default_endpoint()
        if reconnect is None:
            reconnect = float(os.environ.get(ENV_RECONNECT, "300"))
        self._reconnect = reconnect if reconnect and reconnect > 0 else None
        self._stage_from = stage_from or 0
        self._max_stages = max_staging_buffers
        self._stages: list[_Stage] = []
        self._stage_lock = threading.Lock()
        self._staging_refused = False
        self._timeout_ms = None if timeout is None else int(timeout * 1000)
        self._ctx = zmq.Context.instance()
        self._sock = self._ctx.socket(zmq.DEALER)
        self._sock.setsockopt(zmq.LINGER, 0)
        self._set_curve(server_key, secret_key)
        self._sock.connect(self.endpoint)
        self._token = ""  # from Hello; every later request carries it
        self._lock = threading.Lock()
        self._stash: dict[int, tuple[pb.Reply, list[zmq.Frame]]] = {}
        self._outstanding: set[int] = set()
        self._buffers: list[SharedBuffer] = []
        self._next_id = 1
        self._closed = False
        if allocation_token is None:
            allocation_token = os.environ.get(ENV_ALLOCATION_TOKEN, "")
        try:
            self.server = self._hello(name, allocation_token)
        except BaseException:  # refused, or no answer (e.g. a CURVE key the daemon refuses)
            self._closed = True
            self._sock.close(0)
            raise
        self._stop = threading.Event()
        lease_s = max(self.server["lease_ms"] / 1000.0, 0.3)
        self._heartbeat = threading.Thread(
            target=self._beat, args=(lease_s / 3,), name="salus-heartbeat", daemon=True
        )
        self._heartbeat.start()

    # -- plumbing ------------------------------------------------------------------------
    def _set_curve(self, server_key: str | bytes | os.PathLike[str] | None,
                   secret_key: str | bytes | os.PathLike[str] | None) -> None:
        """Sets the socket's CURVE options (before connect); none without a server key."""
        self.public_key: str | None = None  # this client's CURVE key, as the daemon sees it
        if self.endpoint.startswith("tcp://"):
            server_key = server_key or os.environ.get(ENV_SERVER_KEY) or None
            secret_key = secret_key or os.environ.get(ENV_SECRET_KEY) or None
        if server_key is None:
            if secret_key is not None:
                raise ValueError("a CURVE secret_key needs the server's key (server_key)")
            return
        if secret_key is None:
            public, secret = zmq.curve_keypair()
        else:
            secret = read_curve_key(secret_key)
            public = zmq.curve_public(secret)
        self._sock.setsockopt(zmq.CURVE_SERVERKEY, read_curve_key(server_key))
        self._sock.setsockopt(zmq.CURVE_PUBLICKEY, public)
        self._sock.setsockopt(zmq.CURVE_SECRETKEY, secret)
        self.public_key = public.decode("ascii")

    def _send(self, req: pb.Request, frames: list[bytes | memoryview] | None = None) -> int:
        """Sends one request; its reply is collected with _await."""
        if self._closed:
            raise SalusError("FAILED_PRECONDITION", "the client is closed")
        with self._lock:
            req.request_id = self._next_id
            self._next_id += 1
            req.client_token = self._token
            self._sock.send_multipart([req.SerializeToString(), *(frames or [])], copy=False)
            self._outstanding.add(req.request_id)
            return req.request_id

    def _await(self, request_id: int, timeout_ms: int | None,
               keep_on_timeout: bool = False) -> tuple[pb.Reply, list[zmq.Frame]]:
        """Waits for the reply to `request_id`, keeping replies to other outstanding requests
        for their own _await; a reply to a request that timed out is dropped, unless
        `keep_on_timeout` (it may be awaited again)."""
        with self._lock:
            timed_out = False
            try:
                while request_id not in self._stash:
                    if timeout_ms is not None and not self._sock.poll(timeout_ms):
                        timed_out = keep_on_timeout
                        raise SalusError(
                            "DEADLINE_EXCEEDED",
                            f"no reply from {self.endpoint} within {timeout_ms} ms",
                        )
                    parts = self._sock.recv_multipart(copy=False)
                    reply = pb.Reply()
                    reply.ParseFromString(parts[0].bytes)
                    rid = reply.request_id
                    if rid == 0:  # the server could not read an envelope: the oldest request's
                        rid = min(self._outstanding, default=request_id)
                    if rid in self._outstanding:
                        self._stash[rid] = (reply, parts[1:])
            finally:
                if not timed_out:
                    self._outstanding.discard(request_id)
            reply, frames = self._stash.pop(request_id)
        _raise_for(reply.status)
        return reply, frames

    def _call(self, req: pb.Request, frames: list[bytes | memoryview] | None = None,
              timeout_ms: int | None | str = "default") -> tuple[pb.Reply, list[zmq.Frame]]:
        tmo = self._timeout_ms if timeout_ms == "default" else timeout_ms
        return self._await(self._send(req, frames), tmo)

    def _hello(self, name: str, allocation_token: str = "") -> dict[str, Any]:
        req = pb.Request()
        req.hello.protocol_version = PROTOCOL_VERSION
        req.hello.client_name = name
        req.hello.allocation_token = allocation_token
        h = self._call(req)[0].hello
        self._token = h.client_token
        self.server_instance = h.server_instance
        return {
            "protocol_version": h.protocol_version,
            "server_version": h.server_version,
            "device": h.device,
            "capacity_bytes": h.capacity_bytes,
            "policy": h.policy,
            "client_id": h.client_id,
            "lease_ms": h.lease_ms,
            "role": "admin" if h.role == pb.ROLE_ADMIN else "user",
            "principal": h.principal,
            "allocation": h.allocation,
        }

    def _beat(self, period: float) -> None:
        while not self._stop.wait(period):
            if not self._lock.acquire(blocking=False):
                continue  # a request is in flight: the server knows we are alive
            self._lock.release()
            try:
                self._heartbeat_now(self._timeout_ms)
            except (SalusError, zmq.ZMQError):
                pass

    def _heartbeat_now(self, timeout_ms: int) -> pb.HeartbeatReply | None:
        """One Heartbeat; None when no answer came within `timeout_ms` (the daemon is away)."""
        req = pb.Request()
        req.heartbeat.SetInParent()
        try:
            return self._call(req, timeout_ms=timeout_ms)[0].heartbeat
        except SalusError as e:
            if e.code == "DEADLINE_EXCEEDED":
                return None
            raise

    def _after_refusal(self, error: SalusError, submitted_to: int) -> None:
        """Called with an error an iteration sent to daemon instance `submitted_to` got.
        Returns when it should be sent again: the daemon restarted since (its shared buffers
        are gone), or was draining and is back. Raises `error` when neither holds, and a clear
        error when the daemon does not come back within `reconnect` seconds or came back
        without this client."""
        if self._reconnect is None or error.code not in ("UNAVAILABLE", "NOT_FOUND",
                                                         "UNAUTHENTICATED"):
            raise error
        deadline = time.monotonic() + self._reconnect
        delay = 0.05
        while True:
            if self.server_instance != submitted_to:
                return  # another iteration saw the restart already
            beat = self._heartbeat_now(1000)
            restarted = beat is not None and beat.server_instance != self.server_instance
            if restarted and not beat.client_known:
                raise SalusError(
                    "ABORTED",
                    f"the daemon at {self.endpoint} restarted without this client's sessions "
                    "(no snapshot restored them)") from error
            if restarted:
                self._restarted(beat.server_instance)
                return
            if beat is not None and not beat.draining:
                raise error  # the daemon is as it was: the error is the answer
            if time.monotonic() >= deadline:
                raise SalusError(
                    "UNAVAILABLE",
                    f"the daemon at {self.endpoint} drained and did not come back within "
                    f"{self._reconnect:g} s") from error
            time.sleep(delay)
            delay = min(delay * 2, 1.0)

    def _sync_instance(self) -> None:
        """Learns the daemon's instance now, as after a restart when it changed."""
        beat = self._heartbeat_now(1000)
        if beat is not None and beat.server_instance != self.server_instance:
            self._restarted(beat.server_instance)

    def _restarted(self, instance: int) -> None:
        """The daemon is a new instance that restored this client: the shared buffers it had
        mapped are gone, so feeds travel in frames or newly staged buffers from now on."""
        with self._stage_lock:
            stale = [st.buffer for st in self._stages] + list(self._buffers)
            self._stages = []
            self._buffers = []
        for b in stale:
            b._forget()
        self.server_instance = instance

    # -- API -----------------------------------------------------------------------------
    def create_session(
        self,
        model: str | bytes | os.PathLike[str] | None = None,
        mode: str = "train",
        inputs: dict[str, tuple[int, ...]] | None = None,
        loss: str = "",
        optimizer: dict[str, Any] | None = None,
        synthetic: dict[str, float] | None = None,
        iterations: int = 0,
        duration: float = 0.0,
        priority: int = 0,
        latency_class: str = "batch",
        name: str = "",
        admission_timeout: float = 0.0,
        seed: int = 0,
        tf_graph: bytes | os.PathLike[str] | None = None,
        outputs: list[str] | None = None,
        device: str = "",
        aten_graph: bytes | None = None,
        convolution_transforms: bool = False,
        job: str = "",
    ) -> Session:
        """A session of an ONNX `model` (bytes or a path), of a TensorFlow graph (`tf_graph`:
        a serialized GraphDef, bytes or a path, run as written: `inputs` gives every
        Placeholder's shape, `outputs` the tensors "node:k" it may fetch; mode, loss and
        optimizer are not used), of an ATen graph (`aten_graph`: a serialized
        salus.v1.AtenGraph as salus_torch traces it, which names its own inputs and outputs),
        or of a `synthetic` profile. `device` pins it to one of the
        daemon's devices by name ("cpu:1"); empty: the daemon places it.
        `convolution_transforms`: on a GPU, let convolutions take cuDNN's FFT and Winograd
        algorithms (faster for larger batches, a larger E; see ModelSpec in salus.proto).
        `job`: the job the session belongs to; this client's sessions of one job take turns
        and are admitted as one (under FIFO a job's new session never waits behind the job's
        own sessions). Empty: a job of its own."""
        if (model is None and tf_graph is None and aten_graph is None) == (synthetic is None):
            raise ValueError(
                "give exactly one of model= (or tf_graph= or aten_graph=) and synthetic=")
        req = pb.Request()
        cs = req.create_session
        if model is not None or tf_graph is not None or aten_graph is not None:
            # Both a model and a graph go to the daemon, which refuses them.
            if aten_graph is not None:
                cs.model.aten_graph = aten_graph
            if model is not None:
                cs.model.onnx = model if isinstance(model, bytes) else Path(model).read_bytes()
            if tf_graph is not None:
                cs.model.tf_graph = (tf_graph if isinstance(tf_graph, bytes)
                                     else Path(tf_graph).read_bytes())
            cs.model.outputs.extend(outputs or [])
            modes = {"train": pb.TRAIN, "infer": pb.INFER}
            if mode not in modes:
                raise ValueError(f"mode must be 'train' or 'infer', got {mode!r}")
            cs.model.mode = modes[mode]
            for n, dims in (inputs or {}).items():
                s = cs.model.inputs.add()
                s.name = n
                s.dims.extend(int(d) for d in dims)
            cs.model.loss = loss
            for k, v in (optimizer or {}).items():
                setattr(cs.model.optimizer, k, v)
            cs.model.seed = seed
            cs.model.convolution_transforms = convolution_transforms
        else:
            assert synthetic is not None
            cs.synthetic.persistent_bytes = int(synthetic.get("persistent_bytes", 0))
            cs.synthetic.ephemeral_bytes = int(synthetic.get("ephemeral_bytes", 0))
            cs.synthetic.iteration_seconds = float(synthetic.get("iteration_seconds", 0.0))
        cs.iterations = iterations
        cs.duration_seconds = duration
        cs.priority = priority
        cs.latency_class = _latency_class(latency_class)
        cs.name = name
        cs.admission_timeout_seconds = admission_timeout
        cs.device = device
        cs.job = job
        r = self._call(req)[0].create_session
        return Session(self, r)

    def sessions(self) -> list[dict[str, Any]]:
        """This client's sessions; an administrator's: every client's (see `client_id`)."""
        req = pb.Request()
        req.list_sessions.SetInParent()
        out = []
        for s in self._call(req)[0].list_sessions.sessions:
            out.append({
                "session_id": s.session_id, "client_id": s.client_id, "name": s.name,
                "kind": s.kind,
                "state": pb.SessionState.Name(s.state), "state_reason": s.state_reason,
                "page_outs": s.page_outs, "lane": s.lane, "device": s.device,
                "migrations": s.migrations,
                "priority": s.priority,
                "latency_class": "interactive" if s.latency_class == pb.LATENCY_INTERACTIVE
                else "batch",
                "persistent_bytes": s.persistent_bytes, "ephemeral_bytes": s.ephemeral_bytes,
                "iterations_done": s.iterations_done,
                "iterations_declared": s.iterations_declared,
                "avg_iteration_seconds": s.avg_iteration_seconds,
                "allocation": s.allocation, "job": s.job,
            })
        return out

    def others(self) -> dict[str, int]:
        """Other clients' sessions as totals: sessions, waiting (for memory), admitted (the
        rest are closing), persistent_bytes, ephemeral_bytes; all zero for an administrator,
        whose `sessions()` lists them."""
        req = pb.Request()
        req.list_sessions.SetInParent()
        o = self._call(req)[0].list_sessions.others
        return {"sessions": o.sessions, "waiting": o.waiting, "admitted": o.admitted,
                "persistent_bytes": o.persistent_bytes, "ephemeral_bytes": o.ephemeral_bytes}

    def stats(self) -> dict[str, Any]:
        import json

        req = pb.Request()
        req.get_stats.SetInParent()
        return json.loads(self._call(req)[0].get_stats.json)

    def memory_map(self) -> dict[str, Any]:
        import json

        req = pb.Request()
        req.get_memory_map.SetInParent()
        return json.loads(self._call(req)[0].get_memory_map.json)

    def shared_buffer(self, nbytes: int) -> SharedBuffer:
        """Memory shared with the daemon (same host, same user or one the daemon can read).

        Feeds that are views of it (`buf.array(shape, dtype, offset)`) reach the daemon
        without travelling through the socket. Raises SalusError (NOT_FOUND,
        PERMISSION_DENIED) when the daemon cannot open it, e.g. over tcp from another host."""
        buf = self._new_buffer(nbytes)
        self._buffers.append(buf)
        return buf

    @property
    def staging(self) -> bool:
        """Whether large feeds are staged in shared memory (until the daemon refuses one)."""
        return self._stage_from > 0 and not self._staging_refused

    @property
    def staging_buffers(self) -> int:
        """Staging buffers this client holds, busy or free."""
        with self._stage_lock:
            return len(self._stages)

    def _acquire_stage(self, nbytes: int) -> _Stage | None:
        """A free staging buffer of at least `nbytes`, marked busy; None: use frames."""
        if nbytes == 0 or not self.staging:
            return None
        with self._stage_lock:
            free = [st for st in self._stages if not st.busy]
            for st in free:
                if st.buffer.size >= nbytes:
                    st.busy = True
                    return st
            if free:  # too small: replaced by one that fits
                self._stages.remove(free[0])
                free[0].buffer.close()
            elif len(self._stages) >= self._max_stages:
                return None
            try:
                buf = self._new_buffer(1 << max(nbytes - 1, (1 << 20) - 1).bit_length())
            except SalusError:
                self._staging_refused = True
                return None
            st = _Stage(buf)
            self._stages.append(st)
            return st

    def _release_stage(self, st: _Stage | None) -> None:
        if st is not None:
            with self._stage_lock:
                st.busy = False

    def _new_buffer(self, nbytes: int) -> SharedBuffer:
        from multiprocessing import shared_memory

        if nbytes <= 0:
            raise ValueError("a shared buffer needs at least one byte")
        name = f"salus-{os.getpid()}-{secrets.token_hex(8)}"
        shm = shared_memory.SharedMemory(name=name, create=True, size=nbytes)
        try:
            req = pb.Request()
            req.register_buffer.shm_name = "/" + name
            req.register_buffer.bytes = nbytes
            buffer_id = self._call(req)[0].register_buffer.buffer_id
        except BaseException:
            shm.close()
            shm.unlink()
            raise
        shm.unlink()  # both sides hold it mapped; the name is no longer needed
        return SharedBuffer(self, buffer_id, shm, nbytes)

    def _slice_of(self, arr: np.ndarray) -> tuple[int, int] | None:
        """(buffer id, offset) when `arr`'s bytes lie inside one of this client's buffers."""
        if not self._buffers:
            return None
        start = arr.__array_interface__["data"][0]
        for b in self._buffers:
            if b._base <= start and start + arr.nbytes <= b._base + b.size:
                return b.id, start - b._base
        return None

    def close_session(self, session_id: int) -> None:
        """Closes a session by id: one of this client's, or as the administrator anyone's
        (NOT_FOUND for a session that is not open or not this client's)."""
        req = pb.Request()
        req.session_id = session_id
        req.close_session.SetInParent()
        self._call(req)

    @property
    def allocation(self) -> str:
        """The id of the allocation this client acts for, or "" when it presented no token."""
        return str(self.server["allocation"])

    # -- allocations (the administrator only; PERMISSION_DENIED otherwise) ----------------
    def grant_allocation(self, id: str, token: str, memory_bytes: int = 0,
                         latency_class: str = "batch", priority: int = 0,
                         max_priority: int = 0, pod: str = "") -> bool:
        """Grants allocation `id`: a client that presents `token` (32 characters or more) in
        Hello acts for it; its sessions get `latency_class`, `priority` when they ask for
        none, at most `max_priority` (0: the daemon's quota), and together at most
        `memory_bytes` of P+E (0: no budget). Granting an existing id updates it (`token` must
        be its own, or "" to keep it). Returns whether it was created. INVALID_ARGUMENT names
        a bad field."""
        req = pb.Request()
        a = req.grant_allocation.allocation
        a.id = id
        a.token = token
        a.memory_bytes = memory_bytes
        a.latency_class = _latency_class(latency_class)
        a.priority = priority
        a.max_priority = max_priority
        a.pod = pod
        return bool(self._call(req)[0].grant_allocation.created)

    def revoke_allocation(self, id: str) -> int:
        """Forgets allocation `id`: its clients are dropped and their sessions closed; returns
        how many sessions closed. NOT_FOUND for an unknown id."""
        req = pb.Request()
        req.revoke_allocation.id = id
        return int(self._call(req)[0].revoke_allocation.sessions_closed)

    def list_allocations(self) -> list[dict[str, Any]]:
        """Every allocation: id, memory_bytes, latency_class ("batch" or "interactive"),
        priority, max_priority, pod, used_bytes (P+E of its open sessions), sessions,
        clients. Never a token."""
        req = pb.Request()
        req.list_allocations.SetInParent()
        return [{"id": a.id, "memory_bytes": a.memory_bytes,
                 "latency_class": _LATENCY_NAMES.get(a.latency_class, "batch"),
                 "priority": a.priority, "max_priority": a.max_priority, "pod": a.pod,
                 "used_bytes": a.used_bytes, "sessions": a.sessions, "clients": a.clients}
                for a in self._call(req)[0].list_allocations.allocations]

    def move_session(self, session_id: int, device: str) -> tuple[str, str]:
        """Moves session `session_id`, between its iterations, to the daemon's device `device`
        ("cpu:1", "cuda:1"); needs the administrator role. Returns (from, to). The session runs
        there once its state is copied. NOT_FOUND for an unknown session, INVALID_ARGUMENT for
        an unknown device, FAILED_PRECONDITION while it runs or moves, or where the device has
        no room for it now."""
        req = pb.Request()
        req.session_id = session_id
        req.move_session.device = device
        reply = self._call(req)[0].move_session
        return getattr(reply, "from"), reply.to

    def drain(self, snapshot: str | os.PathLike[str] | None = None) -> None:
        """Asks the daemon to finish what it holds and exit; needs the administrator role
        (PERMISSION_DENIED otherwise). With `snapshot` (a directory on the daemon's host) it
        writes its sessions there first, for `salus-server --restore` (docs/operations.md,
        Restarts)."""
        req = pb.Request()
        req.drain.SetInParent()
        if snapshot is not None:
            req.drain.snapshot_dir = str(Path(snapshot).absolute())
        self._call(req)

    def close(self) -> None:
        if self._closed:
            return
        for b in list(self._buffers) + [st.buffer for st in self._stages]:
            b.close()
        self._stages = []
        self._stop.set()
        self._heartbeat.join(timeout=2)
        self._closed = True
        self._sock.close(0)

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class Session:
    """One session in the daemon. Iterations run one at a time, in call order."""

    def __init__(self, client: Client, reply: pb.CreateSessionReply) -> None:
        self._client = client
        self.id = reply.session_id
        self.state = pb.SessionState.Name(reply.state)
        self.persistent_bytes = reply.persistent_bytes
        self.ephemeral_bytes = reply.ephemeral_bytes
        self.lane = reply.lane
        self.device = reply.device  # empty while it waits for any device
        self.inputs = {t.name: (tuple(t.shape), _NP_DTYPES.get(t.dtype)) for t in reply.inputs}
        self.outputs = {t.name: (tuple(t.shape), _NP_DTYPES.get(t.dtype)) for t in reply.outputs}
        # The persistent values (parameters, optimizer state, variables) that read_state and
        # write_state (or run's feeds and fetches) can read and write: name -> (shape, dtype).
        self.state_specs = {t.name: (tuple(t.shape), _NP_DTYPES.get(t.dtype))
                            for t in reply.state_tensors}
        self.last_stats: IterationStats | None = None

    def run(
        self,
        feeds: dict[str, np.ndarray] | None = None,
        fetches: list[str] | None = None,
        timeout: float | None = None,
        reply_when_fetched: bool = False,
    ) -> dict[str, np.ndarray]:
        """Runs one iteration; waits for admission first if the session is waiting. With
        `reply_when_fetched`, returns once its fetches are computed (see `submit`)."""
        return self.submit(feeds, fetches, reply_when_fetched).result(timeout)

    def read_state(self, names: list[str] | tuple[str, ...] | str) -> dict[str, np.ndarray]:
        """Copies of the named state values (see `state_specs`), read after every iteration
        submitted before; runs no iteration and does not count as one."""
        if isinstance(names, str):
            names = [names]
        return self._submit(None, list(names), state_only=True).result()

    def write_state(self, values: dict[str, np.ndarray]) -> None:
        """Overwrites state values (see `state_specs`; dtype and shape must match) after every
        iteration submitted before and before any submitted later; runs no iteration and does
        not count as one."""
        self._submit(values, None, state_only=True).result()

    def submit(
        self,
        feeds: dict[str, np.ndarray] | None = None,
        fetches: list[str] | None = None,
        reply_when_fetched: bool = False,
    ) -> PendingIteration:
        """Queues one iteration and returns at once, so the next iteration's feeds travel while
        this one runs. Iterations run in submission order. The feed arrays must not change
        until `result()` returns (they are sent without a copy). A feed or fetch may also name
        a state value: it is written before the step, or read after it.

        `reply_when_fetched`: `result()` may return as soon as the fetches are computed (a
        training step's loss, after its forward pass), while the rest of the iteration runs;
        the session's later requests still follow the whole iteration, and an error in that
        rest is raised by the next one (RunIteration.reply_when_fetched)."""
        return self._submit(feeds, fetches, state_only=False,
                            reply_when_fetched=reply_when_fetched)

    def _submit(self, feeds: dict[str, np.ndarray] | None, fetches: list[str] | None,
                state_only: bool, reply_when_fetched: bool = False,
                instance: int | None = None) -> PendingIteration:
        """`instance`: the daemon instance it was first sent to, when it is sent again."""
        client = self._client
        if instance is None:
            instance = client.server_instance
        req = pb.Request()
        req.session_id = self.id
        body = req.run_iteration
        body.SetInParent()
        # Which daemon this client last heard from: a session the daemon rewound after a crash
        # tells a client that has not heard of it (Note [Rewound sessions] in the daemon).
        body.server_instance = instance
        arrays: list[tuple[str, np.ndarray, tuple[int, int] | None]] = []
        for name, value in (feeds or {}).items():
            # ascontiguousarray makes a 0-d array 1-d; a scalar state value stays 0-d.
            arr = np.ascontiguousarray(value).reshape(np.shape(value))
            if arr.dtype not in _DTYPES:
                raise ValueError(f"feed {name!r}: unsupported dtype {arr.dtype}")
            arrays.append((name, arr, client._slice_of(arr)))

        def staged(arr: np.ndarray, where: tuple[int, int] | None) -> bool:
            return where is None and client._stage_from > 0 and arr.nbytes >= client._stage_from

        def aligned(n: int) -> int:
            return -(-n // _STAGE_ALIGN) * _STAGE_ALIGN

        stage = client._acquire_stage(
            sum(aligned(a.nbytes) for _, a, w in arrays if staged(a, w)))
        offset = 0
        frames: list[memoryview] = []
        keep: list[np.ndarray] = []
        for name, arr, where in arrays:
            spec = body.feeds.add()
            spec.name = name
            spec.dtype = _DTYPES[arr.dtype]
            spec.shape.extend(arr.shape)
            if where is None and stage is not None and staged(arr, where):
                np.copyto(stage.buffer.array(arr.shape, arr.dtype, offset), arr)
                where = (stage.buffer.id, offset)
                offset += aligned(arr.nbytes)
            if where is not None:
                spec.buffer.buffer_id, spec.buffer.offset = where
                keep.append(arr)
            else:
                # (a tensor with no elements is an empty frame; memoryview cannot cast it)
                frames.append(memoryview(arr).cast("B") if arr.size else memoryview(b""))
        body.fetches.extend(fetches or [])
        body.state_only = state_only
        body.reply_when_fetched = reply_when_fetched
        try:
            request_id = client._send(req, frames)
        except BaseException:
            client._release_stage(stage)
            raise
        pending = PendingIteration(self, request_id, keep, stage, state_only)
        # What sends it again should the daemon refuse it while it restarts.
        pending._resend = (feeds, fetches, state_only, reply_when_fetched, instance)
        return pending

    def _finish(self, reply: pb.Reply, parts: list[zmq.Frame],
                update_stats: bool = True) -> dict[str, np.ndarray]:
        r = reply.run_iteration
        st = r.stats
        if update_stats:
            self.last_stats = IterationStats(st.iteration, st.lane, st.queue_delay_us,
                                             st.run_us, st.switch_gap_us, st.early)
        out = {}
        for spec, frame in zip(r.outputs, parts, strict=False):
            dtype = _NP_DTYPES[spec.dtype]
            arr = np.frombuffer(frame.buffer, dtype=dtype).reshape(tuple(spec.shape))
            out[spec.name] = arr.copy()
        return out

    def close(self) -> None:
        self._client.close_session(self.id)

    def __enter__(self) -> Session:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class PendingIteration:
    """An iteration handed to `Session.submit`; `result()` collects its outputs, once."""

    def __init__(self, session: Session, request_id: int, keep: list[np.ndarray],
                 stage: _Stage | None = None, state_only: bool = False) -> None:
        self._session = session
        self._state_only = state_only  # leaves the session's last_stats alone
        self._request_id = request_id
        self._keep = keep  # feeds read from shared buffers stay referenced until the reply
        self._stage = stage  # the staging buffer its large feeds were copied into
        self._done = False
        self._resend: tuple | None = None  # Session._submit's arguments and the daemon's instance

    def result(self, timeout: float | None = None) -> dict[str, np.ndarray]:
        if self._done:
            raise SalusError("FAILED_PRECONDITION", "this iteration's result was already taken")
        self._done = True
        tmo = None if timeout is None else int(timeout * 1000)
        client = self._session._client
        try:
            if tmo is None and self._resend is not None and client._reconnect is not None:
                reply, parts = self._await_watching()
            else:
                reply, parts = client._await(self._request_id, tmo)
        except SalusError as e:
            # A deadline passed with the iteration still queued or running: its staging
            # buffer stays busy. Any other answer means the daemon is done reading it.
            if e.code != "DEADLINE_EXCEEDED":
                client._release_stage(self._stage)
            at = _REWOUND.search(e.message) if e.code == "ABORTED" else None
            if at is not None:
                # The daemon restarted from a snapshot older than this session's last
                # iterations: from now on this client has heard of it, and the job is told.
                client._sync_instance()
                raise SessionRewound(e.message, int(at.group(1))) from None
            if self._resend is None or e.code == "DEADLINE_EXCEEDED":
                raise
            # Refused while the daemon drained, sent on to a restarted one that no longer has
            # its buffer, or lost with a daemon that restarted: nothing of it ran, so it is
            # sent again, with its number, once the daemon is back.
            feeds, fetches, state_only, early, instance = self._resend
            client._after_refusal(e, instance)
            again = self._session._submit(feeds, fetches, state_only, early, instance)
            self._keep = []
            again._done = False
            return again.result(timeout)
        client._release_stage(self._stage)
        self._keep = []
        return self._session._finish(reply, parts, update_stats=not self._state_only)


    def _await_watching(self) -> tuple[pb.Reply, list[zmq.Frame]]:
        """Waits for the reply as long as it takes while the daemon that has the iteration is
        there; raises UNAVAILABLE once another instance answers (the daemon restarted: the
        iteration went with it) or none answers for `reconnect` seconds."""
        client = self._session._client
        instance = self._resend[4]
        away_since: float | None = None
        while True:
            try:
                return client._await(self._request_id, 1000, keep_on_timeout=True)
            except SalusError as e:
                if e.code != "DEADLINE_EXCEEDED":
                    raise
            beat = client._heartbeat_now(1000)
            if beat is not None and beat.server_instance == instance:
                away_since = None
                continue  # still running there
            if beat is None:
                away_since = away_since or time.monotonic()
                if time.monotonic() - away_since < client._reconnect:
                    continue
            with client._lock:
                client._outstanding.discard(self._request_id)
                client._stash.pop(self._request_id, None)
            raise SalusError("UNAVAILABLE",
                             f"the daemon at {client.endpoint} went away while the iteration ran")


class SharedBuffer:
    """Memory shared with the daemon; see `Client.shared_buffer`. Bytes an iteration reads
    must not change until that iteration's result has been taken."""

    def __init__(self, client: Client, buffer_id: int, shm: Any, size: int) -> None:
        self._client = client
        self.id = buffer_id
        self.size = size
        self._shm = shm
        self._closed = False
        self._base = np.frombuffer(shm.buf, dtype=np.uint8).__array_interface__["data"][0]

    def array(self, shape: tuple[int, ...], dtype: Any = np.float32, offset: int = 0) -> np.ndarray:
        """A view of the buffer: fill it, then pass it as a feed."""
        return np.ndarray(shape, dtype=dtype, buffer=self._shm.buf, offset=offset)

    def _forget(self) -> None:
        """The daemon that mapped it is gone: it is closed here only."""
        self._closed = True
        try:
            self._shm.close()
        except BufferError:
            pass

    def close(self) -> None:
        """Unregisters the buffer; views of it stay valid until they are gone."""
        if self._closed:
            return
        self._closed = True
        if self in self._client._buffers:
            self._client._buffers.remove(self)
        try:
            req = pb.Request()
            req.unregister_buffer.buffer_id = self.id
            self._client._call(req)
        except (SalusError, zmq.ZMQError):
            pass  # the lease frees it anyway
        try:
            self._shm.close()
        except BufferError:
            pass  # views still exist; the mapping goes with the last of them

    def __enter__(self) -> SharedBuffer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def connect(endpoint: str | None = None, timeout: float | None = 30.0,
            name: str = "python", stage_from: int | None = 64 * 1024,
            max_staging_buffers: int = 4,
            server_key: str | bytes | os.PathLike[str] | None = None,
            secret_key: str | bytes | os.PathLike[str] | None = None,
            allocation_token: str | None = None, reconnect: float | None = None) -> Client:
    """Connects to a salus-server (default: `default_endpoint()`).

    Feeds of `stage_from` bytes or more are staged in shared memory when the daemon can map
    it (see `Client`); None sends every feed in a frame. `server_key` and `secret_key` (Z85
    or key files; default $SALUS_CURVE_SERVER_KEY, $SALUS_CURVE_SECRET_KEY) make a CURVE
    connection to a remote endpoint. `allocation_token` (default $SALUS_ALLOCATION_TOKEN)
    makes the client act for that allocation. `reconnect`: how long an iteration waits for a
    restarting daemon (see `Client`)."""
    return Client(endpoint, timeout=timeout, name=name, stage_from=stage_from,
                  max_staging_buffers=max_staging_buffers, server_key=server_key,
                  secret_key=secret_key, allocation_token=allocation_token,
                  reconnect=reconnect)
