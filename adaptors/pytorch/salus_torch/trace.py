"""Tracing a training or inference step into one functional ATen graph (Note [One graph per step]).

Note [One graph per step]
A step is the user's function: forward, `loss.backward()`, `optimizer.step()`. It becomes one
graph in two passes, both below Dynamo:
1. `make_fx` runs the step on fake tensors with every parameter, buffer and optimizer state
   tensor as an input of the trace. The modules are re-parametrised with those inputs for the
   duration (torch.nn.utils.stateless), the optimizers' `step` and `zero_grad` are replaced by
   their functional forms (optim.py) acting on the inputs' `.grad`, and autograd runs as usual,
   so the backward pass appears as ATen ops. PyTorch's Core-ATen decompositions apply, which
   leaves few distinct ops.
2. Functionalization of that graph turns every in-place write (the optimizer's updates,
   BatchNorm's running statistics) into a pure op and a final `copy_` into the input it wrote.
The result has the step's inputs (the batch and the learning rates), its state and its outputs;
its shapes are known, so the daemon knows P and E before anything runs.
"""

from __future__ import annotations

import contextlib
import operator
import types
from dataclasses import dataclass, field
from typing import Any

import torch
from torch._decomp import core_aten_decompositions, get_decompositions
from torch._subclasses.fake_tensor import DataDependentOutputException
from torch.fx.experimental.proxy_tensor import make_fx
from torch.fx.experimental.symbolic_shapes import GuardOnDataDependentSymNode
from torch.nn.utils import stateless
from torch.utils import _pytree as pytree

from salus._generated.salus.v1 import aten_graph_pb2 as apb

from . import optim as _optim

_DTYPES = {
    torch.float32: apb.ATEN_FLOAT32,
    torch.int64: apb.ATEN_INT64,
    torch.bool: apb.ATEN_BOOL,
    torch.int32: apb.ATEN_INT32,
    torch.float64: apb.ATEN_FLOAT64,
}


class CaptureError(RuntimeError):
    """The step cannot be captured; the message says what in it and why."""


@dataclass
class StateTensor:
    """A persistent tensor of the step: where it lives in the user's process."""

    name: str
    kind: str  # "parameter", "buffer" or "optimizer"
    module: torch.nn.Module | None = None
    attr: str = ""  # the module-relative name (parameters and buffers)
    param: torch.Tensor | None = None  # optimizer state: the parameter it belongs to
    key: str = ""  # optimizer state: torch.optim's key
    initial: torch.Tensor | None = None  # optimizer state when the optimizer has none yet
    optimizer: torch.optim.Optimizer | None = None  # optimizer state: its optimizer

    def host(self) -> torch.Tensor:
        """The tensor's value in the user's process."""
        if self.kind != "optimizer":
            return self.module.get_parameter(self.attr) if self.kind == "parameter" \
                else self.module.get_buffer(self.attr)
        value = self.optimizer.state.get(self.param, {}).get(self.key)
        return self.initial if value is None else value


@dataclass
class Traced:
    """One captured step: its graph and how its values map to the user's tensors."""

    graph: apb.AtenGraph
    state: list[StateTensor]
    inputs: list[str]  # batch inputs then learning rates, as the graph names them
    lr_inputs: list[tuple[torch.optim.Optimizer, int]]  # (optimizer, group) per lr input
    outputs: list[str]
    out_spec: pytree.TreeSpec
    constant_outputs: dict[int, object] = field(default_factory=dict)
    # Random draws (Note [Random numbers]): with any, the graph's last input is "rng".
    rng_draws: int = 0


def discover(fn: object) -> tuple[list[torch.nn.Module], list[torch.optim.Optimizer]]:
    """The modules and optimizers `fn` refers to by name (closure, globals, a bound self)."""
    found: list[object] = []
    code = getattr(fn, "__code__", None)
    if getattr(fn, "__self__", None) is not None:
        found.append(fn.__self__)
        found.extend(vars(fn.__self__).values())
    if code is not None:
        for cell in getattr(fn, "__closure__", None) or ():
            with contextlib.suppress(ValueError):
                found.append(cell.cell_contents)
        g = getattr(fn, "__globals__", {})
        found.extend(g[n] for n in code.co_names if n in g)
    modules, optimizers = [], []
    for obj in found:
        if isinstance(obj, torch.nn.Module) and all(obj is not m for m in modules):
            modules.append(obj)
        elif isinstance(obj, torch.optim.Optimizer) and all(obj is not o for o in optimizers):
            optimizers.append(obj)
    # A module that is a submodule of another found one is covered by it.
    inner = {id(s) for m in modules for s in m.modules() if s is not m}
    return [m for m in modules if id(m) not in inner], optimizers


def _state_tensors(modules: list[torch.nn.Module], optimizers: list[_optim.Functional]
                   ) -> list[StateTensor]:
    states: list[StateTensor] = []
    owner: dict[int, str] = {}
    for i, m in enumerate(modules):
        prefix = "" if len(modules) == 1 else f"m{i}."
        for n, p in m.named_parameters():
            states.append(StateTensor(prefix + n, "parameter", module=m, attr=n))
            owner.setdefault(id(p), prefix + n)
        for n, _ in m.named_buffers():
            states.append(StateTensor(prefix + n, "buffer", module=m, attr=n))
    for k, f in enumerate(optimizers):
        prefix = "" if len(optimizers) == 1 else f"opt{k}."
        for group in f.optimizer.param_groups:
            for p in group["params"]:
                if id(p) not in owner:
                    raise CaptureError(
                        "an optimizer updates a parameter of no module the step refers to; "
                        "pass the modules explicitly: capture_step(fn, modules=[...])")
                for slot in f.slots(group, p):
                    states.append(StateTensor(f"{prefix}{owner[id(p)]}.{slot.key}", "optimizer",
                                              param=p, key=slot.key, initial=slot.initial,
                                              optimizer=f.optimizer))
    return states


_NO_DECOMPOSE = {
    # Kept whole: the engine has kernels for them and their decompositions are long.
    torch.ops.aten.native_layer_norm.default,
    torch.ops.aten.native_layer_norm_backward.default,
    torch.ops.aten.native_batch_norm_backward.default,
    torch.ops.aten._softmax_backward_data.default,
    torch.ops.aten._log_softmax_backward_data.default,
    torch.ops.aten.threshold_backward.default,
    torch.ops.aten.gelu_backward.default,
    torch.ops.aten.select_backward.default,
    # (sliding windows' gradient: one scatter-add, where the decomposition indexes by int32)
    torch.ops.aten.unfold_backward.default,
}


def _vector_norm(x: torch.Tensor, ord: float = 2, dim: object = None, keepdim: bool = False,
                 *, dtype: torch.dtype | None = None) -> torch.Tensor:
    """linalg_vector_norm (gradient clipping's) in ops the engine has."""
    if dtype is not None:
        x = x.to(dtype)
    dims = [] if dim is None else ([dim] if isinstance(dim, int) else list(dim))
    a = x.abs()
    if ord == float("inf"):
        return torch.amax(a, dims, keepdim)
    if ord == 2:
        return torch.sqrt(torch.sum(x * x, dims, keepdim))
    if ord == 1:
        return torch.sum(a, dims, keepdim)
    return torch.pow(torch.sum(torch.pow(a, ord), dims, keepdim), 1.0 / ord)


def _clamp(x: torch.Tensor, min: float | None = None, max: float | None = None
           ) -> torch.Tensor:
    """clamp with number bounds as maximum and minimum against 0-d tensors."""
    if min is not None:
        x = torch.maximum(x, torch.scalar_tensor(min, dtype=x.dtype))
    if max is not None:
        x = torch.minimum(x, torch.scalar_tensor(max, dtype=x.dtype))
    return x


