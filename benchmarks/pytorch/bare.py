"""The floor of any device written as a Python tensor subclass: a step whose every ATen op
reaches a `__torch_dispatch__` that does nothing but make its outputs' wrappers.

`Bare` tensors have shapes and no data. Each op's output shapes come from running it once on
meta tensors per op and input shapes, then from that memo; in-place ops return their
argument. Nothing is recorded, sent or computed, so the time of a step on `Bare` tensors is
what PyTorch's dispatch into Python, autograd over a tensor subclass and the wrappers cost
by themselves: the lazy `salus` device's recording can only be slower, and a device that
must stay within a fraction of eager PyTorch's step has to record below Python.

`python bare.py --cpp` times the same floor below Python, in a process of its own: plain
PrivateUse1 tensors whose ops reach a C++ fallback that makes their outputs from a memo
(bare.cc), beside eager steps in that process. That is the least a device recording in C++
can cost: the user's Python, PyTorch's dispatcher and autograd, and one memo lookup per op.
It prints JSON: per model, the ops per step and the per-step seconds of each side.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import types
from pathlib import Path
from typing import Any

import torch
from torch.utils import _pytree as pytree


def _meta(t: torch.Tensor) -> torch.Tensor:
    return torch.empty_strided(t.shape, t.stride(), dtype=t.dtype, device="meta")


class Bare(torch.Tensor):
    """A tensor with a shape, a dtype and nothing else."""

    _memo: dict[tuple, Any] = {}
    ops = 0

    @staticmethod
    def __new__(cls, meta: torch.Tensor) -> Bare:
        r = torch.Tensor._make_wrapper_subclass(
            cls, meta.shape, strides=meta.stride(), storage_offset=meta.storage_offset(),
            dtype=meta.dtype, device="cpu", requires_grad=False)
        r._m = meta
        return r

    __torch_function__ = torch._C._disabled_torch_function_impl

    @classmethod
    def __torch_dispatch__(cls, func: Any, types: Any, args: tuple = (),
                           kwargs: dict | None = None) -> Any:
        Bare.ops += 1
        kwargs = kwargs or {}
        if func is torch.ops.aten._local_scalar_dense.default:  # a read: no value to give
            return 0.0
        if func._schema.is_mutable:  # in place or out=: its first argument
            return args[0]
        key = (func, tuple(a._m.shape if isinstance(a, Bare)
                           else tuple(a) if isinstance(a, list) else a for a in args))
        try:
            out = Bare._memo.get(key)
        except TypeError:  # an unhashable argument
            key, out = None, None
        if out is None:
            margs, mkwargs = pytree.tree_map(
                lambda a: _meta(a._m) if isinstance(a, Bare) else a, (args, kwargs))
            out = func(*margs, **mkwargs)
            if key is not None:
                Bare._memo[key] = out
        return pytree.tree_map(lambda m: Bare(m) if isinstance(m, torch.Tensor) else m, out)


def bare_model(model: torch.nn.Module) -> torch.nn.Module:
    """`model` with its parameters and buffers replaced, in place, by `Bare` tensors."""
    for module in model.modules():
        for name, p in list(module._parameters.items()):
            if p is not None:
                module._parameters[name] = torch.nn.Parameter(Bare(_meta(p)))
        for name, b in list(module._buffers.items()):
            if b is not None:
                module._buffers[name] = Bare(_meta(b))
    return model


def bare_data(*tensors: torch.Tensor) -> tuple[Bare, ...]:
    return tuple(Bare(_meta(t)) for t in tensors)


def _cpp_device() -> Any:
    """Names PrivateUse1 `bare` and loads its guard and hooks (the lazy device's) and the
    fallback of bare.cc; returns that extension."""
    from torch.utils.cpp_extension import load
    torch.utils.rename_privateuse1_backend("bare")
    module = types.ModuleType("torch.bare")
    module.is_available = lambda: True
    module.device_count = lambda: 1
    module.current_device = lambda: 0
    module._is_in_bad_fork = lambda: False
    module.manual_seed_all = lambda seed: None
    torch._register_device_module("bare", module)
    here = Path(__file__).resolve().parent
    load("salus_torch_device",
         [str(here.parents[1] / "adaptors/pytorch/salus_torch/csrc/device.cc")], verbose=False)
    return load("salus_bare_floor", [str(here / "bare.cc")], verbose=False)


def cpp_main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--cpp", action="store_true", required=True)
    ap.add_argument("--models", default="resnet,encoder")
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from compare import build, timed
    from models import user_step
    ext = _cpp_device()
    out = {}
    for model in args.models.split(","):
        m, opt, data = build(model, args.batch)
        eager = user_step(m, opt)
        m, opt, data = build(model, args.batch)
        m.to("bare")
        opt = type(opt)(m.parameters(), **opt.defaults)
        bare = user_step(m, opt)
        on_device = tuple(t.to("bare") for t in data)
        bare_times = timed(bare, on_device, args.steps, args.warmup)
        before = ext.calls()
        float(bare(*on_device))
        out[model] = {"ops": ext.calls() - before, "cpp": bare_times,
                      "eager": timed(eager, data, args.steps, args.warmup)}
    print(json.dumps(out))


if __name__ == "__main__":
    cpp_main()
