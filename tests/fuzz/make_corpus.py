"""Writes the committed seed corpora of the structure-aware fuzz targets (tests/fuzz/corpus/).

Run from the repository root with the project's venv: `.venv/bin/python tests/fuzz/make_corpus.py`.
Seeds are binary protobuf messages: a few ONNX node-test models of libonnx-testdata and small
hand-built ONNX models (onnx_graph_fuzzer), hand-built TensorFlow GraphDefs of the importer's
subset (tf_graph_fuzzer; its Python module is generated from src/exec/tf_graph.proto with
protoc into a temporary folder), hand-built ATen graphs (aten_graph_fuzzer) and RunIteration
requests with their frames in run_iteration_fuzzer's layout (2-byte length, request, frames).
"""

from __future__ import annotations

import importlib
import shutil
import struct
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

import onnx
from onnx import TensorProto, helper

ROOT = Path(__file__).resolve().parents[2]
CORPUS = ROOT / "tests" / "fuzz" / "corpus"
NODE_TESTS = Path("/usr/share/libonnx-testdata/data/node")
ONNX_NODE_SEEDS = [
    "test_gemm_default_vector_bias", "test_conv_with_strides_padding", "test_maxpool_2d_default",
    "test_batchnorm_example", "test_softmax_axis_1", "test_reshape_reordered_all_dims",
    "test_transpose_default", "test_concat_2d_axis_1", "test_sce_mean", "test_matmul_2d",
    "test_averagepool_2d_default", "test_reduce_mean_default_axes_keepdims_example",
]

sys.path.insert(0, str(ROOT / "adaptors" / "python" / "salus" / "_generated"))
aten_pb2 = importlib.import_module("salus.v1.aten_graph_pb2")
salus_pb2 = importlib.import_module("salus.v1.salus_pb2")


def write(target: str, name: str, data: bytes) -> None:
    folder = CORPUS / target
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f"{name}.pb").write_bytes(data)


# --- ONNX ------------------------------------------------------------------------------------

def tiny_mlp() -> onnx.ModelProto:
    """x[2,4] -> Gemm -> Relu -> Gemm -> logits[2,3]; loss = cross-entropy against labels[2]."""
    def init(name: str, dims: list[int]) -> TensorProto:
        n = 1
        for d in dims:
            n *= d
        return helper.make_tensor(name, TensorProto.FLOAT, dims,
                                  [0.01 * ((i * 7) % 13 - 6) for i in range(n)])
    nodes = [
        helper.make_node("Gemm", ["x", "w1", "b1"], ["h"]),
        helper.make_node("Relu", ["h"], ["r"]),
        helper.make_node("Gemm", ["r", "w2", "b2"], ["logits"]),
        helper.make_node("SoftmaxCrossEntropyLoss", ["logits", "labels"], ["loss"],
                         reduction="mean"),
    ]
    graph = helper.make_graph(
        nodes, "tiny_mlp",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 4]),
         helper.make_tensor_value_info("labels", TensorProto.INT64, [2])],
        [helper.make_tensor_value_info("loss", TensorProto.FLOAT, []),
         helper.make_tensor_value_info("logits", TensorProto.FLOAT, [2, 3])],
        [init("w1", [4, 8]), init("b1", [8]), init("w2", [8, 3]), init("b2", [3])])
    return helper.make_model(graph, ir_version=8, opset_imports=[helper.make_opsetid("", 17)])


