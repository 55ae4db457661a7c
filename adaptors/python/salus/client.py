"""The client: one DEALER socket to a salus-server, requests answered one at a time."""

from __future__ import annotations

import os
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import zmq

from salus._generated.salus.v1 import salus_pb2 as pb

PROTOCOL_VERSION = 1
DEFAULT_TCP = "tcp://127.0.0.1:5501"

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


class SalusError(Exception):
    """A request failed. `code` is the canonical code name, `message` the server's words."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(f"{code}: {message}")
        self.code = code
        self.message = message


@dataclass
class IterationStats:
    iteration: int
    lane: int
    queue_delay_us: float
    run_us: float
    switch_gap_us: float


def default_endpoint() -> str:
    """$SALUS_ENDPOINT, else the daemon's default tcp endpoint."""
    return os.environ.get("SALUS_ENDPOINT", DEFAULT_TCP)


def _raise_for(status: pb.Status) -> None:
    if status.code != 0:
        name = _CODE_NAMES[status.code] if 0 <= status.code < len(_CODE_NAMES) else "UNKNOWN"
        raise SalusError(name, status.message)


class Client:
    """A connection to one salus-server. Thread-safe: requests are serialised on a lock."""

    def __init__(self, endpoint: str | None = None, timeout: float | None = 30.0,
                 name: str = "python") -> None:
        self.endpoint = endpoint or default_endpoint()
        self._timeout_ms = None if timeout is None else int(timeout * 1000)
        self._ctx = zmq.Context.instance()
        self._sock = self._ctx.socket(zmq.DEALER)
        self._sock.setsockopt(zmq.LINGER, 0)
        self._sock.connect(self.endpoint)
        self._lock = threading.Lock()
        self._next_id = 1
        self._closed = False
        self.server = self._hello(name)
        self._stop = threading.Event()
        lease_s = max(self.server["lease_ms"] / 1000.0, 0.3)
        self._heartbeat = threading.Thread(
            target=self._beat, args=(lease_s / 3,), name="salus-heartbeat", daemon=True
        )
        self._heartbeat.start()

    # -- plumbing ------------------------------------------------------------------------
    def _call(self, req: pb.Request, frames: list[bytes | memoryview] | None = None,
              timeout_ms: int | None | str = "default") -> tuple[pb.Reply, list[zmq.Frame]]:
        if self._closed:
            raise SalusError("FAILED_PRECONDITION", "the client is closed")
        tmo = self._timeout_ms if timeout_ms == "default" else timeout_ms
        with self._lock:
            req.request_id = self._next_id
            self._next_id += 1
            self._sock.send_multipart([req.SerializeToString(), *(frames or [])], copy=False)
            while True:
                if tmo is not None and not self._sock.poll(tmo):
                    raise SalusError(
                        "DEADLINE_EXCEEDED", f"no reply from {self.endpoint} within {tmo} ms"
                    )
                parts = self._sock.recv_multipart(copy=False)
                reply = pb.Reply()
                reply.ParseFromString(parts[0].bytes)
                if reply.request_id == req.request_id or reply.request_id == 0:
                    break  # 0: the server could not read our envelope at all
                # A late reply to an earlier request that timed out: drop it.
        _raise_for(reply.status)
        return reply, parts[1:]

    def _hello(self, name: str) -> dict[str, Any]:
        req = pb.Request()
        req.hello.protocol_version = PROTOCOL_VERSION
        req.hello.client_name = name
        h = self._call(req)[0].hello
        return {
            "protocol_version": h.protocol_version,
            "server_version": h.server_version,
            "device": h.device,
            "capacity_bytes": h.capacity_bytes,
            "policy": h.policy,
            "client_id": h.client_id,
            "lease_ms": h.lease_ms,
        }

    def _beat(self, period: float) -> None:
        while not self._stop.wait(period):
            if not self._lock.acquire(blocking=False):
                continue  # a request is in flight: the server knows we are alive
            self._lock.release()
            try:
                req = pb.Request()
                req.heartbeat.SetInParent()
                self._call(req)
            except (SalusError, zmq.ZMQError):
                pass

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
        name: str = "",
        admission_timeout: float = 0.0,
    ) -> Session:
        if (model is None) == (synthetic is None):
            raise ValueError("give exactly one of model= and synthetic=")
        req = pb.Request()
        cs = req.create_session
        if model is not None:
            data = model if isinstance(model, bytes) else Path(model).read_bytes()
            cs.model.onnx = data
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
        else:
            assert synthetic is not None
            cs.synthetic.persistent_bytes = int(synthetic.get("persistent_bytes", 0))
            cs.synthetic.ephemeral_bytes = int(synthetic.get("ephemeral_bytes", 0))
            cs.synthetic.iteration_seconds = float(synthetic.get("iteration_seconds", 0.0))
        cs.iterations = iterations
        cs.duration_seconds = duration
        cs.priority = priority
        cs.name = name
        cs.admission_timeout_seconds = admission_timeout
        r = self._call(req)[0].create_session
        return Session(self, r)

    def sessions(self) -> list[dict[str, Any]]:
        req = pb.Request()
        req.list_sessions.SetInParent()
        out = []
        for s in self._call(req)[0].list_sessions.sessions:
            out.append({
                "session_id": s.session_id, "name": s.name, "kind": s.kind,
                "state": pb.SessionState.Name(s.state), "lane": s.lane, "priority": s.priority,
                "persistent_bytes": s.persistent_bytes, "ephemeral_bytes": s.ephemeral_bytes,
                "iterations_done": s.iterations_done,
                "iterations_declared": s.iterations_declared,
                "avg_iteration_seconds": s.avg_iteration_seconds,
            })
        return out

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

    def drain(self) -> None:
        req = pb.Request()
        req.drain.SetInParent()
        self._call(req)

    def close(self) -> None:
        if self._closed:
            return
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
        self.inputs = {t.name: (tuple(t.shape), _NP_DTYPES.get(t.dtype)) for t in reply.inputs}
        self.outputs = {t.name: (tuple(t.shape), _NP_DTYPES.get(t.dtype)) for t in reply.outputs}
        self.last_stats: IterationStats | None = None

    def run(
        self,
        feeds: dict[str, np.ndarray] | None = None,
        fetches: list[str] | None = None,
        timeout: float | None = None,
    ) -> dict[str, np.ndarray]:
        """Runs one iteration; waits for admission first if the session is waiting."""
        req = pb.Request()
        req.session_id = self.id
        body = req.run_iteration
        body.SetInParent()
        frames: list[memoryview] = []
        for name, value in (feeds or {}).items():
            arr = np.ascontiguousarray(value)
            if arr.dtype not in _DTYPES:
                raise ValueError(f"feed {name!r}: unsupported dtype {arr.dtype}")
            spec = body.feeds.add()
            spec.name = name
            spec.dtype = _DTYPES[arr.dtype]
            spec.shape.extend(arr.shape)
            frames.append(memoryview(arr).cast("B"))
        body.fetches.extend(fetches or [])
        tmo = None if timeout is None else int(timeout * 1000)
        reply, parts = self._client._call(req, frames, timeout_ms=tmo)
        r = reply.run_iteration
        st = r.stats
        self.last_stats = IterationStats(st.iteration, st.lane, st.queue_delay_us, st.run_us,
                                         st.switch_gap_us)
        out = {}
        for spec, frame in zip(r.outputs, parts, strict=False):
            dtype = _NP_DTYPES[spec.dtype]
            arr = np.frombuffer(frame.buffer, dtype=dtype).reshape(tuple(spec.shape))
            out[spec.name] = arr.copy()
        return out

    def close(self) -> None:
        req = pb.Request()
        req.session_id = self.id
        req.close_session.SetInParent()
        self._client._call(req)

    def __enter__(self) -> Session:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def connect(endpoint: str | None = None, timeout: float | None = 30.0,
            name: str = "python") -> Client:
    """Connects to a salus-server (default: $SALUS_ENDPOINT or tcp://127.0.0.1:5501)."""
    return Client(endpoint, timeout=timeout, name=name)
