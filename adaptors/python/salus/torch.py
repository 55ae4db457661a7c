"""`salus.torch`: the PyTorch adaptor (the salus-torch package, adaptors/pytorch)."""

from salus_torch import CapturedStep, CaptureError, UnsupportedOptimizer, capture_step

__all__ = ["CaptureError", "CapturedStep", "UnsupportedOptimizer", "capture_step"]