def tiny_cnn() -> onnx.ModelProto:
    """Conv -> BatchNormalization -> Relu -> MaxPool -> Flatten -> Gemm, with initializers."""
    def init(name: str, dims: list[int], value: float = 0.1) -> TensorProto:
        n = 1
        for d in dims:
            n *= d
        return helper.make_tensor(name, TensorProto.FLOAT, dims, [value] * n)
    nodes = [
        helper.make_node("Conv", ["x", "k", "kb"], ["c"], kernel_shape=[3, 3], pads=[1, 1, 1, 1]),
        helper.make_node("BatchNormalization", ["c", "s", "bb", "m", "v"], ["n"]),
        helper.make_node("Relu", ["n"], ["r"]),
        helper.make_node("MaxPool", ["r"], ["p"], kernel_shape=[2, 2], strides=[2, 2]),
        helper.make_node("Flatten", ["p"], ["f"]),
        helper.make_node("Gemm", ["f", "fw"], ["y"], transB=1),
        helper.make_node("ReduceMean", ["y"], ["loss"], keepdims=0),
    ]
    graph = helper.make_graph(
        nodes, "tiny_cnn",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 2, 4, 4])],
        [helper.make_tensor_value_info("loss", TensorProto.FLOAT, [])],
        [init("k", [3, 2, 3, 3]), init("kb", [3]), init("s", [3], 1.0), init("bb", [3], 0.0),
         init("m", [3], 0.0), init("v", [3], 1.0), init("fw", [5, 12])])
    return helper.make_model(graph, ir_version=8, opset_imports=[helper.make_opsetid("", 17)])


def onnx_seeds() -> None:
    for name in ONNX_NODE_SEEDS:
        model = NODE_TESTS / name / "model.onnx"
        if model.exists():
            write("onnx_graph_fuzzer", name, model.read_bytes())
    write("onnx_graph_fuzzer", "tiny_mlp", tiny_mlp().SerializeToString())
    write("onnx_graph_fuzzer", "tiny_cnn", tiny_cnn().SerializeToString())


# --- TensorFlow -------------------------------------------------------------------------------

def tf_module():
    out = Path(tempfile.mkdtemp(prefix="salus-tfgraph-"))
    src = ROOT / "src" / "exec"
    subprocess.run(["protoc", f"--proto_path={src}", f"--python_out={out}",
                    str(src / "tf_graph.proto")], check=True)
    sys.path.insert(0, str(out))
    module = importlib.import_module("tf_graph_pb2")
    shutil.rmtree(out)
    return module


class TfGraph:
    """Builds a GraphDef node by node, as tests/unit/exec/tf_importer_test.cc does."""

    def __init__(self, tf) -> None:
        self.tf = tf
        self.gd = tf.GraphDef()

    def node(self, name: str, op: str, inputs: tuple[str, ...] = (), **attrs: object):
        n = self.gd.node.add(name=name, op=op, input=list(inputs))
        for key, value in attrs.items():
            if isinstance(value, bool):
                n.attr[key].b = value
            elif isinstance(value, int):
                n.attr[key].i = value
            elif isinstance(value, str):
                n.attr[key].s = value.encode()
            elif isinstance(value, list):
                n.attr[key].list.i.extend(value)
        return n

    def placeholder(self, name: str, shape: list[int], dtype: int | None = None) -> None:
        n = self.node(name, "Placeholder")
        n.attr["dtype"].type = dtype if dtype is not None else self.tf.DT_FLOAT
        n.attr["shape"].shape.SetInParent()  # a scalar's shape too
        for d in shape:
            n.attr["shape"].shape.dim.add(size=d)

    def var(self, name: str, shape: list[int], dtype: int | None = None) -> None:
        n = self.node(name, "VarHandleOp")
        n.attr["dtype"].type = dtype if dtype is not None else self.tf.DT_FLOAT
        n.attr["shape"].shape.SetInParent()  # a scalar's shape too
        for d in shape:
            n.attr["shape"].shape.dim.add(size=d)

    def read(self, name: str, var: str) -> None:
        self.node(name, "ReadVariableOp", (var,)).attr["dtype"].type = self.tf.DT_FLOAT

    def const(self, name: str, shape: list[int], values: list, dtype: int | None = None) -> None:
        tf = self.tf
        dtype = dtype if dtype is not None else tf.DT_FLOAT
        n = self.node(name, "Const")
        t = n.attr["value"].tensor
        t.dtype = dtype
        for d in shape:
            t.tensor_shape.dim.add(size=d)
        {tf.DT_FLOAT: t.float_val, tf.DT_INT32: t.int_val, tf.DT_INT64: t.int64_val}[dtype].extend(
            values)
        n.attr["dtype"].type = dtype

    def bytes(self) -> bytes:
        return self.gd.SerializeToString()


