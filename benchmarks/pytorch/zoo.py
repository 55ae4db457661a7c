"""Architectures nobody here wrote, through the two PyTorch front doors, against PyTorch itself.

torchvision classification models and Hugging Face transformers from small configs (random
weights, no downloads) each run:
- on the lazy `salus` device: three steps of an unmodified loop (SGD with momentum 0.9, lr
  1e-2; the model moved to "salus") beside the same steps eagerly on the CPU from the same
  weights: the largest relative difference of the losses; and the error of the parameters'
  update (L2 over the whole model, relative to the update's size) against the same steps in
  float64, the device's beside eager float32's own: BatchNorm and deep stacks amplify
  float32's rounding, and the two errors should be of one size;
- through ONNX (torchvision models): exported with torch.onnx.export (the TorchScript exporter,
  opset 17, equal initializers unshared as benchmarks/models/make_torch_models.py does), run in
  the daemon for inference beside onnxruntime (largest relative difference of the logits) and
  trained three SGD steps beside PyTorch (largest relative loss difference).

Dropout is set to 0 everywhere (the device draws its own random numbers). The batch is 8 at
64x64 (torchvision) or 8 sequences of 16 tokens (BatchNorm over two samples at a 1x1 map is
so ill-conditioned that eager on one thread and on two disagree at once). SGD rather than Adam:
Adam's first steps move every parameter by about the learning rate whatever its gradient's
size, so rounding in a tiny gradient becomes a full-size difference.

    python benchmarks/pytorch/zoo.py [--models resnet18,hf_bert] [--no-onnx] [--json FILE]

Needs torch, torchvision, transformers, onnx and onnxruntime in the interpreter, salus_torch
and the Python client importable (adaptors/pytorch and adaptors/python), and a built
salus-server (build/bin, or $SALUS_SERVER).
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import sys
import tempfile
import time
import warnings
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F  # noqa: N812
from torch import nn

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "tests" / "integration"))
sys.path.insert(0, str(REPO / "benchmarks" / "models"))

BATCH, SIZE, TOKENS, VOCAB, CLASSES, STEPS = 8, 64, 16, 1000, 10, 3


def torchvision_models() -> dict[str, Callable[[], nn.Module]]:
    import torchvision
    from torchvision.models.swin_transformer import (
        PatchMergingV2,
        SwinTransformer,
        SwinTransformerBlockV2,
    )
    from torchvision.models.vision_transformer import VisionTransformer

    def tv(name: str) -> Callable[[], nn.Module]:
        return lambda: getattr(torchvision.models, name)(num_classes=CLASSES)

    names = ["resnet18", "resnext50_32x4d", "vgg11_bn", "densenet121", "squeezenet1_0",
             "shufflenet_v2_x0_5", "mnasnet0_5", "mobilenet_v3_small", "mobilenet_v3_large",
             "efficientnet_b0", "efficientnet_v2_s", "regnet_y_400mf", "convnext_tiny"]
    out = {n: tv(n) for n in names}
    # The transformers at small configs (their torchvision builders fix the size).
    out["vit (small)"] = lambda: VisionTransformer(
        image_size=SIZE, patch_size=8, num_layers=2, num_heads=4, hidden_dim=64, mlp_dim=128,
        num_classes=CLASSES)
    out["swin (small)"] = lambda: SwinTransformer(
        patch_size=[4, 4], embed_dim=32, depths=[2, 2], num_heads=[2, 4], window_size=[4, 4],
        num_classes=CLASSES)
    out["swin_v2 (small)"] = lambda: SwinTransformer(
        patch_size=[4, 4], embed_dim=32, depths=[2, 2], num_heads=[2, 4], window_size=[4, 4],
        num_classes=CLASSES, block=SwinTransformerBlockV2, downsample_layer=PatchMergingV2)
    return out


def huggingface_models() -> dict[str, Callable[[], nn.Module]]:
    import transformers as tr

    small = {"hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
             "intermediate_size": 128, "max_position_embeddings": 64, "hidden_dropout_prob": 0.0,
             "attention_probs_dropout_prob": 0.0, "num_labels": CLASSES, "vocab_size": VOCAB}
    return {
        "hf_gpt2": lambda: tr.GPT2LMHeadModel(tr.GPT2Config(
            vocab_size=VOCAB, n_positions=64, n_embd=64, n_layer=2, n_head=4, resid_pdrop=0.0,
            embd_pdrop=0.0, attn_pdrop=0.0)),
        "hf_llama": lambda: tr.LlamaForCausalLM(tr.LlamaConfig(
            vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
            num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)),
        "hf_bert": lambda: tr.BertForSequenceClassification(tr.BertConfig(**small)),
        "hf_roberta": lambda: tr.RobertaForSequenceClassification(tr.RobertaConfig(
            **{**small, "max_position_embeddings": 80})),
        "hf_distilbert": lambda: tr.DistilBertForSequenceClassification(tr.DistilBertConfig(
            vocab_size=VOCAB, dim=64, n_layers=2, n_heads=4, hidden_dim=128,
            max_position_embeddings=64, dropout=0.0, attention_dropout=0.0,
            seq_classif_dropout=0.0, num_labels=CLASSES)),
        "hf_t5": lambda: tr.T5ForConditionalGeneration(tr.T5Config(
            vocab_size=VOCAB, d_model=64, d_kv=16, d_ff=128, num_layers=2, num_heads=4,
            dropout_rate=0.0, decoder_start_token_id=0, pad_token_id=0)),
        "hf_vit": lambda: tr.ViTForImageClassification(tr.ViTConfig(
            image_size=32, patch_size=8, hidden_size=64, num_hidden_layers=2,
            num_attention_heads=4, intermediate_size=128, hidden_dropout_prob=0.0,
            attention_probs_dropout_prob=0.0, num_labels=CLASSES)),
    }


def build(make: Callable[[], nn.Module]) -> nn.Module:
    torch.manual_seed(0)
    m = make()
    for mod in m.modules():
        if isinstance(mod, nn.Dropout):
            mod.p = 0.0
        if type(mod).__name__ == "StochasticDepth":
            mod.p = 0.0
    return m


def inputs(name: str) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    if not name.startswith("hf_"):
        return {"x": torch.randn(BATCH, 3, SIZE, SIZE, generator=g),
                "labels": torch.randint(0, CLASSES, (BATCH,), generator=g)}
    if name == "hf_vit":
        return {"pixel_values": torch.randn(BATCH, 3, 32, 32, generator=g),
                "labels": torch.randint(0, CLASSES, (BATCH,), generator=g)}
    ids = torch.randint(0, VOCAB, (BATCH, TOKENS), generator=g)
    if name in ("hf_gpt2", "hf_llama"):
        return {"input_ids": ids, "labels": ids}
    if name == "hf_t5":
        return {"input_ids": ids, "labels": torch.randint(0, VOCAB, (BATCH, 8), generator=g)}
    return {"input_ids": ids, "labels": torch.randint(0, CLASSES, (BATCH,), generator=g)}


def loss_of(name: str, m: nn.Module, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    if name.startswith("hf_"):
        return m(**batch).loss
    return F.cross_entropy(m(batch["x"]), batch["labels"])


def on_device(name: str, make: Callable[[], nn.Module]) -> dict:
    start = build(make)
    init = {k: p.detach().clone() for k, p in start.named_parameters()}
    batch = inputs(name)
    losses, params = {}, {}
    for run, dev, dtype in (("eager", "cpu", torch.float32), ("eager64", "cpu", torch.float64),
                            ("salus", "salus", torch.float32)):
        m = copy.deepcopy(start).to(dev, dtype)
        opt = torch.optim.SGD(m.parameters(), lr=1e-2, momentum=0.9)
        out = []
        for _ in range(STEPS):
            opt.zero_grad()
            loss = loss_of(name, m, {k: v.to(dev, dtype) if v.is_floating_point() else v.to(dev)
                                     for k, v in batch.items()})
            loss.backward()
            opt.step()
            out.append(loss.item())
        losses[run] = np.array(out)
        params[run] = {k: p.detach().cpu().double() for k, p in m.named_parameters()}

    def update_error(a: str) -> float:  # against float64's update, relative to its size
        num = sum(float(((params[a][k] - params["eager64"][k]) ** 2).sum()) for k in init)
        den = sum(float(((params["eager64"][k] - init[k].double()) ** 2).sum()) for k in init)
        return (num / den) ** 0.5 if den > 0 else 0.0

    loss_diff = np.abs(losses["salus"] - losses["eager"]) / np.abs(losses["eager"])
    return {"params": sum(v.numel() for v in init.values()),
            "device_loss": float(np.max(loss_diff)), "device_update": update_error("salus"),
            "eager_update": update_error("eager")}


def through_onnx(name: str, make: Callable[[], nn.Module], client, workdir: str) -> dict:
    import onnx
    import onnxruntime as ort
    from make_torch_models import WithLoss, legacy_exporter, unshare_initializers

    module = WithLoss(build(make)).eval()
    batch = inputs(name)
    path = os.path.join(workdir, f"{name.split()[0]}.onnx")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(module, (batch["x"], batch["labels"]), path, opset_version=17,
                          input_names=["x", "labels"], output_names=["loss", "logits"],
                          training=torch.onnx.TrainingMode.PRESERVE, do_constant_folding=True,
                          **legacy_exporter())
    model = onnx.load(path)
    unshare_initializers(model)
    onnx.save(model, path)
    feeds = {k: v.numpy() for k, v in batch.items()}
    shapes = {k: v.shape for k, v in feeds.items()}
    so = ort.SessionOptions()
    so.intra_op_num_threads = 2
    want = ort.InferenceSession(path, so, providers=["CPUExecutionProvider"]).run(
        ["logits"], feeds)[0]
    s = client.create_session(model=path, mode="infer", inputs=shapes, name=name)
    try:
        got = s.run(feeds, fetches=["logits"])["logits"]
    finally:
        s.close()
    infer = float(np.max(np.abs(got - want)) / max(float(np.max(np.abs(want))), 1e-30))
    s = client.create_session(model=path, mode="train", inputs=shapes, loss="loss",
                              optimizer={"type": "sgd", "lr": 1e-3}, name=name)
    try:
        engine = [float(s.run(feeds, fetches=["loss"])["loss"]) for _ in range(STEPS)]
    finally:
        s.close()
    ref_module = WithLoss(build(make)).train()
    opt = torch.optim.SGD(ref_module.parameters(), lr=1e-3)
    reference = []
    for _ in range(STEPS):
        opt.zero_grad()
        loss, _ = ref_module(batch["x"], batch["labels"])
        loss.backward()
        opt.step()
        reference.append(loss.item())
    train = float(np.max(np.abs(np.array(engine) - reference) / np.abs(reference)))
    return {"ops": len({n.op_type for n in model.graph.node}), "onnx_infer": infer,
            "onnx_train_loss": train}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--models", help="comma-separated names (default: all)")
    p.add_argument("--no-onnx", action="store_true", help="the lazy device only")
    p.add_argument("--json", default=str(REPO / "results" / "pytorch_zoo.json"))
    args = p.parse_args()
    from salus_daemon import Daemon

    models = {**torchvision_models(), **huggingface_models()}
    chosen = args.models.split(",") if args.models else list(models)
    unknown = [m for m in chosen if m not in models]
    if unknown:
        sys.exit(f"unknown models: {', '.join(unknown)}; known: {', '.join(models)}")
    torch.set_num_threads(2)
    daemon = Daemon(memory="8GiB")
    os.environ["SALUS_ENDPOINT"] = daemon.endpoint
    import salus_torch

    import salus
    rows = []
    try:
        with salus.connect(daemon.endpoint, timeout=600) as client, \
                tempfile.TemporaryDirectory() as tmp:
            for name in chosen:
                row: dict = {"model": name}
                t0 = time.perf_counter()
                try:
                    row.update(on_device(name, models[name]))
                except Exception as e:  # noqa: BLE001 - the table reports any refusal
                    row["device_error"] = f"{type(e).__name__}: {e}"[:300]
                if not args.no_onnx and not name.startswith("hf_"):
                    try:
                        row.update(through_onnx(name, models[name], client, tmp))
                    except Exception as e:  # noqa: BLE001
                        row["onnx_error"] = f"{type(e).__name__}: {e}"[:300]
                row["seconds"] = round(time.perf_counter() - t0, 1)
                rows.append(row)
                print(json.dumps(row), flush=True)
    finally:
        salus_torch.device.close()
        daemon.stop()
    versions = {"torch": torch.__version__}
    for lib in ("torchvision", "transformers", "onnxruntime"):
        try:
            versions[lib] = __import__(lib).__version__
        except ImportError:
            pass
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(json.dumps({"versions": versions, "rows": rows}, indent=2))

    def f(row: dict, key: str) -> str:
        if key in row:
            return f"{row[key]:.1e}"
        err = row.get({"eager": "device"}.get(key.split("_")[0], key.split("_")[0]) + "_error")
        return "refused" if err else "-"

    print(f"\n{json.dumps(versions)}\n")
    print("| model | parameters | device: loss vs eager | device: update error | eager: update "
          "error | ONNX: inference | ONNX: training loss |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for row in rows:
        print(f"| {row['model']} | {row.get('params', 0):,} | {f(row, 'device_loss')} | "
              f"{f(row, 'device_update')} | {f(row, 'eager_update')} | "
              f"{f(row, 'onnx_infer')} | {f(row, 'onnx_train_loss')} |")
    for row in rows:
        for key in ("device_error", "onnx_error"):
            if key in row:
                print(f"{row['model']}: {key}: {row[key]}")


if __name__ == "__main__":
    main()
