"""Writes the reference models of the execution engine as ONNX files (ir_version 8, opset 17).

    .venv/bin/python benchmarks/models/make_models.py [OUT_DIR]

Every model takes its batch dimension symbolically ("N"); the engine fixes it at compile time.
Each has a scalar output "loss" for training and its prediction as a second output. Weights
are He-uniform from a fixed seed, so the files are reproducible.

  mlp       784-512-512-10, Gemm + Relu, softmax cross-entropy
  lenet5    LeNet-5 for 1x28x28: conv5-pool-conv5-pool-fc120-fc84-fc10
  resnet    a small ResNet for 3x32x32: stem, two residual stages (16, 32 channels), GAP, fc10
  espcn     ESPCN x3 super-resolution for 1x16x16: conv5-tanh-conv3-tanh-conv3, DepthToSpace;
            mean squared error against the target
  vae       dense VAE 784-256-(20, 20), reparameterised with the noise fed as input "eps";
            loss = reconstruction squared error + KL divergence, averaged over the batch
"""

from __future__ import annotations

import os
import sys

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

RNG = np.random.RandomState(20240601)


class Graph:
    def __init__(self) -> None:
        self.nodes: list[onnx.NodeProto] = []
        self.inits: list[onnx.TensorProto] = []
        self.count = 0

    def name(self, stem: str) -> str:
        self.count += 1
        return f"{stem}{self.count}"

    def weight(self, stem: str, shape: tuple[int, ...], fan_in: int) -> str:
        bound = np.sqrt(6.0 / fan_in)
        name = self.name(stem)
        self.inits.append(numpy_helper.from_array(
            RNG.uniform(-bound, bound, size=shape).astype(np.float32), name))
        return name

    def zeros(self, stem: str, shape: tuple[int, ...]) -> str:
        name = self.name(stem)
        self.inits.append(numpy_helper.from_array(np.zeros(shape, np.float32), name))
        return name

    def const(self, value: float | list[int], dtype: type = np.float32) -> str:
        name = self.name("const")
        arr = np.array(value, dtype=dtype)
        self.nodes.append(helper.make_node(
            "Constant", [], [name], value=numpy_helper.from_array(arr, name + "_value")))
        return name

    def op(self, op_type: str, inputs: list[str], out: str | None = None, **attrs) -> str:
        out = out or self.name(op_type.lower())
        self.nodes.append(helper.make_node(op_type, inputs, [out], name=out, **attrs))
        return out

    def dense(self, x: str, n_in: int, n_out: int, out: str | None = None) -> str:
        w = self.weight("fc_w", (n_out, n_in), n_in)
        b = self.zeros("fc_b", (n_out,))
        return self.op("Gemm", [x, w, b], out, transB=1)

    def conv(self, x: str, c_in: int, c_out: int, k: int, stride: int = 1, pad: int = 0) -> str:
        w = self.weight("conv_w", (c_out, c_in, k, k), c_in * k * k)
        b = self.zeros("conv_b", (c_out,))
        return self.op("Conv", [x, w, b], kernel_shape=[k, k], strides=[stride, stride],
                       pads=[pad] * 4)

    def model(self, name: str, inputs: list, outputs: list) -> onnx.ModelProto:
        graph = helper.make_graph(self.nodes, name, inputs, outputs, self.inits)
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)],
                                  producer_name="salus-make-models")
        model.ir_version = 8
        onnx.checker.check_model(model)
        return model


def vi(name: str, shape: list, dtype: int = TensorProto.FLOAT) -> onnx.ValueInfoProto:
    return helper.make_tensor_value_info(name, dtype, shape)


def classifier_outputs(g: Graph, logits: str) -> list:
    g.op("SoftmaxCrossEntropyLoss", [logits, "labels"], "loss")
    return [vi("loss", []), vi(logits, ["N", 10])]


def mlp() -> onnx.ModelProto:
    g = Graph()
    h = g.op("Relu", [g.dense("x", 784, 512)])
    h = g.op("Relu", [g.dense(h, 512, 512)])
    logits = g.dense(h, 512, 10, "logits")
    outs = classifier_outputs(g, logits)
    return g.model("mlp", [vi("x", ["N", 784]), vi("labels", ["N"], TensorProto.INT64)], outs)