def tf_seeds() -> None:
    tf = tf_module()
    # A Dense+relu, Dense, sparse cross-entropy training step with SGD.
    g = TfGraph(tf)
    g.placeholder("x", [4, 3])
    g.placeholder("labels", [4], tf.DT_INT32)
    for name, shape in (("w1", [3, 5]), ("b1", [5]), ("w2", [5, 3]), ("b2", [3])):
        g.var(name, shape)
        g.read("read_" + name, name)
    g.var("iterations", [], tf.DT_INT64)
    g.node("mm1", "MatMul", ("x", "read_w1"))
    g.node("pre1", "BiasAdd", ("mm1", "read_b1"))
    g.node("h", "Relu", ("pre1",))
    g.node("mm2", "MatMul", ("h", "read_w2"))
    g.node("logits", "BiasAdd", ("mm2", "read_b2"))
    g.node("xent", "SparseSoftmaxCrossEntropyWithLogits", ("logits", "labels"))
    g.const("axis0", [1], [0], tf.DT_INT32)
    g.node("loss", "Mean", ("xent", "axis0"))
    g.const("inv_batch", [], [0.25])
    g.node("dlogits", "Mul", ("xent:1", "inv_batch"))
    g.node("dw2", "MatMul", ("h", "dlogits"), transpose_a=True)
    g.node("db2", "BiasAddGrad", ("dlogits",))
    g.node("dh", "MatMul", ("dlogits", "read_w2"), transpose_b=True)
    g.node("dpre1", "ReluGrad", ("dh", "h"))
    g.node("dw1", "MatMul", ("x", "dpre1"), transpose_a=True)
    g.node("db1", "BiasAddGrad", ("dpre1",))
    g.const("lr", [], [0.1])
    for v in ("w1", "b1", "w2", "b2"):
        g.node("step_" + v, "Mul", ("lr", "d" + v))
        g.node("update_" + v, "AssignSubVariableOp", (v, "step_" + v))
    g.const("one", [], [1], tf.DT_INT64)
    g.node("count", "AssignAddVariableOp", ("iterations", "one"))
    write("tf_graph_fuzzer", "mlp_step", g.bytes())

    # Shape arithmetic that folds once the Placeholder's shape is fixed.
    g = TfGraph(tf)
    g.placeholder("x", [2, 3, 4])
    g.node("shape", "Shape", ("x",))
    g.const("b0", [1], [0], tf.DT_INT32)
    g.const("e1", [1], [1], tf.DT_INT32)
    g.const("s1", [1], [1], tf.DT_INT32)
    g.node("batch", "StridedSlice", ("shape", "b0", "e1", "s1"), shrink_axis_mask=1)
    g.const("minus1", [], [-1], tf.DT_INT32)
    g.node("packed", "Pack", ("batch", "minus1"))
    g.node("flat", "Reshape", ("x", "packed"))
    g.node("prod", "Prod", ("shape", "b0"))
    g.node("size", "Size", ("x",))
    g.node("rank", "Rank", ("x",))
    g.node("out", "Relu", ("flat",))
    write("tf_graph_fuzzer", "shape_arithmetic", g.bytes())

    # Conv2D and MaxPool, NHWC, with their gradients.
    g = TfGraph(tf)
    g.placeholder("x", [1, 5, 5, 2])
    g.placeholder("f", [3, 3, 2, 4])
    conv = {"strides": [1, 1, 1, 1], "padding": "SAME", "data_format": "NHWC"}
    g.node("conv", "Conv2D", ("x", "f"), **conv)
    g.placeholder("dy", [1, 5, 5, 4])
    g.const("x_sizes", [4], [1, 5, 5, 2], tf.DT_INT32)
    g.const("f_sizes", [4], [3, 3, 2, 4], tf.DT_INT32)
    g.node("dx", "Conv2DBackpropInput", ("x_sizes", "f", "dy"), **conv)
    g.node("df", "Conv2DBackpropFilter", ("x", "f_sizes", "dy"), **conv)
    pool = {"ksize": [1, 2, 2, 1], "strides": [1, 2, 2, 1], "padding": "VALID"}
    g.node("pool", "MaxPool", ("x",), **pool)
    g.placeholder("dpool", [1, 2, 2, 2])
    g.node("dxpool", "MaxPoolGrad", ("x", "pool", "dpool"), **pool)
    write("tf_graph_fuzzer", "conv_pool_grads", g.bytes())

    # Element-wise ops, broadcasting, a transpose and a concat.
    g = TfGraph(tf)
    g.placeholder("a", [2, 3])
    g.placeholder("b", [3])
    g.node("sum", "AddV2", ("a", "b"))
    g.node("diff", "Sub", ("sum", "a"))
    g.const("perm", [2], [1, 0], tf.DT_INT32)
    g.node("t", "Transpose", ("diff", "perm"))
    g.const("axis", [], [0], tf.DT_INT32)
    g.node("cat", "ConcatV2", ("t", "t", "axis"), N=2)
    g.node("sig", "Sigmoid", ("cat",))
    write("tf_graph_fuzzer", "elementwise", g.bytes())


