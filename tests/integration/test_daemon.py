"""The daemon as a user meets it: real process, real sockets, real models."""

from __future__ import annotations

import multiprocessing as mp
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

import numpy as np
import pytest
import zmq
from salus_daemon import CTL, MODELS, SERVER, Daemon

import salus
from salus._generated.salus.v1 import salus_pb2 as pb

MiB = 1 << 20


def synthetic(client: salus.Client, p: int, e: int, t: float, **kw):  # noqa: ANN201
    return client.create_session(
        synthetic={"persistent_bytes": p, "ephemeral_bytes": e, "iteration_seconds": t}, **kw
    )


def mlp_session(client: salus.Client, batch: int = 16):  # noqa: ANN201
    return client.create_session(model=MODELS / "mlp.onnx", mode="train",
                                 inputs={"x": (batch, 784), "labels": (batch,)}, loss="loss",
                                 optimizer={"type": "sgd", "lr": 0.05}, name="mlp")


def mlp_feeds(batch: int = 16, seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {"x": rng.standard_normal((batch, 784), dtype=np.float32),
            "labels": rng.integers(0, 10, batch).astype(np.int64)}


def test_convolution_transforms_are_a_gpu_choice_the_cpu_ignores(daemon: Daemon) -> None:
    """ModelSpec.convolution_transforms reaches the compile; on the CPU it changes neither P, E
    nor a step's loss."""
    with salus.connect(daemon.endpoint) as c:
        losses, sizes = [], []
        rng = np.random.default_rng(3)
        feeds = {"x": rng.standard_normal((4, 3, 32, 32), dtype=np.float32),
                 "labels": rng.integers(0, 10, 4).astype(np.int64)}
        for transforms in (False, True):
            s = c.create_session(model=MODELS / "resnet.onnx", mode="train",
                                 inputs={"x": (4, 3, 32, 32), "labels": (4,)}, loss="loss",
                                 optimizer={"type": "sgd", "lr": 0.05},
                                 convolution_transforms=transforms)
            sizes.append((s.persistent_bytes, s.ephemeral_bytes))
            losses.append([float(s.run(feeds, ["loss"])["loss"]) for _ in range(2)])
            s.close()
    assert sizes[0] == sizes[1]
    assert losses[0] == losses[1]


def test_hello_reports_the_server(daemon: Daemon) -> None:
    with salus.connect(daemon.endpoint) as c:
        assert c.server["protocol_version"] == 1
        assert c.server["device"] == "cpu"
        assert c.server["capacity_bytes"] == 1 << 30
        assert c.server["policy"] == "fair"


def test_session_waits_for_memory_and_is_admitted_when_another_closes(daemon_factory) -> None:
    d = daemon_factory(memory="256MiB", policy="fifo")  # FIFO: one job on the device
    with salus.connect(d.endpoint) as a, salus.connect(d.endpoint) as b:
        first = synthetic(a, 64 * MiB, 64 * MiB, 0.01)
        assert first.state == "ADMITTED"
        second = synthetic(b, 64 * MiB, 64 * MiB, 0.01)
        assert second.state == "WAITING"
        done = threading.Event()

        def run_second() -> None:
            second.run(timeout=30)  # blocks until admitted
            done.set()

        t = threading.Thread(target=run_second)
        t.start()
        time.sleep(0.3)
        assert not done.is_set(), "a waiting session ran before memory was free"
        first.run()
        first.close()
        t.join(timeout=30)
        assert done.is_set()
        # Each client lists its own sessions: a's is closed, b's admitted.
        assert a.sessions() == [] and a.others()["sessions"] == 1
        assert [s["state"] for s in b.sessions()] == ["ADMITTED"]


def test_session_that_can_never_fit_is_refused(daemon: Daemon) -> None:
    with salus.connect(daemon.endpoint) as c:
        with pytest.raises(salus.SalusError) as e:
            synthetic(c, 700 * MiB, 400 * MiB, 0.0)
        assert e.value.code == "RESOURCE_EXHAUSTED"
        assert "700MiB" in e.value.message and "1GiB" in e.value.message


def test_admission_timeout(daemon_factory) -> None:
    d = daemon_factory(memory="256MiB", policy="fifo")
    with salus.connect(d.endpoint) as c:
        keep = synthetic(c, 64 * MiB, 64 * MiB, 0.0)
        late = synthetic(c, 64 * MiB, 64 * MiB, 0.0, admission_timeout=0.3)
        assert late.state == "WAITING"
        with pytest.raises(salus.SalusError) as e:
            late.run(timeout=10)
        assert e.value.code == "DEADLINE_EXCEEDED"
        keep.run()


def test_a_job_never_waits_on_itself_under_fifo(daemon_factory) -> None:
    """A job's sessions are one tenant under FIFO: its new session is admitted beside the job's
    own, in one lane grown to the larger E; another job (or another client's job of the same
    name) waits for the whole job, and a job name belongs to its client."""
    d = daemon_factory(memory="256MiB", policy="fifo")
    with salus.connect(d.endpoint) as a, salus.connect(d.endpoint) as b:
        train = synthetic(a, 16 * MiB, 16 * MiB, 0.0, job="fit", name="train")
        evaluate = synthetic(a, 16 * MiB, 32 * MiB, 0.0, job="fit", name="evaluate")
        assert (train.state, evaluate.state) == ("ADMITTED", "ADMITTED")
        assert train.lane == evaluate.lane
        alone = synthetic(a, MiB, MiB, 0.0, name="alone")  # a's session of no job: another tenant
        other = synthetic(b, MiB, MiB, 0.0, job="fit")  # b's "fit" is not a's
        assert (alone.state, other.state) == ("WAITING", "WAITING")
        listed = {s["name"]: s for s in a.sessions()}
        assert listed["train"]["job"] == listed["evaluate"]["job"] == "fit"
        assert listed["alone"]["job"] == ""
        assert listed["evaluate"]["ephemeral_bytes"] == 32 * MiB
        train.run()
        evaluate.run()
        train.close()
        late = synthetic(a, MiB, MiB, 0.0, job="fit", name="predict")  # the job is still there
        assert late.state == "ADMITTED"
        evaluate.close()
        late.close()
        # The job left: the queue in order gives the device to the next tenant, one at a time.
        alone.run(timeout=30)
        assert [s["state"] for s in b.sessions()] == ["WAITING"]
        alone.close()
        other.run(timeout=30)
        with pytest.raises(salus.SalusError) as e:
            synthetic(b, MiB, MiB, 0.0, job="j" * 5000)
        assert e.value.code == "INVALID_ARGUMENT" and "job name" in e.value.message


def folding_model(folds: int) -> bytes:
    """An ONNX model whose `folds` broadcasting Adds of initializers (256 KiB each) all fold."""
    from onnx import TensorProto, helper, numpy_helper

    a = numpy_helper.from_array(np.ones((256, 1), np.float32), "a")
    b = numpy_helper.from_array(np.ones((1, 256), np.float32), "b")
    nodes = [helper.make_node("Add", ["a", "b"], ["c0"], name="fold_0")]
    nodes += [helper.make_node("Add", [f"c{i - 1}", "b"], [f"c{i}"], name=f"fold_{i}")
              for i in range(1, folds)]
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [256, 256])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [256, 256])
    nodes.append(helper.make_node("Add", ["x", f"c{folds - 1}"], ["y"], name="add_x"))
    graph = helper.make_graph(nodes, "folds", [x], [y], [a, b])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model.SerializeToString()


