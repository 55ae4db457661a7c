"""The lazy `salus` device: `model.to("salus")` and an unmodified training loop run in the daemon.

Note [The lazy device]
`import salus_torch` names PyTorch's PrivateUse1 device `salus`. A tensor on it is a
`SalusTensor`: shape, dtype and a *location* (a value on the host, or a state value of a daemon
session), never data of its own. Every ATen op on such tensors reaches `__torch_dispatch__`,
below autograd, so the forward pass, the backward pass PyTorch's autograd engine runs and the
optimizer's in-place updates all arrive as plain ATen calls. They are recorded, not run; each
result's shape comes from running the op on meta tensors.

A *flush* turns the recording into one functional graph and runs it as one iteration:
- the optimizer's post-step hook flushes (one iteration per training step), and so does any read
  of a value on the host (`.item()`, `.cpu()`, `.tolist()`, printing), which splits a step into
  more iterations;
- the recording is replayed under `make_fx` and functionalized exactly as `capture_step` traces a
  step (trace.py), so the graph has the same form and takes the same path through the daemon;
- the tensors the recording read from before it began become the graph's state (those already
  in the daemon, and those it writes) or inputs (batches uploaded from the host); results still
  referenced afterwards become state too (gradients, new optimizer state), except small ones
  (the loss), which are fetched so that reading them costs nothing;
- Python floats given to arithmetic ops (learning rates, Adam's bias corrections) are lifted into
  inputs, so a step whose only change is such a number is the same graph;
- a graph is sent once: graphs are cached by hash, each one a daemon session, and a flush whose
  state already sits in that session's slots sends only its inputs. When a different graph needs
  a state value (the first step, an evaluation pass), it is read from the session holding it and
  written into the new one in the same iteration.
P and E of each graph are known from its shapes when its session is admitted.

Note [Flushes in flight]
A flush submits its iteration and returns without waiting for it: the script goes on recording
the next step while the daemon runs this one. Its fetched results (the loss) are *pending*
until needed. The wait happens at the next flush (which starts from the previous one's end, so
at most one iteration is in flight), at a host read of a pending value, and before an in-place
host write into a tensor whose bytes that iteration was fed (they are sent without a copy). An
iteration that fails in the daemon reports its error at that wait, once; the tensors it was to
give values to have none. The iteration is submitted with `reply_when_fetched`: on the CPU the
daemon replies as soon as the fetched values are computed (a step's loss, after its forward
pass; Note [Fetches before the end] in the daemon's exec/executable.cc) and runs the backward
pass and the updates while the script records the next step. So a loop that reads its loss
every step waits only for the forward pass, and one that logs every few steps overlaps its
recording with the whole iteration. The daemon runs the session's next request behind the
whole iteration; an error in the part after the reply fails that next request (the next
flush's wait, or a read of a value the session holds), once, its message naming the
iteration.

Note [A job never waits on itself]
Each graph is a daemon session, and the device's sessions are one job to the daemon
(CreateSession.job), which admits a job's sessions as one tenant: under FIFO a new graph's
session never waits behind the job's own. It may still wait for memory the job's own sessions
hold (each its values and a lane; a full arena), and those never close by themselves: a step
split in two by a read, or an evaluation pass, would wait forever. So when a session is
created waiting, the device first moves the values its other sessions still hold to the host
and closes them (their graphs stay traced); the values go back in with the next iteration, as
any host value does, and a session closed so is made again when its graph is next flushed.
Whatever the new session then waits for is another job, as the policy intends. A job that
alternates between graphs in a full arena so pays a state read and a session compile at each
switch; the device warns once. (The TensorFlow adaptor does the same, Note [A job never waits
on itself] in its kernels.cc.)

Note [Shared locations]
`detach()` or `alias` of a tensor whose value exists, run at once, makes a tensor with the same
location (F.embedding's max_norm renormalizes `weight.detach()` in place, then reads `weight`).
In a recording, the first of such tensors used is the input; the others are its aliases, the
same tensor when the recording is replayed, so a write through one is read through the other,
and the location they share holds the result afterwards.

Note [The collector paused while recording]
A recording is thousands of small objects that Python's cycle collector tracks (each op's
record, its arguments, its plan-key entry: about 6,000 in an encoder step) and that live until
the flush, freed then by reference counting (they form no cycles). Left to the collector, they
survived its young collections (about five per step), were promoted to its oldest generation,
and brought a full collection of the whole process (some 300,000 objects with torch loaded,
~300 ms on the development VM) every ~40 steps, besides the young ones: 5-7 ms per encoder step
on average, where eager PyTorch allocates no tracked object per step and never collects. So
while a recording holds ops the collector is paused: the first op recorded disables it (if the
program left it enabled) and the flush enables it again once the recording is freed; closing
the device does too. Cycles the program makes meanwhile are collected after the flush. A
program that disables the collector itself during a recording finds it enabled after the flush.

What does not carry across a flush: aliasing between two tensors that were views of each other
(each keeps its own value afterwards), and values in the daemon that nothing references anymore
(their slots are reused). Random ops get the daemon's explicit seeds (Note [Random numbers]).
"""

from __future__ import annotations

import atexit
import collections
import gc
import hashlib
import itertools
import os
import sys
import threading
import time
import types
import warnings
import weakref
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from torch.fx.experimental.proxy_tensor import make_fx
from torch.utils import _pytree as pytree

import salus

from . import trace as _trace
from .step import _numpy

aten = torch.ops.aten
NAME = "salus"

# Produced tensors still referenced after a flush, up to this many elements, are fetched to the
# host rather than kept in the daemon: a loss, a metric. (Small gradients are not fetched: each
# fetch costs the round trip more than the slot costs the session.)
_FETCH_MAX = 1

# Traced graphs kept by plan key after their sessions close (Note [Plans]).
_TRACED_MAX = 64

# Ops run at once on the host value of a tensor not yet used in the recording: initialisation.
_HOST_INPLACE = {
    aten.fill_.Scalar, aten.zero_.default, aten.normal_.default, aten.uniform_.default,
    aten.copy_.default, aten.random_.default, getattr(aten.random_, "from"), aten.random_.to,
    aten.bernoulli_.float, aten.exponential_.default, aten.fill_.Tensor, aten.scatter_.src,
    aten.scatter_.value, aten.cauchy_.default, aten.log_normal_.default, aten.geometric_.default,
}
# Random ops that take a generator: given one, they draw on the host (Note [Draws on the host]).
_DRAWS = frozenset({
    aten.bernoulli.default, aten.bernoulli.p, aten.bernoulli_.Tensor, aten.bernoulli_.float,
    aten.normal.Tensor_float, aten.normal.float_Tensor, aten.normal.Tensor_Tensor})
# Ops that may run at once rather than be recorded (see Runtime._dispatch).
_EAGER = _HOST_INPLACE | _DRAWS | {aten.detach.default, aten.alias.default}
# Ops that read values on the host: they flush, then run on the host values.
_HOST_READS = {aten._local_scalar_dense.default, aten.equal.default, aten.is_nonzero.default,
               aten.allclose.default}
# (The recording looks ops up by id: an OpOverload hashes in Python, and each lives as long as
# the process.)
_HOST_READ_IDS = frozenset(map(id, _HOST_READS))
_EAGER_IDS = frozenset(map(id, _EAGER))

_COPY = aten.copy_.default
_CHANNELS_LAST = (torch.channels_last, torch.channels_last_3d)
_HOST_COPIES = (aten._to_copy.default, aten.clone.default)
# In-place random fills of a whole tensor: Note [Draws on the host].
_RANDOM_FILLS = frozenset({
    aten.normal_.default, aten.uniform_.default, aten.exponential_.default,
    aten.random_.default, getattr(aten.random_, "from"), aten.random_.to,
    aten.cauchy_.default, aten.log_normal_.default, aten.geometric_.default})
_COPY_ID = id(_COPY)

# Note [One detach, one dispatch]
# `x.detach()` reaches __torch_dispatch__ twice: once from its ADInplaceOrView kernel, below
# that key (AutoDispatchBelowADInplaceOrView), then again from the `as_view` that follows, whose
# shallow_copy_and_detach of that first result asks the subclass for a detach of it. Each made a
# tensor and recorded an op: 50-70 us per detach, and autograd detaches every gradient it
# accumulates into a `.grad` (about 60 per encoder step). The first result is seen by nothing but
# that second call, so the second call, when it is the next dispatch, on the same thread, of the
# tensor the first returned, above ADInplaceOrView, returns that tensor: one wrapper, one op.
# (Under autograd the extension's kernel for `detach` at the device's autograd key makes the
# call once, as an `alias` given the tensor's version counter: Note [One detach, one dispatch]
# in csrc/device.cc. The two calls remain for `.data` and under inference mode.)
# An inference tensor's detach is one call (nothing remembered). Under inference mode a normal
# tensor's detach is still two, and its result must be a normal tensor (autograd gives it its
# base's version counter, which an inference tensor cannot take), so it is made outside it.
_DETACH = aten.detach.default
_AD_INPLACE_OR_VIEW = torch._C.DispatchKey.ADInplaceOrView

# Note [Host dtypes]
# The engine computes in float32, int64 and bool. A tensor of another dtype moved to the
# device keeps its host value there: images as uint8, arrays from NumPy as float64 or int32.
# An op whose tensors are all such host values (`x.float() / 255`, `y.long()`) runs on the host
# at once, as the factories do, and its result is a host value of the device, which the graph
# takes as an input when it is of an engine dtype. An op that mixes a tensor of another dtype
# with values the device computes, or makes one from them (`loss.detach().double()`, a metric
# summed in float64), reads those values first, as `.item()` does, which splits the step. A
# tensor that requires grad is never read so: an op that would take or make a tensor of another
# dtype from one (`model.half()`, `model.double()`) is refused by name as it is called.
# In the same way, an in-place op into a host value that the recording has not read, from host
# values nothing recorded writes, runs on the host: initialisers made of in-place ops
# (`trunc_normal_`'s `erfinv_` and `clamp_`), a rescale of a fresh batch. It gives the value
# the recording would, sooner. So does a copy or conversion of a host value the recording has
# not read (`model.to(memory_format=...)` before training: the recording would hold a weak
# reference to the parameter, and Module._apply could not swap it).
_ENGINE_DTYPES = frozenset({torch.float32, torch.int64, torch.bool})

# Note [Lifted scalars]: Python floats in these arguments become graph inputs.
_LIFT: dict[Any, tuple[str, ...]] = {}
for _name in ("add", "sub"):
    for _f in (getattr(aten, _name), getattr(aten, _name + "_")):
        _LIFT[_f.Tensor] = ("other", "alpha")
        _LIFT[_f.Scalar] = ("other", "alpha")
for _name in ("mul", "div"):
    for _f in (getattr(aten, _name), getattr(aten, _name + "_")):
        _LIFT[_f.Tensor] = ("other",)
        _LIFT[_f.Scalar] = ("other",)
for _f in (aten.addcmul, aten.addcmul_, aten.addcdiv, aten.addcdiv_):
    _LIFT[_f.default] = ("value",)
_LIFT[aten.lerp.Scalar] = ("weight",)
_LIFT[aten.lerp_.Scalar] = ("weight",)
# id -> (argument names to lift, the schema's argument names)
_LIFT_IDS = {id(f): (names, [a.name for a in f._schema.arguments]) for f, names in _LIFT.items()}


class _Loc:
    """Where a value lives: on the host (`host`), in slot `slot` of a daemon graph, in the
    reply of the iteration in flight (`pending`, Note [Flushes in flight]), or nowhere but
    recomputable by `remat` (func, args, kwargs, output index) from live tensors."""

    __slots__ = ("__weakref__", "graph", "host", "pending", "remat", "slot")

    def __init__(self, host: torch.Tensor | None = None) -> None:
        self.host = host
        self.graph: _Graph | None = None
        self.slot = ""
        self.pending = False
        self.remat: _Remat | None = None

    def known(self) -> bool:
        """Whether the value exists somewhere (rather than only as a recording)."""
        return self.host is not None or self.graph is not None or self.pending


@dataclass(eq=False)
class _Inflight:
    """The iteration the last flush submitted, and where its fetched values go."""

    pending: salus.client.PendingIteration
    fills: list[tuple[_Loc, str, torch.Size]]
    # The locations whose host tensors it was fed (sent without a copy), by id; held, so that
    # no new location takes one of their ids while it runs.
    fed: dict[int, _Loc]


@dataclass(eq=False)
class _Remat:
    """An op to record again when a later segment reads one of its results (`index`: the
    result's uid -> output position); recorded once per segment for all of them."""

    func: Any
    args: tuple
    kwargs: dict
    index: dict[int, int]
    seg: Any = None
    op: Any = None


# Results recomputed where a later graph needs them instead of being kept: what only a backward
# op reads, and which the engine's backward takes from its own forward node in the same graph
# (max pooling's indices, the batch and layer statistics). Per op: those outputs, arguments
# replaced when recomputing (BatchNorm uses momentum 0, so its running statistics are written
# back unchanged), and, for outputs the engine never computes at all (so they cannot be kept
# or read either), what they are.
_REMAT: dict[Any, tuple[set[int], dict[int, Any], str | None]] = {
    aten.max_pool2d_with_indices.default: ({1}, {}, "max pooling's indices"),
    aten.adaptive_max_pool2d.default: ({1}, {}, "adaptive max pooling's indices"),
    aten.max_pool3d_with_indices.default: ({1}, {}, "3-D max pooling's indices"),
    aten.native_batch_norm.default: ({1, 2}, {6: 0.0}, None),
    aten.native_layer_norm.default: ({1, 2}, {}, None),
}