# --- ATen -------------------------------------------------------------------------------------

class AtenGraph:
    """Builds an AtenGraph, as tests/unit/exec/aten_importer_test.cc does."""

    def __init__(self) -> None:
        self.g = aten_pb2.AtenGraph()

    def value(self, name: str, shape: list[int], dtype: int = aten_pb2.ATEN_FLOAT32) -> int:
        self.g.values.add(name=name, dtype=dtype, shape=shape)
        return len(self.g.values) - 1

    def node(self, op: str, outputs: list[int], /, **args: object) -> None:
        n = self.g.nodes.add(op=op, outputs=outputs)
        for name, v in args.items():
            a = n.args.add(name=name)
            if isinstance(v, tuple) and v[0] == "t":
                a.value = v[1]
            elif v is None:
                a.none = True
            elif isinstance(v, bool):
                a.bool_value = v
            elif isinstance(v, int):
                a.int_value = v
            elif isinstance(v, float):
                a.float_value = v
            elif isinstance(v, str):
                a.string_value = v
            elif isinstance(v, list):
                a.ints.v.extend(v)

    def bytes(self) -> bytes:
        return self.g.SerializeToString()


def aten_seeds() -> None:
    # y = relu(x @ w^T + b); loss = mean(y); w := 0.5 w, a stand-in update through copy_.
    b = AtenGraph()
    x, w, bias = b.value("input0", [4, 3]), b.value("w", [2, 3]), b.value("b", [2])
    b.g.inputs.append(x)
    b.g.state.extend([w, bias])
    wt = b.value("wt", [3, 2])
    b.node("aten.permute_copy.default", [wt], self=("t", w), dims=[1, 0])
    mm = b.value("mm", [4, 2])
    b.node("aten.addmm.default", [mm], self=("t", bias), mat1=("t", x), mat2=("t", wt),
           beta=1.0, alpha=1.0)
    y = b.value("y", [4, 2])
    b.node("aten.relu.default", [y], self=("t", mm))
    loss = b.value("loss", [])
    b.node("aten.mean.dim", [loss], self=("t", y), dim=None, keepdim=False)
    scaled = b.value("scaled", [2, 3])
    b.node("aten.mul.Tensor", [scaled], self=("t", w), other=0.5)
    copied = b.value("copied", [2, 3])
    b.node("aten.copy_.default", [copied], self=("t", w), src=("t", scaled), non_blocking=False)
    b.g.outputs.append(loss)
    write("aten_graph_fuzzer", "linear_step", b.bytes())

    # log_softmax, a sum over a dim, a view and a clone of a constant.
    b = AtenGraph()
    x = b.value("input0", [2, 5])
    b.g.inputs.append(x)
    ls = b.value("ls", [2, 5])
    b.node("aten._log_softmax.default", [ls], self=("t", x), dim=1, half_to_float=False)
    s = b.value("s", [2])
    b.node("aten.sum.dim_IntList", [s], self=("t", ls), dim=[1], keepdim=False)
    c = b.value("c", [2])
    b.g.values[c].constant = True
    b.g.values[c].data = struct.pack("<2f", 1.5, -2.0)
    out = b.value("out", [2])
    b.node("aten.add.Tensor", [out], self=("t", s), other=("t", c), alpha=1)
    v = b.value("v", [1, 2])
    b.node("aten.view_copy.default", [v], self=("t", out), size=[1, 2])
    cl = b.value("cl", [1, 2])
    b.node("aten.clone.default", [cl], self=("t", v))
    b.g.outputs.extend([cl, s])
    write("aten_graph_fuzzer", "log_softmax_sum", b.bytes())

    # A 2-d convolution with int64 arguments and a bias.
    b = AtenGraph()
    x, k, kb = b.value("input0", [1, 2, 5, 5]), b.value("k", [3, 2, 3, 3]), b.value("kb", [3])
    b.g.inputs.append(x)
    b.g.state.extend([k, kb])
    y = b.value("y", [1, 3, 5, 5])
    b.node("aten.convolution.default", [y], input=("t", x), weight=("t", k), bias=("t", kb),
           stride=[1, 1], padding=[1, 1], dilation=[1, 1], transposed=False,
           output_padding=[0, 0], groups=1)
    r = b.value("r", [1, 3, 5, 5])
    b.node("aten.relu.default", [r], self=("t", y))
    b.g.outputs.append(r)
    write("aten_graph_fuzzer", "convolution", b.bytes())


