"""An ordinary PyTorch step function, captured: `salus_torch.capture_step` traces it once per
shape signature and runs each call as one salus-server iteration (the batch in, the loss out).
The model stays an ordinary CPU model in this process; `sync()` brings the trained weights,
BatchNorm statistics and optimizer state home.

    .venv-torch/bin/python examples/pytorch_capture_step.py [--steps 60]
"""

import argparse

import salus_torch
import torch
import torch.nn.functional as F

p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
p.add_argument("--steps", type=int, default=60)
args = p.parse_args()

torch.manual_seed(0)
model = torch.nn.Sequential(
    torch.nn.Conv2d(1, 8, 3, padding=1), torch.nn.BatchNorm2d(8), torch.nn.ReLU(),
    torch.nn.MaxPool2d(2), torch.nn.Flatten(), torch.nn.Linear(8 * 8 * 8, 2))
opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)


@salus_torch.capture_step
def train_step(x, y):
    opt.zero_grad()
    loss = F.cross_entropy(model(x), y)
    loss.backward()
    opt.step()
    return loss


for step in range(args.steps):
    # Class 1: a bright left half.
    y = torch.randint(0, 2, (32,))
    x = torch.randn(32, 1, 16, 16)
    x[y == 1, :, :, :8] += 0.3
    loss = train_step(x, y)
    if step % 20 == 0 or step == args.steps - 1:
        print(f"step {step:4d}  loss {float(loss):.4f}")
train_step.sync()
model.eval()
with torch.no_grad():
    y = torch.randint(0, 2, (256,))
    x = torch.randn(256, 1, 16, 16)
    x[y == 1, :, :, :8] += 0.3
    accuracy = (model(x).argmax(1) == y).float().mean().item()
print(f"accuracy of the synced model, on the CPU: {accuracy:.3f}")