def test_compilation_is_bounded_by_max_constant_bytes(daemon_factory) -> None:
    # The initializers (2 KiB) and sixteen folds of 256 KiB: exactly the limit. The older flag
    # --max-folded-bytes sets limits.max_constant_bytes.
    limit = 4 * MiB + 2048
    d = daemon_factory("--max-folded-bytes", str(limit))
    with salus.connect(d.endpoint) as c:
        mlp = mlp_session(c)
        mlp.run(mlp_feeds())
        ok = c.create_session(model=folding_model(16), mode="infer", inputs={"x": (256, 256)})
        x = np.full((256, 256), 0.5, np.float32)
        y = ok.run({"x": x}, fetches=["y"])["y"]
        np.testing.assert_array_equal(y, np.full((256, 256), 17.5, np.float32))
        # A seventeenth is refused, naming the node and the limit.
        with pytest.raises(salus.SalusError) as e:
            c.create_session(model=folding_model(17), mode="infer", inputs={"x": (256, 256)})
        assert e.value.code == "RESOURCE_EXHAUSTED"
        assert "fold_16" in e.value.message and str(limit) in e.value.message, e.value.message
        assert "max_constant_bytes" in e.value.message
        mlp.run(mlp_feeds(seed=1))
    assert d.stop() == 0


