"""`capture_step`: a PyTorch training or inference step run as daemon iterations.

Note [Where the state lives]
The parameters, buffers and optimizer state of a captured step live in the daemon, in the
persistent memory of the step's session, between calls. A call sends only the batch and the
learning rates and fetches only what the step returns. The user's own tensors are the *host*
copy; which copy is newest is tracked:
- the first call of a session (a new shape signature) writes the whole state from the host in
  the same RunIteration, pulling it from the session that held it first, if any;
- `sync()` pulls the state into the user's tensors (parameters, buffers, `optimizer.state`),
  after which the host copy is the newest: a later call writes it to the daemon again, so
  changes made on the host in between (loading a checkpoint, say) are seen.

Note [A captured job never waits on itself]
Each shape signature of each captured step is a session. The process's captured steps share one
client per endpoint (unless given their own), and their sessions are one job to the daemon
(CreateSession.job, scoped to the client), which admits a job's sessions as one tenant: under
FIFO an uneven last batch or an evaluation step never waits behind the job's own training
step. A new session may still wait for memory the job's own idle sessions hold (a full arena),
and those never close by themselves. So when a session is created waiting, every captured
step of the process pulls its state home and closes its other sessions; a closed one is made
again when its signature is next called (its trace is kept), and its first call writes the
state from the host as any new session's does. A warning says so once. (The lazy device and
the TensorFlow adaptor do the same: Note [A job never waits on itself].)
"""

from __future__ import annotations

import functools
import gc
import hashlib
import threading
import warnings
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch.utils import _pytree as pytree

import salus

from . import trace as _trace

_NP = {torch.float32: np.float32, torch.int64: np.int64, torch.bool: np.bool_}

# Which captured step's session holds the newest state of a module or optimizer (by id), so
# that a step that shares them with another (a training and an evaluation step) pulls it first.
_holders: dict[int, CapturedStep] = {}
# Every captured step of the process, for Note [A captured job never waits on itself].
_live: weakref.WeakSet[CapturedStep] = weakref.WeakSet()
_warned = False
# The clients the process's captured steps share, per endpoint, with how many steps use each
# (Note [A captured job never waits on itself]).
_clients: dict[str | None, tuple[salus.Client, int]] = {}
_clients_lock = threading.Lock()


def _acquire_client(endpoint: str | None) -> salus.Client:
    with _clients_lock:
        client, users = _clients.get(endpoint, (None, 0))
        if client is None:
            client = salus.connect(endpoint)
        _clients[endpoint] = (client, users + 1)
        return client


def _release_client(endpoint: str | None) -> None:
    with _clients_lock:
        client, users = _clients[endpoint]
        if users > 1:
            _clients[endpoint] = (client, users - 1)
            return
        del _clients[endpoint]
    client.close()


@dataclass
class _Entry:
    traced: _trace.Traced
    session: salus.Session | None  # None: closed by Note [A captured job never waits on itself]
    digest: str
    blob: bytes
    name: str