def _native_batch_norm(x: torch.Tensor, weight: torch.Tensor | None,
                       bias: torch.Tensor | None, running_mean: torch.Tensor | None,
                       running_var: torch.Tensor | None, training: bool, momentum: float,
                       eps: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """native_batch_norm as the `_native_batch_norm_legit` op that declares its writes.

    native_batch_norm updates the running statistics without its schema saying so, so
    functionalization cannot see those writes: a graph keeping it would drop them. (torch 2.4's
    decompositions never reach it in a training step; later versions do.)"""
    aten = torch.ops.aten
    if running_mean is None and running_var is None:
        return aten._native_batch_norm_legit.no_stats(x, weight, bias, training, momentum, eps)
    if not training:
        return aten._native_batch_norm_legit_no_training.default(
            x, weight, bias, running_mean, running_var, momentum, eps)
    return aten._native_batch_norm_legit.default(x, weight, bias, running_mean, running_var,
                                                 training, momentum, eps)


# PyTorch decompositions outside its Core-ATen set (in torch 2.4) whose results the importer
# lowers: hardtanh (ReLU6), RReLU's gradient and the 2-D nll_loss of segmentation would
# otherwise reach the daemon whole and be refused. (Some others, constant_pad_nd's and
# var_mean's, produce prims ops instead; those are lowered whole.)
_EXTRA_DECOMPOSE = (
    torch.ops.aten.hardtanh.default,
    torch.ops.aten.hardtanh_backward.default,
    torch.ops.aten.nll_loss2d_forward.default,
    torch.ops.aten.nll_loss2d_backward.default,
    torch.ops.aten.upsample_bicubic2d.default,
    torch.ops.aten.upsample_bicubic2d.vec,
    torch.ops.aten.rrelu_with_noise_backward.default,
    # torch 2.15 leaves the .default overload out of its core set (the .vec one stays in).
    torch.ops.aten.upsample_trilinear3d.default,
)


def _decompositions() -> dict:
    table = core_aten_decompositions()
    table.update(get_decompositions(list(_EXTRA_DECOMPOSE)))
    for op in _NO_DECOMPOSE:
        table.pop(op, None)
    table[torch.ops.aten.linalg_vector_norm.default] = _vector_norm
    table[torch.ops.aten.clamp.default] = _clamp
    table[torch.ops.aten.native_batch_norm.default] = _native_batch_norm
    table[torch.ops.aten._weight_norm_interface_backward.default] = _weight_norm_backward
    table[torch.ops.aten._cdist_forward.default] = _cdist_forward
    table[torch.ops.aten._cdist_backward.default] = _cdist_backward
    # Operators the importer lacks or lowers only in part, each with its backward; a
    # decomposition that returns NotImplemented leaves its op whole (lowered, or refused).
    a = torch.ops.aten
    table.update({
        a.grid_sampler_2d.default: _grid_sampler_2d,
        a.grid_sampler_2d_backward.default: _grid_sampler_2d_backward,
        a.upsample_bicubic2d_backward.default: _resize_backward(a.upsample_bicubic2d.default),
        a.upsample_trilinear3d_backward.default: _resize_backward(a.upsample_trilinear3d.default),
        a.upsample_linear1d_backward.default: _resize_backward(a.upsample_linear1d.default),
        a.multi_margin_loss_backward.default: _multi_margin_loss_backward,
        a.avg_pool2d.default: _avg_pool2d,
        a.avg_pool2d_backward.default: _pool_backward(_avg_pool2d, _avg_pool2d_decomposes, 6),
        a.avg_pool3d.default: _avg_pool3d,
        a.avg_pool3d_backward.default: _pool_backward(_avg_pool3d, _avg_pool3d_decomposes, 6),
        a.max_pool3d_with_indices.default: _max_pool3d,
        a.max_pool3d_with_indices_backward.default:
            _pool_backward(_max_pool3d, lambda x, *args: x.dim() == 5, 5),
        a.max_pool2d_with_indices.default: _dilated_max_pool2d,
        a.max_pool2d_with_indices_backward.default:
            _pool_backward(_dilated_max_pool2d, _dilated, 5),
        a.adaptive_max_pool2d.default: _adaptive_max_pool2d,
        a.adaptive_max_pool2d_backward.default: _adaptive_max_pool2d_backward,
        a._ctc_loss.default: _ctc_loss,
        a._ctc_loss_backward.default: _ctc_loss_backward,
        a.index.Tensor: _index,
        a.index_put.default: _index_put,
        a.index_put_.default: _index_put_,
        a._index_put_impl_.default: _index_put_,
        a._trilinear.default: _trilinear,
        a.embedding_renorm_.default: _embedding_renorm_,
        a.atan2.default: _atan2,
        a._scaled_dot_product_flash_attention_for_cpu.default: _attention,
        a._scaled_dot_product_flash_attention_for_cpu_backward.default: _attention_backward,
        a.mkldnn_linear.default: _linear,
        a.mkldnn_linear_backward.default: _linear_backward,
        # torch 2.15's `all` of a tensor reaches the recording as this op.
        a._is_all_true.default: lambda x: torch.all(x),
        # torch 2.15's cumprod gradient finds each row's first zero with the max of a bool
        # tensor and clamps int64 positions with relu_: through float32 and a select, which the
        # engine has.
        a.max.dim: _bool_extreme(torch.max),
        a.min.dim: _bool_extreme(torch.min),
        a.relu.default: _int_relu,
        a.relu_.default: _int_relu_,
    })
    # torch 2.15 declares rrelu_with_noise's write to its noise and drops it from the core
    # decompositions: in eval it is the leaky ReLU of the bounds' mean (training, which draws
    # slopes, stays whole and is refused by name).
    # (Later versions make the table torch.export's own mapping, whose setdefault does not store.)
    if a.rrelu_with_noise.default not in table:
        table[a.rrelu_with_noise.default] = _rrelu_in_eval
    table.update(_MATH)
    return table


def _bool_extreme(reduce: object) -> object:
    """max.dim or min.dim of a bool tensor, through float32; other types stay whole."""
    def extreme(x: torch.Tensor, dim: int, keepdim: bool = False) -> object:
        if x.dtype != torch.bool:
            return NotImplemented
        values, indices = reduce(x.to(torch.float32), dim, keepdim)
        return values.to(torch.bool), indices
    return extreme


def _int_relu(x: torch.Tensor) -> object:
    """relu of an integer tensor as a select; float relu stays whole."""
    if x.dtype.is_floating_point:
        return NotImplemented
    return torch.where(x > 0, x, torch.zeros_like(x))


def _int_relu_(x: torch.Tensor) -> object:
    if x.dtype.is_floating_point:
        return NotImplemented
    return x.copy_(_int_relu(x))


def _rrelu_in_eval(x: torch.Tensor, noise: torch.Tensor, lower: float = 0.125,
                   upper: float = 1 / 3, training: bool = False,
                   generator: object = None) -> object:
    if training:
        return NotImplemented
    return torch.nn.functional.leaky_relu(x, (lower + upper) / 2)


# The dispatch keys of this thread outside any op: a decomposition runs inside one, where
# autograd is off (see _vjp).
_BASE_KEYS = (torch._C._dispatch_tls_local_include_set(),
              torch._C._dispatch_tls_local_exclude_set())


def _vjp(forward: object, inputs: tuple[torch.Tensor, ...], grad: torch.Tensor
         ) -> tuple[torch.Tensor, ...]:
    """Note [Gradients of decompositions]: the gradient of `forward` (a decomposition of some
    forward operator, in operators the engine has) at `inputs`, for the output gradient `grad`.
    A backward operator with no decomposition of its own is decomposed this way: autograd, run
    inside the trace, differentiates the forward's decomposition, so the graph holds the
    gradients of its gathers, products and selects, which the importer lowers. Zeros stand for
    an input the forward does not depend on."""
    with torch._C._ForceDispatchKeyGuard(*_BASE_KEYS), torch.enable_grad():
        xs = [x.detach().requires_grad_(True) for x in inputs]
        grads = torch.autograd.grad(forward(*xs), xs, grad, allow_unused=True)
    return tuple(torch.zeros_like(x) if g is None else g
                 for x, g in zip(inputs, grads, strict=True))


_DECOMPOSED = get_decompositions([torch.ops.aten.grid_sampler_2d.default,
                                  torch.ops.aten.upsample_bicubic2d.default,
                                  torch.ops.aten.upsample_trilinear3d.default,
                                  torch.ops.aten.upsample_linear1d.default,
                                  torch.ops.aten.multi_margin_loss.default])


def _grid_sampler_2d(input: torch.Tensor, grid: torch.Tensor, interpolation: int = 0,
                     padding: int = 0, align_corners: bool = False) -> torch.Tensor:
    """grid_sample as PyTorch decomposes it (gathers at the corners, weighted), but for
    reflection padding, which that decomposition computes in int8: there the grid is reflected
    here first, in floats, and sampled with border padding (the clamp a reflected point needs).
    Bicubic sampling reflects each of its sixteen taps instead, and is left whole."""
    forward = _DECOMPOSED[torch.ops.aten.grid_sampler_2d.default]
    if padding == 2:
        if interpolation == 2:
            return NotImplemented  # type: ignore[return-value]
        height, width = input.shape[-2:]
        x, y = grid.split(1, -1)
        grid = torch.cat([_reflected(x, width, align_corners),
                          _reflected(y, height, align_corners)], -1)
        padding = 1
    return forward(input, grid, interpolation, padding, align_corners)


def _reflected(coords: torch.Tensor, size: int, align_corners: bool) -> torch.Tensor:
    """Normalized sampling coordinates along a dim of `size`, reflected at its edges (at the
    outer pixels' centres with align_corners, at their outer edges without) as grid_sample's
    reflection padding does, and normalized again."""
    scale = (size - 1) / 2 if align_corners else size / 2
    if scale == 0:
        return torch.zeros_like(coords)
    centre = (size - 1) / 2
    low, span = (0.0, size - 1.0) if align_corners else (-0.5, float(size))
    if span == 0:
        return torch.zeros_like(coords)
    dist = (coords * scale + centre - low).abs()
    extra = torch.fmod(dist, span)
    even = torch.fmod(torch.floor(dist / span), 2) == 0
    pixel = torch.where(even, extra + low, span + low - extra).clamp(0, size - 1)
    return (pixel - centre) / scale


def _grid_sampler_2d_backward(grad: torch.Tensor, input: torch.Tensor, grid: torch.Tensor,
                              interpolation: int, padding: int, align_corners: bool,
                              output_mask: list[bool]) -> tuple[torch.Tensor, torch.Tensor]:
    """grid_sample's gradient for the input and the grid (Note [Gradients of decompositions])."""
    if padding == 2 and interpolation == 2:
        return NotImplemented  # type: ignore[return-value]
    return _vjp(lambda x, g: _grid_sampler_2d(x, g, interpolation, padding, align_corners),
                (input, grid), grad)


def _resize_backward(forward_op: Any) -> Any:
    """The gradient of a resizing (`forward_op`: bicubic, trilinear). Resizing is linear, so
    the gradient of its decomposition at zeros of the input's shape is the gradient anywhere
    (Note [Gradients of decompositions])."""
    def backward(grad: torch.Tensor, output_size: list[int], input_size: list[int],
                 align_corners: bool, *scales: float | None) -> torch.Tensor:
        forward = _DECOMPOSED[forward_op]
        zeros = grad.new_zeros(input_size)
        return _vjp(lambda x: forward(x, output_size, align_corners, *scales), (zeros,), grad)[0]
    return backward


def _multi_margin_loss_backward(grad: torch.Tensor, input: torch.Tensor, target: torch.Tensor,
                                p: float, margin: float, weight: torch.Tensor | None = None,
                                reduction: int = 1) -> torch.Tensor:
    """multi_margin_loss's gradient (Note [Gradients of decompositions])."""
    forward = _DECOMPOSED[torch.ops.aten.multi_margin_loss.default]
    return _vjp(lambda x: forward(x, target, p, margin, weight, reduction), (input,), grad)[0]


def _per_dim(v: object, dims: int) -> list[int]:
    """A pooling argument (a number, or one or `dims` of them) as one number per pooled dim."""
    v = [v] if isinstance(v, int) else list(v)
    return v * dims if len(v) == 1 else v


def _avg_pool3d_decomposes(x: torch.Tensor, kernel_size: object, stride: object,
                           padding: object = 0, ceil_mode: bool = False,
                           count_include_pad: bool = True, divisor_override: int | None = None
                           ) -> bool:
    """Whether _avg_pool3d decomposes, for its arguments (its backward asks the same)."""
    return x.dim() == 5 and not ceil_mode and not divisor_override and \
        (count_include_pad or not any(_per_dim(padding, 3)))


def _avg_pool3d(x: torch.Tensor, kernel_size: list[int], stride: list[int] | None = None,
                padding: object = 0, ceil_mode: bool = False, count_include_pad: bool = True,
                divisor_override: int | None = None) -> torch.Tensor:
    """3-D average pooling (LocalResponseNorm's, over channels) as two 2-D ones: over height
    and width in each depth slice, then over depth with height and width flattened. With the
    padding counted (the default), the mean of the means is the mean of the window. Other
    settings are left whole, refused by name."""
    if not _avg_pool3d_decomposes(x, kernel_size, stride, padding, ceil_mode,
                                  count_include_pad, divisor_override):
        return NotImplemented  # type: ignore[return-value]
    return _slices_then_depth(
        x, lambda t, k, s, p, _: torch.nn.functional.avg_pool2d(t, k, s, p),
        kernel_size, stride, padding, 1)


def _slices_then_depth(x: torch.Tensor, pool: Any, kernel_size: object, stride: object,
                       padding: object, dilation: object) -> torch.Tensor:
    """A 3-D pooling as two 2-D ones, `pool(t, kernel, stride, padding, dilation)`: over
    height and width in each depth slice, then over depth with height and width flattened."""
    k = _per_dim(kernel_size, 3)
    s = _per_dim(stride, 3) if stride else k
    p, dil = _per_dim(padding, 3), _per_dim(dilation, 3)
    n, c, d, h, w = x.shape
    plane = pool(x.reshape(n, c * d, h, w), k[1:], s[1:], p[1:], dil[1:])
    h2, w2 = plane.shape[-2:]
    depth = pool(plane.reshape(n, c, d, h2 * w2), (k[0], 1), (s[0], 1), (p[0], 0), (dil[0], 1))
    return depth.reshape(n, c, depth.shape[2], h2, w2)


def _pool_backward(forward: Any, decomposes: Any, arity: int) -> Any:
    """The gradient of a pooling `forward` decomposes (Note [Gradients of decompositions]):
    backward(grad, x, *args), where forward takes x and the first `arity` of args (a max
    pooling's backward also gets its indices, which the decomposition does not need) and
    `decomposes(x, *those)` says whether the forward decomposes."""
    def backward(grad: torch.Tensor, x: torch.Tensor, *args: Any) -> torch.Tensor:
        args = args[:arity]
        if not decomposes(x, *args):
            return NotImplemented  # type: ignore[return-value]

        def first(t: torch.Tensor) -> torch.Tensor:
            out = forward(t, *args)
            return out[0] if isinstance(out, tuple) else out
        return _vjp(first, (x,), grad)[0]
    return backward


@torch.library.custom_op("salus::max_pool3d_indices", mutates_args=(),
                         schema="(Tensor out) -> Tensor")
def _max_pool3d_indices(out: torch.Tensor) -> torch.Tensor:
    """Stands for 3-D max pooling's indices in a graph (Note [3-D max pooling]): the engine
    does not compute them, so a graph that uses them is refused with this name."""
    raise RuntimeError("3-D max pooling's indices are not computed")


@_max_pool3d_indices.register_fake
def _(out: torch.Tensor) -> torch.Tensor:
    return torch.empty_like(out, dtype=torch.int64)


def _max_pool3d(x: torch.Tensor, kernel_size: list[int], stride: list[int] | None = None,
                padding: object = 0, dilation: object = 1, ceil_mode: bool = False
                ) -> tuple[torch.Tensor, torch.Tensor]:
    """Note [3-D max pooling]: the maximum over a 3-D window is the maximum over its depth of
    the 2-D maxima of its depth slices, and each dim's output size depends on that dim alone
    (ceil_mode, dilation and padding included). So it is two 2-D max poolings, as _avg_pool3d.
    Its gradient goes to the first maximum of each window in (depth, height, width) order, as
    PyTorch's does: the depth pooling takes the first slice holding it, the slice's pooling the
    first position there. The indices are not computed; only its backward used them, and that
    is the gradient of this decomposition."""
    if x.dim() != 5:
        return NotImplemented  # type: ignore[return-value]
    out = _slices_then_depth(
        x, lambda t, k, s, p, dil: torch.nn.functional.max_pool2d(t, k, s, p, dil, ceil_mode),
        kernel_size, stride, padding, dilation)
    return out, _max_pool3d_indices(out)


def _trilinear(i1: torch.Tensor, i2: torch.Tensor, i3: torch.Tensor, expand1: list[int],
               expand2: list[int], expand3: list[int], sumdim: list[int],
               unroll_dim: int = 1) -> torch.Tensor:
    """nn.Bilinear's product (and its gradients, which are this op again) as one einsum:
    each input's dims are the common dims it is not expanded on, the summed dims leave."""
    rank = i1.dim() + len(expand1)
    letters = "abcdefghijklmnopqrstuvwxyz"[:rank]

    def spec(expand: list[int]) -> str:
        return "".join(ch for d, ch in enumerate(letters) if d not in expand)

    out = "".join(ch for d, ch in enumerate(letters) if d not in sumdim)
    return torch.einsum(f"{spec(expand1)},{spec(expand2)},{spec(expand3)}->{out}", i1, i2, i3)


def _embedding_renorm_(weight: torch.Tensor, indices: torch.Tensor, max_norm: float,
                       norm_type: float) -> torch.Tensor:
    """Embedding(max_norm=...)'s renormalization, in place: every row that `indices` names and
    whose norm exceeds max_norm is scaled by max_norm / (norm + 1e-7), as PyTorch's kernel does.
    The rows named are marked by a scatter-add of ones (each row scaled once however often it
    is named), and every row's norm is taken, so no row is written twice."""
    named = torch.zeros(weight.shape[0], dtype=weight.dtype).index_put(
        (indices.reshape(-1),), torch.ones(indices.numel(), dtype=weight.dtype),
        accumulate=True) > 0
    norms = _vector_norm(weight, norm_type, 1)
    scale = torch.where(named & (norms > max_norm), max_norm / (norms + 1e-7), 1.0)
    return weight.copy_(weight * scale.unsqueeze(1))


def _ctc_loss(log_probs: torch.Tensor, targets: torch.Tensor, input_lengths: list[int],
              target_lengths: list[int], blank: int = 0, zero_infinity: bool = False
              ) -> tuple[torch.Tensor, torch.Tensor]:
    """CTC's negative log likelihood per sample and its log alphas (N, T, 2S + 1), by the
    forward recursion over the T steps, all samples and label positions at once: each
    position's alpha is the log-sum-exp of its own, its predecessor's and (between different
    labels) the one two back, plus the step's log probability of its label. The lengths are
    numbers in the graph, so a different length is a different graph."""
    steps, batch, _ = log_probs.shape
    width = max(target_lengths, default=0) if targets.dim() == 1 else targets.shape[1]
    if targets.dim() == 1:  # concatenated: padded rows by constant positions
        starts = [sum(target_lengths[:n]) for n in range(batch)]
        where = [starts[n] + min(s, max(target_lengths[n] - 1, 0)) for n in range(batch)
                 for s in range(width)]
        targets = targets[torch.tensor(where, dtype=torch.int64)].reshape(batch, width) \
            if targets.numel() else torch.zeros(batch, width, dtype=torch.int64)
    labels = 2 * width + 1
    blanks = torch.full((batch, width), blank, dtype=torch.int64)
    ext = torch.cat([torch.stack([blanks, targets.to(torch.int64)], -1).reshape(batch, -1),
                     torch.full((batch, 1), blank, dtype=torch.int64)], 1)  # (N, L)
    skip = torch.cat([torch.zeros(batch, 2, dtype=torch.bool),
                      (ext[:, 2:] != blank) & (ext[:, 2:] != ext[:, :-2])], 1)
    emit = log_probs.permute(1, 0, 2).gather(
        2, ext.unsqueeze(1).expand(batch, steps, labels))  # (N, T, L)
    position = torch.arange(labels).unsqueeze(0)
    ends = torch.tensor([2 * n + 1 for n in target_lengths], dtype=torch.int64).unsqueeze(1)
    none = torch.tensor(float("-inf"), dtype=log_probs.dtype)
    alpha = torch.where((position < 2) & (position < ends), emit[:, 0], none)
    alphas = [alpha]
    for t in range(1, steps):
        one = torch.cat([none.expand(batch, 1), alpha[:, :-1]], 1)
        two = torch.where(skip, torch.cat([none.expand(batch, 2), alpha[:, :-2]], 1), none)
        top = torch.maximum(torch.maximum(alpha, one), two)
        empty = top == float("-inf")
        top = torch.where(empty, 0.0, top)
        total = (alpha - top).exp() + (one - top).exp() + (two - top).exp()
        alpha = torch.where(empty, none, torch.log(torch.where(empty, 1.0, total)) + top) \
            + emit[:, t]
        alphas.append(alpha)
    log_alpha = torch.stack(alphas, 1)
    # The likelihood: the last step's alphas at the final blank and the final label.
    last = [(n * steps + input_lengths[n] - 1) * labels + 2 * target_lengths[n] - k
            for n in range(batch) for k in (0, 1)]
    pair = log_alpha.reshape(-1)[torch.tensor(last, dtype=torch.int64)].reshape(batch, 2)
    has_label = torch.tensor([[True, n > 0] for n in target_lengths])
    pair = torch.where(has_label, pair, none)
    top = pair.amax(1, keepdim=True)
    empty = top == float("-inf")
    top = torch.where(empty, 0.0, top)
    likelihood = torch.where(empty, none, torch.log(torch.where(
        empty, 1.0, (pair - top).exp().sum(1, keepdim=True))) + top).squeeze(1)
    nll = -likelihood
    if zero_infinity:
        nll = torch.where(nll == float("inf"), 0.0, nll)
    return nll, log_alpha


def _ctc_loss_backward(grad: torch.Tensor, log_probs: torch.Tensor, targets: torch.Tensor,
                       input_lengths: list[int], target_lengths: list[int], nll: torch.Tensor,
                       log_alpha: torch.Tensor, blank: int, zero_infinity: bool = False
                       ) -> torch.Tensor:
    """CTC's gradient as PyTorch's kernel gives it: the gradient of _ctc_loss's likelihood
    (Note [Gradients of decompositions]) plus exp(log_probs) on each sample's steps (PyTorch's
    kernel assumes the log probabilities come from a log-softmax, whose gradient then removes
    that term again), zero past a sample's length, and zero for a sample whose loss is
    infinite when zero_infinity is set."""
    steps, batch, _ = log_probs.shape
    nll_of = lambda lp: _ctc_loss(lp, targets, input_lengths, target_lengths, blank,  # noqa: E731
                                  zero_infinity)[0]
    (exact,) = _vjp(nll_of, (log_probs,), grad)
    within = torch.tensor([[t < input_lengths[n] for n in range(batch)] for t in range(steps)])
    kept = within.unsqueeze(2)
    if zero_infinity:
        kept = kept & (nll != float("inf")).reshape(1, batch, 1)
    return torch.where(kept, exact + log_probs.exp() * grad.reshape(1, batch, 1), 0.0)


_LN2, _LN10 = 0.6931471805599453, 2.302585092994046


def _median(x: torch.Tensor, dim: int | None = None, keepdim: bool = False
            ) -> Any:
    """median as the lower middle of a stable sort (PyTorch's median is the lower one of an
    even count), with its index along dim; over all elements, the value alone."""
    return _kth(x.reshape(-1) if dim is None else x, (x.numel() + 1) // 2 if dim is None
                else (x.shape[dim] + 1) // 2, 0 if dim is None else dim, keepdim, dim is None)


def _kth(x: torch.Tensor, k: int, dim: int = -1, keepdim: bool = False,
         value_only: bool = False) -> Any:
    """The k-th smallest along dim (kthvalue; 1-based) from a stable sort, and its index."""
    values, indices = torch.sort(x, dim=dim, stable=True)
    value = values.narrow(dim, k - 1, 1)
    index = indices.narrow(dim, k - 1, 1)
    if not keepdim:
        value, index = value.squeeze(dim), index.squeeze(dim)
    return value.reshape(()) if value_only else (value, index)


def _bucketize(x: torch.Tensor, boundaries: torch.Tensor, *, out_int32: bool = False,
               right: bool = False) -> torch.Tensor:
    """bucketize: how many boundaries lie below x (at or below, with right)."""
    below = x.unsqueeze(-1) >= boundaries if right else x.unsqueeze(-1) > boundaries
    return below.sum(-1, dtype=torch.int32 if out_int32 else torch.int64)


def _searchsorted(seq: torch.Tensor, values: torch.Tensor, *, out_int32: bool = False,
                  right: bool = False, side: str | None = None,
                  sorter: torch.Tensor | None = None) -> torch.Tensor:
    """searchsorted: how many of the sequence's entries lie below each value (at or below, on
    the right side), along its last dim; a 1-D sequence serves every value, as bucketize."""
    if sorter is not None:
        seq = torch.gather(seq, -1, sorter)
    right = right or side == "right"
    if seq.dim() == 1:
        return _bucketize(values, seq, out_int32=out_int32, right=right)
    v, s = values.unsqueeze(-1), seq.unsqueeze(-2)
    below = v >= s if right else v > s
    return below.sum(-1, dtype=torch.int32 if out_int32 else torch.int64)


def _fmax_fmin(pick: Any) -> Any:
    def f(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        """fmax/fmin: maximum/minimum, but a NaN loses to a number."""
        return torch.where(torch.isnan(b), a, torch.where(torch.isnan(a), b, pick(a, b)))
    return f


# The longest dim the importer's cumprod takes (kMaxCumprod in aten_importer.cc).
_RUNNING_PRODUCT_MAX = 64


def _scan(x: torch.Tensor, dim: int, combine: Any, fill: float) -> torch.Tensor:
    """Note [Scans]: a cumulative `combine` along dim in log2(n) steps, each combining every
    position with the one `step` before it (`fill` before the start), the step doubling. The
    engine has cumulative sums only; this gives any associative combination from elementwise
    ops, slices and concatenations."""
    dim = dim % x.dim() if x.dim() else 0
    n = x.shape[dim] if x.dim() else 1
    step = 1
    while step < n:
        shape = list(x.shape)
        shape[dim] = step
        before = torch.cat([torch.full(shape, fill, dtype=x.dtype, device=x.device),
                            x.narrow(dim, 0, n - step)], dim)
        x = combine(x, before)
        step *= 2
    return x


def _cumulative_extreme(pick: Any, fill: float) -> Any:
    def f(x: torch.Tensor, dim: int) -> tuple[torch.Tensor, torch.Tensor]:
        """cummax/cummin (Note [Scans]): the running extreme, and the last position at or
        before each where x equals the extreme it has there (PyTorch's kernel moves the index
        on ties too), or a NaN (which, as there, stays the extreme)."""
        if not x.is_floating_point():
            return NotImplemented  # type: ignore[return-value]
        values = _scan(x, dim, pick, fill)
        dim = dim % x.dim() if x.dim() else 0
        shape = [1] * x.dim()
        if x.dim():
            shape[dim] = x.shape[dim]
        at = torch.arange(x.shape[dim] if x.dim() else 1, dtype=x.dtype,
                          device=x.device).reshape(shape)
        record = (x == values) | torch.isnan(x)
        last = _scan(torch.where(record, at, -1.0), dim, torch.maximum, -1.0)
        return values, last.to(torch.int64)
    return f


def _long_cumprod(x: torch.Tensor, dim: int, dtype: torch.dtype | None = None) -> torch.Tensor:
    """cumprod along a dim longer than the importer's running product takes (which multiplies
    in PyTorch's order), as a scan (Note [Scans]): the same products, grouped otherwise."""
    if x.dim() == 0 or x.shape[dim] <= _RUNNING_PRODUCT_MAX or not x.is_floating_point():
        return NotImplemented  # type: ignore[return-value]
    return _scan(x if dtype is None else x.to(dtype), dim, torch.mul, 1.0)


def _logaddexp(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """log(exp(a) + exp(b)), exact where both are -inf (the scan's fill) or one is inf."""
    top = torch.maximum(a, b)
    return torch.where(top.abs() == float("inf"), top,
                       top + torch.log1p(torch.exp(-(a - b).abs())))


# Elementwise math the engine has no kernel for, from what it has. sinh uses expm1, so it keeps
# its digits near 0.
_MATH = {
    torch.ops.aten.sinh.default: lambda x: (torch.expm1(x) - torch.expm1(-x)) * 0.5,
    torch.ops.aten.cosh.default: lambda x: (torch.exp(x) + torch.exp(-x)) * 0.5,
    torch.ops.aten.tan.default: lambda x: torch.sin(x) / torch.cos(x),
    torch.ops.aten.asin.default: lambda x: torch.atan(x / torch.sqrt((1 - x) * (1 + x))),
    torch.ops.aten.acos.default:
        lambda x: torch.pi / 2 - torch.atan(x / torch.sqrt((1 - x) * (1 + x))),
    torch.ops.aten.exp2.default: lambda x: torch.exp(x * _LN2),
    torch.ops.aten.log2.default: lambda x: torch.log(x) / _LN2,
    torch.ops.aten.log10.default: lambda x: torch.log(x) / _LN10,
    torch.ops.aten.trunc.default:
        lambda x: torch.where(x < 0, torch.ceil(x), torch.floor(x)),
    torch.ops.aten.hypot.default: lambda a, b: torch.sqrt(a * a + b * b),
    torch.ops.aten.fmax.default: _fmax_fmin(torch.maximum),
    torch.ops.aten.fmin.default: _fmax_fmin(torch.minimum),
    torch.ops.aten.bucketize.Tensor: _bucketize,
    torch.ops.aten.searchsorted.Tensor: _searchsorted,
    torch.ops.aten.median.dim: _median,
    torch.ops.aten.median.default: _median,
    torch.ops.aten.kthvalue.default: _kth,
    torch.ops.aten.cummax.default: _cumulative_extreme(torch.maximum, float("-inf")),
    torch.ops.aten.cummin.default: _cumulative_extreme(torch.minimum, float("inf")),
    torch.ops.aten.logcumsumexp.default:
        lambda x, dim: _scan(x, dim, _logaddexp, float("-inf")),
    torch.ops.aten.cumprod.default: _long_cumprod,
}


def _apart(indices: list[torch.Tensor | None]) -> list[int] | None:
    """The dims indexed by integer tensors, when they are not consecutive (x[i, :, j])."""
    dims = [d for d, i in enumerate(indices) if i is not None]
    if not dims or dims == list(range(dims[0], dims[-1] + 1)) or \
            any(indices[d].dtype in (torch.bool, torch.uint8) for d in dims):
        return None
    return dims


def _index(x: torch.Tensor, indices: list[torch.Tensor | None]) -> torch.Tensor:
    """Advanced indexing by tensors on dims apart: PyTorch puts the indices' broadcast dims
    first, then the other dims in order, which is indexing on consecutive dims (what the
    importer lowers) of x with the indexed dims moved to the front."""
    dims = _apart(indices)
    if dims is None:
        return NotImplemented  # type: ignore[return-value]
    rest = [d for d in range(x.dim()) if d not in dims]
    return torch.ops.aten.index.Tensor(x.permute(dims + rest), [indices[d] for d in dims])


def _index_put(x: torch.Tensor, indices: list[torch.Tensor | None], values: torch.Tensor,
               accumulate: bool = False) -> torch.Tensor:
    """index_put on dims apart (the gradient of _index's indexing): on x with those dims
    moved to the front, as indexing them there, and moved back. An overwriting index_put
    (`x[i] = v`) is two accumulating ones (Note [Overwriting index_put])."""
    dims = _apart(indices)
    if dims is None:
        if accumulate or not x.is_floating_point():
            return NotImplemented  # type: ignore[return-value]
        return _overwrite(x, indices, values)
    order = dims + [d for d in range(x.dim()) if d not in dims]
    back = [order.index(d) for d in range(x.dim())]
    put = torch.ops.aten.index_put.default(x.permute(order), [indices[d] for d in dims], values,
                                           accumulate)
    return put.permute(back)


def _index_put_(x: torch.Tensor, indices: list[torch.Tensor | None], values: torch.Tensor,
                accumulate: bool = False, unsafe: bool = False) -> torch.Tensor:
    """The in-place forms of index_put, where _index_put decomposes it."""
    put = _index_put(x, indices, values, accumulate)
    return put if put is NotImplemented else x.copy_(put)


def _overwrite(x: torch.Tensor, indices: list[torch.Tensor | None], values: torch.Tensor
               ) -> torch.Tensor:
    """Note [Overwriting index_put]: the importer lowers index_put as a scatter that adds.
    Overwriting is the sum of the values put at each position, divided by how many were put
    there, where any were, and x elsewhere. Positions put once (a mask's, a permutation's)
    take their value exactly. PyTorch leaves the result of repeated positions undefined; here
    it is their mean, which is the value itself when all are equal (`x[i] = 0`)."""
    at = [k for k, i in enumerate(indices) if i is not None]
    shape = torch.broadcast_shapes(*[indices[k].shape for k in at])
    put_shape = (*x.shape[:at[0]], *shape, *x.shape[at[-1] + 1:])
    values = values.to(x.dtype).expand(put_shape)
    index_put = torch.ops.aten.index_put.default
    counts = index_put(torch.zeros_like(x), indices, torch.ones_like(values), True)
    sums = index_put(torch.zeros_like(x), indices, values, True)
    return torch.where(counts > 0, sums / counts.clamp_min(1), x)


def _avg_pool2d_decomposes(x: torch.Tensor, kernel_size: object, stride: object,
                           padding: object = 0, ceil_mode: bool = False,
                           count_include_pad: bool = True, divisor_override: int | None = None
                           ) -> bool:
    """Whether _avg_pool2d decomposes, for its arguments (its backward asks the same)."""
    return x.dim() == 4 and ceil_mode and count_include_pad and not divisor_override and \
        any(_per_dim(padding, 2))


def _avg_pool2d(x: torch.Tensor, kernel_size: list[int], stride: list[int] | None = None,
                padding: object = 0, ceil_mode: bool = False, count_include_pad: bool = True,
                divisor_override: int | None = None) -> torch.Tensor:
    """Average pooling with ceil_mode, padding and count_include_pad together, which the
    engine's pooling divides otherwise: PyTorch divides a window that runs past the padded
    input by the part inside the padding. So the padding is made explicit (zeros) and the
    padded input pooled without padding and without counting outside it, which divides the
    same way; the one window PyTorch drops (one that would start in the right padding) is
    sliced off. Every other configuration is left whole, for the importer."""
    if not _avg_pool2d_decomposes(x, kernel_size, stride, padding, ceil_mode,
                                  count_include_pad, divisor_override):
        return NotImplemented  # type: ignore[return-value]
    k, p = _per_dim(kernel_size, 2), _per_dim(padding, 2)
    s = _per_dim(stride, 2) if stride else k
    sizes = []
    for d in range(2):
        size = x.shape[2 + d]
        out = -(-(size + 2 * p[d] - k[d]) // s[d]) + 1
        if (out - 1) * s[d] >= size + p[d]:
            out -= 1
        sizes.append(out)
    padded = torch.nn.functional.pad(x, (p[1], p[1], p[0], p[0]))
    y = torch.nn.functional.avg_pool2d(padded, k, s, 0, True, False)
    return y[..., :sizes[0], :sizes[1]]


def _adaptive_windows(size: int, out: int) -> list[range]:
    """PyTorch's adaptive pooling windows along a dim: floor(i * size / out) up to
    ceil((i + 1) * size / out)."""
    return [range(i * size // out, -(-(i + 1) * size // out)) for i in range(out)]


def _adaptive_size(x: torch.Tensor, output_size: list[int | None]) -> tuple[int, int]:
    return tuple(size if size is not None else full  # type: ignore[return-value]
                 for size, full in zip(output_size, x.shape[-2:], strict=True))


def _adaptive_max_pool2d(x: torch.Tensor, output_size: list[int]
                         ) -> tuple[torch.Tensor, torch.Tensor]:
    """Adaptive max pooling whose output does not divide the input (the importer pools the
    dividing case whole): every window's positions gathered into a row (padded with -inf where
    a window is smaller than the largest), and the row's max and its first position, as
    PyTorch scans a window, give the value and the index. Its gradient goes to that position
    alone, as PyTorch's does."""
    height, width = x.shape[-2:]
    out_h, out_w = _adaptive_size(x, output_size)
    if height % out_h == 0 and width % out_w == 0:
        return NotImplemented  # type: ignore[return-value]
    windows = [[[r * width + c for r in rows for c in cols]
                for cols in _adaptive_windows(width, out_w)]
               for rows in _adaptive_windows(height, out_h)]
    longest = max(len(w) for row in windows for w in row)
    none = height * width  # (_max_over_windows's -inf column)
    return _max_over_windows(x, [[w + [none] * (longest - len(w)) for w in row]
                                 for row in windows])


def _max_over_windows(x: torch.Tensor, windows: list[list[list[int]]]
                      ) -> tuple[torch.Tensor, torch.Tensor]:
    """The max of each window over x's last two dims, and its first position (the window's
    order), as a max pooling gives them. `windows` holds, per output row and column, the
    window's positions in the flattened plane, all windows of one length; the position
    height * width stands for -inf (padding)."""
    height, width = x.shape[-2:]
    table = torch.tensor(windows, dtype=torch.int64)  # (out_h, out_w, window)
    flat = x.reshape(*x.shape[:-2], height * width)
    flat = torch.cat([flat, torch.full_like(flat[..., :1], float("-inf"))], -1)
    rows = flat[..., table.reshape(-1)].reshape(*x.shape[:-2], *table.shape)
    values, where = rows.max(-1)
    index = table.expand(*where.shape, table.shape[-1]).gather(-1, where.unsqueeze(-1))
    return values, index.squeeze(-1)


def _dilated(x: torch.Tensor, kernel_size: object, stride: object = (), padding: object = 0,
             dilation: object = 1, ceil_mode: bool = False) -> bool:
    """Whether a 2-D max pooling is dilated (the importer pools the others whole)."""
    return any(d != 1 for d in _per_dim(dilation, 2))


def _pool_windows(size: int, k: int, s: int, p: int, d: int, ceil_mode: bool
                  ) -> list[list[int | None]]:
    """The positions of a pooling's windows along a dim (None in the padding), with PyTorch's
    output size: with ceil_mode a last window that would start in the right padding is
    dropped."""
    span = d * (k - 1) + 1
    n = size + 2 * p - span
    out = (-(-n // s) if ceil_mode else n // s) + 1
    if ceil_mode and (out - 1) * s >= size + p:
        out -= 1
    return [[q if 0 <= q < size else None for q in range(i * s - p, i * s - p + span, d)]
            for i in range(out)]


def _dilated_max_pool2d(x: torch.Tensor, kernel_size: list[int], stride: object = (),
                        padding: object = 0, dilation: object = 1, ceil_mode: bool = False
                        ) -> tuple[torch.Tensor, torch.Tensor]:
    """Dilated max pooling, as adaptive max pooling whose output does not divide the input:
    each window's positions (a step of the dilation apart, -inf in the padding) gathered into
    a row, and the row's max and its first position, in the (row, column) order PyTorch scans
    a window, give the value and the index. Its gradient goes to that position alone."""
    if not _dilated(x, kernel_size, stride, padding, dilation, ceil_mode):
        return NotImplemented  # type: ignore[return-value]
    k = _per_dim(kernel_size, 2)
    s = _per_dim(stride, 2) if stride else k
    p, d = _per_dim(padding, 2), _per_dim(dilation, 2)
    height, width = x.shape[-2:]
    none = height * width  # (_max_over_windows's -inf column)
    return _max_over_windows(
        x, [[[none if r is None or c is None else r * width + c for r in rows for c in cols]
             for cols in _pool_windows(width, k[1], s[1], p[1], d[1], ceil_mode)]
            for rows in _pool_windows(height, k[0], s[0], p[0], d[0], ceil_mode)])


def _adaptive_max_pool2d_backward(grad: torch.Tensor, x: torch.Tensor, indices: torch.Tensor
                                  ) -> torch.Tensor:
    """_adaptive_max_pool2d's gradient (Note [Gradients of decompositions]); the dividing
    case is left whole for the importer."""
    size = list(grad.shape[-2:])
    if x.shape[-2] % size[0] == 0 and x.shape[-1] % size[1] == 0:
        return NotImplemented  # type: ignore[return-value]
    return _vjp(lambda t: _adaptive_max_pool2d(t, size)[0], (x,), grad)[0]


def _atan2(y: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """atan2 from the engine's atan: atan(y / x), moved by pi into the left half-plane, and
    pi / 2 with y's sign where x is 0 (0 where y is 0 too; PyTorch would give +-0 or +-pi
    there by the zeros' signs)."""
    a = torch.atan(y / x)
    a = torch.where(x < 0, torch.where(y >= 0, a + torch.pi, a - torch.pi), a)
    return torch.where(x == 0, torch.sign(y) * (torch.pi / 2), a)


def _cdist_forward(x1: torch.Tensor, x2: torch.Tensor, p: float,
                   compute_mode: int | None) -> torch.Tensor:
    """cdist as PyTorch computes it: for p = 2 with more than 25 rows on either side (or when
    the mode asks), by a matrix product (|a|^2 + |b|^2 - 2 a.b, clamped at 0); otherwise from
    the differences of every pair of rows."""
    euclid = p == 2 and (compute_mode == 1 or (compute_mode is None and (
        x1.shape[-2] > 25 or x2.shape[-2] > 25)))
    if euclid:
        n1 = x1.pow(2).sum(-1, keepdim=True)
        n2 = x2.pow(2).sum(-1, keepdim=True)
        a = torch.cat([x1.mul(-2), n1, torch.ones_like(n1)], -1)
        b = torch.cat([x2, torch.ones_like(n2), n2], -1)
        return a.matmul(b.mT).clamp_min(0).sqrt()
    diff = (x1.unsqueeze(-2) - x2.unsqueeze(-3)).abs()
    if p == 0:
        return (diff != 0).to(x1.dtype).sum(-1)
    if p == float("inf"):
        return diff.amax(-1)
    return diff.pow(p).sum(-1).pow(1.0 / p)


def _cdist_backward(grad: torch.Tensor, x1: torch.Tensor, x2: torch.Tensor, p: float,
                    cdist: torch.Tensor) -> torch.Tensor:
    """cdist's gradient with respect to x1 (PyTorch calls it again with x1 and x2 swapped for
    x2's): the sum over x2's rows of grad * d|x1 - x2|_p / dx1, 0 where the distance is 0."""
    diff = x1.unsqueeze(-2) - x2.unsqueeze(-3)
    g = grad.unsqueeze(-1)
    if p == 1:
        return (g * diff.sign()).sum(-2)
    d = cdist.unsqueeze(-1)
    if p == 2:
        return torch.where(d == 0, 0.0, g * diff / d).sum(-2)
    if p == float("inf"):
        hit = (diff.abs() == d) & (d != 0)
        return torch.where(hit, g * diff.sign(), 0.0).sum(-2)
    if p < 1:
        return NotImplemented  # type: ignore[return-value]  # left whole: refused by name
    # (PyTorch's two forms, equal in value, rounded as its kernel rounds them)
    slope = diff.sign() * diff.abs().pow(p - 1) if p < 2 else diff * diff.abs().pow(p - 2)
    return torch.where(d == 0, 0.0, g * slope / d.pow(p - 1)).sum(-2)


# Note [Fused attention]
# The lazy device records the fused CPU attention op where PyTorch would run the math composite
# (Note [Fused attention] in csrc/device.cc), so the trace meets it and its backward. Both are
# decomposed into the math here: scores = q k^T scaled (q and k each by the root of the scale,
# as PyTorch's math does), masked, a softmax, times v; and the row log-sum-exp that the fused
# op returns for its backward (computed only where a later graph reads it: within one graph
# nothing does, and it is dead code). The backward recomputes the probabilities P = softmax(S)
# rather than keeping them between the passes (as the fused kernel does): dV = P^T dO, dS the
# softmax gradient of dP = dO V^T (the engine's SalusSoftmaxGrad), dQ = dS K * scale,
# dK = dS^T Q * scale. Each result has the fused op's strides (contiguous in batch, token,
# head, feature order), so views the recording made of them are views here too.
def _attention_scores(q: torch.Tensor, k: torch.Tensor, is_causal: bool,
                      attn_mask: torch.Tensor | None, scale: float | None
                      ) -> tuple[torch.Tensor, float]:
    s = scale if scale is not None else 1.0 / q.shape[-1] ** 0.5
    root = s ** 0.5
    scores = torch.matmul(q * root, (k * root).transpose(-2, -1))
    if is_causal:
        keep = q.new_ones((q.shape[-2], k.shape[-2]), dtype=torch.bool).tril()
        scores = scores.masked_fill(keep.logical_not(), float("-inf"))
    if attn_mask is not None:
        scores = scores + attn_mask
    return scores, s


def _as_fused(t: torch.Tensor) -> torch.Tensor:
    return t.transpose(1, 2).contiguous().transpose(1, 2)


def _attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, dropout_p: float = 0.0,
               is_causal: bool = False, *, attn_mask: torch.Tensor | None = None,
               scale: float | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Note [Fused attention]: the output and the rows' log-sum-exp of the scores."""
    if dropout_p != 0.0:
        return NotImplemented  # type: ignore[return-value]  # left whole: refused by name
    scores, _ = _attention_scores(q, k, is_causal, attn_mask, scale)
    top = torch.amax(scores, -1, keepdim=True)
    lse = (torch.log(torch.sum(torch.exp(scores - top), -1, keepdim=True)) + top).squeeze(-1)
    out = torch.matmul(torch.softmax(scores, -1), v)
    return _as_fused(out), lse


def _attention_backward(grad_out: torch.Tensor, q: torch.Tensor, k: torch.Tensor,
                        v: torch.Tensor, out: torch.Tensor, lse: torch.Tensor, dropout_p: float,
                        is_causal: bool, *, attn_mask: torch.Tensor | None = None,
                        scale: float | None = None
                        ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Note [Fused attention]: the gradients of q, k and v."""
    if dropout_p != 0.0:
        return NotImplemented  # type: ignore[return-value]
    scores, s = _attention_scores(q, k, is_causal, attn_mask, scale)
    p = torch.softmax(scores, -1)
    grad_v = torch.matmul(p.transpose(-2, -1), grad_out)
    grad_p = torch.matmul(grad_out, v.transpose(-2, -1))
    grad_s = torch.ops.aten._softmax_backward_data(grad_p, p, -1, p.dtype)
    grad_q = torch.matmul(grad_s, k) * s
    grad_k = torch.matmul(grad_s.transpose(-2, -1), q) * s
    return _as_fused(grad_q), _as_fused(grad_k), _as_fused(grad_v)


# Note [Fused linear]
# The lazy device records a linear layer as one op each way (Note [Fused linear] in
# csrc/device.cc): `mkldnn_linear` and its backward, decomposed here into the products the
# composite computes, over the input's leading dims merged into rows: y = x W^T + b,
# dx = dy W, dW = dy^T x, db the column sums of dy; each result contiguous.
def _rows(t: torch.Tensor) -> torch.Tensor:
    return t.reshape(-1, t.shape[-1])


def _linear(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None = None) -> torch.Tensor:
    """Note [Fused linear]: the layer's output."""
    y = torch.mm(_rows(x), w.t()) if b is None else torch.addmm(b, _rows(x), w.t())
    return y.view(*x.shape[:-1], w.shape[0])


def _linear_backward(x: torch.Tensor, grad: torch.Tensor, w: torch.Tensor,
                     mask: list[bool]) -> tuple[torch.Tensor | None, ...]:
    """Note [Fused linear]: the gradients of the input, the weight and the bias (None where
    `mask` leaves one out)."""
    g = _rows(grad)
    return (torch.mm(g, w).view(x.shape) if mask[0] else None,
            torch.mm(g.t(), _rows(x)) if mask[1] else None,
            g.sum(0) if mask[2] else None)


def _weight_norm_backward(grad_w: torch.Tensor, saved_v: torch.Tensor, saved_g: torch.Tensor,
                          saved_norms: torch.Tensor, dim: int
                          ) -> tuple[torch.Tensor, torch.Tensor]:
    """weight_norm's gradient (PyTorch has kernels for it but no decomposition): with
    w = v * g / |v|, the norm over every dim but `dim` (kept as size 1, as g and the norms are),
    dg = sum(dw * v) / |v| and dv = g / |v| * (dw - v * dg / |v|)."""
    dim = dim % saved_v.dim()
    others = [d for d in range(saved_v.dim()) if d != dim]
    grad_g = (grad_w * saved_v).sum(others, keepdim=True) / saved_norms
    grad_v = saved_g / saved_norms * (grad_w - saved_v * (grad_g / saved_norms))
    return grad_v, grad_g.reshape(saved_g.shape)


def trace(fn: object, args: tuple, modules: list[torch.nn.Module],
          optimizers: list[torch.optim.Optimizer]) -> Traced:
    """Traces one call `fn(*args)` into a Traced (Note [One graph per step])."""
    functional = [_optim.functional(o) for o in optimizers]
    states = _state_tensors(modules, functional)
    flat_args, in_spec = pytree.tree_flatten(args)
    batch = [a for a in flat_args if isinstance(a, torch.Tensor)]
    lr_inputs = [(f.optimizer, gi) for f in functional
                 for gi in range(len(f.optimizer.param_groups))]
    # Fed as 1-element tensors, used as scalars.
    lrs = [torch.tensor([float(o.param_groups[gi]["lr"])], dtype=torch.float32)
           for o, gi in lr_inputs]
    out_spec: list[pytree.TreeSpec] = []
    by_param: dict[int, int] = {}
    for i, s in enumerate(states):
        if s.kind == "parameter":
            by_param.setdefault(id(s.module.get_parameter(s.attr)), i)

    def step(state_values: list[torch.Tensor], batch_values: list[torch.Tensor],
             lr_values: list[torch.Tensor]) -> list[torch.Tensor]:
        for i, s in enumerate(states):
            if s.kind == "parameter":
                state_values[i].requires_grad_(True)
        per_module: list[dict[str, torch.Tensor]] = [{} for _ in modules]
        for i, s in enumerate(states):
            if s.kind != "optimizer":
                per_module[modules.index(s.module)][s.attr] = state_values[i]

        def sub(p: torch.Tensor) -> torch.Tensor:
            return state_values[by_param[id(p)]]

        def make_step(f: _optim.Functional, first_lr: int):  # noqa: ANN202
            def opt_step(closure: object = None) -> None:
                if closure is not None:
                    raise CaptureError("optimizer.step(closure) is not supported by capture")
                with torch.no_grad():
                    for gi, group in enumerate(f.optimizer.param_groups):
                        for p in group["params"]:
                            q = sub(p)
                            if q.grad is None:
                                continue
                            slots = {st.key: state_values[j] for j, st in enumerate(states)
                                     if st.kind == "optimizer" and st.param is p
                                     and st.optimizer is f.optimizer}
                            f.update(group, lr_values[first_lr + gi].reshape(()), q, q.grad, slots)
            return opt_step

        def make_zero_grad(f: _optim.Functional):  # noqa: ANN202
            def zero_grad(set_to_none: bool = True) -> None:
                for group in f.optimizer.param_groups:
                    for p in group["params"]:
                        sub(p).grad = None
            return zero_grad

        first = 0
        with contextlib.ExitStack() as stack:
            for m, params in zip(modules, per_module, strict=False):
                stack.enter_context(stateless._reparametrize_module(m, params))
            for f in functional:
                o = f.optimizer
                stack.callback(_restore, o, "step", o.__dict__.get("step"))
                stack.callback(_restore, o, "zero_grad", o.__dict__.get("zero_grad"))
                o.step = make_step(f, first)
                o.zero_grad = make_zero_grad(f)
                first += len(o.param_groups)
            for m in modules:
                for mod in m.modules():
                    # Re-parametrised, a module's parameters are the traced inputs already.
                    mod.zero_grad = types.MethodType(_module_zero_grad, mod)
                    stack.callback(_restore, mod, "zero_grad", None)
            it = iter(batch_values)
            call_args = pytree.tree_unflatten(
                [next(it) if isinstance(a, torch.Tensor) else a for a in flat_args], in_spec)
            result = fn(*call_args)
        flat_out, spec = pytree.tree_flatten(result)
        out_spec.append(spec)
        return [o.detach() if isinstance(o, torch.Tensor) else o for o in flat_out]

    state_now = [s.host().detach() for s in states]
    # The math attention backend decomposes above autograd, so its backward is plain ops.
    try:
        with torch.nn.attention.sdpa_kernel(torch.nn.attention.SDPBackend.MATH):
            joint = make_fx(step, decomposition_table=_decompositions(),
                            tracing_mode="fake")(state_now, batch, lrs)
            pure = make_fx(torch.func.functionalize(joint, remove="mutations_and_views"),
                           tracing_mode="fake")(state_now, batch, lrs)
    except (GuardOnDataDependentSymNode, DataDependentOutputException) as e:
        raise CaptureError(
            "the step reads a tensor's value while it runs (.item(), .tolist(), a Python "
            "branch on a tensor, printing one): a captured step is one graph computed in the "
            f"daemon, so return the value instead and read it after the call ({e})") from None
    for m in modules:  # parameters' .grad set on the traced inputs are not the user's
        for p in m.parameters():
            p.grad = None
    input_names = [f"input{i}" for i in range(len(batch))] + \
        [f"lr.{i}" for i in range(len(lrs))]
    pure.graph.eliminate_dead_code()  # keeps the copy_ writes: their schema mutates
    graph, outputs, constants = _serialize(pure, [s.name for s in states], input_names)
    draws = _number_draws(graph)
    if draws:
        input_names.append("rng")
    return Traced(graph, states, input_names, lr_inputs, outputs, out_spec[-1], constants,
                  draws)


# Note [Random numbers]
# A traced step's random draws (`bernoulli`, which dropout decomposes into) cannot use PyTorch's
# generator: the daemon draws them, with the engine's counter-based Philox generator. The graph
# gets one more input, "rng" (int64 [2]: a seed and an offset), and each draw an index k
# (argument "salus_draw"); draw k of a step uses the stream (seed, offset + k). The adaptor takes
# the seed from PyTorch's default generator when it captures the step (so torch.manual_seed
# makes a run reproducible) and advances the offset by the number of draws every call, so no two
# draws of a run share a stream. The numbers differ from those eager PyTorch would draw.
def _number_draws(graph: apb.AtenGraph) -> int:
    draws = 0
    for node in graph.nodes:
        if node.op.startswith("aten.bernoulli."):
            a = node.args.add()
            a.name = "salus_draw"
            a.int_value = draws
            draws += 1
    if draws:
        v = graph.values.add()
        v.name = "rng"
        v.dtype = apb.ATEN_INT64
        v.shape.append(2)
        graph.inputs.append(len(graph.values) - 1)
    return draws


def _module_zero_grad(self: torch.nn.Module, set_to_none: bool = True) -> None:
    for p in self.parameters():
        p.grad = None


def _restore(obj: object, attr: str, value: object) -> None:
    if value is None:
        obj.__dict__.pop(attr, None)
    else:
        obj.__dict__[attr] = value


def _dtype(t: torch.dtype, where: str) -> int:
    if t not in _DTYPES:
        raise CaptureError(f"{where}: dtype {t} is not supported")
    return _DTYPES[t]


# Note [Strided views]
# as_strided_copy and as_strided_scatter (a gradient restrided by autograd, once functionalized:
# ConvNeXt's [N, C, 1, 1] one in channels-last strides) address their base's storage. The
# engine's tensors are row-major, so its importer reads the view's strides against the base's
# row-major elements (Note [Strided views] in aten_importer.cc); a base whose storage is
# otherwise ordered (its non-unit dims not row-major, or an offset) is refused here, where the
# trace still knows its strides, rather than read wrongly there.
_STRIDED_VIEWS = (torch.ops.aten.as_strided_copy.default, torch.ops.aten.as_strided_scatter.default)


def _check_row_major_base(n: torch.fx.Node) -> None:
    base = n.args[0].meta.get("val") if isinstance(n.args[0], torch.fx.Node) else None
    if not isinstance(base, torch.Tensor):
        return
    expected = 1
    for size, stride in reversed(list(zip(base.shape, base.stride(), strict=True))):
        if size != 1 and stride != expected:
            break
        expected *= size
    else:
        if base.storage_offset() == 0:
            return
    raise CaptureError(
        f"{n.target} ({n.name}): a strided view of a tensor whose storage is not row-major "
        f"(shape {tuple(base.shape)}, strides {base.stride()}, offset {base.storage_offset()})")


def _serialize(gm: torch.fx.GraphModule, state_names: list[str], input_names: list[str]
               ) -> tuple[apb.AtenGraph, list[str], dict[int, object]]:
    g = apb.AtenGraph()
    g.producer = f"salus-torch, torch {torch.__version__}"
    index: dict[torch.fx.Node, object] = {}  # node -> value index, or tuple of them
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    names = state_names + input_names
    if len(placeholders) != len(names):
        raise CaptureError(f"the trace has {len(placeholders)} inputs, expected {len(names)}")

    def new_value(name: str, val: torch.Tensor, where: str) -> int:
        v = g.values.add()
        v.name = name
        v.dtype = _dtype(val.dtype, where)
        v.shape.extend(int(d) for d in val.shape)
        return len(g.values) - 1

    for n, name in zip(placeholders, names, strict=False):
        index[n] = new_value(name, n.meta["val"], name)
        (g.state if name in state_names else g.inputs).append(index[n])

    def const_value(t: torch.Tensor, where: str) -> int:
        k = new_value(f"const{len(g.values)}", t, where)
        g.values[k].constant = True
        g.values[k].data = t.detach().contiguous().cpu().numpy().tobytes()
        return k

    def arg(a: apb.AtenArgument, x: object, where: str) -> None:
        if isinstance(x, torch.fx.Node):
            if not isinstance(index.get(x), int):
                raise CaptureError(f"{where}: argument {a.name} is not a tensor value")
            a.value = index[x]
        elif x is None:
            a.none = True
        elif isinstance(x, bool):
            a.bool_value = x
        elif isinstance(x, int):
            a.int_value = x
        elif isinstance(x, float):
            a.float_value = x
        elif isinstance(x, torch.dtype):
            a.string_value = str(x).removeprefix("torch.")
        elif isinstance(x, torch.device | torch.layout | torch.memory_format | str):
            a.string_value = str(x)
        elif isinstance(x, list | tuple):
            if all(isinstance(e, torch.fx.Node) or e is None for e in x) and x:
                a.values.v.extend(-1 if e is None else index[e] for e in x)
            elif all(isinstance(e, bool) for e in x) and x:
                a.ints.v.extend(int(e) for e in x)
            elif all(isinstance(e, int) for e in x):
                a.ints.v.extend(x)
            elif all(isinstance(e, int | float) for e in x):
                a.floats.v.extend(float(e) for e in x)
            else:
                raise CaptureError(f"{where}: argument {a.name} has an unsupported list {x!r}")
        elif isinstance(x, torch.Tensor):
            a.value = const_value(x, where)
        else:
            raise CaptureError(f"{where}: argument {a.name} of type {type(x).__name__}")

    outputs: list[str] = []
    constants: dict[int, object] = {}
    for n in gm.graph.nodes:
        if n.op == "placeholder":
            continue
        if n.op == "get_attr":
            index[n] = const_value(getattr(gm, n.target), n.target)
        elif n.op == "call_function" and n.target is operator.getitem:
            index[n] = index[n.args[0]][n.args[1]]
        elif n.op == "call_function" and isinstance(n.target, torch._ops.OpOverload):
            if n.target in _STRIDED_VIEWS:
                _check_row_major_base(n)
            schema = n.target._schema
            node = g.nodes.add()
            ns, _, base = schema.name.partition("::")
            node.op = f"{ns}.{base}.{schema.overload_name or 'default'}"
            where = f"{node.op} ({n.name})"
            given = dict(zip([a.name for a in schema.arguments], n.args, strict=False))
            given.update(n.kwargs)
            for sa in schema.arguments:
                a = node.args.add()
                a.name = sa.name
                if sa.name in given:
                    arg(a, given[sa.name], where)
                elif sa.has_default_value():
                    arg(a, sa.default_value, where)
                else:
                    raise CaptureError(f"{where}: argument {sa.name} is missing")
            val = n.meta.get("val")
            if isinstance(val, tuple | list):
                outs = []
                for k, v in enumerate(val):
                    if isinstance(v, torch.Tensor):
                        outs.append(new_value(f"{n.name}.{k}", v, where))
                    else:
                        outs.append(-1)
                node.outputs.extend(outs)
                index[n] = tuple(outs)
            elif isinstance(val, torch.Tensor):
                index[n] = new_value(n.name, val, where)
                node.outputs.append(index[n])
            else:
                index[n] = None
        elif n.op == "output":
            for k, o in enumerate(pytree.tree_leaves(n.args[0])):
                if isinstance(o, torch.fx.Node):
                    g.outputs.append(index[o])
                    outputs.append(f"output{k}")  # the importer's name for it
                else:
                    constants[k] = o
                    outputs.append("")
        else:
            raise CaptureError(f"{n.op} {n.target} is not an ATen operator")
    return g, outputs, constants
