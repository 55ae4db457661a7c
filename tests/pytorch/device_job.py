"""A training job whose loop differs from a plain PyTorch one only by its device, run as its own
process (the lazy device serves one job per process). Prints its losses as JSON.

    python device_job.py resnet|encoder sgd|adam DEVICE SEED STEPS
"""

from __future__ import annotations

import json
import sys

import salus_torch  # noqa: F401  (names the "salus" device)
import torch
from test_capture import images, sentences
from test_device import loop


def main() -> None:
    model, optimizer, device, seed, steps = sys.argv[1:6]
    torch.set_num_threads(1)
    make_batches = images if model == "resnet" else sentences
    losses, _ = loop(model, optimizer, device, make_batches(int(steps), int(seed)))
    print(json.dumps(losses))


if __name__ == "__main__":
    main()
