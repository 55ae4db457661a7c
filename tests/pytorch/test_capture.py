"""The PyTorch adaptor against a real salus-server: unmodified training steps captured with
salus_torch.capture_step, checked step by step against eager PyTorch on the CPU."""

from __future__ import annotations

import threading
import warnings
from pathlib import Path

import numpy as np
import pytest
import salus_torch
import torch
import torch.nn.functional as F
from models import Encoder, ResNet, user_step
from salus_daemon import Daemon

import salus

REPO = Path(__file__).resolve().parents[2]
torch.set_num_threads(1)


@pytest.fixture(scope="module")
def daemon():
    d = Daemon(memory="2GiB", policy="fair")
    yield d
    d.stop()


def images(n: int, seed: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    g = torch.Generator().manual_seed(seed)
    return [(torch.randn(8, 3, 16, 16, generator=g), torch.randint(0, 10, (8,), generator=g))
            for _ in range(n)]


def sentences(n: int, seed: int, batch: int = 8) -> list[tuple[torch.Tensor, torch.Tensor]]:
    g = torch.Generator().manual_seed(seed)
    return [(torch.randint(0, 100, (batch, 16), generator=g),
             torch.randint(0, 10, (batch,), generator=g)) for _ in range(n)]


def job(model: str, optimizer: str):  # noqa: ANN201
    """A fresh model and optimizer, the same for every call, and the user's step function."""
    torch.manual_seed(7)
    m = ResNet() if model == "resnet" else Encoder()
    if optimizer == "sgd":
        opt = torch.optim.SGD(m.parameters(), lr=0.05, momentum=0.9, weight_decay=1e-4)
    else:
        opt = torch.optim.Adam(m.parameters(), lr=1e-3)
    return m, opt, user_step(m, opt)


def train(model: str, optimizer: str, batches: list, endpoint: str | None):  # noqa: ANN201
    m, opt, train_step = job(model, optimizer)
    step = train_step if endpoint is None else salus_torch.capture_step(train_step,
                                                                         endpoint=endpoint)
    losses = [float(step(x, y)) for x, y in batches]
    if endpoint is not None:
        step.close()  # pulls the state home
    return losses, m.state_dict(), opt


def assert_losses_match(got: list[float], want: list[float]) -> None:
    assert len(got) == len(want)
    for k, (g, w) in enumerate(zip(got, want, strict=False)):
        assert abs(g - w) <= 1e-4 * abs(w), f"step {k}: {g} vs eager {w}"


def assert_state_match(got: dict, want: dict, atol: float) -> None:
    """`atol` is for tensors whose elements are at most 1 in magnitude; a tensor with larger ones
    gets `atol` times its largest, since float32 sums of larger terms round by more (kernels for
    other instruction sets, AVX2 or AVX-512, sum in other orders)."""
    assert got.keys() == want.keys()
    for name in want:
        if want[name].dtype == torch.int64:
            assert torch.equal(got[name], want[name]), name
        else:
            scale = max(1.0, want[name].abs().max().item()) if want[name].numel() else 1.0
            torch.testing.assert_close(got[name], want[name], rtol=1e-3, atol=atol * scale,
                                       msg=name)


@pytest.mark.parametrize("model,optimizer", [("resnet", "sgd"), ("resnet", "adam"),
                                             ("encoder", "sgd"), ("encoder", "adam")])
def test_training_matches_eager_pytorch(daemon: Daemon, model: str, optimizer: str) -> None:
    batches = images(4, 1) if model == "resnet" else sentences(4, 1)
    want_losses, want_state, want_opt = train(model, optimizer, batches, None)
    got_losses, got_state, got_opt = train(model, optimizer, batches, daemon.endpoint)
    assert_losses_match(got_losses, want_losses)
    # BatchNorm's running statistics and counters, and every parameter. Adam turns the
    # attention key bias's rounding-level gradient (exactly zero in real arithmetic) into
    # lr-sized steps either way, hence the absolute tolerance.
    assert_state_match(got_state, want_state, atol=3e-5 if optimizer == "sgd" else 3e-4)
    # The optimizer's state came home under torch.optim's own keys.
    for p_got, p_want in zip(got_opt.state.values(), want_opt.state.values(), strict=False):
        assert p_got.keys() == p_want.keys()
        for key in p_want:
            torch.testing.assert_close(p_got[key], p_want[key], rtol=1e-3, atol=3e-4)


def uneven_last_batch_and_an_eval_pass(endpoint: str, open_at_end: tuple[int, int] = (2, 1),
                                       **options: object) -> None:
    """A smaller last batch is a second session that receives the state from the first; an
    evaluation step under torch.no_grad() (BatchNorm in eval mode) sees the trained state."""
    batches = images(3, 2) + [(torch.randn(5, 3, 16, 16), torch.randint(0, 10, (5,)))]
    test_x = torch.randn(6, 3, 16, 16)

    def run(endpoint: str | None):  # noqa: ANN202
        m, _, train_step = job("resnet", "sgd")

        def evaluate(x: torch.Tensor) -> torch.Tensor:
            with torch.no_grad():
                return m(x)

        step, ev = train_step, evaluate
        if endpoint is not None:
            step = salus_torch.capture_step(train_step, endpoint=endpoint, **options)
            ev = salus_torch.capture_step(evaluate, endpoint=endpoint, **options)
        m.train()
        losses = [float(step(x, y)) for x, y in batches[:2]]
        m.eval()
        logits = ev(test_x)
        m.train()
        losses += [float(step(x, y)) for x, y in batches[2:]]
        if endpoint is not None:
            sessions = (len(step.sessions), len(ev.sessions))
            ev.close()
            step.close()
            # Every session stays open, under FIFO too (they are one job), unless the arena
            # cannot hold them together.
            assert sessions == open_at_end
        return losses, logits, m.state_dict()

    want_losses, want_logits, want_state = run(None)
    got_losses, got_logits, got_state = run(endpoint)
    assert_losses_match(got_losses, want_losses)
    torch.testing.assert_close(got_logits, want_logits, rtol=1e-4, atol=1e-5)
    assert_state_match(got_state, want_state, atol=3e-5)


def test_uneven_last_batch_and_an_eval_pass(daemon: Daemon) -> None:
    uneven_last_batch_and_an_eval_pass(daemon.endpoint)


def test_a_job_with_several_sessions_under_a_daemon_that_runs_one_job_at_a_time() -> None:
    """Note [A captured job never waits on itself]: under FIFO the job's sessions (two shapes of
    the training step, the evaluation step) are one job, admitted as one: none queues behind
    another, none is closed. The admission timeout turns a wait into a failure."""
    fifo = Daemon(memory="2GiB", policy="fifo")
    try:
        with warnings.catch_warnings():
            warnings.filterwarnings("error", "(?s).*the daemon queued a session")
            uneven_last_batch_and_an_eval_pass(fifo.endpoint, admission_timeout=60.0)
    finally:
        fifo.stop()


def test_a_job_whose_sessions_do_not_fit_together_closes_its_idle_ones() -> None:
    """Note [A captured job never waits on itself], the memory case: in an arena that holds
    the training step's session (P 174 KiB + E 748 KiB here) but not it and another of the job
    beside it, each new session waits for memory the job's own idle sessions hold; the job
    closes them, their state pulled home, and the results still match eager PyTorch."""
    fifo = Daemon(memory="960KiB", policy="fifo")
    try:
        with pytest.warns(UserWarning, match="the daemon queued a session"):
            uneven_last_batch_and_an_eval_pass(fifo.endpoint, (1, 0), admission_timeout=60.0)
    finally:
        fifo.stop()


def onnx_job(endpoint: str, steps: int) -> list[float]:
    rng = np.random.default_rng(3)
    with salus.connect(endpoint) as c:
        s = c.create_session(model=REPO / "benchmarks" / "models" / "mlp.onnx", mode="train",
                             inputs={"x": (16, 784), "labels": (16,)}, loss="loss",
                             optimizer={"type": "sgd", "lr": 0.1}, name="onnx-mlp")
        out = []
        for _ in range(steps):
            feeds = {"x": rng.standard_normal((16, 784), dtype=np.float32),
                     "labels": rng.integers(0, 10, 16).astype(np.int64)}
            out.append(float(s.run(feeds=feeds, fetches=["loss"])["loss"]))
        s.close()
    return out


def test_two_pytorch_jobs_and_an_onnx_job_share_the_daemon(daemon: Daemon) -> None:
    """Under FAIR, two captured PyTorch jobs and an ONNX job train at once; each reproduces
    its solo run exactly."""
    cnn_batches, enc_batches = images(4, 5), sentences(4, 6)
    solo_cnn = train("resnet", "sgd", cnn_batches, daemon.endpoint)[0]
    solo_enc = train("encoder", "adam", enc_batches, daemon.endpoint)[0]
    solo_onnx = onnx_job(daemon.endpoint, 6)

    results: dict[str, list[float]] = {}
    jobs = []
    for key, model, opt, batches in (("cnn", "resnet", "sgd", cnn_batches),
                                     ("enc", "encoder", "adam", enc_batches)):
        m, _, train_step = job(model, opt)
        step = salus_torch.capture_step(train_step, endpoint=daemon.endpoint)
        results[key] = [float(step(*batches[0]))]  # traced here: tracing is not thread-safe
        jobs.append((key, step, batches[1:]))

    def run_torch(key: str, step: salus_torch.CapturedStep, rest: list) -> None:
        results[key] += [float(step(x, y)) for x, y in rest]
        step.close()

    def run_onnx() -> None:
        results["onnx"] = onnx_job(daemon.endpoint, 6)

    threads = [threading.Thread(target=run_torch, args=j) for j in jobs]
    threads.append(threading.Thread(target=run_onnx))
    for t in threads:
        t.start()
    for t in threads:
        t.join(300)
    assert results["cnn"] == solo_cnn
    assert results["enc"] == solo_enc
    assert results["onnx"] == solo_onnx


class Besseled(ResNet):
    """The CNN with a Bessel function, which the importer does not lower."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return super().forward(torch.special.bessel_j0(x))


def test_an_op_the_engine_lacks_is_refused_by_name(daemon: Daemon) -> None:
    """The session is refused naming the operators, and the daemon goes on serving."""
    torch.manual_seed(0)
    m = Besseled()
    step = salus_torch.capture_step(user_step(m, torch.optim.SGD(m.parameters(), lr=0.1)),
                                    endpoint=daemon.endpoint)
    with pytest.raises(salus.SalusError) as e:
        step(*images(1, 1)[0])
    assert e.value.code == "UNIMPLEMENTED"
    assert "aten.special_bessel_j0" in str(e.value)
    step.close()
    assert train("resnet", "sgd", images(1, 1), daemon.endpoint)[0]


def test_dropout_draws_in_the_daemon_reproducibly(daemon: Daemon) -> None:
    """Dropout's Bernoulli draws run in the daemon (Note [Random numbers]): the dropped
    fraction is p, each call draws anew, and torch.manual_seed makes a run repeat."""
    def draws(seed: int) -> list[torch.Tensor]:
        torch.manual_seed(seed)

        def drop(x: torch.Tensor) -> torch.Tensor:
            return F.dropout(x, 0.3, training=True)

        with salus_torch.capture_step(drop, endpoint=daemon.endpoint) as step:
            return [step(torch.ones(200, 500)) for _ in range(2)]

    a, b = draws(1), draws(1)
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])
    assert not torch.equal(a[0], a[1])
    assert not torch.equal(a[0], draws(2)[0])
    for out in a:
        dropped = (out == 0).float().mean().item()
        assert abs(dropped - 0.3) < 0.01, dropped
        torch.testing.assert_close(out[out != 0], torch.full_like(out[out != 0], 1 / 0.7))


def test_training_with_dropout_repeats_under_one_seed(daemon: Daemon) -> None:
    def run(dropout: float) -> list[float]:
        torch.manual_seed(3)
        m = Encoder(dropout=dropout)
        opt = torch.optim.Adam(m.parameters(), lr=1e-3)
        with salus_torch.capture_step(user_step(m, opt), endpoint=daemon.endpoint) as step:
            return [float(step(x, y)) for x, y in sentences(3, 4)]

    first, again, without = run(0.2), run(0.2), run(0.0)
    assert first == again
    assert all(np.isfinite(first)) and first != without


def test_a_value_read_inside_a_step_is_refused_clearly(daemon: Daemon) -> None:
    torch.manual_seed(0)
    m, opt, _ = job("resnet", "sgd")

    def train_step(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        opt.zero_grad()
        loss = F.cross_entropy(m(x), y)
        if loss.item() > 100:  # a branch on a value computed in the step
            raise RuntimeError("diverged")
        loss.backward()
        opt.step()
        return loss

    step = salus_torch.capture_step(train_step, endpoint=daemon.endpoint)
    with pytest.raises(salus_torch.CaptureError, match="reads a tensor's value"):
        step(*images(1, 1)[0])
    step.close()


def test_bad_graph_bytes_get_a_clear_error(daemon: Daemon) -> None:
    with salus.connect(daemon.endpoint) as c:
        with pytest.raises(salus.SalusError) as e:
            c.create_session(aten_graph=b"\x08\x01not a graph")
        assert e.value.code == "INVALID_ARGUMENT"
        assert "AtenGraph" in str(e.value)


def test_unsupported_optimizer_is_refused_before_anything_runs(daemon: Daemon) -> None:
    torch.manual_seed(0)
    m = ResNet()
    opt = torch.optim.RMSprop(m.parameters(), lr=0.01)

    def train_step(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        opt.zero_grad()
        F.cross_entropy(m(x), y).backward()
        opt.step()

    step = salus_torch.capture_step(train_step, endpoint=daemon.endpoint)
    with pytest.raises(salus_torch.UnsupportedOptimizer, match="RMSprop"):
        step(*images(1, 1)[0])
    step.close()


def test_a_step_that_zeroes_gradients_through_the_module(daemon: Daemon) -> None:
    def run(endpoint: str | None) -> list[float]:
        torch.manual_seed(5)
        m = ResNet()
        opt = torch.optim.SGD(m.parameters(), lr=0.05, momentum=0.9)

        def train_step(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
            m.zero_grad()
            loss = F.cross_entropy(m(x), y)
            loss.backward()
            opt.step()
            return loss

        step = train_step if endpoint is None else salus_torch.capture_step(
            train_step, endpoint=endpoint)
        return [float(step(x, y)) for x, y in images(2, 8)]

    assert_losses_match(run(daemon.endpoint), run(None))