# -- bad input ------------------------------------------------------------------------------


def raw_hello(endpoint: str) -> str:
    """A new client's token, from a Hello on a connection of its own."""
    hello = request(hello=pb.Hello(protocol_version=1, client_name="raw"))
    reply = pb.Reply()
    reply.ParseFromString(raw_call(endpoint, [hello.SerializeToString()])[0])
    assert reply.status.code == 0 and reply.hello.client_token, reply.status.message
    return reply.hello.client_token


def raw_call(endpoint: str, frames: list[bytes]) -> list[bytes]:
    ctx = zmq.Context.instance()
    s = ctx.socket(zmq.DEALER)
    s.setsockopt(zmq.LINGER, 0)
    s.connect(endpoint)
    try:
        s.send_multipart(frames)
        assert s.poll(10000), "no reply"
        return s.recv_multipart()
    finally:
        s.close()


def reply_status(frames: list[bytes]) -> tuple[int, str, int]:
    r = pb.Reply()
    r.ParseFromString(frames[0])
    return r.status.code, r.status.message, r.request_id


def request(**kw: object) -> pb.Request:
    r = pb.Request(request_id=77)
    for k, v in kw.items():
        if isinstance(v, int | str):
            setattr(r, k, v)
        else:
            getattr(r, k).CopyFrom(v)
    return r


def run_request(session_id: int, specs: list[tuple[str, int, tuple[int, ...]]],
                token: str = "") -> pb.Request:
    r = request(session_id=session_id, client_token=token)
    for name, dtype, shape in specs:
        t = r.run_iteration.feeds.add()
        t.name, t.dtype = name, dtype
        t.shape.extend(shape)
    r.run_iteration.fetches.append("loss")
    return r