@dataclass(eq=False)
class _Graph:
    """One flushed graph, its session and which value sits in each of its state slots."""

    session: salus.Session
    digest: str
    graph: bytes  # the serialized AtenGraph (for salus-aten-profile --graph)
    occupant: dict[str, weakref.ref] = field(default_factory=dict)  # slot -> its _Loc

    def holder(self, slot: str) -> _Loc | None:
        """The location whose value is in `slot`, if anything still refers to it."""
        ref = self.occupant.get(slot)
        loc = ref() if ref is not None else None
        return loc if loc is not None and loc.graph is self and loc.slot == slot else None


@dataclass
class _Op:
    func: Any
    args: tuple
    kwargs: dict
    outs: list  # uid per flattened output, None where the output is no tensor
    lifted: bool = False  # some arguments are _Scalar (Note [Lifted scalars])


class _Ref:
    """A tensor argument of a recorded op, by uid."""

    __slots__ = ("uid",)

    def __init__(self, uid: int) -> None:
        self.uid = uid

    def __eq__(self, other: object) -> bool:
        return type(other) is _Ref and other.uid == self.uid

    def __hash__(self) -> int:
        return hash(("ref", self.uid))

    def __repr__(self) -> str:
        return f"_Ref({self.uid})"


@dataclass(frozen=True)
class _Scalar:
    index: int


@dataclass
class _Segment:
    ops: list[_Op] = field(default_factory=list)
    order: list[int] = field(default_factory=list)  # uids in order of first use
    pos: dict[int, int] = field(default_factory=dict)  # uid -> its place in `order`
    sig: list[tuple] = field(default_factory=list)  # the ops, uids as places (the plan key)
    refs: dict[int, weakref.ref] = field(default_factory=dict)
    metas: dict[int, torch.Tensor] = field(default_factory=dict)
    inputs: dict[int, _Loc] = field(default_factory=dict)  # uid -> location before the segment
    # Tensors sharing one location (a detach() or alias run at once, Runtime._dispatch): the
    # first one used is the input, the others are its aliases in the recording.
    by_loc: dict[int, int] = field(default_factory=dict)  # id(location) -> uid
    alias: dict[int, int] = field(default_factory=dict)  # uid -> the uid it aliases
    producer: dict[int, tuple[_Op, int]] = field(default_factory=dict)  # uids made in it
    mutated: set[int] = field(default_factory=set)
    scalars: list[float] = field(default_factory=list)
    # host tensors given to device ops, by (id, version), with their wrappers as inputs (the
    # host tensor is held so that its id stays its own)
    wrapped: dict[tuple[int, int], tuple[torch.Tensor, SalusTensor]] = field(
        default_factory=dict)
    wanted: set[int] = field(default_factory=set)  # read on the host: kept, never recomputed


class SalusTensor(torch.Tensor):
    """A tensor on the lazy `salus` device (Note [The lazy device])."""

    _meta: torch.Tensor  # shared with other tensors of one op's outputs: never modified
    _key: tuple  # (dtype, shape, stride, offset): what an op's output shapes depend on in it
    _uid: int
    _loc: _Loc

    @staticmethod
    def __new__(cls, meta: torch.Tensor, loc: _Loc) -> SalusTensor:
        shape, stride, offset = meta.shape, meta.stride(), meta.storage_offset()
        r = torch.Tensor._make_wrapper_subclass(
            cls, shape, strides=stride, storage_offset=offset, dtype=meta.dtype,
            device=_DEVICE, requires_grad=False)
        r._meta = meta
        r._key = (meta.dtype, shape, stride, offset)
        r._uid = next(_uids)
        r._loc = loc
        return r

    __torch_function__ = torch._C._disabled_torch_function_impl

    @classmethod
    def __torch_dispatch__(cls, func: Any, types: Any, args: tuple = (),
                           kwargs: dict | None = None) -> Any:
        return runtime().dispatch(func, args, kwargs or {})

    # A traceable wrapper subclass: Module._apply then swaps each parameter object in place
    # (torch.utils.swap_tensors) rather than making a new one, so an optimizer built before
    # `model.to("salus")` keeps the model's parameters, as it does with CUDA. Its one inner
    # tensor is the meta tensor of its geometry: PyTorch's checks that walk a subclass's inner
    # tensors (activation checkpointing asks whether they are functional) need at least one.
    def __tensor_flatten__(self) -> tuple[list[str], None]:
        return ["_meta"], None

    @staticmethod
    def __tensor_unflatten__(inner: dict, ctx: None, outer_size: Any, outer_stride: Any) -> Any:
        # What torch.compile asks of a subclass's arguments: Note [Compiled models].
        if "torch._dynamo" not in sys.modules:
            raise NotImplementedError("salus device tensors cannot be rebuilt from parts")
        global _dynamo_skips
        from torch._dynamo.exc import SkipFrame
        if not _dynamo_skips:
            from torch._dynamo import trace_rules
            trace_rules.add(__package__)
            _dynamo_skips = True
        raise SkipFrame("salus device tensors: the frame runs uncompiled")

    def __reduce_ex__(self, protocol: Any) -> Any:
        # torch.save / pickle: the value, as a host tensor (as if saved after `.cpu()`).
        return self.detach().cpu().__reduce_ex__(protocol)

    def __deepcopy__(self, memo: dict) -> SalusTensor:
        # copy.deepcopy(model) (an EMA or teacher copy): a clone on the device, recorded as
        # any op, rather than a copy of the wrapper's location and the runtime behind it.
        if id(self) in memo:
            return memo[id(self)]
        with torch.no_grad():
            new = self.clone()
        new.requires_grad_(self.requires_grad)
        memo[id(self)] = new
        return new

    def tolist(self) -> Any:
        return self.cpu().tolist()

    def __repr__(self, **kwargs: Any) -> str:
        body = repr(self.detach().cpu())
        return body[:-1] + f", device='{NAME}:0')" if body.endswith(")") else body


_uids = itertools.count()
_DEVICE: Any = None  # torch.device("salus", 0), once register() named the backend
_BASE_KEYS = (torch._C._dispatch_tls_local_include_set(),
              torch._C._dispatch_tls_local_exclude_set())


_VIEWS: dict[int, bool] = {}


def _is_view(func: Any) -> bool:
    """Whether `func`'s result aliases its first argument (select, view, transpose, ...)."""
    view = _VIEWS.get(id(func))
    if view is None:
        view = _VIEWS[id(func)] = bool(getattr(func, "is_view", False))
    return view


def _meta_of(x: torch.Tensor) -> torch.Tensor:
    return torch.empty_strided(x.shape, x.stride(), dtype=x.dtype, device="meta")


def _to_device(x: Any, device: str) -> Any:
    if isinstance(x, torch.Generator) and x.device.type == NAME:
        # a generator of the device draws on the host (Note [Draws on the host])
        return _extension.host_generator(x)
    if isinstance(x, torch.device) and x.type == NAME:
        return torch.device(device)
    if isinstance(x, str) and x.startswith(NAME):
        return device
    return x


