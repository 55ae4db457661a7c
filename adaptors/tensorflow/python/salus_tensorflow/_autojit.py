"""Keeps Keras' own XLA choices off while the SALUS device is present.

Keras 3 resolves ``jit_compile="auto"`` to True whenever TensorFlow lists a device other than
the CPU, and XLA has no compiler for SALUS: an unmodified ``model.compile(...)`` would fail with
"No JIT device registered for SALUS". The step needs no XLA there, since the daemon compiles it.
Keras also compiles every grouped convolution (ConvNeXt's depthwise ``Conv2D(groups=C)``) as a
function of its own with XLA, because TensorFlow's CPU kernels have none; such a function stays
a call inside the traced step, which the daemon cannot run, while the daemon's convolutions are
grouped. This module, imported at interpreter start by ``salus_tensorflow.pth``, waits for
Keras' modules to load and wraps both choices: with SALUS listed, "auto" means no XLA and a
grouped 2-D convolution is TensorFlow's plain Conv2D. An explicit ``jit_compile=True`` is left
as the user asked. Nothing is imported early: a process that never imports Keras pays one
finder lookup per import.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys


def _salus_listed() -> bool:
    try:
        import tensorflow as tf

        return any(d.device_type == "SALUS" for d in tf.config.list_physical_devices())
    except Exception:  # noqa: BLE001 - never break Keras over this
        return False


def _patch_trainer(module) -> None:
    trainer = getattr(module, "Trainer", None)
    original = getattr(trainer, "_resolve_auto_jit_compile", None)
    if original is None or getattr(original, "_salus", False):
        return

    def resolve(self):
        return False if _salus_listed() else original(self)

    resolve._salus = True
    trainer._resolve_auto_jit_compile = resolve


def _patch_nn(module) -> None:
    original = getattr(module, "conv", None)
    convert = getattr(module, "_convert_data_format", None)
    if original is None or convert is None or getattr(original, "_salus", False):
        return

    def conv(inputs, kernel, strides=1, padding="valid", data_format=None, dilation_rate=1):
        try:
            import tensorflow as tf
            from keras.src import backend

            fmt = backend.standardize_data_format(data_format)
            channels = inputs.shape[-1] if fmt == "channels_last" else inputs.shape[1]
            grouped_2d = len(inputs.shape) == 4 and channels != kernel.shape[-2]
        except Exception:  # noqa: BLE001 - never break Keras over this
            grouped_2d = False
        if grouped_2d and _salus_listed():
            return tf.nn.convolution(inputs, kernel, strides, padding.upper(),
                                     data_format=convert(fmt, 4), dilations=dilation_rate)
        return original(inputs, kernel, strides, padding, data_format, dilation_rate)

    conv._salus = True
    module.conv = conv


_TARGETS = {"keras.src.trainers.trainer": _patch_trainer,
            "keras.src.backend.tensorflow.nn": _patch_nn}


class _Loader(importlib.abc.Loader):
    def __init__(self, loader) -> None:
        self._loader = loader

    def create_module(self, spec):
        return self._loader.create_module(spec)

    def exec_module(self, module) -> None:
        self._loader.exec_module(module)
        _TARGETS[module.__name__](module)


class _Finder(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name not in _TARGETS:
            return None
        for finder in sys.meta_path:
            if finder is self:
                continue
            spec = getattr(finder, "find_spec", lambda *a: None)(name, path, target)
            if spec is not None and spec.loader is not None:
                spec.loader = _Loader(spec.loader)
                return spec
        return None


def install() -> None:
    for target, patch in _TARGETS.items():
        if target in sys.modules:
            patch(sys.modules[target])
    if not all(t in sys.modules for t in _TARGETS) and not any(
            isinstance(f, _Finder) for f in sys.meta_path):
        sys.meta_path.insert(0, _Finder())


install()