class CapturedStep:
    """A step function whose calls run in salus-server (see `capture_step`)."""

    def __init__(self, fn: Callable[..., Any], modules: list[torch.nn.Module] | None,
                 optimizers: list[torch.optim.Optimizer] | None,
                 client: salus.Client | None, endpoint: str | None, name: str,
                 session_options: dict[str, Any]) -> None:
        self._fn = fn
        found_m, found_o = _trace.discover(fn)
        self.modules = list(modules) if modules is not None else found_m
        self.optimizers = list(optimizers) if optimizers is not None else found_o
        self._shared_endpoint = endpoint
        self._own_client = client is None
        self._client = client if client is not None else _acquire_client(endpoint)
        self._name = name or f"torch:{getattr(fn, '__name__', 'step')}"
        self._options = {"job": "torch:captured", **session_options}
        self._entries: dict[tuple, _Entry] = {}
        self._holder: _Entry | None = None  # the session with the newest state, if any
        # Note [Random numbers]: the seed of this step's draws and the next unused offset.
        self._rng_seed: int | None = None
        self._rng_offset = 0
        functools.update_wrapper(self, fn)
        _live.add(self)

    # ---- calls ----

    def _key(self, args: tuple) -> tuple:
        flat, spec = pytree.tree_flatten(args)
        parts = []
        for a in flat:
            if isinstance(a, torch.Tensor):
                parts.append(("t", tuple(a.shape), str(a.dtype)))
            else:
                parts.append(("v", repr(a)))
        modes = tuple(m.training for m in self.modules for m in m.modules())
        opts = tuple(_trace._optim.functional(o).signature() for o in self.optimizers)
        return (str(spec), tuple(parts), modes, opts)

    def _entry(self, args: tuple) -> _Entry:
        key = self._key(args)
        entry = self._entries.get(key)
        if entry is None:
            traced = _trace.trace(self._fn, args, self.modules, self.optimizers)
            blob = traced.graph.SerializeToString()
            digest = hashlib.sha256(blob).hexdigest()[:16]
            for other in self._entries.values():  # the same graph: share its session
                if other.digest == digest:
                    entry = _Entry(traced, other.session, digest, blob, other.name)
                    break
            if entry is None:
                entry = _Entry(traced, None, digest, blob, f"{self._name}:{len(self._entries)}")
            self._entries[key] = entry
            gc.collect()  # the trace's cycles, now rather than in a later step (device.py)
        if entry.session is None:
            self._open(entry)
        return entry

    def _open(self, entry: _Entry) -> None:
        """Makes `entry`'s session (and gives it to the entries of the same graph); when the
        daemon queues it, closes the process's other captured sessions first (Note [A captured
        job never waits on itself])."""
        global _warned
        session = self._client.create_session(aten_graph=entry.blob, name=entry.name,
                                              **self._options)
        for e in self._entries.values():
            if e.digest == entry.digest:
                e.session = session
        if session.state != "WAITING":
            return
        evicted = False
        for step in list(_live):
            evicted = step._close_others(session) or evicted
        if evicted and not _warned:
            _warned = True
            warnings.warn(
                "salus_torch.capture_step: the daemon queued a session of this job (the arena "
                "has no room for it beside the job's other sessions, or another job holds the "
                "device); the job's other sessions close, their state pulled home, and are "
                "made again when next called. Each switch between steps or shapes pays that "
                "while the arena stays this full.", stacklevel=3)

    def _close_others(self, keep: salus.Session) -> bool:
        """Pulls this step's state home and closes its sessions but `keep`; whether any was
        open."""
        open_ = [s for s in self.sessions if s is not keep]
        if not open_:
            return False
        if self._holder is not None and self._holder.session is not keep:
            self._pull()
        for e in self._entries.values():
            if e.session is not None and e.session is not keep:
                e.session = None
        for s in open_:
            try:
                s.close()
            except salus.SalusError:
                pass
        return True

    def __call__(self, *args: Any) -> Any:
        entry = self._entry(args)
        t = entry.traced
        feeds: dict[str, np.ndarray] = {}
        batch = [a for a in pytree.tree_leaves(args) if isinstance(a, torch.Tensor)]
        for name, value in zip(t.inputs, batch, strict=False):
            feeds[name] = _numpy(value, name)
        for name, (opt, gi) in zip(t.inputs[len(batch):], t.lr_inputs, strict=False):
            feeds[name] = np.asarray([float(opt.param_groups[gi]["lr"])], dtype=np.float32)
        if t.rng_draws:
            if self._rng_seed is None:
                self._rng_seed = int(torch.randint(0, 2**62, (1,)).item())
            feeds["rng"] = np.asarray([self._rng_seed, self._rng_offset], dtype=np.int64)
            self._rng_offset += t.rng_draws
        owners = [id(o) for o in (*self.modules, *self.optimizers)]
        for other in {_holders[k] for k in owners if _holders.get(k, self) is not self}:
            other._pull()
        if self._holder is None or self._holder.session is not entry.session:
            self._pull()
            for s in t.state:
                feeds[s.name] = _numpy(s.host(), s.name)
        fetches = [o for o in t.outputs if o]
        out = entry.session.run(feeds=feeds, fetches=fetches, reply_when_fetched=True)
        self._holder = entry
        for k in owners:
            _holders[k] = self
        leaves = []
        for k, name in enumerate(t.outputs):
            leaves.append(torch.from_numpy(np.array(out[name])) if name
                          else t.constant_outputs[k])
        return pytree.tree_unflatten(leaves, t.out_spec)

    # ---- state ----

    def _pull(self) -> None:
        """Copies the newest state from the daemon into the user's tensors."""
        holder, self._holder = self._holder, None
        for k in [k for k, v in _holders.items() if v is self]:
            del _holders[k]
        if holder is None:
            return
        states = holder.traced.state
        values = holder.session.read_state([s.name for s in states])
        with torch.no_grad():
            for s in states:
                value = torch.from_numpy(np.array(values[s.name]))
                if s.kind == "optimizer":
                    slot = s.optimizer.state.setdefault(s.param, {})
                    if s.key in slot:
                        slot[s.key].copy_(value)
                    else:
                        slot[s.key] = value
                else:
                    s.host().copy_(value)

    def sync(self) -> None:
        """Brings the parameters, buffers and optimizer state back into the user's tensors
        (Note [Where the state lives]); the next call sends them to the daemon again."""
        self._pull()

    @property
    def sessions(self) -> list[salus.Session]:
        """The daemon sessions of this step, one per shape signature."""
        seen: list[salus.Session] = []
        for e in self._entries.values():
            if e.session is not None and all(e.session is not s for s in seen):
                seen.append(e.session)
        return seen

    def close(self) -> None:
        """Pulls the state home and closes the step's sessions (and its own client)."""
        try:
            self._pull()
        finally:
            for s in self.sessions:
                s.close()
            self._entries.clear()
            if self._own_client:
                self._own_client = False
                _release_client(self._shared_endpoint)

    def __enter__(self) -> CapturedStep:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _numpy(t: torch.Tensor, name: str) -> np.ndarray:
    if t.dtype not in _NP:
        raise TypeError(f"{name}: dtype {t.dtype} is not supported (float32, int64, bool)")
    return t.detach().cpu().contiguous().numpy()


def capture_step(fn: Callable[..., Any] | None = None, *,
                 modules: list[torch.nn.Module] | None = None,
                 optimizers: list[torch.optim.Optimizer] | None = None,
                 client: salus.Client | None = None, endpoint: str | None = None,
                 name: str = "", **session_options: Any) -> Any:
    """Runs every call of the step `fn` as one iteration of a salus-server session.

    `fn` is an ordinary step (`opt.zero_grad(); loss = ...; loss.backward(); opt.step();
    return loss`, or a forward pass under `torch.no_grad()`). The modules and optimizers it
    uses are found among the names it refers to, or given. Each new shape signature of the
    arguments is traced once into a graph and gets a session; `session_options` go to
    `Client.create_session` (priority, iterations, device...). Use as `step =
    capture_step(fn)` or as a decorator."""
    def wrap(f: Callable[..., Any]) -> CapturedStep:
        return CapturedStep(f, modules, optimizers, client, endpoint, name, session_options)
    return wrap if fn is None else wrap(fn)