class Runtime:
    """Records ops on salus tensors and flushes them to the daemon (Note [The lazy device])."""

    def __init__(self, endpoint: str | None = None) -> None:
        self._endpoint = endpoint
        self._client: salus.Client | None = None
        self._lock = threading.RLock()  # autograd runs backward on its own thread
        self._seg = _Segment()
        self._graphs: dict[str, _Graph] = {}
        self._plans: dict[tuple, tuple[_Graph, list[str], int]] = {}
        # Note [Plans]: graphs traced, by plan key, kept when their session closes (a mask's
        # count seen again): (serialized graph, its digest, its outputs, its random draws)
        self._traced: collections.OrderedDict[tuple, tuple[bytes, str, list[str], int]] = \
            collections.OrderedDict()
        self._collected_at = float("-inf")
        self._collect_cost = 0.0
        self._metas: dict[tuple, tuple] = {}  # (template, the op to record) per key
        self._kids: dict[tuple, int] = {}  # memo keys numbered (Runtime._kid)
        self._rng_seed: int | None = None
        self._rng_offset = 0
        self._inflight: _Inflight | None = None
        self._session_options: dict[str, Any] = {}
        self._collector_paused = False  # Note [The collector paused while recording]
        self._detached: tuple[int, SalusTensor] | None = None  # Note [One detach, one dispatch]
        self._evicted = False  # whether Note [A job never waits on itself] warned
        self.flushes = 0
        self.traces = 0  # recordings traced into a new graph (the others found their plan)

    @property
    def client(self) -> salus.Client:
        if self._client is None:
            self._client = salus.connect(self._endpoint, name="torch:salus-device")
        return self._client

    # ---- dispatch ----

    def dispatch(self, func: Any, args: tuple, kwargs: dict) -> Any:
        with self._lock:
            if func is _DETACH:
                return self._detach(args, kwargs)
            self._detached = None
            return self._dispatch(func, args, kwargs)

    def _detach(self, args: tuple, kwargs: dict) -> Any:
        """Note [One detach, one dispatch]."""
        detached, self._detached = self._detached, None
        below = torch._C._dispatch_tls_is_dispatch_key_excluded(_AD_INPLACE_OR_VIEW)
        x = args[0]
        if detached is not None and x is detached[1] and not below and \
                detached[0] == threading.get_ident():
            return x  # the second call, of the first one's result
        if not below or x.is_inference():
            return self._dispatch(_DETACH, args, kwargs)  # the only call
        if torch.is_inference_mode_enabled():  # a normal tensor's detach is a normal tensor
            with torch.inference_mode(False):
                out = self._dispatch(_DETACH, args, kwargs)
        else:
            out = self._dispatch(_DETACH, args, kwargs)
        self._detached = (threading.get_ident(), out)
        return out

    def _dispatch(self, func: Any, args: tuple, kwargs: dict) -> Any:
        fid = id(func)
        if fid in _HOST_READ_IDS or (func is aten._to_copy.default and _to_host(kwargs)):
            return self._on_host(func, args, kwargs)
        if func is aten.copy_.default and not isinstance(args[0], SalusTensor):
            self.flush()
            return args[0].copy_(self.host_value(args[1]))
        if func is aten.empty_like.default and \
                kwargs.get("dtype", args[0].dtype) in (torch.int64, torch.bool):
            # An index buffer, made on the host as the factories are: what fills it from host
            # values runs there too (the inverse permutation of a packed sequence's sort).
            return _empty(args[0].shape, dtype=kwargs.get("dtype", args[0].dtype))
        if fid not in _EAGER_IDS:
            by_value = _BY_VALUE.get(fid)
            if by_value is not None:  # Note [Values that give shapes]
                out = by_value(self, args, kwargs)
                if out is not NotImplemented:
                    return out
            return self._record(func, args, kwargs)
        # (these ops take their tensors as arguments of their own, never in lists)
        tensors = [a for a in (*args, *kwargs.values()) if isinstance(a, SalusTensor)]
        seg = self._seg

        dest = args[0]
        if func in (aten.detach.default, aten.alias.default) and dest._loc.known() and \
                dest._uid not in seg.refs and id(dest._loc) not in seg.by_loc:
            return SalusTensor(_meta_of(dest._meta), dest._loc)
        # An in-place op into an untouched host value, from values the recording does not
        # change (initialisation; the inverse permutation of a packed sequence's sort).
        if func in _HOST_INPLACE and isinstance(dest, SalusTensor) and \
                self._host_values(tensors, first_untouched=True):
            return self._on_host_values(func, args, kwargs, tensors, "")
        if (func in _RANDOM_FILLS and isinstance(dest, SalusTensor)) or \
                (func in _DRAWS and _has_generator(args, kwargs)):
            return self._draw(func, args, kwargs)
        return self._record(func, args, kwargs)

    def _draw(self, func: Any, args: tuple, kwargs: dict) -> Any:
        """Note [Draws on the host]: a random fill of a device tensor, or a draw with a
        generator, made on the host."""
        dest = args[0]
        in_place = bool(_writes(func))
        if in_place:
            made = self._seg.producer.get(dest._uid)
            if made is not None and _is_view(made[0].func):
                return self._record(func, args, kwargs)  # (a write into a view: refused by name)
        # (the arguments a draw reads, probabilities or means, are read if the device computes
        # them, as .item() reads)
        host_args = [self._host_arg(a) for a in args[1:]]
        host_kwargs = {k: self._host_arg(v) for k, v in kwargs.items()}
        if not in_place:
            out = func(self._host_arg(dest), *host_args, **host_kwargs)
            return _on_device(out)
        host = torch.empty(dest.shape, dtype=dest.dtype)
        func(host, *host_args, **host_kwargs)
        dest._uid, dest._loc = next(_uids), _Loc(host)  # a value of its own from here on
        return dest

    def _host_arg(self, a: Any) -> Any:
        return self.host_value(a) if isinstance(a, SalusTensor) else _to_device(a, "cpu")

    def _on_host(self, func: Any, args: tuple, kwargs: dict) -> Any:
        self.flush()
        return self._host_call(func, args, kwargs)

    def _host_call(self, func: Any, args: tuple, kwargs: dict) -> Any:
        """`func` on the host values of its arguments (each flushing what it depends on)."""
        host_args, host_kwargs = pytree.tree_map(self._host_arg, (args, kwargs))
        return func(*host_args, **host_kwargs)

    def _record(self, func: Any, args: tuple, kwargs: dict) -> Any:
        if _knowable(func):
            out = self._record_known(func, args, kwargs)
            if out is not NotImplemented:
                return out
        if _composite(func):
            # An op made of others reaches the device only where autograd's dispatch keys are
            # absent (tensors made under torch.inference_mode): it runs as those others.
            out = func.decompose(*args, **kwargs)
            if out is not NotImplemented:
                return out
        seg = self._seg
        if kwargs.get("memory_format") in _CHANNELS_LAST:
            # A layout hint (`model.to(memory_format=torch.channels_last)`, for faster CUDA
            # convolutions): the engine picks its own layouts, and the device's tensors are
            # contiguous, so their strides say what the graph computes.
            kwargs = {**kwargs, "memory_format": torch.contiguous_format}
        tensors: list[SalusTensor] = []  # the op's tensor arguments, in order
        lift = _LIFT_IDS.get(id(func))
        scan = self._scan
        rargs_l, keys = [], []
        for a in args:
            r, k = scan(a, tensors, lift)
            rargs_l.append(r)
            keys.append(k)
        rargs = tuple(rargs_l)
        rkwargs, kkeys = {}, []
        for n, v in kwargs.items():
            r, k = scan(v, tensors, lift)
            rkwargs[n] = r
            kkeys.append((n, k))
        for t in tensors:  # (before the meta run: ops on these need no meta kernel)
            if t._key[0] not in _ENGINE_DTYPES:  # Note [Host dtypes]
                return self._on_host_values(func, args, kwargs, tensors, f"takes a {t.dtype}")
        # Note [Plans]: the output shapes of an op on given shapes are computed on meta
        # tensors once, then remembered.
        key = (id(func), tuple(keys), tuple(kkeys))
        try:
            entry = self._metas.get(key)
        except TypeError:  # an unhashable argument: no memo
            key, entry = None, None
        if entry is None:
            template = self._template(func, rargs, rkwargs, tensors)
            # Note [Reshaped in place]: such an op is recorded as its functional form.
            entry = (template, _functional_of(func) if _reshapes(template) else func,
                     _odd_dtype(template))
            entry += (entry[1] is func and entry[2] is None and _plain_keywords(kwargs) and
                      _known(func, template), None if key is None else self._kid(key))
            if key is not None:
                self._metas[key] = entry
        template, recorded, odd, _, kid = entry
        if odd is not None:  # Note [Host dtypes]
            return self._on_host_values(func, args, kwargs, tensors, odd)
        if (template == ("arg", 0) or func in _HOST_COPIES) and tensors and args and \
                args[0] is tensors[0] and self._host_values(tensors, first_untouched=True):
            # An in-place op on a host value from host values, or a copy of one not yet read
            # (Module._apply's conversions, which then swap the parameter): Note [Host dtypes].
            return self._on_host_values(func, args, kwargs, tensors, "")
        for t in tensors:
            self._use(t)
        op = _Op(recorded, rargs, rkwargs, [])
        if lift is not None:
            op.lifted = self._lift(op, *lift)
        written = list(_writes(recorded))
        if func is aten.native_batch_norm.default and rargs[5]:
            written += [(3, "running_mean"), (4, "running_var")]  # undeclared writes
        for i, name in written:
            v = rargs[i] if i < len(rargs) else rkwargs.get(name)
            if isinstance(v, _Ref):
                self._mutate(v.uid)

        def wrap(m: Any) -> Any:
            if not (type(m) is tuple and _is_leaf(m)):
                op.outs.append(None)
                return m
            if m[0] != "new":  # an in-place op or out= returns its argument
                same = tensors[m[1]]
                if m[0] == "reshaped":  # the tensor now holds the op's new value
                    _set_geometry(same, m[2])
                    same._uid, same._loc = next(_uids), _Loc()
                    seg.producer[same._uid] = (op, len(op.outs))
                    self._use(same)
                op.outs.append(same._uid)
                return same
            t = SalusTensor(m[1], _Loc())
            seg.producer[t._uid] = (op, len(op.outs))
            self._use(t)
            op.outs.append(t._uid)
            return t

        out = _map_out(wrap, template)
        self._add_op(seg, op)
        pos = seg.pos
        seg.sig.append((kid if kid is not None else (func, _canon((op.args, op.kwargs), pos)),
                        tuple([pos[t._uid] for t in tensors]),
                        tuple([-1 if u is None else pos[u] for u in op.outs])))
        return out

    def _known_entry(self, func: Any, args: tuple, kwargs: dict | None = None
                     ) -> tuple | None:
        """Note [Known ops]: (its memo entry, its tensors, its arguments and keywords as
        recorded) for `func` on these arguments, when its entry allows recording it from there;
        None otherwise."""
        tensors: list[SalusTensor] = []
        rargs: list[Any] = []
        keys: list[Any] = []
        for a in args:
            kind = type(a)
            if kind is not SalusTensor and isinstance(a, torch.Tensor):
                a, kind = self._wrap_host(a), SalusTensor
            if kind is SalusTensor:
                tensors.append(a)
                rargs.append(_Ref(a._uid))
                keys.append(a._key)
            elif kind in _PLAIN:
                rargs.append(a)
                keys.append(a)
            elif kind is list or kind is tuple:
                for e in a:
                    if type(e) is not int and type(e) is not bool:  # (sizes, output masks)
                        return None
                rargs.append(kind(a))
                keys.append(tuple(a))
            else:
                return None
        kkeys: tuple = ()
        if kwargs:
            if not _plain_keywords(kwargs):
                return None
            kkeys = tuple(kwargs.items())
        entry = self._metas.get((id(func), tuple(keys), kkeys))
        if entry is None or not entry[3]:
            return None
        return entry, tensors, tuple(rargs), dict(kwargs) if kwargs else {}

    def _record_known(self, func: Any, args: tuple, kwargs: dict) -> Any:
        """_record of `func` from its memo entry (Note [Known ops]), or NotImplemented."""
        known = self._known_entry(func, args, kwargs)
        if known is None:
            return NotImplemented
        template = known[0][0]
        outs = self._record_from(func, known, wrapped=True)
        return outs[0] if template[0] == "new" else type(template)(outs)

    def _record_update(self, func: Any, args: tuple, dsts: tuple[SalusTensor, ...]) -> None:
        """Records the fused update `func(*args)` and the copy of each of its results into
        the matching tensor of `dsts` (Note [Fused updates]). Once the update is known (Note
        [Known ops]) its results get no wrappers: only the copies read them, so they are
        recorded by uid, and the recording and its plan key are what the general path and
        _record_copy make of the same calls."""
        known = self._known_entry(func, args)
        if known is None:
            outs = self._dispatch(func, args, {})
            for dst, src in zip(dsts, outs, strict=True):
                _write(self, dst, src)
            return
        uids = self._record_from(func, known, wrapped=False)
        for dst, u, (_, meta) in zip(dsts, uids, known[0][0], strict=True):
            self._record_copy_of(dst, u, _key_of(meta))
            torch.autograd.graph.increment_version(dst)

    def _record_from(self, func: Any, known: tuple, wrapped: bool) -> list:
        """Records `func` from what _known_entry found: its results as new tensors
        (`wrapped`), or, read by nothing outside the recording, as uids alone."""
        entry, tensors, rargs, rkwargs = known
        for t in tensors:
            self._use(t)
        seg = self._seg
        op = _Op(func, rargs, rkwargs, [])
        template = entry[0]
        outs: list = []
        for k, m in enumerate((template,) if template[0] == "new" else template):
            if m is None:  # (a gradient the output mask leaves out)
                op.outs.append(None)
                outs.append(None)
                continue
            meta = m[1]
            if wrapped:
                t = SalusTensor(meta, _Loc())
                seg.producer[t._uid] = (op, k)
                self._use(t)
                u = t._uid
                outs.append(t)
            else:
                u = next(_uids)
                seg.producer[u] = (op, k)
                seg.refs[u] = _gone  # nothing holds it: never kept past the flush
                seg.pos[u] = len(seg.order)
                seg.order.append(u)
                seg.metas[u] = meta
                outs.append(u)
            op.outs.append(u)
        self._add_op(seg, op)
        pos = seg.pos
        seg.sig.append((entry[4], tuple([pos[t._uid] for t in tensors]),
                        tuple([-1 if u is None else pos[u] for u in op.outs])))
        return outs

    def _record_copy(self, dst: SalusTensor, src: SalusTensor) -> None:
        """What _record does for `dst.copy_(src)` of two device tensors of one shape and
        dtype, without its generic scan: the optimizers' fused updates write four tensors per
        parameter this way. The op's entry in the plan key is the one _record would make."""
        self._use(dst)
        self._use(src)
        self._record_copy_of(dst, src._uid, src._key)

    def _record_copy_of(self, dst: SalusTensor, src: int, src_key: tuple) -> None:
        """_record_copy from the recorded value `src` (a uid, in the recording already)."""
        seg = self._seg
        self._use(dst)
        self._mutate(dst._uid)
        self._add_op(seg, _Op(_COPY, (_Ref(dst._uid), _Ref(src)), {}, [dst._uid]))
        pos = seg.pos
        seg.sig.append((self._kid((_COPY_ID, (dst._key, src_key), ())),
                        (pos[dst._uid], pos[src]), (pos[dst._uid],)))

    def _kid(self, key: tuple) -> int:
        """Note [Plans]: the number standing for an op's memo key in plan keys."""
        kid = self._kids.get(key)
        if kid is None:
            kid = self._kids[key] = len(self._kids)
        return kid

    def _mutate(self, uid: int) -> None:
        """Notes a write into `uid`, and into what it is a view of when a view op of this
        recording made it (`empty(...).select(-1, 0).copy_(...)`): a tensor from before the
        recording written through a view is state, not an input."""
        seg = self._seg
        uid = seg.alias.get(uid, uid)
        while uid not in seg.mutated:
            seg.mutated.add(uid)
            made = seg.producer.get(uid)
            if made is None or not _is_view(made[0].func):
                return
            base = next((a for a in made[0].args if isinstance(a, _Ref)), None)
            if base is None:
                return
            uid = base.uid

    @staticmethod
    def _template(func: Any, rargs: tuple, rkwargs: dict, tensors: list[SalusTensor]) -> Any:
        """The op's outputs as ("arg", k) (its k-th tensor argument, returned: an in-place op,
        out=) or ("new", meta), from running it on meta tensors. Each argument gets a meta of
        its own (tensors share the metas an op's template made, which must not change)."""
        fresh = {t._uid: _meta_of(t._meta) for t in tensors}

        def meta(a: Any) -> Any:
            return fresh[a.uid] if isinstance(a, _Ref) else _to_device(a, "meta")

        # (each meta's geometry before the op; its offset is 0 where the tensor's is not)
        geometry = {id(m): (m.shape, m.stride(), m.storage_offset()) for m in fresh.values()}
        try:
            mout = func(*_map(meta, rargs), **_map(meta, rkwargs))
        except Exception as e:
            raise RuntimeError(f"salus device: {func} cannot be recorded: {e}") from None
        where = {id(fresh[t._uid]): k for k, t in enumerate(tensors)}

        def leaf(m: Any) -> Any:
            if not isinstance(m, torch.Tensor):
                return m
            k = where.get(id(m))
            if k is None:
                return ("new", m)
            if (m.shape, m.stride(), m.storage_offset()) != geometry[id(m)]:
                return ("reshaped", k, m)  # transpose_, unsqueeze_, ...: Note [Reshaped in place]
            return ("arg", k)

        return _map(leaf, mout)

    def _lift(self, op: _Op, names: tuple[str, ...], schema: list[str]) -> bool:
        """Replaces the op's float arguments `names` by _Scalar inputs."""
        args, kwargs = list(op.args), dict(op.kwargs)
        lifted = False
        for name in names:
            k = schema.index(name)
            here = args if k < len(args) else kwargs
            key = k if k < len(args) else name
            if k >= len(args) and name not in kwargs:
                continue
            if type(here[key]) is float:
                self._seg.scalars.append(here[key])
                here[key] = _Scalar(len(self._seg.scalars) - 1)
                lifted = True
        op.args, op.kwargs = tuple(args), kwargs
        return lifted

    def _scan(self, a: Any, tensors: list[SalusTensor], lift: tuple | None) -> tuple[Any, Any]:
        """An op's argument as recorded, and what the op's output shapes depend on in it.
        (A method, not a recursive closure: a closure cycle would keep the op's tensors alive
        until a garbage collection, and one collected later loses its Python attributes.)"""
        kind = type(a)
        if kind is not SalusTensor and isinstance(a, torch.Tensor):
            if not isinstance(a, SalusTensor):
                a = self._wrap_host(a)  # a host tensor given to a device op
            kind = SalusTensor
        if kind is SalusTensor:  # (used by _record once all its tensors are known)
            tensors.append(a)
            return _Ref(a._uid), a._key
        if kind is list or kind is tuple:
            if all(type(e) is int for e in a):  # sizes, strides, dims
                return kind(a), tuple(a)
            parts = [self._scan(e, tensors, lift) for e in a]
            return kind(p[0] for p in parts), tuple(p[1] for p in parts)
        return a, (float if lift is not None and kind is float else a)

    def _host_values(self, tensors: list[SalusTensor], first_untouched: bool) -> bool:
        """Whether each tensor's host value is its value (nothing recorded writes it), and the
        first one's is not read by the recording either (an op may write into it)."""
        seg = self._seg
        for t in tensors:
            if t._loc.host is None or t._uid in seg.mutated or \
                    seg.by_loc.get(id(t._loc), t._uid) in seg.mutated:
                return False
        t = tensors[0]
        return not first_untouched or (t._uid not in seg.refs and id(t._loc) not in seg.by_loc)

    def _on_host_values(self, func: Any, args: tuple, kwargs: dict,
                        tensors: list[SalusTensor], odd: str) -> Any:
        """Note [Host dtypes]: `func`, which takes or makes (`odd`) a tensor of a dtype the
        engine lacks, or writes in place into a host value (`odd` empty), run on the host
        values of its tensors: values the device computes are read first."""
        written = _writes(func)
        for t in tensors:
            if odd and t.requires_grad:
                raise RuntimeError(
                    f"salus device: {func} {odd} tensor from one that requires grad; the "
                    "engine trains in float32 (a model in half or double precision is not "
                    "supported, and torch.autocast on the device keeps float32): detach it, "
                    "or read it with .item(), first")
            if _is_written(t, args, kwargs, written) and not self._host_values([t], True):
                raise RuntimeError(
                    f"salus device: {func} {odd} tensor and writes into one the device "
                    "computes; the engine computes in float32, int64 and bool: convert it "
                    "(.float(), .long()) first")
        values = {id(t): t._loc.host if self._host_values([t], False) else self.host_value(t)
                  for t in tensors}  # (a read flushes the recording, as .item() does)
        if self._inflight is not None and \
                any(id(t._loc) in self._inflight.fed for t in tensors):
            self._settle()  # the iteration in flight may still be reading a value written here
        by_host = {id(values[id(t)]): t for t in tensors}
        host_args, host_kwargs = pytree.tree_map(
            lambda a: values[id(a)] if isinstance(a, SalusTensor) else _to_device(a, "cpu"),
            (args, kwargs))
        out = _host_copy(*host_args) if func is aten.copy_.default and not host_kwargs \
            else None
        if out is None:
            out = func(*host_args, **host_kwargs)

        def wrap(h: Any) -> Any:
            if not isinstance(h, torch.Tensor):
                return h
            same = by_host.get(id(h))  # an in-place op or out= returns its argument
            return same if same is not None else SalusTensor(_meta_of(h), _Loc(h))

        return pytree.tree_map(wrap, out)

    def _wrap_host(self, a: torch.Tensor) -> SalusTensor:
        """A host tensor given to a device op, as an input of the segment (once per value)."""
        seg = self._seg
        key = (id(a), a._version)
        if key not in seg.wrapped:
            seg.wrapped[key] = (a, SalusTensor(_meta_of(a), _Loc(a.detach().clone())))
        return seg.wrapped[key][1]

    def _use(self, t: SalusTensor) -> None:
        seg = self._seg
        try:
            if t._uid in seg.refs:
                return
        except AttributeError:
            raise RuntimeError(
                "salus device: a tensor lost its identity (it was freed by Python's cycle "
                "collector while autograd still held it); keep device tensors out of "
                "reference cycles") from None
        seg.refs[t._uid] = weakref.ref(t)
        seg.pos[t._uid] = len(seg.order)
        seg.order.append(t._uid)
        seg.metas[t._uid] = t._meta
        if t._loc.known():
            first = seg.by_loc.setdefault(id(t._loc), t._uid)
            if first != t._uid:  # Note [Shared locations]
                seg.alias[t._uid] = first
            else:
                seg.inputs[t._uid] = t._loc
        elif t._loc.remat is not None:  # recorded again, as the producer of this tensor
            r = t._loc.remat
            if r.seg is not seg:
                self._record(r.func, r.args, r.kwargs)
                r.seg, r.op = seg, seg.ops[-1]
            k = r.index[t._uid]
            r.op.outs[k] = t._uid
            seg.producer[t._uid] = (r.op, k)

    # ---- values on the host ----

    def host_value(self, t: SalusTensor) -> torch.Tensor:
        """The value of `t` on the host (flushing what it depends on first)."""
        with self._lock:
            if t._loc.remat is not None and not t._loc.known():
                never = _REMAT[t._loc.remat.func][2]
                if never is not None:
                    raise RuntimeError(
                        f"salus device: {never} cannot be read; the engine does not compute "
                        "them (only the backward uses them, and it finds them again)")
                self._use(t)  # a result kept as its recomputation: record that, then run it
                self._seg.wanted.add(t._uid)
            if t._uid in self._seg.refs:
                self.flush()
            loc = t._loc
            if loc.pending:
                self._settle()
            if loc.host is None:
                if loc.graph is None:
                    raise RuntimeError("salus device: a tensor with no value (it was never "
                                       "written, or the flush that made it failed)")
                value = loc.graph.session.read_state([loc.slot])[loc.slot]
                loc.host = torch.from_numpy(np.array(value))
            return loc.host

    # ---- flush ----

    def flush(self) -> None:
        """Runs everything recorded so far as one daemon iteration (Note [The lazy device])."""
        with self._lock:
            seg = self._seg
            if not seg.ops:
                return
            # The state bookkeeping of _flush starts from every earlier flush's end; an error
            # of the iteration in flight is raised here, with this recording still intact.
            self._settle()
            self._seg = _Segment()
            try:
                # A host read flushes from inside __torch_dispatch__, where the dispatch keys
                # that tracing needs are off: trace with the thread's keys as they are outside.
                with torch._C._ForceDispatchKeyGuard(*_BASE_KEYS):
                    self._flush(seg)
            finally:
                del seg  # (freed before the collector runs again, never promoted by it)
                self._resume_collector()

    def _add_op(self, seg: _Segment, op: _Op) -> None:
        """Appends `op` to the recording; its first op pauses the collector (Note [The
        collector paused while recording])."""
        if not seg.ops and not self._collector_paused and gc.isenabled():
            gc.disable()
            self._collector_paused = True
        seg.ops.append(op)

    def _resume_collector(self) -> None:
        if self._collector_paused:
            self._collector_paused = False
            gc.enable()

    def _settle(self) -> None:
        """Waits for the iteration in flight and gives its fetched values to their tensors
        (Note [Flushes in flight]); raises its error, once, if it failed."""
        inflight, self._inflight = self._inflight, None
        if inflight is None:
            return
        try:
            out = inflight.pending.result()
        finally:
            for loc, _, _ in inflight.fills:
                loc.pending = False
        for loc, name, shape in inflight.fills:
            loc.host = torch.from_numpy(out[name]).reshape(shape)

    def _flush(self, seg: _Segment) -> None:
        # (a tensor whose uid changed since, see zeros_on_host, is alive under its new one)
        alive = {u: t for u in seg.order if (t := seg.refs[u]()) is not None and t._uid == u}
        state_in = [u for u in seg.order if u in seg.inputs
                    and (seg.inputs[u].graph is not None or u in seg.mutated)]
        stateful = set(state_in)
        fed = [u for u in seg.order if u in seg.inputs and u not in stateful]
        kept = []
        remats: dict[int, _Remat] = {}
        for u in seg.order:
            if u not in seg.producer or u not in alive:
                continue
            op, k = seg.producer[u]
            remat = _REMAT.get(op.func)
            if remat is not None and k in remat[0] and u not in seg.wanted:
                if id(op) not in remats:
                    remats[id(op)] = self._remat(seg, op)
                r = remats[id(op)]
                if r is not None or remat[2] is not None:
                    if r is None:  # nothing can recompute it, and the engine never computes it
                        r = _Remat(op.func, (), {}, {})
                    r.index[u] = k
                    alive[u]._loc.remat = r
                    continue
            kept.append(u)
        fetch = [u for u in kept if seg.metas[u].numel() <= _FETCH_MAX]
        write = [u for u in kept if seg.metas[u].numel() > _FETCH_MAX]
        slots = state_in + write
        slot_names = [f"s{k}" for k in range(len(slots))]
        input_names = [f"in{k}" for k in range(len(fed))] + \
            [f"x{k}" for k in range(len(seg.scalars))]
        # Note [Plans]: a recording like an earlier one (same ops on the same shapes, the same
        # tensors kept) is the same graph: no tracing, no serializing, no hashing.
        role = dict.fromkeys(state_in, "S") | dict.fromkeys(fed, "F") | \
            dict.fromkeys(write, "W") | dict.fromkeys(fetch, "O")
        # (Each op's entry holds its arguments' shapes, so a tensor's role is all that is left.
        # An entry names its op and shapes by the number of their memo key, so that the key
        # of an encoder step, about 1,200 entries, hashes and compares as small tuples: nested
        # keys made this lookup about 1.5 ms of the flush.)
        key = (tuple(seg.sig), "".join(role.get(u, "-") for u in seg.order),
               tuple(sorted((seg.pos[a], seg.pos[u]) for a, u in seg.alias.items())))
        plan = self._plans.get(key)
        if plan is None:
            traced = self._traced.get(key)
            if traced is None:
                gm = self._trace(seg, state_in, fed, write, fetch)
                self.traces += 1
                graph, outputs, _ = _trace._serialize(gm, slot_names, input_names)
                draws = _trace._number_draws(graph)  # (numbers them in the graph)
                blob = graph.SerializeToString()
                traced = (blob, hashlib.sha256(blob).hexdigest()[:16], outputs, draws)
                self._traced[key] = traced
                if len(self._traced) > _TRACED_MAX:
                    self._traced.popitem(last=False)
                del gm, graph
                self._collect()
            else:
                self._traced.move_to_end(key)
            blob, digest, outputs, draws = traced
            g = self._graphs.get(digest)
            if g is None:
                options = {"name": f"torch:salus-device:{len(self._graphs)}", "job": "torch"}
                options.update(self._session_options)
                session = self.client.create_session(aten_graph=blob, **options)
                g = _Graph(session, digest, blob)
                if session.state == "WAITING":  # Note [A job never waits on itself]
                    for other in list(self._graphs.values()):
                        self._evict(other)
                self._graphs[digest] = g
            plan = self._plans[key] = (g, outputs, draws)
        g, outputs, draws = plan
        feeds: dict[str, np.ndarray] = {}
        for name, u in zip(input_names, fed, strict=False):
            feeds[name] = _numpy(self._input_value(seg, u), name)
        for k, x in enumerate(seg.scalars):
            feeds[f"x{k}"] = np.asarray(x, dtype=np.float32)
        if draws:
            if self._rng_seed is None:
                self._rng_seed = torch.initial_seed()
            feeds["rng"] = np.asarray([self._rng_seed, self._rng_offset], dtype=np.int64)
            self._rng_offset += draws
        # State values not in their slot of this graph's session are written with the run.
        pending: dict[_Graph, list[tuple[str, str]]] = {}
        for name, u in zip(slot_names, state_in, strict=False):
            loc = seg.inputs[u]
            if g.holder(name) is loc:
                continue
            if loc.host is not None:
                feeds[name] = _numpy(self._input_value(seg, u), name)
            else:
                pending.setdefault(loc.graph, []).append((name, loc.slot))
        for other, pairs in pending.items():
            values = other.session.read_state([s for _, s in pairs])
            for name, s in pairs:
                feeds[name] = np.array(values[s])
        # Values in slots this run overwrites that other tensors still hold move to the host.
        moving = {id(seg.inputs[u]) for u in state_in}
        self._move_home(g, [name for name in slot_names
                            if (loc := g.holder(name)) is not None and id(loc) not in moving])
        # A session whose state nothing refers to anymore (the first step's, once its values
        # moved into this one) is closed, so that its memory returns and a FIFO daemon is not
        # left waiting for it.
        for other in [o for o in self._graphs.values() if o is not g and o.occupant]:
            if all(loc is None or id(loc) in moving
                   for loc in map(other.holder, list(other.occupant))):
                self._drop(other)
        fed_locs = {id(loc): loc for u in fed + state_in
                    if (loc := seg.inputs[u]).host is not None}
        pending = g.session.submit(feeds=feeds, fetches=[o for o in outputs if o],
                                   reply_when_fetched=True)
        self.flushes += 1
        for name, u in zip(slot_names, slots, strict=False):
            loc = seg.inputs.get(u)
            t = alive.get(u)
            if loc is None:
                loc = t._loc if t is not None else _Loc()
            loc.host = None if (u in seg.mutated or u in write) else loc.host
            loc.graph, loc.slot = g, name
            g.occupant[name] = weakref.ref(loc)
            if t is not None:
                t._loc = loc
        fills = []
        for u, name in zip(fetch, outputs, strict=False):
            t = alive[u]
            t._loc = _Loc()
            t._loc.pending = True
            fills.append((t._loc, name, t.shape))
        self._inflight = _Inflight(pending, fills, fed_locs)

    def _collect(self) -> None:
        """Note [Collections after a trace]: tracing leaves tens of thousands of objects in
        reference cycles (fake tensors, FX graphs). They are collected here, inside a flush
        that already took a trace's time, rather than by a full collection that Python would
        start in some later step (about 150 ms on the development VM, in an encoder step of
        15 ms). A job whose graphs keep changing (a mask's count, Note [Values that give
        shapes]) traces in many steps: it collects only when the time since its last
        collection is at least 20 times what that one took, so the collections cost it at
        most about 5%, and Python's own collector still runs as it would."""
        start = time.perf_counter()
        if start - self._collected_at < 20 * self._collect_cost:
            return
        gc.collect()
        self._collected_at = time.perf_counter()
        self._collect_cost = self._collected_at - start

    def _evict(self, g: _Graph) -> None:
        """Moves the values `g`'s session holds that tensors still refer to onto the host and
        closes it (Note [A job never waits on itself])."""
        if not self._evicted:
            self._evicted = True
            warnings.warn(
                "salus device: the daemon queued a session of this job (the arena has no "
                "room for it beside the job's other sessions, or another job holds the "
                "device); the job's other sessions close, their state moved to the host, and "
                "are made again when next needed. Each switch between graphs pays that while "
                "the arena stays this full.", stacklevel=2)
        self._move_home(g, [name for name in list(g.occupant) if g.holder(name) is not None])
        self._drop(g)

    @staticmethod
    def _move_home(g: _Graph, slots: list[str]) -> None:
        """The values in `g`'s `slots` (each held by a location) become host values: those
        with no host copy yet are read, in one request, and each location leaves its slot."""
        locs = {name: g.holder(name) for name in slots}
        unread = [name for name, loc in locs.items() if loc.host is None]
        values = g.session.read_state(unread) if unread else {}
        for name, loc in locs.items():
            if loc.host is None:
                loc.host = torch.from_numpy(np.array(values[name]))
            loc.graph, loc.slot = None, ""

    def _drop(self, g: _Graph) -> None:
        del self._graphs[g.digest]
        for key in [k for k, plan in self._plans.items() if plan[0] is g]:
            del self._plans[key]
        try:
            g.session.close()
        except salus.SalusError:
            pass

    @staticmethod
    def _remat(seg: _Segment, op: _Op) -> _Remat | None:
        """How to record `op` again later, or None when an input of it is gone."""
        gone = []

        def obj(a: Any) -> Any:
            if isinstance(a, _Ref):
                t = seg.refs[a.uid]()
                if t is None:
                    gone.append(a.uid)
                return t
            return a

        args, kwargs = _map(obj, op.args), _map(obj, op.kwargs)
        if gone:
            return None
        args = list(args)
        for i, v in _REMAT[op.func][1].items():
            args[i] = v
        return _Remat(op.func, tuple(args), kwargs, {})

    def _input_value(self, seg: _Segment, u: int) -> torch.Tensor:
        return seg.inputs[u].host

    def _trace(self, seg: _Segment, state_in: list[int], fed: list[int], write: list[int],
               fetch: list[int]) -> torch.fx.GraphModule:
        def replay(state: list[torch.Tensor], inputs: list[torch.Tensor]) -> list[torch.Tensor]:
            env: dict[int, torch.Tensor] = {}
            env.update(zip(state_in, state[:len(state_in)], strict=False))
            env.update(zip(fed, inputs[:len(fed)], strict=False))
            for a, u in seg.alias.items():
                env[a] = env[u]
            scalars = inputs[len(fed):]
            for op in seg.ops:
                def value(a: Any) -> Any:
                    if isinstance(a, _Ref):
                        return env[a.uid]
                    if isinstance(a, _Scalar):
                        return scalars[a.index]
                    return _to_device(a, "cpu")

                args, kwargs = pytree.tree_map(value, (op.args, op.kwargs))
                if op.lifted:
                    result = _lifted_call(op.func, args, kwargs)
                else:
                    result = op.func(*args, **kwargs)
                for u, r in zip(op.outs, pytree.tree_leaves(result), strict=False):
                    if u is not None:
                        env[u] = r
            for u, s in zip(write, state[len(state_in):], strict=False):
                s.copy_(env[u])
            return [env[u] for u in fetch]

        def example(u: int) -> torch.Tensor:
            m = seg.metas[u]
            return torch.zeros(m.shape, dtype=m.dtype)

        state_ex = [example(u) for u in state_in + write]
        input_ex = [example(u) for u in fed] + \
            [torch.zeros((), dtype=torch.float32) for _ in seg.scalars]
        with torch.no_grad(), \
                torch.nn.attention.sdpa_kernel(torch.nn.attention.SDPBackend.MATH):
            joint = make_fx(replay, decomposition_table=_decompositions(),
                            tracing_mode="fake")(state_ex, input_ex)
            pure = make_fx(torch.func.functionalize(joint, remove="mutations_and_views"),
                           tracing_mode="fake")(state_ex, input_ex)
        pure.graph.eliminate_dead_code()
        return pure

    def zeros_on_host(self, t: SalusTensor) -> None:
        """Makes `t`, just made by zeros_like in this segment, a host value of zeros instead, so
        that the graph takes it as state (Note [Fused updates])."""
        with self._lock:
            made = self._seg.producer.get(t._uid)
            if made is not None and made[0].func is aten.zeros_like.default:
                t._uid = next(_uids)
                t._loc = _Loc(torch.zeros(t.shape, dtype=t.dtype))

    def manual_seed(self, seed: int) -> None:
        """Reseeds the device's draws (torch.manual_seed calls this): draws recorded before
        keep the old seed, later ones use (seed, 0), (seed, 1)... as on a fresh device."""
        with self._lock:
            self.flush()
            self._rng_seed, self._rng_offset = int(seed), 0

    # ---- lifetime ----

    def close(self) -> None:
        """Closes the device's sessions and its connection; its tensors lose their values."""
        with self._lock:
            try:
                self._settle()
            except salus.SalusError:
                pass
            for g in self._graphs.values():
                try:
                    g.session.close()
                except salus.SalusError:
                    pass
            self._graphs.clear()
            self._plans.clear()
            self._seg = _Segment()  # (a recording never flushed: its values are gone too)
            self._resume_collector()
            if self._client is not None:
                self._client.close()
                self._client = None

    def set_session_options(self, **options: Any) -> None:
        """Options of Client.create_session for the sessions made from now on (priority,
        latency_class, iterations, device, convolution_transforms, name...)."""
        with self._lock:
            self._session_options = dict(options)

    @property
    def in_flight(self) -> int:
        """How many flushed iterations the device has not yet waited for (0 or 1)."""
        return 0 if self._inflight is None else 1

    @property
    def sessions(self) -> list[salus.Session]:
        return [g.session for g in self._graphs.values()]

    @property
    def graphs(self) -> list[bytes]:
        """The serialized graphs of the open sessions, oldest first."""
        return [g.graph for g in self._graphs.values()]


