"""Writes eight models defined in PyTorch and exported to ONNX (opset 17) with torch.onnx.export.

    .venv/bin/python benchmarks/models/make_torch_models.py [--out DIR] [--ops] [NAME...]

Needs benchmarks/requirements.txt. Each module's forward takes (inputs..., labels) and returns
(loss, logits); the export names them "loss" (a scalar) and "logits", with the batch dimension
symbolic ("N"). Weights come from PyTorch's default initialisation under a fixed seed, so
`build(name)` rebuilds exactly the module a file was exported from (the parity tests in
tests/integration/test_exported_models.py train both). `--ops` prints, per model, the op types
its graph contains.

  resnet18     ResNet-18 (BasicBlocks [2, 2, 2, 2], BatchNorm) at widths 16-32-64-128 for
               3x32x32, 10 classes, cross-entropy
  mobilenetv2  MobileNetV2 (inverted residuals, depthwise convolutions, BatchNorm, ReLU6) at a
               small width for 3x32x32, 10 classes, cross-entropy
  mobilenetv3  torchvision's MobileNetV3-Small at width 0.5 (hard-swish, squeeze-and-excite
               gates with hard-sigmoid; dropout 0) for 3x32x32, 10 classes, cross-entropy;
               needs torchvision
  transformer  token and learned positional embeddings, 2 nn.TransformerEncoderLayer (d_model
               64, 4 heads, feed-forward 128, GELU), mean-pool, linear classifier; 32 tokens
               of a 1,000-word vocabulary, 10 classes
  gpt          GPT-style decoder: 2 pre-norm blocks of hand-written causal self-attention (the
               mask a constant boolean buffer) and a GELU MLP, untied LM head, next-token
               cross-entropy over (N*T, vocab); 32 tokens, vocabulary 1,000, width 64
  lstm         embedding, 1-layer nn.LSTM (hidden 128), linear classifier on the last hidden
               state; 32 tokens, 10 classes
  hf_gpt2      Hugging Face's GPT2LMHeadModel from a small config (2 layers, width 64, 4
               heads, vocabulary 1,000, untied head, dropout 0) with its own shifted
               next-token loss (labels = the tokens); needs transformers
  hf_bert      Hugging Face's BertForSequenceClassification from a small config (2 layers,
               width 64, 4 heads, feed-forward 128, vocabulary 1,000, dropout 0), 10 classes;
               needs transformers
The torchvision and Hugging Face models were written with torch 2.15.0, torchvision 0.29.2 and
transformers 5.25.0 (the TorchScript exporter, dynamo=False).

How they are exported (Note [Exporting for training]):
- The modules are in eval mode, so Dropout (ratio 0 everywhere anyway) disappears and
  BatchNormalization is the one-output inference form holding the running statistics; a
  training executable switches it to batch statistics. The export uses TrainingMode.PRESERVE
  rather than EVAL: EVAL also folds each BatchNorm into the preceding Conv's weights, which
  leaves a model that no longer trains like the module.
- Constant folding (do_constant_folding) turns the weights PyTorch transposes or reorders for
  ONNX (Linear on 3-D inputs becomes MatMul by Wᵀ; the LSTM's gates are reordered) into new
  initializers. Each is a fixed permutation of one parameter, so training it trains that
  parameter, and SGD and Adam, elementwise, take the same steps. The LM head is untied for
  that reason: a tied head would become two initializers trained apart.
- The exporter shares initializers of equal contents through Identity nodes (all BatchNorm
  scales start as ones); `unshare_initializers` gives each parameter its own again.
- Values that are not parameters are never float initializers (the engine trains every float
  initializer): the causal mask is a boolean buffer, and scale factors are constants.
"""

from __future__ import annotations

import argparse
import inspect
import os
import warnings
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import onnx
import torch
import torch.nn.functional as F  # noqa: N812
from torch import nn

SEED = 20240601
CLASSES = 10
SEQ = 32
VOCAB = 1000
IMAGE = (3, 32, 32)
OPSET = 17


# -- ResNet-18 --------------------------------------------------------------------------------