def test_bad_input_battery_gets_errors_and_harms_no_one(daemon: Daemon) -> None:
    with salus.connect(daemon.endpoint) as good:
        s = mlp_session(good)
        feeds = mlp_feeds()
        before = float(s.run(feeds=feeds, fetches=["loss"])["loss"])
        sid = s.id
        x = feeds["x"].tobytes()
        y = feeds["labels"].tobytes()
        rng = np.random.default_rng(3)
        junk = rng.bytes(4096)
        # The raw requests come on connections of their own with the good client's token (the
        # token, not the connection, is the client), so they reach its session's checks.
        tok = good._token
        create_bad_model = request(client_token=tok)
        create_bad_model.create_session.model.onnx = b"\x08\x07not a model"
        create_bad_model.create_session.model.mode = pb.TRAIN
        create_bad_model.create_session.model.loss = "loss"
        body_less = request(client_token=tok)
        f32, i64 = pb.FLOAT32, pb.INT64
        def env(*specs: tuple[str, int, tuple[int, ...]], sid: int = sid) -> bytes:
            return run_request(sid, list(specs), tok).SerializeToString()

        xs, ls = ("x", f32, (16, 784)), ("labels", i64, (16,))
        bad_time = request(client_token=tok, create_session=pb.CreateSession(
            synthetic=pb.SyntheticProfile(iteration_seconds=-1)))
        close_unknown = request(session_id=12345, close_session=pb.CloseSession(),
                                client_token=tok)
        old_hello = request(hello=pb.Hello(protocol_version=9))
        # A string field holding invalid UTF-8 (protobuf checks proto3 strings when parsing).
        bad_utf8 = request(hello=pb.Hello(protocol_version=1, client_name="x")).SerializeToString()
        bad_utf8 = bad_utf8.replace(b"\x12\x01x", b"\x12\x01\xff")
        cases: list[tuple[str, list[bytes], int]] = [
            ("random bytes", [junk], 3),
            ("empty envelope", [b""], 3),
            ("truncated envelope", [env(xs)[:7]], 3),
            ("no body", [body_less.SerializeToString()], 3),
            ("unknown session", [env(sid=999)], 5),
            ("missing frame", [env(xs, ls), x], 3),
            ("extra frame", [env(xs), x, y], 3),
            ("frame of the wrong size", [env(xs, ls), x[:100], y], 3),
            ("wrong dtype", [env(("x", pb.FLOAT64, (16, 392)), ls), x, y], 3),
            ("oversized frame", [env(xs, ls), x * 40, y], 3),
            ("unknown dtype", [env(("x", 42, (16, 784)), ls), x, y], 3),
            ("wrong shape", [env(("x", f32, (784, 16)), ls), x, y], 3),
            ("unknown feed", [env(("z", f32, (16, 784)), ls), x, y], 3),
            ("model that does not parse", [create_bad_model.SerializeToString()], 3),
            ("synthetic with bad time", [bad_time.SerializeToString()], 3),
            ("close unknown session", [close_unknown.SerializeToString()], 5),
            ("wrong protocol version", [old_hello.SerializeToString()], 9),
            ("invalid UTF-8 in a string", [bad_utf8], 3),
        ]
        for name, frames, want in cases:
            code, message, rid = reply_status(raw_call(daemon.endpoint, frames))
            assert code == want, f"{name}: got {code} {message!r}"
            assert message, f"{name}: an error needs a message"
            unparseable = ("random bytes", "empty envelope", "truncated envelope",
                           "invalid UTF-8 in a string")
            if want != 3 or name not in unparseable:
                assert rid == 77, f"{name}: reply must carry the request id"
        # The good session still trains, and its state was not touched.
        after = float(s.run(feeds=feeds, fetches=["loss"])["loss"])
        assert after < before
        assert daemon.proc.poll() is None
        # Bad strings are answered, not echoed into the daemon's log by the protobuf library.
        assert not [line for line in daemon.log if "libprotobuf" in line]


# -- pipelining and shared buffers -------------------------------------------------------------

FEED_BYTES = 16 * 784 * 4 + 16 * 8  # one mlp_feeds() batch


def test_submitted_and_shared_buffer_feeds_train_exactly_like_frames(daemon: Daemon) -> None:
    steps = 6
    batches = [mlp_feeds(seed=i) for i in range(steps)]
    with salus.connect(daemon.admin_endpoint) as c:
        framed = mlp_session(c)
        want = [float(framed.run(feeds=b, fetches=["loss"])["loss"]) for b in batches]
        # Submitted ahead, with frames.
        piped = mlp_session(c)
        pending = [piped.submit(feeds=b, fetches=["loss"]) for b in batches]
        got_piped = [float(p.result(timeout=60)["loss"]) for p in pending]
        # Submitted ahead, from two slots of a shared buffer.
        shared = mlp_session(c)
        buf = c.shared_buffer(2 * FEED_BYTES)
        assert c.stats()["shared_buffers"] == 1
        got_shared: list[float] = []
        inflight: list[salus.PendingIteration] = []
        for i, b in enumerate(batches):
            if len(inflight) == 2:  # the slot about to be written is free once its reader is done
                got_shared.append(float(inflight.pop(0).result(timeout=60)["loss"]))
            off = (i % 2) * FEED_BYTES
            x = buf.array((16, 784), np.float32, off)
            y = buf.array((16,), np.int64, off + x.nbytes)
            x[:], y[:] = b["x"], b["labels"]
            inflight.append(shared.submit(feeds={"x": x, "labels": y}, fetches=["loss"]))
        got_shared += [float(p.result(timeout=60)["loss"]) for p in inflight]
        assert got_piped == want
        assert got_shared == want
        buf.close()
        assert c.stats()["shared_buffers"] == 0