def _map(fn: Any, x: Any) -> Any:
    """`fn` over the leaves of an op's arguments (tuples, lists and dicts of them)."""
    if type(x) is tuple or type(x) is list:
        return type(x)(_map(fn, e) for e in x)
    if type(x) is dict:
        return {k: _map(fn, v) for k, v in x.items()}
    return fn(x)


_COMPOSITE: dict[int, bool] = {}


def _composite(func: Any) -> bool:
    c = _COMPOSITE.get(id(func))
    if c is None:
        c = _COMPOSITE[id(func)] = torch._C._dispatch_has_kernel_for_dispatch_key(
            func.name(), "CompositeImplicitAutograd")
    return c


_dynamo_skips = False  # whether the package is on Dynamo's skip list: Note [Compiled models]


# Note [Compiled models]
# `model = torch.compile(model)` (a default in many training scripts) runs uncompiled on the
# device: the device already records each step into one graph that the daemon compiles once.
# Dynamo, turning a frame into a graph, rebuilds a subclass argument from its parts; the
# device's tensors refuse with SkipFrame, so Dynamo runs that frame (and, once it has failed
# so, every later call of it) as plain Python, and the recorder's own code is put on Dynamo's
# skip list so that Dynamo never traces the recording itself. A compiled model's steps then
# cost what an uncompiled one's do and give the same results.
def _has_generator(args: tuple, kwargs: dict) -> bool:
    return any(isinstance(a, torch.Generator) for a in (*args, *kwargs.values()))


