"""salus-torch: PyTorch steps run in salus-server.

    step = salus_torch.capture_step(train_step)   # or @salus_torch.capture_step
    loss = step(x, y)                              # one daemon iteration
    step.sync()                                    # parameters and optimizer state back home

See adaptors/pytorch/README.md and docs/pytorch.md.
"""

from .optim import UnsupportedOptimizer
from .step import CapturedStep, capture_step
from .trace import CaptureError

__all__ = ["CaptureError", "CapturedStep", "UnsupportedOptimizer", "capture_step"]
__version__ = "0.1.0"
