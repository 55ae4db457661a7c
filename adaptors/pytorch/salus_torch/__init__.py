"""salus-torch: PyTorch steps run in salus-server.

    step = salus_torch.capture_step(train_step)   # or @salus_torch.capture_step
    loss = step(x, y)                              # one daemon iteration
    step.sync()                                    # parameters and optimizer state back home

or, with no change to the training loop but its device:

    model = Net().to("salus")                      # the lazy device (device.py)
    ...x.to("salus")..., loss.backward(), opt.step()  # one daemon iteration per step

See adaptors/pytorch/README.md and docs/pytorch.md.
"""

from . import device
from .optim import UnsupportedOptimizer
from .step import CapturedStep, capture_step
from .trace import CaptureError

device.register()

__all__ = ["CaptureError", "CapturedStep", "UnsupportedOptimizer", "capture_step", "device"]
__version__ = "0.1.0"