def _odd_dtype(template: Any) -> str | None:
    """The reason an op runs on the host, "makes a <dtype>", when one of its new outputs has a
    dtype the engine lacks (Note [Host dtypes]); None otherwise."""
    odd = []

    def leaf(m: Any) -> None:
        if type(m) is tuple and m[0] == "new" and m[1].dtype not in _ENGINE_DTYPES:
            odd.append(m[1].dtype)
    _map_out(leaf, template)
    return f"makes a {odd[0]}" if odd else None


def _is_written(t: SalusTensor, args: tuple, kwargs: dict,
                written: tuple[tuple[int, str], ...]) -> bool:
    """Whether `t` is an argument that an op writing `written` writes."""
    return any((args[i] if i < len(args) else kwargs.get(name)) is t for i, name in written)


# Note [Known ops]
# Most ops a step records take only tensors, numbers and lists of ints (sizes, dims) or bools
# (output masks) as positional arguments, write nothing and make new tensors (or None where an
# output mask leaves a gradient out): views, matmuls, elementwise ops and their gradients, the
# convolution and BatchNorm backwards, most of the ops of a step. Once _record has seen such an
# op on given shapes, its memo entry says so, and later calls are recorded from the entry
# directly (_record_known): the same op, arguments, outputs and plan-key entry, without the
# general scan, the checks the entry already answered, and the template walk. Keywords may be
# plain values and memory formats (`.contiguous()` is `clone(memory_format=...)`, about 20 per
# encoder step); a layout hint that the general path rewrites (channels_last) finds no entry
# under its own value. Anything else (tensors or devices as keywords, lifted scalars, writes,
# host dtypes, host copies, lists of tensors) takes the general path.
_PLAIN = frozenset({int, float, bool, type(None), str, torch.dtype})
_PLAIN_KEYWORDS = _PLAIN | {torch.memory_format}


def _plain_keywords(kwargs: dict) -> bool:
    """Whether every keyword of a call is a plain value (Note [Known ops])."""
    for v in kwargs.values():
        if type(v) not in _PLAIN_KEYWORDS:
            return False
    return True


_KNOWABLE: dict[int, bool] = {}


def _knowable(func: Any) -> bool:
    """Whether `func` may be a known op on some shapes: it writes nothing (undeclared writes
    included), is no host copy and lifts no scalars."""
    knowable = _KNOWABLE.get(id(func))
    if knowable is None:
        knowable = _KNOWABLE[id(func)] = not (
            _writes(func) or func is aten.native_batch_norm.default or func in _HOST_COPIES
            or id(func) in _LIFT_IDS)
    return knowable


def _known(func: Any, template: Any) -> bool:
    """Whether calls of `func` with this output template may be recorded by _record_known:
    _knowable, and it makes only new tensors (None where an output mask leaves one out)."""
    if not _knowable(func):
        return False
    if type(template) is tuple and template and template[0] == "new":
        return True
    return type(template) in (tuple, list) and len(template) > 0 and all(
        m is None or (type(m) is tuple and len(m) == 2 and m[0] == "new") for m in template)


def _gone() -> None:
    """The weak reference of a recorded value that no tensor holds."""
    return None


def _is_leaf(x: tuple) -> bool:
    """Whether a template entry is ("arg", k), ("new", meta) or ("reshaped", k, meta)."""
    return (len(x) == 2 and (x[0] == "arg" or x[0] == "new")) or \
        (len(x) == 3 and x[0] == "reshaped")


def _map_out(fn: Any, x: Any) -> Any:
    """`fn` over an output template, whose leaves _is_leaf names."""
    if type(x) is tuple and not _is_leaf(x) or type(x) is list:
        return type(x)(_map_out(fn, e) for e in x)
    return fn(x)


# Note [Reshaped in place]
# A few in-place ops change their argument's shape or strides rather than its values
# (`transpose_`, `t_`, `unsqueeze_`, `squeeze_`; `nn.GRU` with batch_first=True ends with
# `output.transpose_(0, 1)`). Their template says so. Such an op is recorded as its functional
# form (`transpose`), whose result the tensor then holds: it takes a new uid produced by that
# op (as zeros_on_host does), and its new geometry, as a new meta and key here and as the
# wrapper's own sizes and strides through the extension, since autograd and every later op
# read them. Its old value stays what it was, for whatever read it before.
def _reshapes(template: Any) -> bool:
    """Whether an op's output template has a ("reshaped", k, meta) leaf."""
    if type(template) is tuple and _is_leaf(template):
        return template[0] == "reshaped"
    if type(template) in (tuple, list):
        return any(_reshapes(e) for e in template)
    return False


def _functional_of(func: Any) -> Any:
    """transpose_.int -> transpose.int: the out-of-place op of an in-place reshaping op."""
    packet = func._schema.name.split("::")[-1]
    functional = getattr(aten, packet[:-1], None) if packet.endswith("_") else None
    # The overload whose arguments are the same (transpose_.default is transpose.int).
    want = [(a.name, str(a.type)) for a in func._schema.arguments]
    out = None
    for name in functional.overloads() if functional is not None else ():
        candidate = getattr(functional, name)
        if [(a.name, str(a.type)) for a in candidate._schema.arguments] == want:
            out = candidate
            break
    if out is None:
        raise RuntimeError(f"salus device: {func} changes a tensor's shape in place and has no "
                           "out-of-place form the device can record instead")
    return out


def _key_of(meta: torch.Tensor) -> tuple:
    """A tensor's _key (what an op's output shapes depend on in it) from its meta."""
    return (meta.dtype, meta.shape, meta.stride(), meta.storage_offset())


def _set_geometry(t: SalusTensor, meta: torch.Tensor) -> None:
    t._meta = _meta_of(meta)
    t._key = _key_of(t._meta)
    _extension.set_geometry(t, list(meta.shape), list(meta.stride()), meta.storage_offset())


_WRITES: dict[Any, tuple[tuple[int, str], ...]] = {}


def _writes(func: Any) -> tuple[tuple[int, str], ...]:
    """The arguments `func` writes, as (position, name)."""
    w = _WRITES.get(func)
    if w is None:
        w = _WRITES[func] = tuple(
            (i, a.name) for i, a in enumerate(func._schema.arguments)
            if a.alias_info is not None and a.alias_info.is_write)
    return w


def _canon(x: Any, pos: dict[int, int]) -> Any:
    if isinstance(x, _Ref):
        return ("r", pos[x.uid])
    if isinstance(x, _Scalar):
        return ("s",)
    if isinstance(x, list | tuple):
        return tuple(_canon(e, pos) for e in x)
    if isinstance(x, dict):
        return tuple((k, _canon(v, pos)) for k, v in x.items())
    return x


