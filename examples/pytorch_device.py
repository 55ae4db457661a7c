"""A PyTorch training loop on the `salus` device: the loop is what it would be on a GPU, its
device "salus". Each optimizer step runs in salus-server as one iteration; the weights and the
optimizer's state stay in the daemon between steps.

    .venv-torch/bin/python examples/pytorch_device.py [--steps 100]
"""

import argparse

import salus_torch  # noqa: F401  (registers the "salus" device)
import torch
import torch.nn.functional as F

p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
p.add_argument("--steps", type=int, default=100)
args = p.parse_args()

torch.manual_seed(0)
# y = a fixed linear map of x, through a small MLP.
w_true = torch.randn(32, 4)
model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 4))
model = model.to("salus")
opt = torch.optim.Adam(model.parameters(), lr=1e-2)
for step in range(args.steps):
    x = torch.randn(64, 32)
    y = x @ w_true
    x, y = x.to("salus"), y.to("salus")
    opt.zero_grad()
    loss = F.mse_loss(model(x), y)
    loss.backward()
    opt.step()  # the step's recording goes to the daemon as one iteration
    if step % 25 == 0 or step == args.steps - 1:
        print(f"step {step:4d}  loss {loss.item():.4f}")  # fetched with the step
state = {k: v.cpu() for k, v in model.state_dict().items()}
print("trained:", {k: tuple(v.shape) for k, v in state.items()})