def test_staged_feeds_train_exactly_like_frames(daemon: Daemon) -> None:
    batch, steps = 64, 8  # 200 KiB of x: over the default staging threshold
    batches = [mlp_feeds(batch, seed=i) for i in range(steps)]
    with salus.connect(daemon.admin_endpoint, stage_from=None) as framed_client:
        assert not framed_client.staging
        framed = mlp_session(framed_client, batch)
        want = [float(framed.run(feeds=b, fetches=["loss"])["loss"]) for b in batches]
        assert framed_client.stats()["shared_buffers"] == 0
    # One call at a time: x is staged, the 512-byte labels travel in a frame.
    with salus.connect(daemon.admin_endpoint) as c:
        s = mlp_session(c, batch)
        got = [float(s.run(feeds=b, fetches=["loss"])["loss"]) for b in batches]
        assert got == want
        assert c.staging and c.staging_buffers == 1
        assert c.stats()["shared_buffers"] == 1
    # Four in flight, two staging buffers: two iterations staged, the others in frames. The
    # batches are rewritten in place after submit, as a loader reusing its arrays would.
    with salus.connect(daemon.admin_endpoint, max_staging_buffers=2) as c:
        s = mlp_session(c, batch)
        reused = [{k: v.copy() for k, v in mlp_feeds(batch).items()} for _ in range(4)]
        got, inflight = [], []
        for i, b in enumerate(batches):
            if len(inflight) == 4:
                got.append(float(inflight.pop(0).result(timeout=60)["loss"]))
            slot = reused[i % 4]
            for k in slot:
                slot[k][...] = b[k]
            inflight.append(s.submit(feeds=slot, fetches=["loss"]))
        got += [float(p.result(timeout=60)["loss"]) for p in inflight]
        assert got == want
        assert c.staging_buffers == 2
        assert c.stats()["shared_buffers"] == 2
    with salus.connect(daemon.admin_endpoint) as c:
        assert c.stats()["shared_buffers"] == 0  # closing the clients unregistered them


def test_staging_refused_by_the_daemon_falls_back_to_frames(daemon: Daemon) -> None:
    batch = 64
    feeds = mlp_feeds(batch)
    with salus.connect(daemon.admin_endpoint, stage_from=None) as c:
        want = float(mlp_session(c, batch).run(feeds=feeds, fetches=["loss"])["loss"])
    with salus.connect(daemon.admin_endpoint) as c:
        held = [c.shared_buffer(4096) for _ in range(64)]  # the daemon's limit per client
        with pytest.raises(salus.SalusError) as e:
            c.shared_buffer(4096)
        assert e.value.code == "RESOURCE_EXHAUSTED"
        s = mlp_session(c, batch)
        assert float(s.run(feeds=feeds, fetches=["loss"])["loss"]) == want
        assert not c.staging and c.staging_buffers == 0
        for b in held:
            b.close()