def _lifted_call(func: Any, args: tuple, kwargs: dict) -> Any:
    """Calls `func` whose lifted scalars are now 0-d tensors (Note [Lifted scalars]): the same
    arithmetic through overloads, or short expansions, that take tensors."""
    schema = func._schema
    given = dict(zip([a.name for a in schema.arguments], args, strict=False))
    given.update(kwargs)
    name = schema.name.removeprefix("aten::")
    inplace = name.endswith("_")
    base = name.rstrip("_")
    packet = getattr(aten, name)
    x = given["self"]
    if base in ("add", "sub", "mul", "div"):
        other = given["other"]
        alpha = given.get("alpha", 1)
        if isinstance(alpha, torch.Tensor) or alpha != 1:
            other = torch.mul(other, alpha)
        if base == "div" and "rounding_mode" in given:
            return packet.Tensor_mode(x, other, rounding_mode=given["rounding_mode"])
        return packet.Tensor(x, other)
    if base in ("addcmul", "addcdiv"):
        t1, t2 = given["tensor1"], given["tensor2"]
        term = torch.mul(torch.mul(t1, t2) if base == "addcmul" else torch.div(t1, t2),
                         given["value"])
        return x.add_(term) if inplace else torch.add(x, term)
    if base == "lerp":
        return packet.Tensor(x, given["end"], given["weight"])
    raise AssertionError(f"no lifted form of {func}")


def _native_dropout(x: torch.Tensor, p: float, train: bool | None
                    ) -> tuple[torch.Tensor, torch.Tensor]:
    """Dropout as PyTorch computes it on the CPU (Bernoulli noise scaled by 1/(1-p)); on a
    PrivateUse1 device PyTorch calls native_dropout instead, which the importer does not take.
    The draws are the daemon's (Note [Random numbers])."""
    if not train or p == 0:
        return x.clone(), torch.ones_like(x, dtype=torch.bool)
    if p == 1:
        return torch.zeros_like(x), torch.zeros_like(x, dtype=torch.bool)
    noise = torch.empty(x.shape, dtype=x.dtype).bernoulli_(1 - p)
    return x * noise.div_(1 - p), noise != 0


def _decompositions() -> dict:
    table = _trace._decompositions()
    table[aten.native_dropout.default] = _native_dropout
    return table


def _to_host(kwargs: dict) -> bool:
    d = kwargs.get("device")
    return d is not None and torch.device(d).type == "cpu"


# ---- registration ----

_runtime: Runtime | None = None
_extension: Any = None
_registered = False


def runtime() -> Runtime:
    """The process's salus device (its connection: salus.default_endpoint())."""
    global _runtime
    if _runtime is None:
        _runtime = Runtime(os.environ.get("SALUS_ENDPOINT"))
    return _runtime


def set_session_options(**options: Any) -> None:
    """Options of `salus.Client.create_session` for the daemon sessions the device makes from
    now on, one per graph: `priority`, `latency_class="interactive"` (a lane of its own),
    `device`, `convolution_transforms=True` (on a GPU)... Call it before the first step."""
    runtime().set_session_options(**options)


def flush() -> None:
    """Runs what the device has recorded so far (the optimizer step does this by itself)."""
    if _runtime is not None:
        _runtime.flush()


def close() -> None:
    """Closes the device's daemon sessions; later use starts afresh."""
    global _runtime
    if _runtime is not None:
        _runtime.close()
        _runtime = None


def _load_extension() -> None:
    global _extension
    if _extension is not None:
        return
    from torch.utils.cpp_extension import load
    src = os.path.join(os.path.dirname(__file__), "csrc", "device.cc")
    _extension = load("salus_torch_device", [src], verbose=False)


def _empty_strided(size: list[int], stride: list[int], dtype: torch.dtype | None = None,
                   layout: Any = None, device: Any = None, pin_memory: Any = None
                   ) -> SalusTensor:
    # (Contiguous whatever the strides asked: the device keeps no layouts, see _record's
    # memory_format. PyTorch asks for channels-last strides moving a model so converted.)
    host = torch.empty(size, dtype=dtype)
    return SalusTensor(_meta_of(host), _Loc(host))


def _empty(size: list[int], dtype: torch.dtype | None = None, layout: Any = None,
           device: Any = None, pin_memory: Any = None, memory_format: Any = None
           ) -> SalusTensor:
    host = torch.empty(size, dtype=dtype)  # (contiguous: see _empty_strided)
    return SalusTensor(_meta_of(host), _Loc(host))


def _copy_from(src: torch.Tensor, dst: torch.Tensor, non_blocking: bool = False) -> torch.Tensor:
    """copy_ between the host and the device where Python dispatch is off: torch.tensor(data,
    device="salus"), new_tensor and as_tensor copy their host tensor in that way."""
    runtime().dispatch(aten.copy_.default, (dst, src), {})
    return dst


# Note [Host copies in one thread]
# A batch moved to the device (`x.to("salus")`) is copied into its host value, once per step.
# PyTorch copies a large tensor with its intra-op threads, and after that parallel region
# OpenMP's worker spins, waiting for more work, for milliseconds: measured on the 2-core VM,
# about 9 ms of a core per CNN step in a process that computes nothing else, taken from the
# daemon's threads when its run overlaps the next step's recording, and from other jobs on a
# shared host. The copy is a memcpy, done in this thread (numpy's copy); a copy numpy cannot
# make (a dtype it lacks, shapes that broadcast) stays PyTorch's.
def _host_copy(dst: torch.Tensor, src: torch.Tensor, non_blocking: bool = False
               ) -> torch.Tensor | None:
    """copy_ between host tensors of one dtype and shape, in this thread (Note [Host copies in
    one thread]); None where it is not such a copy."""
    if type(dst) is not torch.Tensor or type(src) is not torch.Tensor or \
            dst.dtype != src.dtype or dst.shape != src.shape or dst.dtype not in _NUMPY_DTYPES \
            or dst.is_neg() or src.is_neg():  # (real dtypes: no conjugate bit to resolve)
        return None
    np.copyto(dst.detach().numpy(), src.detach().numpy())
    return dst


_NUMPY_DTYPES = frozenset({torch.float32, torch.float64, torch.int64, torch.int32,
                           torch.int16, torch.int8, torch.uint8, torch.bool})


# Note [Fused updates]
# On the device, PyTorch's optimizers take their single-tensor path (a tensor subclass is not
# a foreach type), a chain of elementwise ops per parameter. For SGD with momentum, Adam and
# AdamW the device replaces that path, for salus tensors only, by one salus::sgd_update or
# salus::adam_update per parameter: the same custom ops `capture_step` traces, which the
# importer runs as the engine's fused in-place update kernels. The arithmetic is torch.optim's
# (optim.py); a momentum buffer starts as zeros, which gives torch's first step exactly. Adam's
# step count stays where torch.optim keeps it (a host tensor, in optimizer.state) and is
# mirrored by a device tensor that the update advances in the graph; the mirror is remade
# whenever the host count is not the one it last saw (a loaded state_dict). Any other setting
# (dampening, maximize, amsgrad, capturable...) runs torch's own path.
#
# The host counts advance in one `_foreach_add_`, and a count whose version is the one its
# mirror last saw is not read again. Mirrors are found by the count's id: a WeakKeyDictionary
# compares a tensor key with `==`, an elementwise op and a read, at every lookup. Together
# these took the recording of the encoder's Adam update (28 parameters) from 1.48-1.68 to
# 1.29-1.48 ms (medians of 190 steps, three runs each, alternated, development VM).
_steps: dict[int, _StepMirror] = {}


@dataclass(eq=False)
class _StepMirror:
    """The device mirror of one host step count (Note [Fused updates])."""

    count: weakref.ref  # the host count
    mirror: SalusTensor
    value: float  # what the mirror holds after the updates recorded so far
    version: int = -1  # the host count's _version once it was advanced to `value`


def _step_mirror(host_step: torch.Tensor) -> _StepMirror:
    key = id(host_step)
    m = _steps.get(key)
    if m is not None and m.count() is host_step and \
            (host_step._version == m.version or float(host_step) == m.value):
        return m
    value = float(host_step)
    m = _steps[key] = _StepMirror(
        weakref.ref(host_step, lambda _, k=key: _steps.pop(k, None)),
        torch.tensor(value, dtype=torch.float32).to(NAME), value)
    return m


_SGD_UPDATE: Any = None
_ADAM_UPDATE: Any = None


def _fused_sgd(original: Any) -> Any:
    def single_tensor_sgd(params: list, grads: list, momentum_buffer_list: list,
                          grad_scale: Any = None, found_inf: Any = None, **kw: Any) -> None:
        if not params or not isinstance(params[0], SalusTensor) or kw["momentum"] == 0 or \
                kw["dampening"] != 0 or kw["maximize"] or grad_scale is not None or \
                found_inf is not None or isinstance(kw["lr"], torch.Tensor):
            return original(params, grads, momentum_buffer_list, grad_scale, found_inf, **kw)
        lr = torch.tensor(float(kw["lr"]), dtype=torch.float32)
        rt = runtime()
        with rt._lock:
            for i, (p, g) in enumerate(zip(params, grads, strict=True)):
                buf = momentum_buffer_list[i]
                if buf is None:
                    buf = momentum_buffer_list[i] = torch.zeros_like(p)
                    rt.zeros_on_host(buf)
                rt._record_update(
                    _SGD_UPDATE, (p, g, buf, lr, kw["momentum"], kw["weight_decay"],
                                  kw["nesterov"]), (p, buf))
        return None
    return single_tensor_sgd


def _fused_adam(original: Any, decoupled: bool) -> Any:
    def single_tensor_adam(params: list, grads: list, exp_avgs: list, exp_avg_sqs: list,
                           max_exp_avg_sqs: list, state_steps: list, grad_scale: Any = None,
                           found_inf: Any = None, **kw: Any) -> None:
        if not params or not isinstance(params[0], SalusTensor) or kw["amsgrad"] or \
                kw["maximize"] or kw["capturable"] or kw["differentiable"] or \
                kw.get("has_complex", False) or grad_scale is not None or found_inf is not None or \
                isinstance(kw["lr"], torch.Tensor) or \
                any(isinstance(s, SalusTensor) for s in state_steps):
            return original(params, grads, exp_avgs, exp_avg_sqs, max_exp_avg_sqs, state_steps,
                            grad_scale, found_inf, **kw)
        lr = torch.tensor(float(kw["lr"]), dtype=torch.float32)
        # Later torch versions run AdamW as Adam with decoupled_weight_decay=True.
        decoupled_now = decoupled or bool(kw.get("decoupled_weight_decay", False))
        rt = runtime()
        with rt._lock:
            mirrors = []
            for p, g, m, v, host_step in zip(params, grads, exp_avgs, exp_avg_sqs, state_steps,
                                             strict=True):
                rt.zeros_on_host(m)
                rt.zeros_on_host(v)
                step = _step_mirror(host_step)
                rt._record_update(
                    _ADAM_UPDATE, (p, g, m, v, step.mirror, lr, kw["beta1"], kw["beta2"],
                                   kw["eps"], kw["weight_decay"], decoupled_now),
                    (p, m, v, step.mirror))
                step.value += 1.0
                mirrors.append(step)
            torch._foreach_add_(state_steps, 1)
            for step, host_step in zip(mirrors, state_steps, strict=True):
                step.version = host_step._version
        return None
    return single_tensor_adam


def _write(rt: Runtime, dst: SalusTensor, src: SalusTensor) -> None:
    """`dst.copy_(src)` recorded directly, `dst` being in the recording already (the update
    read it): what the dispatcher would hand to __torch_dispatch__, less its layers above it
    (the version counter it bumps, bumped here)."""
    rt._record_copy(dst, src)
    torch.autograd.graph.increment_version(dst)


