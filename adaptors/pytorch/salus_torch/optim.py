"""The optimizers' updates as functions of tensors, so that a traced step contains them.

torch.optim's own `step` reads Python numbers out of tensors (Adam's step count) and keeps its
state in dictionaries it fills on the first call; neither can become one graph that runs
every step. Each class here reproduces one torch.optim algorithm's arithmetic (the
single-tensor, non-capturable path torch takes on the CPU) on state tensors that exist before
the first step: the step count is a tensor and the bias corrections are computed from it in the
graph, and the learning rate is an input of the graph (so a scheduler can change it between
steps). The state keeps torch.optim's names, so it goes back into `optimizer.state` as is.
"""


from dataclasses import dataclass

import torch


# One update of one parameter as one operator, so that a traced step holds one node per
# parameter instead of a chain of elementwise ops; the daemon runs each as the engine's fused
# update kernel, in place. Pure functions: the tracer's functionalization writes their results
# back into the state. The bodies are torch.optim's arithmetic, for running them eagerly.
@torch.library.custom_op("salus::sgd_update", mutates_args=())
def sgd_update(param: torch.Tensor, grad: torch.Tensor, buf: torch.Tensor, lr: torch.Tensor,
               momentum: float, weight_decay: float, nesterov: bool
               ) -> tuple[torch.Tensor, torch.Tensor]:
    d_p = grad.add(param, alpha=weight_decay) if weight_decay != 0 else grad
    buf = buf.mul(momentum).add(d_p)
    d_p = d_p.add(buf, alpha=momentum) if nesterov else buf
    return param - d_p * lr, buf


@sgd_update.register_fake
def _(param, grad, buf, lr, momentum, weight_decay, nesterov):  # noqa: ANN001, ANN202
    return torch.empty_like(param), torch.empty_like(buf)