def test_bad_shared_buffer_requests_get_errors_and_harm_no_one(daemon: Daemon) -> None:
    from multiprocessing import shared_memory

    # Shared buffers need the ipc endpoint (the daemon must know the caller's Unix user).
    other = raw_hello(daemon.admin_endpoint)  # another client

    def reg(name: str, nbytes: int) -> bytes:
        return request(register_buffer=pb.RegisterBuffer(shm_name=name, bytes=nbytes),
                       client_token=other).SerializeToString()

    small = shared_memory.SharedMemory(name=f"salus-test-{os.getpid()}", create=True, size=4096)
    try:
        with salus.connect(daemon.admin_endpoint) as c:
            s = mlp_session(c)
            feeds = mlp_feeds()
            before = float(s.run(feeds=feeds, fetches=["loss"])["loss"])
            buf = c.shared_buffer(FEED_BYTES)

            def call(r: pb.Request, frames: list[bytes] | None = None) -> tuple[str, str]:
                try:
                    c._call(r, frames or [])
                except salus.SalusError as e:
                    return e.code, e.message
                return "OK", ""

            def run_slices(*slices: tuple[str, int, tuple[int, ...], int, int]) -> pb.Request:
                r = run_request(s.id, [(n, d, sh) for n, d, sh, _, _ in slices])
                for spec, (_, _, _, bid, off) in zip(r.run_iteration.feeds, slices, strict=True):
                    spec.buffer.buffer_id, spec.buffer.offset = bid, off
                return r

            x = ("x", pb.FLOAT32, (16, 784))
            y = ("labels", pb.INT64, (16,))
            # Raw requests on another connection, with another client's token.
            theirs = run_slices((*x, buf.id, 0), (*y, buf.id, 16 * 784 * 4))
            theirs.client_token = other
            raw_cases = [
                ("name outside /salus-", reg("/not-salus", 16), 3),
                ("name with a slash", reg("/salus-a/b", 16), 3),
                ("object that does not exist", reg(f"/salus-missing-{os.getpid()}", 16), 5),
                ("zero bytes", reg("/" + small.name, 0), 3),
                ("more bytes than the object", reg("/" + small.name, 8192), 3),
                ("unregister unknown", request(
                    unregister_buffer=pb.UnregisterBuffer(buffer_id=999),
                    client_token=other).SerializeToString(), 5),
                ("another client's buffer", theirs.SerializeToString(), 5),
            ]
            # Over loopback TCP the daemon cannot tell who owns the object: refused.
            tcp_client = raw_hello(daemon.endpoint)
            over_tcp = request(register_buffer=pb.RegisterBuffer(shm_name="/" + small.name,
                                                                 bytes=4096),
                               client_token=tcp_client).SerializeToString()
            code, message, _ = reply_status(raw_call(daemon.endpoint, [over_tcp]))
            assert code == 9 and "ipc" in message, message
            for name, env, want in raw_cases:
                code, message, rid = reply_status(raw_call(daemon.admin_endpoint, [env]))
                assert code == want, f"{name}: got {code} {message!r}"
                assert message and rid == 77, name
            own_cases = [
                ("unknown buffer", run_slices((*x, 999, 0), (*y, 999, 0)), "NOT_FOUND"),
                ("slice past the end", run_slices((*x, buf.id, 256), (*y, buf.id, 0)),
                 "INVALID_ARGUMENT"),
                ("offset past the end", run_slices((*x, buf.id, 1 << 40), (*y, buf.id, 0)),
                 "INVALID_ARGUMENT"),
            ]
            for name, r, want in own_cases:
                code, message = call(r)
                assert code == want, f"{name}: got {code} {message!r}"
                assert "feed 'x'" in message, f"{name}: {message!r}"
            mixed = run_slices((*x, buf.id, 0))  # labels as a frame, x from the buffer
            mixed.run_iteration.feeds.add(name="labels", dtype=pb.INT64, shape=[16])
            assert call(mixed, [feeds["labels"].tobytes()]) == ("OK", "")
            assert call(mixed)[0] == "INVALID_ARGUMENT"  # its frame is missing
            # The owner truncates a registered object: refused, not a crash.
            ok_reg = pb.Request()
            ok_reg.register_buffer.shm_name = "/" + small.name
            ok_reg.register_buffer.bytes = 4096
            small_id = c._call(ok_reg)[0].register_buffer.buffer_id
            os.ftruncate(small._fd, 0)
            code, message = call(run_slices(("labels", pb.INT64, (16,), small_id, 0),
                                            (*x, buf.id, 0)))
            assert code == "FAILED_PRECONDITION" and "truncated" in message, message
            after = float(s.run(feeds=feeds, fetches=["loss"])["loss"])
            assert after < before
            assert daemon.proc.poll() is None
    finally:
        small.close()
        small.unlink()