# --- RunIteration -----------------------------------------------------------------------------

def spec(name: str, dtype: int, shape: list[int]):
    return salus_pb2.TensorSpec(name=name, dtype=dtype, shape=shape)


def frame(data: bytes) -> bytes:
    """A control byte that asks for the spec's size, then the bytes."""
    return b"\x00" + data


def iteration_seed(body, frames: bytes) -> bytes:
    request = body.SerializeToString()
    return struct.pack("<H", len(request)) + request + frames


def run_iteration_seeds() -> None:
    f32, i64 = salus_pb2.FLOAT32, salus_pb2.INT64
    x = struct.pack("<8f", 0.5, -1, 2, 0, 1, 1, -0.5, 3)
    labels = struct.pack("<2q", 1, 2)
    step = salus_pb2.RunIteration(feeds=[spec("x", f32, [2, 4]), spec("labels", i64, [2])],
                                  fetches=["loss"])
    write("run_iteration_fuzzer", "train_step", iteration_seed(step, frame(x) + frame(labels)))
    early = salus_pb2.RunIteration(feeds=[spec("x", f32, [2, 4]), spec("labels", i64, [2])],
                                   fetches=["logits", "loss"], reply_when_fetched=True)
    write("run_iteration_fuzzer", "reply_when_fetched",
          iteration_seed(early, frame(x) + frame(labels)))
    w1 = struct.pack("<32f", *[0.01 * i for i in range(32)])
    state = salus_pb2.RunIteration(feeds=[spec("w1", f32, [4, 8])], fetches=["w1", "b2"],
                                   state_only=True)
    write("run_iteration_fuzzer", "state_only", iteration_seed(state, frame(w1)))
    both = salus_pb2.RunIteration(
        feeds=[spec("x", f32, [2, 4]), spec("labels", i64, [2]), spec("w1", f32, [4, 8])],
        fetches=["loss", "w1"])
    write("run_iteration_fuzzer", "state_and_step",
          iteration_seed(both, frame(x) + frame(labels) + frame(w1)))
    wrong = salus_pb2.RunIteration(feeds=[spec("x", i64, [2, 4]), spec("labels", f32, [2, 1])],
                                   fetches=["nope"])
    write("run_iteration_fuzzer", "wrong_specs", iteration_seed(wrong, b"\xe3abc" + b"\x05"))


def main() -> None:
    steps: list[Callable[[], None]] = [onnx_seeds, tf_seeds, aten_seeds, run_iteration_seeds]
    for step in steps:
        step()
    total = sum(p.stat().st_size for p in CORPUS.rglob("*") if p.is_file())
    print(f"corpus: {total} bytes in {CORPUS}")


if __name__ == "__main__":
    main()