# Note [Self-attention in fewer ops]
# nn.MultiheadAttention's functional form (torch.nn.functional.multi_head_attention_forward)
# reshapes its packed projection for each of q, k and v apart: an unflatten, an unsqueeze, a
# transpose, a squeeze and a copy, three selects, a view and a transpose each, a view each for
# the attention, and a permute and a copy after it; backward, as many again, the copies become
# reshapes of strided gradients (clone and _unsafe_view each) and the selects' gradients are
# summed. That is about 56 ops per layer, over half of the encoder's calls into the device. For
# device tensors, self-attention (query, key and value one tensor) with a packed projection, no
# extra key or value biases and no dropout while training, and no weights asked for, runs as
# the same arithmetic in fewer ops: one view of the projection as (tokens, batch, 3, heads,
# head size), one permute, one unbind into q, k and v, the attention, and a permute and a view
# of its output (a view: the fused attention's output is contiguous in token, head and feature
# order) into the output projection (Note [Fused linear] in csrc/device.cc takes the strided
# input). A padding mask (batch, tokens) and a square attention mask are merged as PyTorch's
# function merges them (-inf where a bool mask is set, summed) into one mask the attention
# broadcasts over heads (and queries). Other calls (the causal hint, other mask shapes), and
# host tensors, run PyTorch's own function.
# The function is TorchScript-compilable, as PyTorch's is, so that a MultiheadAttention still
# scripts in a process that imported the device: scripted, it is PyTorch's own.
def _multi_head_attention_forward(
        query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, embed_dim_to_check: int,
        num_heads: int, in_proj_weight: torch.Tensor | None, in_proj_bias: torch.Tensor | None,
        bias_k: torch.Tensor | None, bias_v: torch.Tensor | None, add_zero_attn: bool,
        dropout_p: float, out_proj_weight: torch.Tensor, out_proj_bias: torch.Tensor | None,
        training: bool = True, key_padding_mask: torch.Tensor | None = None,
        need_weights: bool = True, attn_mask: torch.Tensor | None = None,
        use_separate_proj_weight: bool = False, q_proj_weight: torch.Tensor | None = None,
        k_proj_weight: torch.Tensor | None = None, v_proj_weight: torch.Tensor | None = None,
        static_k: torch.Tensor | None = None, static_v: torch.Tensor | None = None,
        average_attn_weights: bool = True, is_causal: bool = False
        ) -> tuple[torch.Tensor, torch.Tensor | None]:
    if not torch.jit.is_scripting():  # (a branch TorchScript leaves out)
        if _fewer_ops(query, key, value, embed_dim_to_check, num_heads, in_proj_weight,
                      bias_k, bias_v, add_zero_attn, dropout_p, training, key_padding_mask,
                      need_weights, attn_mask, use_separate_proj_weight, static_k, static_v,
                      is_causal):
            tokens, batch, width = query.shape
            proj = torch.nn.functional.linear(query, in_proj_weight, in_proj_bias)
            q, k, v = proj.view(tokens, batch, 3, num_heads, width // num_heads) \
                .permute(2, 1, 3, 0, 4).unbind(0)
            mask = None  # (as PyTorch's function merges them: -inf where a bool mask is set)
            if key_padding_mask is not None:
                mask = torch.nn.functional._canonical_mask(
                    mask=key_padding_mask, mask_name="key_padding_mask",
                    other_type=torch.nn.functional._none_or_dtype(attn_mask),
                    other_name="attn_mask", target_type=query.dtype).view(batch, 1, 1, tokens)
            if attn_mask is not None:
                square = torch.nn.functional._canonical_mask(
                    mask=attn_mask, mask_name="attn_mask", other_type=None, other_name="",
                    target_type=query.dtype, check_other=False)
                mask = square if mask is None else mask + square
            out = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask)
            out = out.permute(2, 0, 1, 3).flatten(2)
            return torch.nn.functional.linear(out, out_proj_weight, out_proj_bias), None
    return _MHA_FORWARD(query, key, value, embed_dim_to_check, num_heads, in_proj_weight,
                        in_proj_bias, bias_k, bias_v, add_zero_attn, dropout_p,
                        out_proj_weight, out_proj_bias, training, key_padding_mask,
                        need_weights, attn_mask, use_separate_proj_weight, q_proj_weight,
                        k_proj_weight, v_proj_weight, static_k, static_v,
                        average_attn_weights, is_causal)


def _fewer_ops(query: Any, key: Any, value: Any, embed_dim: int, num_heads: int,
               in_proj_weight: Any, bias_k: Any, bias_v: Any, add_zero_attn: bool,
               dropout_p: float, training: bool, key_padding_mask: Any, need_weights: bool,
               attn_mask: Any, use_separate_proj_weight: bool, static_k: Any, static_v: Any,
               is_causal: bool) -> bool:
    """Whether Note [Self-attention in fewer ops] takes this call."""
    if type(query) is not SalusTensor or query.dim() != 3:
        return False
    tokens, batch = query.shape[0], query.shape[1]
    return query is key and key is value and not need_weights and \
        (key_padding_mask is None or tuple(key_padding_mask.shape) == (batch, tokens)) and \
        (attn_mask is None or tuple(attn_mask.shape) == (tokens, tokens)) and \
        not is_causal and not use_separate_proj_weight and \
        bias_k is None and bias_v is None and not add_zero_attn and static_k is None and \
        static_v is None and (dropout_p == 0.0 or not training) and \
        in_proj_weight is not None and query.shape[2] == embed_dim and \
        embed_dim % num_heads == 0


_MHA_FORWARD = torch.nn.functional.multi_head_attention_forward  # PyTorch's own


def _install_fused_updates() -> None:
    global _SGD_UPDATE, _ADAM_UPDATE
    import torch.optim.adam as adam
    import torch.optim.adamw as adamw
    import torch.optim.sgd as sgd

    from . import optim  # noqa: F401  (defines the salus:: update ops)
    _SGD_UPDATE = torch.ops.salus.sgd_update.default
    _ADAM_UPDATE = torch.ops.salus.adam_update.default
    sgd._single_tensor_sgd = _fused_sgd(sgd._single_tensor_sgd)
    adam._single_tensor_adam = _fused_adam(adam._single_tensor_adam, decoupled=False)
    if hasattr(adamw, "_single_tensor_adamw"):  # torch 2.4; later, AdamW runs Adam's
        adamw._single_tensor_adamw = _fused_adam(adamw._single_tensor_adamw, decoupled=True)


def _host_factory(op: Any) -> Any:
    def make(*args: Any, **kwargs: Any) -> SalusTensor:
        host = op(*args, **{**{k: _to_device(v, "cpu") for k, v in kwargs.items()},
                            "device": torch.device("cpu")})
        return SalusTensor(_meta_of(host), _Loc(host))
    return make