# -- clients that die, draining --------------------------------------------------------------


def wait_for(condition, what: str, limit_s: float = 120.0) -> None:  # noqa: ANN001
    """Polls until `condition()` holds. The limit only turns a hang into a failure: the
    condition is one the daemon guarantees, however slowly a loaded machine gets there."""
    deadline = time.monotonic() + limit_s
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.02)


def _hold_iteration(endpoint: str, started: mp.Event) -> None:  # type: ignore[valid-type]
    c = salus.connect(endpoint)
    s = synthetic(c, 128 * MiB, 128 * MiB, 5.0)
    started.set()
    s.run()  # killed while this iteration runs


def test_client_killed_mid_iteration_frees_its_memory(daemon_factory) -> None:
    d = daemon_factory(memory="1GiB", lease=1.0)
    started = mp.get_context("fork").Event()
    victim = mp.get_context("fork").Process(target=_hold_iteration, args=(d.endpoint, started))
    victim.start()
    assert started.wait(20)
    with salus.connect(d.endpoint) as other:
        wait_for(lambda: other.stats()["running_iterations"] == 1, "the victim's iteration")
        os.kill(victim.pid, signal.SIGKILL)
        victim.join()
        s = mlp_session(other)
        for _ in range(3):
            s.run(feeds=mlp_feeds(), fetches=["loss"])  # unaffected
        mine = s.persistent_bytes + s.ephemeral_bytes
        # The iteration ends (5 s), then the lease (1 s) lapses: its memory returns.
        wait_for(lambda: other.stats()["sessions"] == 1, "the victim's session to close")
        assert other.stats()["committed_bytes"] < mine + 4096
        s.close()


def test_sigterm_drains_answers_everyone_and_exits_zero(daemon: Daemon) -> None:
    results: dict[str, object] = {}
    with salus.connect(daemon.endpoint) as c:
        s = synthetic(c, MiB, MiB, 1.0)

        def first() -> None:
            try:
                s.run(timeout=30)
                results["first"] = "ok"
            except salus.SalusError as e:
                results["first"] = e.code

        t = threading.Thread(target=first)
        t.start()
        with salus.connect(daemon.endpoint) as watcher:
            wait_for(lambda: watcher.stats()["running_iterations"] == 1, "the iteration")
        daemon.proc.send_signal(signal.SIGTERM)
        t.join(30)
        assert daemon.proc.wait(30) == 0
    assert results["first"] == "ok"
    assert any("event: draining" in line for line in daemon.log)


def test_endpoint_in_use_is_a_clear_startup_error(daemon: Daemon) -> None:
    r = subprocess.run([str(SERVER), "--listen", daemon.endpoint, "--memory", "64MiB"],
                       capture_output=True, text=True, timeout=30)
    assert r.returncode == 1, r.stderr
    assert f"cannot listen on '{daemon.endpoint}'" in r.stderr
    assert daemon.proc.poll() is None


def test_daemon_process_is_named_salus_server(daemon: Daemon) -> None:
    # It re-executes itself once (OpenMP wait policy); ps and pkill must still know it.
    comm = Path(f"/proc/{daemon.proc.pid}/comm").read_text().strip()
    assert comm == "salus-server"


def test_drain_request_with_salusctl(daemon: Daemon) -> None:
    out = subprocess.run([str(CTL), "--endpoint", daemon.endpoint, "status"], check=True,
                         capture_output=True, text=True).stdout
    assert "policy fair" in out and "serving" in out
    # Drain needs the administrator: the daemon's own user over ipc.
    subprocess.run([str(CTL), "--endpoint", daemon.admin_endpoint, "drain"], check=True,
                   capture_output=True)
    assert daemon.proc.wait(30) == 0