@torch.library.custom_op("salus::adam_update", mutates_args=())
def adam_update(param: torch.Tensor, grad: torch.Tensor, exp_avg: torch.Tensor,
                exp_avg_sq: torch.Tensor, step: torch.Tensor, lr: torch.Tensor, beta1: float,
                beta2: float, eps: float, weight_decay: float, decoupled: bool
                ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    step = step + 1
    if weight_decay != 0:
        if decoupled:
            param = param * (1 - lr * weight_decay)
        else:
            grad = grad.add(param, alpha=weight_decay)
    exp_avg = exp_avg.lerp(grad, 1 - beta1)
    exp_avg_sq = exp_avg_sq.mul(beta2).addcmul(grad, grad, value=1 - beta2)
    bc1 = 1 - torch.pow(torch.tensor(beta1), step)
    bc2 = 1 - torch.pow(torch.tensor(beta2), step)
    denom = (exp_avg_sq.sqrt() / bc2.sqrt()).add(eps)
    return param - exp_avg / denom * (lr / bc1), exp_avg, exp_avg_sq, step


@adam_update.register_fake
def _(param, grad, exp_avg, exp_avg_sq, step, lr, beta1, beta2, eps, weight_decay,  # noqa: ANN001, ANN202
      decoupled):
    return (torch.empty_like(param), torch.empty_like(exp_avg), torch.empty_like(exp_avg_sq),
            torch.empty_like(step))


class UnsupportedOptimizer(NotImplementedError):
    """The optimizer, or one of its settings, has no traced form."""


@dataclass
class Slot:
    """One optimizer state tensor of one parameter."""

    key: str  # torch.optim's key: "momentum_buffer", "exp_avg", "step"...
    initial: torch.Tensor  # what it starts as when the optimizer has no state yet


def _hyper(group: dict, key: str, default: object = None) -> object:
    return group.get(key, default)


def _check(group: dict, name: str) -> None:
    for flag in ("differentiable", "fused"):
        if _hyper(group, flag):
            raise UnsupportedOptimizer(f"{name}({flag}=True) is not supported by capture")
    if _hyper(group, "foreach"):
        # foreach only changes how the arithmetic is batched, not its result.
        pass


class Functional:
    """The traced form of one torch.optim optimizer."""

    def __init__(self, optimizer: torch.optim.Optimizer) -> None:
        self.optimizer = optimizer
        self.kind = type(optimizer).__name__

    def slots(self, group: dict, param: torch.Tensor) -> list[Slot]:
        raise NotImplementedError

    def update(self, group: dict, lr: torch.Tensor, param: torch.Tensor, grad: torch.Tensor,
               state: dict[str, torch.Tensor]) -> None:
        """Updates `param` and `state` in place (under no_grad)."""
        raise NotImplementedError

    def signature(self) -> tuple:
        """Everything but the learning rates that the traced update depends on."""
        keep = []
        for g in self.optimizer.param_groups:
            keep.append(tuple(sorted((k, repr(v)) for k, v in g.items()
                                     if k not in ("params", "lr"))))
        return (self.kind, tuple(keep))


class Sgd(Functional):
    def slots(self, group: dict, param: torch.Tensor) -> list[Slot]:
        _check(group, "SGD")
        if group["momentum"] != 0 and group["dampening"] != 0:
            raise UnsupportedOptimizer(
                "SGD with dampening is not supported by capture (its first step differs)")
        if group["momentum"] == 0:
            return []
        return [Slot("momentum_buffer", torch.zeros_like(param))]

    def update(self, group: dict, lr: torch.Tensor, param: torch.Tensor, grad: torch.Tensor,
               state: dict[str, torch.Tensor]) -> None:
        if group["momentum"] != 0 and not group.get("maximize", False):
            buf = state["momentum_buffer"]
            new_p, new_buf = sgd_update(param, grad, buf, lr, group["momentum"],
                                        group["weight_decay"], group["nesterov"])
            param.copy_(new_p)
            buf.copy_(new_buf)
            return
        d_p = -grad if group.get("maximize", False) else grad
        if group["weight_decay"] != 0:
            d_p = d_p.add(param, alpha=group["weight_decay"])
        momentum = group["momentum"]
        if momentum != 0:
            # A buffer of zeros gives torch's first step exactly: 0 * momentum + d_p = d_p.
            buf = state["momentum_buffer"]
            buf.mul_(momentum).add_(d_p)
            d_p = d_p.add(buf, alpha=momentum) if group["nesterov"] else buf
        param.sub_(d_p * lr)


class Adam(Functional):
    """torch.optim.Adam and AdamW (decoupled weight decay)."""

    def __init__(self, optimizer: torch.optim.Optimizer, decoupled: bool) -> None:
        super().__init__(optimizer)
        self.decoupled = decoupled

    def slots(self, group: dict, param: torch.Tensor) -> list[Slot]:
        _check(group, type(self.optimizer).__name__)
        if group.get("amsgrad", False):
            raise UnsupportedOptimizer("Adam(amsgrad=True) is not supported by capture")
        if isinstance(group.get("betas", (0, 0))[0], torch.Tensor):
            raise UnsupportedOptimizer("Adam with tensor betas is not supported by capture")
        return [Slot("step", torch.zeros((), dtype=torch.float32)),
                Slot("exp_avg", torch.zeros_like(param)),
                Slot("exp_avg_sq", torch.zeros_like(param))]

    def update(self, group: dict, lr: torch.Tensor, param: torch.Tensor, grad: torch.Tensor,
               state: dict[str, torch.Tensor]) -> None:
        beta1, beta2 = group["betas"]
        eps, wd = group["eps"], group["weight_decay"]
        step_t, exp_avg, exp_avg_sq = state["step"], state["exp_avg"], state["exp_avg_sq"]
        if not group.get("maximize", False):
            outs = adam_update(param, grad, exp_avg, exp_avg_sq, step_t, lr, beta1, beta2, eps,
                               wd, self.decoupled)
            for dst, src in zip((param, exp_avg, exp_avg_sq, step_t), outs, strict=True):
                dst.copy_(src)
            return
        grad = -grad
        step_t.add_(1)
        if wd != 0:
            if self.decoupled:
                param.mul_(1 - lr * wd)
            else:
                grad = grad.add(param, alpha=wd)
        exp_avg.lerp_(grad, 1 - beta1)
        exp_avg_sq.mul_(beta2).addcmul_(grad, grad, value=1 - beta2)
        bias_correction1 = 1 - torch.pow(torch.tensor(beta1, dtype=torch.float32), step_t)
        bias_correction2 = 1 - torch.pow(torch.tensor(beta2, dtype=torch.float32), step_t)
        step_size = lr / bias_correction1
        denom = (exp_avg_sq.sqrt() / bias_correction2.sqrt()).add_(eps)
        param.sub_(exp_avg / denom * step_size)


def functional(optimizer: torch.optim.Optimizer) -> Functional:
    """The traced form of `optimizer`, or UnsupportedOptimizer naming what is missing."""
    kind = type(optimizer)
    if kind is torch.optim.SGD:
        return Sgd(optimizer)
    if kind is torch.optim.Adam:
        return Adam(optimizer, decoupled=False)
    if kind is torch.optim.AdamW:
        return Adam(optimizer, decoupled=True)
    raise UnsupportedOptimizer(
        f"{kind.__name__} is not supported by capture (supported: SGD, Adam, AdamW)")