def _step_hook(optimizer: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
    for group in optimizer.param_groups:
        for p in group["params"]:
            if isinstance(p, SalusTensor):
                flush()
                return


def register() -> None:
    """Names PrivateUse1 `salus` and installs the device (done by `import salus_torch`)."""
    global _registered, _lib, _DEVICE
    if _registered:
        return
    if torch._C._get_privateuse1_backend_name() != NAME:
        torch.utils.rename_privateuse1_backend(NAME)
    _DEVICE = torch.device(NAME, 0)
    module = types.ModuleType("torch.salus")
    module.is_available = lambda: True
    module.device_count = lambda: 1
    module.current_device = lambda: 0
    module._is_in_bad_fork = lambda: False
    module.manual_seed_all = lambda seed: runtime().manual_seed(seed)
    module.manual_seed = module.manual_seed_all
    module.get_rng_state = lambda device=None: torch.empty(0, dtype=torch.uint8)
    module.set_rng_state = lambda state, device=None: None
    module.synchronize = lambda device=None: flush()
    # Note [Host dtypes]: no half type in the engine, so `torch.autocast("salus", dtype=...)`
    # warns that a half dtype is not supported and leaves the ops in float32, as on a CPU
    # without bfloat16.
    module.get_amp_supported_dtype = lambda: [torch.float32]
    torch._register_device_module(NAME, module)
    # ... and float32 is its autocast dtype, so that code entering the device's autocast state
    # as it stands (activation checkpointing's recompute) does not warn when nothing asked for
    # another dtype.
    torch.set_autocast_dtype(NAME, torch.float32)
    # torch.load(..., map_location="salus"): device tensors are saved as host tensors (see
    # SalusTensor.__reduce_ex__), and are loaded so; load_state_dict puts them on the device.
    torch.serialization.register_package(
        11, lambda storage: None,
        lambda storage, location: storage if location.startswith(NAME) else None)
    _load_extension()  # compiled once per machine and torch version, then cached
    _lib = torch.library.Library("aten", "IMPL")
    _lib.impl("empty_strided", _empty_strided, "PrivateUse1")
    _lib.impl("empty.memory_format", _empty, "PrivateUse1")
    _lib.impl("_copy_from", _copy_from, "PrivateUse1")
    # Factories that fill an out= tensor of another size: made on the host, whole.
    for name in ("arange", "arange.start", "arange.start_step", "linspace", "eye", "eye.m",
                 "randperm", "randperm.generator"):
        packet, _, overload = name.partition(".")
        _lib.impl(name, _host_factory(getattr(getattr(aten, packet), overload or "default")),
                  "PrivateUse1")
    _register_missing_meta(_lib)
    # (above autograd: made of differentiable ops, so autograd records their gradients)
    _lib.impl("_pack_padded_sequence", _pack_padded_sequence, "AutogradPrivateUse1")
    _lib.impl("_ctc_loss.Tensor", _ctc_loss_of_tensors, "AutogradPrivateUse1")
    # In eval under no_grad, nn.TransformerEncoderLayer and nn.MultiheadAttention take a fused
    # "fast path" on any device PyTorch lists, PrivateUse1 included. Its fused ops have no meta
    # kernels, so the device could not record them: the fast path is turned off for the
    # process (elsewhere it only costs inference speed), and the layers run as plain ops.
    torch.backends.mha.set_fastpath_enabled(False)
    from torch.optim.optimizer import register_optimizer_step_post_hook
    register_optimizer_step_post_hook(_step_hook)
    _install_fused_updates()
    # Note [Self-attention in fewer ops]
    _multi_head_attention_forward.__doc__ = _MHA_FORWARD.__doc__
    torch.nn.functional.multi_head_attention_forward = _multi_head_attention_forward
    atexit.register(close)
    _registered = True


_lib: torch.library.Library | None = None


def _gru_cell_meta(input_gates: torch.Tensor, hidden_gates: torch.Tensor, hx: torch.Tensor,
                   input_bias: torch.Tensor | None = None,
                   hidden_bias: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """_thnn_fused_gru_cell's shapes: hy like hx, and a workspace of five [batch, hidden] parts."""
    return hx.new_empty(hx.shape), hx.new_empty((hx.shape[0], 5 * hx.shape[1]))


def _gru_cell_backward_meta(grad_hy: torch.Tensor, workspace: torch.Tensor, has_bias: bool
                            ) -> tuple[torch.Tensor, ...]:
    batch, hidden = grad_hy.shape
    gates = (batch, 3 * hidden)
    bias = (3 * hidden,) if has_bias else (0,)
    return (grad_hy.new_empty(gates), grad_hy.new_empty(gates), grad_hy.new_empty(grad_hy.shape),
            grad_hy.new_empty(bias), grad_hy.new_empty(bias))


def _weight_norm_backward_meta(grad_w: torch.Tensor, saved_v: torch.Tensor,
                               saved_g: torch.Tensor, saved_norms: torch.Tensor, dim: int
                               ) -> tuple[torch.Tensor, torch.Tensor]:
    return saved_v.new_empty(saved_v.shape), saved_g.new_empty(saved_g.shape)


def _pack_padded_sequence(input: torch.Tensor, lengths: torch.Tensor, batch_first: bool
                          ) -> tuple[torch.Tensor, torch.Tensor]:
    """pack_padded_sequence's packing on the device. PyTorch's kernel reads the lengths and
    copies rows, so it has no meta kernel and could not be recorded. Here the lengths (on the
    host, as PyTorch requires) give the batch sizes and the rows to keep, and the packed data
    is one gather of those rows, whose gradient autograd records as a scatter-add. The RNN
    layers then run on the packed data step by step (PyTorch's own packed-sequence loop, its
    slices and cells recorded), and pad_packed_sequence's copies are recorded as they come."""
    if lengths.device.type != "cpu" or lengths.dim() != 1 or lengths.dtype != torch.int64:
        raise RuntimeError("'lengths' argument should be a 1D CPU int64 tensor, but got "
                           f"{lengths.dim()}D {lengths.device.type} {lengths.dtype} tensor")
    if batch_first:
        input = input.transpose(0, 1)
    steps, batch = input.shape[:2]
    sizes = lengths.tolist()
    if len(sizes) != batch:
        raise RuntimeError(f"Expected `len(lengths)` to be equal to batch_size, but got "
                           f"{len(sizes)} (batch_size={batch})")
    if sizes and sizes[-1] <= 0:
        raise RuntimeError("Length of all samples has to be greater than 0, but found an "
                           "element in 'lengths' that is <= 0")
    if any(a < b for a, b in zip(sizes, sizes[1:], strict=False)):
        raise RuntimeError("`lengths` array must be sorted in decreasing order when "
                           "`enforce_sorted` is True. You can pass `enforce_sorted=False` to "
                           "pack_padded_sequence and/or pack_sequence to sidestep this "
                           "requirement if you do not need ONNX exportability.")
    if sizes and sizes[0] > steps:
        raise RuntimeError(f"the longest length {sizes[0]} exceeds the input's {steps} steps")
    batch_sizes = [sum(1 for n in sizes if n > t) for t in range(sizes[0] if sizes else 0)]
    rows = torch.tensor([t * batch + b for t, n in enumerate(batch_sizes) for b in range(n)],
                        dtype=torch.int64)
    data = input.reshape(steps * batch, *input.shape[2:])[rows.to(input.device)]
    return data, torch.tensor(batch_sizes, dtype=torch.int64)


def _ctc_loss_of_tensors(log_probs: torch.Tensor, targets: torch.Tensor,
                         input_lengths: torch.Tensor, target_lengths: torch.Tensor,
                         blank: int = 0, zero_infinity: bool = False
                         ) -> tuple[torch.Tensor, torch.Tensor]:
    """CTC with its lengths as tensors, as its form with the lengths as numbers: the numbers
    fix the loss's graph (and a device tensor's are read on the host), as PyTorch's CPU
    kernel reads them."""
    return aten._ctc_loss.default(log_probs, targets, input_lengths.tolist(),
                                  target_lengths.tolist(), blank, zero_infinity)


def _multi_margin_loss_backward_meta(grad: torch.Tensor, input: torch.Tensor,
                                     target: torch.Tensor, p: float, margin: float,
                                     weight: torch.Tensor | None = None, reduction: int = 1
                                     ) -> torch.Tensor:
    return input.new_empty(input.shape)


def _ctc_loss_backward_meta(grad: torch.Tensor, log_probs: torch.Tensor, *args: Any,
                            **kwargs: Any) -> torch.Tensor:
    return log_probs.new_empty(log_probs.shape)


def _kthvalue_meta(x: torch.Tensor, k: int, dim: int = -1, keepdim: bool = False
                   ) -> tuple[torch.Tensor, torch.Tensor]:
    shape = list(x.shape)
    if shape:
        if keepdim:
            shape[dim] = 1
        else:
            del shape[dim]
    return x.new_empty(shape), x.new_empty(shape, dtype=torch.int64)


def _register_missing_meta(lib: torch.library.Library) -> None:
    """Meta kernels PyTorch lacks for ops that run on a non-CPU device: `nn.GRU`'s fused cells,
    weight_norm's, multi_margin_loss's and CTC's gradients, kthvalue. Without them the device cannot
    know those ops' shapes, so it could not record them."""
    for name, fn in (("_thnn_fused_gru_cell", _gru_cell_meta),
                     ("_thnn_fused_gru_cell_backward", _gru_cell_backward_meta),
                     ("_weight_norm_interface_backward", _weight_norm_backward_meta),
                     ("multi_margin_loss_backward", _multi_margin_loss_backward_meta),
                     ("_ctc_loss_backward", _ctc_loss_backward_meta),
                     ("kthvalue", _kthvalue_meta)):
        if not torch._C._dispatch_has_kernel_for_dispatch_key(f"aten::{name}", "Meta"):
            lib.impl(name, fn, "Meta")


# Note [Values that give shapes]
# Some ops' result shapes depend on their arguments' values: nonzero, unique, bincount, and
# indexing by a bool mask (`x[mask]`, `x[mask] = v`, masked_select, masked_scatter). No meta
# kernel can know them, so the recording cannot. The first ones have no gradient: they run on
# the host values of their arguments (a read, as below). For a mask, as PyTorch's CUDA kernels
# do, the device reads the mask on the host (a read inside a step, which flushes what the mask
# depends on first, Note [The lazy device]), and the op is recorded with the positions of its
# true elements: a bool mask of k dims becomes k int64 index tensors, as PyTorch's own
# indexing makes of it. Those positions are host values, inputs of the graph. The mask's value
# fixes the recorded shapes, so each different count of true elements is a graph of its own:
# traced, sent and compiled once, then found again as any other (Note [Plans]).


def _is_mask(t: Any) -> bool:
    return isinstance(t, torch.Tensor) and t.dtype in (torch.bool, torch.uint8)


# Note [Draws on the host]
# Random numbers inside a step other than dropout's (`torch.randn_like(std)` in a VAE's
# reparameterisation, `rand_like`, Gumbel noise by `empty_like(x).exponential_()`) are drawn
# on the host from PyTorch's generator, as the factories draw, and enter the graph as inputs:
# only their shapes are needed, so nothing is read and the step does not split, and the numbers
# are those eager PyTorch on the CPU would draw. A fill gives its tensor a value of its own (a
# new identity, as zeros_on_host does): what read the tensor before the fill keeps the old one.
# A fill of a view the recording made would have to write through to its base: recorded, and
# refused by name.
# A draw given a generator (`torch.Generator(device="salus")`, whose C++ half is a CPU
# generator under the device's name) is made on the host with it too, so that a seeded
# generator gives the numbers eager PyTorch on the CPU gives with the same seed. One that reads
# values (`torch.bernoulli(p, generator=g)`, `torch.multinomial(probs, n, generator=g)`) reads
# them first, as .item() does, which splits the step; without a generator such draws are the
# daemon's (Note [Random numbers]).
def _drawn_like(func: Any) -> Any:
    def run(rt: Runtime, args: tuple, kwargs: dict) -> Any:
        like = {k: v for k, v in kwargs.items()
                if k not in ("device", "layout", "pin_memory", "memory_format")}
        template = torch.empty(args[0].shape, dtype=args[0].dtype)
        return _on_device(func(template, *args[1:], **like))
    return run


def _on_device(host: torch.Tensor) -> SalusTensor:
    """A host tensor as a device tensor whose value is on the host (an input of the graph)."""
    host = host.contiguous()
    return SalusTensor(_meta_of(host), _Loc(host))


def _positions(rt: Runtime, mask: torch.Tensor, shape: Any = None) -> list[SalusTensor]:
    """The positions of `mask`'s true elements (broadcast to `shape`), one int64 tensor per
    dim (Note [Values that give shapes])."""
    host = rt._host_arg(mask)
    if host.dim() == 0:
        raise RuntimeError("salus device: indexing by a 0-dim bool tensor is not supported")
    if shape is not None:
        host = host.expand(shape)
    return [_on_device(c) for c in host.nonzero().unbind(1)]


def _by_positions(rt: Runtime, indices: list) -> list | None:
    """`indices` with each bool mask replaced by its positions, or None when none is a mask."""
    if not any(_is_mask(i) for i in indices):
        return None
    out: list = []
    for i in indices:
        out.extend(_positions(rt, i) if _is_mask(i) else [i])
    return out


def _as_masked_fill(func: Any, args: tuple, kwargs: dict) -> Any:
    """`x[mask] = v` of one value (Rprop's `sign[sign.gt(0)] = etaplus`) is masked_fill, whose
    shapes do not depend on the mask: no read. NotImplemented for any other index_put."""
    if func not in _INDEX_PUTS:
        return NotImplemented
    given = dict(zip(("self", "indices", "values", "accumulate"), args, strict=False)) | kwargs
    x, indices, values = given["self"], given["indices"], given["values"]
    if given.get("accumulate", False) or len(indices) != 1 or not _is_mask(indices[0]) or \
            values.numel() != 1:
        return NotImplemented
    mask = indices[0]
    if mask.dim() == 0 or mask.dim() > x.dim() or mask.shape != x.shape[:mask.dim()]:
        return NotImplemented
    if mask.dtype != torch.bool:
        mask = mask.bool()
    mask = mask.reshape(*mask.shape, *([1] * (x.dim() - mask.dim())))
    fill = aten.masked_fill_.Tensor if func is not aten.index_put.default \
        else aten.masked_fill.Tensor
    return fill(x, mask, values.reshape(()).to(x.dtype))


def _indexing(func: Any) -> Any:
    """index / index_put and their forms, whose second argument is the indices."""
    def run(rt: Runtime, args: tuple, kwargs: dict) -> Any:
        filled = _as_masked_fill(func, args, kwargs)
        if filled is not NotImplemented:
            return filled
        indices = _by_positions(rt, list(args[1] if len(args) > 1 else kwargs["indices"]))
        if indices is None:
            return NotImplemented
        if len(args) > 1:
            return func(args[0], indices, *args[2:], **kwargs)
        return func(*args, **{**kwargs, "indices": indices})
    return run


def _run_on_host(func: Any) -> Any:
    """An op whose results' shapes depend on values and which has no gradient (nonzero,
    unique, bincount): run on the host values of its arguments, its results device tensors
    whose values are on the host."""
    def run(rt: Runtime, args: tuple, kwargs: dict) -> Any:
        return pytree.tree_map(lambda r: _on_device(r) if isinstance(r, torch.Tensor) else r,
                               rt._host_call(func, args, kwargs))
    return run


def _masked_select(rt: Runtime, args: tuple, kwargs: dict) -> Any:
    x, mask = args
    shape = torch.broadcast_shapes(x.shape, mask.shape)
    return aten.index.Tensor(x.expand(shape), _positions(rt, mask, shape))


def _masked_scatter(inplace: bool) -> Any:
    def run(rt: Runtime, args: tuple, kwargs: dict) -> Any:
        x, mask, source = args
        shape = x.shape if inplace else torch.broadcast_shapes(x.shape, mask.shape)
        at = _positions(rt, mask, shape)
        count = at[0].shape[0] if at else 0
        if source.numel() < count:
            raise RuntimeError(f"masked_scatter: the source has {source.numel()} elements, "
                               f"fewer than the mask's {count} true ones")
        taken = source.reshape(-1)[:count]
        if inplace:
            return aten.index_put_.default(x, at, taken)
        return aten.index_put.default(x.expand(shape), at, taken)
    return run


def _masked_scatter_backward(rt: Runtime, args: tuple, kwargs: dict) -> Any:
    """The source's gradient of masked_scatter: the output gradient at the mask's true
    elements, in order, then zeros up to the source's size."""
    grad, mask, sizes = args
    taken = aten.index.Tensor(grad, _positions(rt, mask, grad.shape))
    total = 1
    for s in sizes:
        total *= s
    return aten.constant_pad_nd.default(taken, [0, total - taken.shape[0]]).reshape(sizes)


_INDEX_PUTS = (aten.index_put.default, aten.index_put_.default, aten._index_put_impl_.default)

# Note [Foreach ops]
# An optimizer built with foreach=True (and other multi-tensor code) calls _foreach_* ops, one
# over every parameter at once, which the engine has no kernels for. The device records each
# as the same op per tensor: _foreach_addcdiv_(params, a, b, scalars) as addcdiv_(params[i],
# a[i], b[i], value=scalars[i]) for each i. Their float arguments are then lifted as any
# op's (Note [Lifted scalars]), so Adam's step sizes, new every step, keep the step one graph.
def _foreach(func: Any) -> Any:
    schema = func._schema
    name = schema.name.removeprefix("aten::_foreach_")
    inplace = name.endswith("_")
    base = name.rstrip("_")
    names = [a.name for a in schema.arguments]
    lists = {a.name for a in schema.arguments if isinstance(a.type, torch.ListType)}
    keyword = {a.name for a in schema.arguments if a.kwarg_only}

    def one(given: dict) -> Any:
        x = given["self"]
        if base in ("addcmul", "addcdiv"):
            value = given.get("scalars", given.get("value", 1))
            if isinstance(value, torch.Tensor):  # the .Tensor form: one 0-d tensor each
                t1, t2 = given["tensor1"], given["tensor2"]
                term = (t1 * t2 if base == "addcmul" else t1 / t2) * value
                return x.add_(term) if inplace else x + term
            return getattr(aten, name)(x, given["tensor1"], given["tensor2"], value=value)
        if base == "norm":
            return torch.linalg.vector_norm(x, given.get("ord", 2), dtype=given.get("dtype"))
        if base == "max":
            return torch.amax(x)
        if base == "copy":
            return x.copy_(given["src"], given.get("non_blocking", False))
        positional = [given[n] for n in names if n in given and n not in keyword]
        named = {n: given[n] for n in keyword if n in given}
        if inplace and not hasattr(aten, name):  # (maximum_, minimum_: no such ops)
            return x.copy_(getattr(aten, base)(*positional, **named))
        return getattr(aten, name)(*positional, **named)

    def run(rt: Runtime, args: tuple, kwargs: dict) -> Any:
        given = dict(zip(names, args, strict=False)) | kwargs
        count = len(next(given[n] for n in names if n in lists))
        out = [one({n: v[i] if n in lists else v for n, v in given.items()})
               for i in range(count)]
        return None if inplace else out
    return run


def _amp_unscale(rt: Runtime, args: tuple, kwargs: dict) -> None:
    """GradScaler's unscale, per gradient as Note [Foreach ops] records the others: each
    gradient times the inverse scale, and `found_inf` 1 once one has a non-finite element."""
    grads, found_inf, inv_scale = (*args, *kwargs.values())
    for g in grads:
        bad = aten.logical_not(aten.isfinite(g)).any().to(found_inf.dtype)
        found_inf.copy_(aten.maximum(found_inf, bad))
        g.mul_(inv_scale)


_FOREACH = [getattr(getattr(aten, op), overload or "default")
            for op, _, overload in (n.removeprefix("aten::").partition(".")
                                    for n in torch._C._dispatch_get_all_op_names()
                                    if n.startswith("aten::_foreach_"))
            if not overload.endswith("out")]

# Ops rewritten before they are recorded: Note [Values that give shapes], Note [Foreach ops].
_BY_VALUE: dict[int, Any] = {id(f): _foreach(f) for f in _FOREACH} | {id(f): h for f, h in (
    (aten.index.Tensor, _indexing(aten.index.Tensor)),
    (aten._unsafe_index.Tensor, _indexing(aten._unsafe_index.Tensor)),
    (aten.index_put.default, _indexing(aten.index_put.default)),
    (aten.index_put_.default, _indexing(aten.index_put_.default)),
    (aten._index_put_impl_.default, _indexing(aten._index_put_impl_.default)),
    (aten._unsafe_index_put.default, _indexing(aten._unsafe_index_put.default)),
    *((f, _run_on_host(f)) for f in (
        aten.nonzero.default, aten._unique2.default, aten.unique_dim.default,
        aten.unique_consecutive.default, aten.bincount.default,
        # (the positions repeat_interleave with a tensor of repeats gathers: their count is
        # the repeats' sum)
        aten.repeat_interleave.Tensor,
        # (QR, which the engine lacks, for nn.init.orthogonal_: its gradient stays refused;
        # sampling from PyTorch's generator, as the factories draw: Categorical.sample(),
        # and the Gamma family's samplers, Beta and Dirichlet's, Poisson's and Binomial's,
        # which the engine lacks: the reparameterised gradients of Gamma and Dirichlet stay
        # refused)
        aten.linalg_qr.default, aten.multinomial.default, aten._standard_gamma.default,
        aten._sample_dirichlet.default, aten.poisson.default, aten.binomial.default)),
    (aten.masked_select.default, _masked_select),
    (aten.masked_scatter.default, _masked_scatter(False)),
    (aten.masked_scatter_.default, _masked_scatter(True)),
    (aten.masked_scatter_backward.default, _masked_scatter_backward),
    (aten._amp_foreach_non_finite_check_and_unscale_.default, _amp_unscale),
    *((f, _drawn_like(f)) for f in (
        aten.randn_like.default, aten.rand_like.default, aten.randint_like.default,
        aten.randint_like.low_dtype)),
)}