def test_metrics_and_health(daemon: Daemon) -> None:
    with salus.connect(daemon.endpoint) as c:
        s = synthetic(c, MiB, MiB, 0.0)
        for _ in range(5):
            s.run()
        base = f"http://127.0.0.1:{daemon.metrics_port}"
        text = urllib.request.urlopen(base + "/metrics", timeout=10).read().decode()
        assert "salus_sched_iterations_total 5" in text
        assert 'salus_server_sessions{state="admitted"} 1' in text
        assert "salus_server_shared_buffers 0" in text
        assert "salus_sched_queue_delay_seconds_bucket" in text
        assert "salus_mem_lane_bytes" in text
        assert urllib.request.urlopen(base + "/healthz", timeout=10).read() == b"ok\n"
        with pytest.raises(urllib.error.HTTPError) as e:
            urllib.request.urlopen(base + "/nope", timeout=10)
        assert e.value.code == 404


def test_interactive_sessions_get_their_own_lane(daemon_factory) -> None:  # noqa: ANN001
    d = daemon_factory(policy="priority")
    with salus.connect(d.endpoint) as c:
        assert c.server["policy"] == "priority"
        batch = [synthetic(c, MiB, 4 * MiB, 0.0, name=f"train{i}", priority=i) for i in range(2)]
        infer = synthetic(c, MiB, MiB, 0.0, name="serve", latency_class="interactive")
        assert batch[0].lane == batch[1].lane  # priority: one batch lane
        assert infer.lane != batch[0].lane
        rows = {r["name"]: r for r in c.sessions()}
        assert rows["serve"]["latency_class"] == "interactive"
        assert rows["train0"]["latency_class"] == "batch"
        for _ in range(3):
            infer.run()
            batch[0].run()
        text = urllib.request.urlopen(f"http://127.0.0.1:{d.metrics_port}/metrics",
                                      timeout=10).read().decode()
        assert 'salus_sched_class_iterations_total{class="interactive"} 3' in text
        assert 'salus_sched_class_iterations_total{class="batch"} 3' in text
        assert 'salus_server_class_sessions{class="interactive"} 1' in text
        assert ('salus_sched_class_queue_delay_seconds_bucket{class="interactive",le="+Inf"} 3'
                in text)
        assert 'salus_sched_holds_total{outcome="returned"}' in text
        with pytest.raises(ValueError):
            synthetic(c, MiB, MiB, 0.0, latency_class="urgent")
        # A latency class the protocol does not know is refused, naming the field.
        req = pb.Request()
        req.create_session.synthetic.persistent_bytes = MiB
        req.create_session.latency_class = 7  # type: ignore[assignment]
        with pytest.raises(salus.SalusError) as e:
            c._call(req)
        assert e.value.code == "INVALID_ARGUMENT" and "latency_class" in str(e.value)


def test_anticipation_is_configurable(daemon_factory) -> None:  # noqa: ANN001
    bad = subprocess.run([str(SERVER), "--policy", "srtf",
                          "--policy-options", '{"max_hold_ms": -1}'],
                         capture_output=True, text=True, timeout=30)
    assert bad.returncode != 0 and "max_hold_ms" in bad.stderr
    d = daemon_factory("--policy-options", '{"max_hold_ms": 5, "min_hold_ms": 1}', policy="srtf")
    with salus.connect(d.endpoint) as c:
        s = synthetic(c, MiB, MiB, 0.0, iterations=4)
        for _ in range(4):
            s.run()
        s.close()


def test_many_processes_train_at_once(daemon_factory) -> None:
    d = daemon_factory(memory="2GiB")
    ctx = mp.get_context("fork")
    with ctx.Pool(4) as pool:
        results = pool.starmap(_train_mlp, [(d.endpoint, seed) for seed in range(4)])
    for first, last in results:
        assert last < first / 5, (first, last)


def _train_mlp(endpoint: str, seed: int) -> tuple[float, float]:
    c = salus.connect(endpoint)
    s = mlp_session(c)
    feeds = mlp_feeds(seed=seed)
    losses = [float(s.run(feeds=feeds, fetches=["loss"])["loss"]) for _ in range(40)]
    s.close()
    c.close()
    return losses[0], losses[-1]


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-v"]))