class BasicBlock(nn.Module):
    def __init__(self, c_in: int, c_out: int, stride: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(c_in, c_out, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(c_out)
        self.conv2 = nn.Conv2d(c_out, c_out, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(c_out)
        self.downsample: nn.Module | None = None
        if stride != 1 or c_in != c_out:
            self.downsample = nn.Sequential(nn.Conv2d(c_in, c_out, 1, stride, bias=False),
                                            nn.BatchNorm2d(c_out))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = F.relu(self.bn1(self.conv1(x)))
        h = self.bn2(self.conv2(h))
        skip = x if self.downsample is None else self.downsample(x)
        return F.relu(h + skip)


class ResNet18(nn.Module):
    def __init__(self, widths: tuple[int, ...] = (16, 32, 64, 128)) -> None:
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, widths[0], 3, 1, 1, bias=False),
                                  nn.BatchNorm2d(widths[0]), nn.ReLU())
        layers: list[nn.Module] = []
        c_in = widths[0]
        for i, c in enumerate(widths):
            stride = 1 if i == 0 else 2
            layers += [BasicBlock(c_in, c, stride), BasicBlock(c, c, 1)]
            c_in = c
        self.layers = nn.Sequential(*layers)
        self.fc = nn.Linear(c_in, CLASSES)

    def forward(self, x: torch.Tensor, labels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        h = self.layers(self.stem(x))
        logits = self.fc(torch.flatten(F.adaptive_avg_pool2d(h, 1), 1))
        return F.cross_entropy(logits, labels), logits


# -- MobileNetV2 ------------------------------------------------------------------------------


def conv_bn(c_in: int, c_out: int, k: int, stride: int = 1, groups: int = 1,
            relu6: bool = True) -> nn.Sequential:
    layers: list[nn.Module] = [nn.Conv2d(c_in, c_out, k, stride, k // 2, groups=groups,
                                         bias=False), nn.BatchNorm2d(c_out)]
    if relu6:
        layers.append(nn.ReLU6())
    return nn.Sequential(*layers)


class InvertedResidual(nn.Module):
    def __init__(self, c_in: int, c_out: int, stride: int, expand: int) -> None:
        super().__init__()
        hidden = c_in * expand
        layers: list[nn.Module] = []
        if expand != 1:
            layers.append(conv_bn(c_in, hidden, 1))
        layers += [conv_bn(hidden, hidden, 3, stride, groups=hidden),
                   conv_bn(hidden, c_out, 1, relu6=False)]
        self.body = nn.Sequential(*layers)
        self.residual = stride == 1 and c_in == c_out

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.body(x) if self.residual else self.body(x)


class MobileNetV2(nn.Module):
    # (expansion, channels, repeats, first stride), MobileNetV2's table at a small width.
    SETTINGS = ((1, 8, 1, 1), (6, 16, 2, 2), (6, 24, 2, 2), (6, 32, 2, 2))

    def __init__(self) -> None:
        super().__init__()
        layers: list[nn.Module] = [conv_bn(3, 16, 3)]
        c_in = 16
        for expand, c, repeats, stride in self.SETTINGS:
            for i in range(repeats):
                layers.append(InvertedResidual(c_in, c, stride if i == 0 else 1, expand))
                c_in = c
        layers.append(conv_bn(c_in, 128, 1))
        self.features = nn.Sequential(*layers)
        self.fc = nn.Linear(128, CLASSES)

    def forward(self, x: torch.Tensor, labels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        h = F.adaptive_avg_pool2d(self.features(x), 1)
        logits = self.fc(torch.flatten(h, 1))
        return F.cross_entropy(logits, labels), logits


# -- MobileNetV3 (torchvision's) --------------------------------------------------------------


class WithLoss(nn.Module):
    """A classifier `net` as the exported models' forward: (x, labels) -> (loss, logits)."""

    def __init__(self, net: nn.Module) -> None:
        super().__init__()
        self.net = net

    def forward(self, x: torch.Tensor, labels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        logits = self.net(x)
        return F.cross_entropy(logits, labels), logits


def mobilenet_v3_small() -> nn.Module:
    from torchvision.models.mobilenetv3 import MobileNetV3, _mobilenet_v3_conf

    setting, last_channel = _mobilenet_v3_conf("mobilenet_v3_small", width_mult=0.5)
    return WithLoss(MobileNetV3(setting, last_channel, num_classes=CLASSES, dropout=0.0))


# -- Transformer encoder classifier ----------------------------------------------------------


class TransformerClassifier(nn.Module):
    def __init__(self, d: int = 64, heads: int = 4, ff: int = 128, layers: int = 2) -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCAB, d)
        self.pos = nn.Parameter(torch.randn(1, SEQ, d) * 0.02)
        self.encoder = nn.ModuleList(
            nn.TransformerEncoderLayer(d, heads, ff, dropout=0.0, activation="gelu",
                                       batch_first=True) for _ in range(layers))
        self.fc = nn.Linear(d, CLASSES)

    def forward(self, tokens: torch.Tensor,
                labels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        h = self.embed(tokens) + self.pos
        for layer in self.encoder:
            h = layer(h)
        logits = self.fc(h.mean(dim=1))
        return F.cross_entropy(logits, labels), logits


# -- GPT --------------------------------------------------------------------------------------


class CausalSelfAttention(nn.Module):
    def __init__(self, d: int, heads: int) -> None:
        super().__init__()
        self.heads, self.head_dim = heads, d // heads
        self.q, self.k, self.v = nn.Linear(d, d), nn.Linear(d, d), nn.Linear(d, d)
        self.proj = nn.Linear(d, d)
        # True above the diagonal: the future positions each query must not see.
        self.register_buffer("future", torch.triu(torch.ones(SEQ, SEQ, dtype=torch.bool), 1))

    def split(self, x: torch.Tensor) -> torch.Tensor:  # (N, T, D) -> (N, H, T, D/H)
        return x.reshape(-1, SEQ, self.heads, self.head_dim).transpose(1, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q, k, v = self.split(self.q(x)), self.split(self.k(x)), self.split(self.v(x))
        scores = torch.matmul(q, k.transpose(2, 3)) * (1.0 / float(np.sqrt(self.head_dim)))
        att = torch.softmax(scores.masked_fill(self.future, float("-inf")), dim=-1)
        y = torch.matmul(att, v).transpose(1, 2).reshape(-1, SEQ, self.heads * self.head_dim)
        return self.proj(y)


class GPTBlock(nn.Module):
    def __init__(self, d: int, heads: int) -> None:
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.attn = CausalSelfAttention(d, heads)
        self.mlp = nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class GPT(nn.Module):
    def __init__(self, d: int = 64, heads: int = 4, blocks: int = 2) -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCAB, d)
        self.pos = nn.Parameter(torch.randn(1, SEQ, d) * 0.02)
        self.blocks = nn.Sequential(*(GPTBlock(d, heads) for _ in range(blocks)))
        self.ln = nn.LayerNorm(d)
        self.head = nn.Linear(d, VOCAB, bias=False)

    def forward(self, tokens: torch.Tensor,
                labels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        h = self.ln(self.blocks(self.embed(tokens) + self.pos))
        logits = self.head(h)
        loss = F.cross_entropy(logits.reshape(-1, VOCAB), labels.reshape(-1))
        return loss, logits


# -- Hugging Face models from small configs ---------------------------------------------------


class HuggingFace(nn.Module):
    """A transformers model as the exported models' forward: (tokens, labels) -> (loss,
    logits), the loss the model's own."""

    def __init__(self, net: nn.Module) -> None:
        super().__init__()
        self.net = net

    def forward(self, tokens: torch.Tensor,
                labels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        out = self.net(input_ids=tokens, labels=labels)
        return out.loss, out.logits


def hf_gpt2() -> nn.Module:
    import transformers

    # Untied: the exporter would give the head its own transposed copy of the embedding.
    cfg = transformers.GPT2Config(vocab_size=VOCAB, n_positions=64, n_embd=64, n_layer=2,
                                  n_head=4, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
                                  tie_word_embeddings=False)
    return HuggingFace(transformers.GPT2LMHeadModel(cfg))


def hf_bert() -> nn.Module:
    import transformers

    cfg = transformers.BertConfig(vocab_size=VOCAB, hidden_size=64, num_hidden_layers=2,
                                  num_attention_heads=4, intermediate_size=128,
                                  max_position_embeddings=64, hidden_dropout_prob=0.0,
                                  attention_probs_dropout_prob=0.0, num_labels=CLASSES)
    return HuggingFace(transformers.BertForSequenceClassification(cfg))


# -- LSTM -------------------------------------------------------------------------------------


class LSTMClassifier(nn.Module):
    def __init__(self, d: int = 64, hidden: int = 128) -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCAB, d)
        self.lstm = nn.LSTM(d, hidden, batch_first=True)
        self.fc = nn.Linear(hidden, CLASSES)

    def forward(self, tokens: torch.Tensor,
                labels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        _, (h, _) = self.lstm(self.embed(tokens))
        logits = self.fc(h.squeeze(0))
        return F.cross_entropy(logits, labels), logits


# -- Export -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Spec:
    module: Callable[[], nn.Module]
    input: str  # the name of the data input; "labels" follows it
    input_shape: tuple[int, ...]  # without the batch dimension
    label_shape: tuple[int, ...]  # without the batch dimension
    logits_shape: tuple[int, ...]  # without the batch dimension


MODELS: dict[str, Spec] = {
    "resnet18": Spec(ResNet18, "x", IMAGE, (), (CLASSES,)),
    "mobilenetv2": Spec(MobileNetV2, "x", IMAGE, (), (CLASSES,)),
    "mobilenetv3": Spec(mobilenet_v3_small, "x", IMAGE, (), (CLASSES,)),
    "transformer": Spec(TransformerClassifier, "tokens", (SEQ,), (), (CLASSES,)),
    "gpt": Spec(GPT, "tokens", (SEQ,), (SEQ,), (SEQ, VOCAB)),
    "lstm": Spec(LSTMClassifier, "tokens", (SEQ,), (), (CLASSES,)),
    "hf_gpt2": Spec(hf_gpt2, "tokens", (SEQ,), (SEQ,), (SEQ, VOCAB)),
    "hf_bert": Spec(hf_bert, "tokens", (SEQ,), (), (CLASSES,)),
}


def build(name: str) -> nn.Module:
    """The module `name`.onnx was exported from, with the same initial weights."""
    torch.manual_seed(SEED)
    return MODELS[name].module()


def example_inputs(name: str, batch: int) -> tuple[torch.Tensor, torch.Tensor]:
    spec = MODELS[name]
    gen = torch.Generator().manual_seed(SEED)
    if spec.input == "tokens":
        x = torch.randint(0, VOCAB, (batch, *spec.input_shape), generator=gen)
    else:
        x = torch.randn(batch, *spec.input_shape, generator=gen)
    labels = torch.randint(0, spec.logits_shape[-1], (batch, *spec.label_shape), generator=gen)
    return x, labels


def unshare_initializers(model: onnx.ModelProto) -> None:
    """Gives every parameter its own initializer again.

    The exporter keeps one copy of initializers with equal contents and turns the others into
    Identity nodes of it: every BatchNorm scale of ones becomes one tensor, and its bias and
    running mean another. A trainer would then train them as one parameter. Each such Identity
    becomes an initializer of its own, holding the same values.
    """
    graph = model.graph
    inits = {t.name: t for t in graph.initializer}
    kept = []
    for node in graph.node:
        if node.op_type == "Identity" and node.input[0] in inits:
            copy = onnx.TensorProto()
            copy.CopyFrom(inits[node.input[0]])
            copy.name = node.output[0]
            graph.initializer.append(copy)
        else:
            kept.append(node)
    del graph.node[:]
    graph.node.extend(kept)


def legacy_exporter() -> dict:
    """torch.onnx.export's arguments for the TorchScript exporter, which later torch versions no
    longer take by default (and earlier ones have no argument for)."""
    return {"dynamo": False} if "dynamo" in inspect.signature(torch.onnx.export).parameters else {}


def export(name: str, path: str) -> None:
    spec = MODELS[name]
    module = build(name).eval()
    batch = {0: "N"}
    # Keep nn.MultiheadAttention on its decomposed (exportable) path.
    torch.backends.mha.set_fastpath_enabled(False)
    with warnings.catch_warnings():
        # Both warn of what this export rules out: folding only permutes parameters (Note
        # [Exporting for training]), and the LSTM's initial state is built from the batch size
        # in the graph (Shape, ConstantOfShape), so any batch runs.
        warnings.filterwarnings("ignore", message="It is recommended that constant folding")
        warnings.filterwarnings("ignore", message="Exporting a model to ONNX with a batch_size")
        torch.onnx.export(
            module, example_inputs(name, 2), path, opset_version=OPSET, do_constant_folding=True,
            **legacy_exporter(),
            training=torch.onnx.TrainingMode.PRESERVE,  # Note [Exporting for training]
            input_names=[spec.input, "labels"], output_names=["loss", "logits"],
            dynamic_axes={spec.input: batch, "labels": batch, "logits": batch})
    model = onnx.load(path)
    unshare_initializers(model)
    model.producer_name = "salus-make-torch-models"
    onnx.checker.check_model(model)
    onnx.save(model, path)


def op_types(path: str) -> list[str]:
    return sorted({n.op_type for n in onnx.load(path).graph.node})


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.path.dirname(os.path.abspath(__file__)))
    ap.add_argument("--ops", action="store_true", help="print the op types of each model")
    ap.add_argument("names", nargs="*", choices=[[], *MODELS], help="the models (default: all)")
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    for name in args.names or MODELS:
        path = os.path.join(args.out, f"{name}.onnx")
        export(name, path)
        if args.ops:
            print(f"{name}: {' '.join(op_types(path))}")
        else:
            print(f"{path}: {os.path.getsize(path)} bytes")


if __name__ == "__main__":
    main()