def lenet5() -> onnx.ModelProto:
    g = Graph()
    h = g.op("Relu", [g.conv("x", 1, 6, 5, pad=2)])
    h = g.op("MaxPool", [h], kernel_shape=[2, 2], strides=[2, 2])
    h = g.op("Relu", [g.conv(h, 6, 16, 5)])
    h = g.op("MaxPool", [h], kernel_shape=[2, 2], strides=[2, 2])
    h = g.op("Flatten", [h], axis=1)
    h = g.op("Relu", [g.dense(h, 16 * 5 * 5, 120)])
    h = g.op("Relu", [g.dense(h, 120, 84)])
    logits = g.dense(h, 84, 10, "logits")
    outs = classifier_outputs(g, logits)
    return g.model("lenet5", [vi("x", ["N", 1, 28, 28]), vi("labels", ["N"], TensorProto.INT64)],
                   outs)


def resnet() -> onnx.ModelProto:
    g = Graph()

    def block(x: str, c_in: int, c_out: int, stride: int) -> str:
        h = g.op("Relu", [g.conv(x, c_in, c_out, 3, stride, 1)])
        h = g.conv(h, c_out, c_out, 3, 1, 1)
        skip = x if stride == 1 and c_in == c_out else g.conv(x, c_in, c_out, 1, stride, 0)
        return g.op("Relu", [g.op("Add", [h, skip])])

    h = g.op("Relu", [g.conv("x", 3, 16, 3, 1, 1)])
    h = block(h, 16, 16, 1)
    h = block(h, 16, 32, 2)
    h = block(h, 32, 32, 1)
    h = g.op("GlobalAveragePool", [h])
    h = g.op("Flatten", [h], axis=1)
    logits = g.dense(h, 32, 10, "logits")
    outs = classifier_outputs(g, logits)
    return g.model("resnet", [vi("x", ["N", 3, 32, 32]), vi("labels", ["N"], TensorProto.INT64)],
                   outs)


def espcn() -> onnx.ModelProto:
    g = Graph()
    r = 3
    h = g.op("Tanh", [g.conv("x", 1, 64, 5, 1, 2)])
    h = g.op("Tanh", [g.conv(h, 64, 32, 3, 1, 1)])
    h = g.conv(h, 32, r * r, 3, 1, 1)
    y = g.op("DepthToSpace", [h], "y", blocksize=r, mode="DCR")
    d = g.op("Sub", [y, "target"])
    g.op("ReduceMean", [g.op("Mul", [d, d])], "loss", keepdims=0)
    return g.model("espcn", [vi("x", ["N", 1, 16, 16]), vi("target", ["N", 1, 48, 48])],
                   [vi("loss", []), vi("y", ["N", 1, 48, 48])])


def vae() -> onnx.ModelProto:
    g = Graph()
    h = g.op("Relu", [g.dense("x", 784, 256)])
    mu = g.dense(h, 256, 20)
    logvar = g.dense(h, 256, 20)
    std = g.op("Exp", [g.op("Mul", [logvar, g.const(0.5)])])
    z = g.op("Add", [mu, g.op("Mul", [std, "eps"])])
    h = g.op("Relu", [g.dense(z, 20, 256)])
    recon = g.op("Sigmoid", [g.dense(h, 256, 784)], "recon")
    d = g.op("Sub", [recon, "x"])
    rec = g.op("ReduceSum", [g.op("Mul", [d, d]), g.const([1], np.int64)], keepdims=0)
    # KL(q(z|x) || N(0, I)) = -0.5 * sum(1 + logvar - mu^2 - exp(logvar))
    inner = g.op("Sub", [g.op("Sub", [g.op("Add", [logvar, g.const(1.0)]),
                                      g.op("Mul", [mu, mu])]), g.op("Exp", [logvar])])
    kl = g.op("Mul", [g.op("ReduceSum", [inner, g.const([1], np.int64)], keepdims=0),
                      g.const(-0.5)])
    g.op("ReduceMean", [g.op("Add", [rec, kl])], "loss", keepdims=0)
    return g.model("vae", [vi("x", ["N", 784]), vi("eps", ["N", 20])],
                   [vi("loss", []), vi("recon", ["N", 784])])


MODELS = {"mlp": mlp, "lenet5": lenet5, "resnet": resnet, "espcn": espcn, "vae": vae}


def main() -> None:
    out_dir = sys.argv[1] if len(sys.argv) > 1 else os.path.dirname(os.path.abspath(__file__))
    os.makedirs(out_dir, exist_ok=True)
    for name, build in MODELS.items():
        path = os.path.join(out_dir, f"{name}.onnx")
        onnx.save(build(), path)
        print(f"{path}: {os.path.getsize(path)} bytes")


if __name__ == "__main__":
    main()
