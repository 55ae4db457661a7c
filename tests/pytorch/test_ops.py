"""Operators that ordinary training scripts emit, through the lazy `salus` device against a real
salus-server: each case's loss and its parameters' gradients match eager PyTorch on the CPU.

The cases are what users write beside the reference models: other losses (L1, smooth L1, BCE,
KL divergence, label smoothing), other activations (LeakyReLU, ELU, softplus, Mish), average
and adaptive pooling, nearest and bilinear resizing, advanced indexing, group and instance
norm, transposed convolutions, LSTM and GRU layers, embedding bags, rotary position embeddings
(sin, cos), top-k routing, sorting, products, diagonals, slicing and masks,
cumulative sums, statistics (var, std, max along a dim), cosine similarity, accuracy
(argmax, comparisons, counts), and what the adaptor decomposes itself: a spatial transformer
(affine_grid, grid_sample), bicubic resizing, LocalResponseNorm, nn.Bilinear,
multi_margin_loss, atan2 and Embedding(max_norm=...); lgamma, digamma, polygamma and erfinv;
indexing by bool masks, which the device reads on the host, overwriting index_put, and scans
(cummax, logcumsumexp)."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import salus_torch  # noqa: F401  (names the "salus" device)
import torch
import torch.nn.functional as F
from salus_daemon import Daemon
from torch import nn

torch.set_num_threads(1)


# The daemon and fresh_device fixtures: conftest.py.
pytestmark = pytest.mark.usefixtures("fresh_device")


def _data() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    return {"x": torch.randn(8, 16, generator=g), "img": torch.randn(4, 3, 16, 16, generator=g),
            "y": torch.randint(0, 5, (8,), generator=g),
            "bits": (torch.rand(8, 5, generator=g) > 0.5).float(),
            "probs": F.softmax(torch.randn(8, 5, generator=g), -1),
            "seq": torch.randn(3, 6, 16, generator=g),
            "bag_idx": torch.tensor([0, 2, 4, 5, 4, 3, 2, 9]),
            "bag_off": torch.tensor([0, 2, 2, 5]),  # bag 1 is empty
            "bag_off_last": torch.tensor([0, 3, 8]),
            "bag_psw": torch.rand(8, generator=g),
            "bag_2d": torch.tensor([[1, 2, 3, 2], [2, 2, 0, 7], [9, 8, 2, 1]]),
            "scores_mask": torch.randn(6, 6, generator=g)}


class Net(nn.Module):
    """Layers with parameters for every case to train."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(1)
        self.fc = nn.Linear(16, 5)
        self.conv = nn.Conv2d(3, 4, 3)
        self.gn = nn.GroupNorm(2, 4)
        self.inorm = nn.InstanceNorm2d(4, affine=True)
        self.lstm = nn.LSTM(16, 8, batch_first=True)
        self.gru = nn.GRU(16, 8, batch_first=True)
        self.bag = nn.EmbeddingBag(10, 4)
        self.bn = nn.BatchNorm2d(4)
        with torch.no_grad():  # running statistics of a model being fine-tuned
            self.bn.running_mean.uniform_(-1, 1)
            self.bn.running_var.uniform_(0.5, 2)
        self.conv1d = nn.Conv1d(6, 4, 3, stride=2, padding=2, dilation=2, groups=2)
        self.deconv1d = nn.ConvTranspose1d(4, 2, 4, stride=2, padding=1)
        self.deconv = nn.ConvTranspose2d(4, 2, 3, stride=2, padding=1)
        self.grouped_deconv = nn.ConvTranspose2d(4, 4, 2, stride=2, groups=2, bias=False)
        self.normed = nn.utils.parametrizations.weight_norm(nn.Linear(16, 3))
        self.normed_last = nn.utils.parametrizations.weight_norm(nn.Conv2d(3, 2, 3), dim=3)
        self.bilinear = nn.Bilinear(16, 5, 3)
        self.lrn = nn.LocalResponseNorm(3)
        self.capped = nn.Embedding(10, 4, max_norm=1.5)
        # (a decoder's upsampling to exact sizes: output_padding below the padding, and above)
        self.padded_deconv = nn.ConvTranspose2d(4, 2, 3, stride=2, padding=1, output_padding=1)
        self.wide_deconv = nn.ConvTranspose2d(4, 3, 2, stride=3, output_padding=2, dilation=2)
        self.padded_deconv1d = nn.ConvTranspose1d(4, 2, 3, stride=2, padding=1,
                                                  output_padding=1)
        # (video and volume models: 3-D convolutions, grouped and dilated, and their transposes)
        self.conv3d = nn.Conv3d(4, 4, (2, 3, 3), stride=(1, 2, 1), padding=(1, 0, 2),
                                dilation=(1, 2, 1), groups=2)
        self.deconv3d = nn.ConvTranspose3d(4, 2, 3, stride=2, padding=1, output_padding=1)
        self.grouped_deconv3d = nn.ConvTranspose3d(4, 4, (1, 2, 2), stride=(1, 2, 2), groups=2,
                                                   bias=False)


Case = Callable[[Net, dict[str, torch.Tensor]], torch.Tensor]


def _rotary(q: torch.Tensor) -> torch.Tensor:
    """A rotary position embedding of q [..., positions, features], its angles made in the step
    (as language models compute them in their forward pass)."""
    t, dim = q.shape[-2], q.shape[-1]
    inv = 1.0 / (10000 ** (torch.arange(0, dim, 2, device=q.device).float() / dim))
    angle = torch.arange(t, device=q.device).float()[:, None] * inv
    cos, sin = angle.cos().repeat(1, 2), angle.sin().repeat(1, 2)
    rotated = torch.cat([-q[..., dim // 2:], q[..., :dim // 2]], -1)
    return q * cos + rotated * sin


def _fused_layout_is_tokens_major() -> bool:
    """Whether the CPU's fused attention kernel lays its output out as [batch, tokens, heads,
    features] (torch 2.4) rather than as the output is shaped (2.15)."""
    q = torch.zeros(1, 2, 3, 4)
    out = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(q, q, q, 0.0, False)[0]
    return out.transpose(1, 2).is_contiguous()


_TOKENS_MAJOR = _fused_layout_is_tokens_major()


def _attention(m: Net, d: dict[str, torch.Tensor]) -> torch.Tensor:
    """scaled_dot_product_attention as blocks call it: two heads, causal, under a float mask
    with a scale, the output viewed as the fused kernel lays it out (Note [Fused attention] in
    device.cc: the device records these as one op each way); and, run as the math composite,
    3-D and under a bool mask."""
    h = m.fc(d["seq"])  # [3, 6, 5]
    q = torch.stack([h, h * 0.5], 1)  # [batch, heads, tokens, features]
    k, v = q.roll(1, 2) + 0.1, torch.tanh(q)
    causal = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    masked = F.scaled_dot_product_attention(q, k, v, attn_mask=d["scores_mask"], scale=0.3)
    # Viewed (no copy) where the fused kernel's layout allows it: the device's tensor must have
    # that layout too.
    merged = causal.transpose(1, 2)
    merged = merged.view(3, 6, 10) if _TOKENS_MAJOR else merged.reshape(3, 6, 10)
    return (merged.pow(2).sum() + masked.pow(2).sum()
            + F.scaled_dot_product_attention(h, h.roll(1, 1), h).pow(2).sum()
            + F.scaled_dot_product_attention(q, k, v, attn_mask=d["scores_mask"] > 0).sum())


def _barlow_twins(z: torch.Tensor) -> torch.Tensor:
    """Barlow Twins' loss on one view's features: the cross-correlation's diagonal pulled to 1,
    the rest to 0."""
    c = (z - z.mean(0)).t() @ (z - z.mean(0)) / z.shape[0]
    on = (torch.diagonal(c) - 1).pow(2).sum()
    return on + 0.005 * (c.pow(2).sum() - torch.diagonal(c).pow(2).sum())


CASES: dict[str, Case] = {
    "l1 loss (sign)": lambda m, d: F.l1_loss(m.fc(d["x"]), d["bits"]),
    "smooth l1 loss": lambda m, d: F.smooth_l1_loss(m.fc(d["x"]) * 3, d["bits"]),
    "bce with logits (log1p)": lambda m, d: F.binary_cross_entropy_with_logits(m.fc(d["x"]),
                                                                               d["bits"]),
    "bce": lambda m, d: F.binary_cross_entropy(torch.sigmoid(m.fc(d["x"])), d["bits"]),
    "label smoothing (bitwise_not)": lambda m, d: F.cross_entropy(m.fc(d["x"]), d["y"],
                                                                  label_smoothing=0.1),
    "kl divergence (isnan)": lambda m, d: F.kl_div(F.log_softmax(m.fc(d["x"]), -1), d["probs"],
                                                   reduction="batchmean"),
    "leaky relu": lambda m, d: F.leaky_relu(m.fc(d["x"]), 0.1).pow(2).sum(),
    "rrelu in eval": lambda m, d: F.rrelu(m.fc(d["x"]), training=False).pow(2).sum(),
    "elu (expm1)": lambda m, d: F.elu(m.fc(d["x"]) * 4).pow(2).sum(),
    "softplus and mish": lambda m, d: (F.softplus(m.fc(d["x"]) * 8) + F.mish(m.fc(d["x"]))).sum(),
    "var and std": lambda m, d: m.fc(d["x"]).var(-1).sum() + m.fc(d["x"]).std(0).sum(),
    "cosine similarity (clamp_min)": lambda m, d: F.cosine_similarity(
        m.fc(d["x"]), m.fc(d["x"]).flip(0)).sum(),
    "max along a dim": lambda m, d: (m.fc(d["x"]).max(dim=-1).values.sum()
                                     + m.fc(d["x"]).min(dim=0, keepdim=True).values.sum()),
    "slices (slice_scatter)": lambda m, d: m.fc(d["x"])[:, 1:3].pow(2).sum()
    + m.fc(d["x"])[2:].sum(),
    "causal mask added to scores": lambda m, d: (
        m.fc(d["x"])[:5] + torch.triu(torch.full((5, 5), -1e4), 1)).softmax(-1).pow(2).sum(),
    "abs and minimum": lambda m, d: torch.minimum(m.fc(d["x"]).abs(), torch.tensor(0.3)).sum(),
    "cumsum": lambda m, d: (m.fc(d["x"]).cumsum(-1).pow(2).sum()
                            + m.fc(d["x"]).cumsum(0).pow(3).sum()),
    "cumsum along 5000 (in blocks)": lambda m, d: (
        m.fc(d["x"]).repeat(1, 1000).cumsum(1)[:, ::7].mul(0.01).pow(2).mean()),
    "index_select": lambda m, d: m.fc(d["x"]).index_select(0, torch.tensor([0, 2, 2])).pow(2)
    .sum(),
    "average pooling": lambda m, d: F.avg_pool2d(m.conv(d["img"]), 2).pow(2).sum(),
    "average pooling, padded, pad excluded": lambda m, d: F.avg_pool2d(
        m.conv(d["img"]), 3, 2, padding=1, count_include_pad=False).pow(2).sum(),
    "average pooling, ceil mode": lambda m, d: F.avg_pool2d(m.conv(d["img"]), 3, 2,
                                                            ceil_mode=True).pow(2).sum(),
    "average pooling, ceil mode with the padding counted (a window PyTorch drops)":
        lambda m, d: (F.avg_pool2d(m.conv(d["img"]), 3, 2, padding=1, ceil_mode=True)
                      .pow(2).sum()
                      + F.avg_pool2d(m.conv(d["img"]), 2, 3, padding=1, ceil_mode=True).sum()),
    "adaptive average pooling, windows of differing sizes": lambda m, d: F.adaptive_avg_pool2d(
        m.conv(d["img"]) * 3, (3, 5)).pow(2).sum(),
    "adaptive max pooling": lambda m, d: (F.adaptive_max_pool2d(m.conv(d["img"]), 7).pow(2).sum()
                                          + F.adaptive_max_pool2d(m.conv(d["img"]), 1).sum()),
    "adaptive max pooling by windows of different sizes": lambda m, d: (
        F.adaptive_max_pool2d(m.conv(d["img"]), (5, 3)).pow(2).sum()
        + (F.adaptive_max_pool2d(torch.relu(m.conv(d["img"])), (4, 6)) * 2).sum()),
    "adaptive average pooling": lambda m, d: F.adaptive_avg_pool2d(m.conv(d["img"]), 7).pow(2)
    .sum(),
    "nearest upsampling": lambda m, d: (
        F.interpolate(m.conv(d["img"]), scale_factor=2).pow(2).sum()
        + F.interpolate(m.conv(d["img"]), size=(28, 42)).pow(3).sum()),
    "bilinear resizing": lambda m, d: (
        F.interpolate(m.conv(d["img"]), scale_factor=2, mode="bilinear").pow(2).sum()
        + F.interpolate(m.conv(d["img"]), size=(20, 31), mode="bilinear", align_corners=True)
        .pow(3).sum()
        + F.interpolate(m.conv(d["img"]), size=(5, 9), mode="bilinear").pow(2).sum()),
    "advanced indexing": lambda m, d: (
        m.fc(d["x"])[torch.arange(8).to(d["x"].device), d["y"]].pow(2).sum()
        + m.fc(d["x"])[:, torch.tensor([4, -1, 0, 4]).to(d["x"].device)].pow(3).sum()),
    "group norm": lambda m, d: m.gn(m.conv(d["img"]) * 2).pow(3).sum(),
    "instance norm (repeat)": lambda m, d: m.inorm(m.conv(d["img"]) * 2).pow(3).sum(),
    "repeat": lambda m, d: (m.fc(d["x"]).repeat(2, 3).pow(2).sum()
                            + (m.fc(d["x"]).repeat(2, 1, 1) * torch.arange(2.0).view(2, 1, 1)
                               .to(d["x"].device)).sum()),
    "transposed convolutions": lambda m, d: (m.deconv(m.conv(d["img"])).pow(2).sum()
                                             + m.grouped_deconv(m.conv(d["img"])).pow(2).sum()),
    "embedding bags": lambda m, d: (
        F.embedding_bag(d["bag_idx"], m.bag.weight, d["bag_off"], mode="mean").pow(2).sum()
        + F.embedding_bag(d["bag_2d"], m.bag.weight, mode="sum", padding_idx=2).pow(3).sum()
        + F.embedding_bag(d["bag_idx"], m.bag.weight, d["bag_off_last"], mode="sum",
                          per_sample_weights=d["bag_psw"], include_last_offset=True).pow(2).sum()
        + m.bag(d["bag_2d"]).sum()),
    "gru (transpose_)": lambda m, d: (lambda out, h: out.pow(2).sum() + h.sum())(
        *m.gru(d["seq"])),
    "gather and scatter_add": lambda m, d: (
        m.fc(d["x"]).gather(1, torch.tensor([[0, 4], [1, 1], [3, 4]] * 2 + [[2, 0]] * 2)
                            .to(d["x"].device)).pow(2).sum()
        + torch.zeros(8, 5).to(d["x"].device).scatter_add(
            1, torch.tensor([[0, 1, 1]] * 8).to(d["x"].device), m.fc(d["x"])[:, 1:4]).pow(2)
        .sum()),
    "chunk, split, roll": lambda m, d: (
        sum(c.pow(2).sum() * (k + 1) for k, c in enumerate(m.fc(d["x"]).chunk(3, dim=0)))
        + sum(c.sum() * (k + 1) for k, c in enumerate(m.fc(d["x"]).split([2, 3], dim=1)))
        + (m.fc(d["x"]).roll(2, 0) * torch.arange(5.0).to(d["x"].device)).sum()),
    "constant padding, cropping too": lambda m, d: (
        F.pad(m.conv(d["img"]), (1, 2, -1, 3), value=0.5).pow(2).sum()
        + F.pad(m.fc(d["x"]), (2, 0)).pow(3).sum()),
    "reflect and replicate padding": lambda m, d: (
        F.pad(m.conv(d["img"]), (1, 2, 3, 1), mode="reflect").pow(2).sum()
        + F.pad(m.conv(d["img"]), (2, 0, 1, 4), mode="replicate").pow(3).sum()),
    "hardtanh, relu6, std_mean": lambda m, d: (
        F.hardtanh(m.fc(d["x"]) * 3).pow(2).sum() + F.relu6(m.fc(d["x"]) * 9).sum()
        + sum(t.sum() for t in torch.std_mean(m.fc(d["x"]), dim=0))),
    "2-d nll_loss (segmentation)": lambda m, d: F.cross_entropy(
        m.conv(d["img"]), torch.randint(0, 4, (4, 14, 14), generator=torch.Generator()
                                        .manual_seed(5)).to(d["x"].device)),
    "frozen batch norm (eval mode) trained through": lambda m, d: m.bn.eval()(
        m.conv(d["img"])).pow(2).sum(),
    "transposed convolutions with output_padding (2-D, dilated, 1-D)": lambda m, d: (
        m.padded_deconv(m.conv(d["img"])).pow(2).sum()
        + (m.wide_deconv(m.conv(d["img"])) * d["img"][:, :1, :1, :1]).sum()
        + m.padded_deconv1d(m.conv1d(d["seq"])).pow(2).sum()),
    "1-d convolutions": lambda m, d: (m.deconv1d(m.conv1d(d["seq"])).pow(2).sum()
                                      + F.max_pool1d(m.conv1d(d["seq"]), 2).pow(2).sum()),
    "lstm": lambda m, d: (lambda out, hc: out.pow(2).sum() + hc[1].sum())(*m.lstm(d["seq"])),
    "top-k routing (topk's gradient)": lambda m, d: (
        (lambda top: (top.values * d["x"][:, :2]).sum() + top.values.pow(2).sum())(
            m.fc(d["x"]).softmax(-1).topk(2, dim=-1))
        + m.fc(d["x"]).topk(3, dim=0, largest=False).values.pow(2).sum()),
    "diagonals (Barlow Twins, offsets, diag)": lambda m, d: (
        _barlow_twins(m.fc(d["x"]))
        + torch.diagonal(m.conv(d["img"]), offset=-2, dim1=3, dim2=1).pow(2).sum()
        + torch.diagonal(m.conv(d["img"]), offset=3, dim1=-1, dim2=-2).pow(2).sum()
        + torch.diag(m.fc(d["x"])[0]).mul(m.fc(d["x"])[:5]).sum()),
    "weight decay by hand (a gradient that arrives expanded)": lambda m, d: (
        m.fc(d["x"]).pow(2).sum() + 0.1 * m.fc.weight.sum() + 0.01 * m.conv.weight.abs().sum()),
    "weight norm (its gradient's decomposition)": lambda m, d: (
        m.normed(d["x"]).pow(2).sum() + m.normed_last(d["img"]).pow(2).sum()),
    "sort (its gradient)": lambda m, d: (
        (m.fc(d["x"]).sort(-1).values * d["x"][:, :5]).sum()
        + m.fc(d["x"]).sort(0, descending=True).values[:3].pow(2).sum()),
    "prod and cumprod (their gradients, zeros among the factors)": lambda m, d: (
        m.fc(d["x"])[:, :3].prod(-1).sum() + (m.fc(d["x"]) * 0.1 + 1).cumprod(0).sum()
        + torch.relu(m.fc(d["x"])).prod(0).sum() + (m.fc(d["x"]) * 0.5).prod()),
    "cdist (prototypes; p = 2 by differences and by a product, 1, inf, a zero distance)":
        lambda m, d: (torch.cdist(m.fc(d["x"]), m.fc(d["x"])[:3] * 0.5).sum()
                      + torch.cdist(m.fc(d["x"].repeat(4, 1)), d["x"][:4, :5]).pow(2).sum()
                      + torch.cdist(m.fc(d["x"]), d["x"][:4, :5], p=1).sum()
                      + torch.cdist(m.fc(d["x"]), d["x"][:4, :5], p=float("inf")).sum()
                      + torch.cdist(m.fc(d["x"])[:4], m.fc(d["x"])[:4]).sum()),
    "rotary embedding, sin and cos": lambda m, d: (
        (_rotary(d["seq"] * m.fc.weight[0]) * d["seq"]).sum()
        + torch.sin(m.fc(d["x"]) * 3).pow(2).sum() + torch.cos(m.fc(d["x"]) * 2).sum()),
    "atan2 (angles; x of 0 on either side of y)": lambda m, d: (
        torch.atan2(m.fc(d["x"]), m.fc(d["x"]).roll(1, 0)).pow(2).sum()
        + torch.atan2(m.fc(d["x"]), torch.relu(m.fc(d["x"]).roll(2, 1))).sum()),
    "lgamma, digamma, erfinv (a Gamma likelihood; a probit)": lambda m, d: (
        -torch.distributions.Gamma(F.softplus(m.fc(d["x"])) + 0.1,
                                   F.softplus(m.fc(d["x"]).roll(1, 0)) + 0.5
                                   ).log_prob(d["probs"] * 3 + 0.1).sum()
        + torch.erfinv(torch.tanh(m.fc(d["x"])) * 0.95).pow(2).sum()
        + (torch.digamma(d["x"].abs()[:, :5] + 0.05) * m.fc(d["x"])).sum()),
    "dilated max pooling (padding, ceil_mode, a stride per dim)": lambda m, d: (
        F.max_pool2d(m.conv(d["img"]), 3, 1, 1, dilation=2).pow(2).sum()
        + F.max_pool2d(m.conv(d["img"]), 2, (2, 3), 1, dilation=(3, 2), ceil_mode=True).sum()),
    "polygamma (a Beta policy's entropy: digamma's gradient; higher orders)": lambda m, d: (
        torch.distributions.Beta(F.softplus(m.fc(d["x"])) + 0.5,
                                 F.softplus(m.fc(d["x"]).roll(1, 0)) + 0.5).entropy().sum()
        + torch.polygamma(2, F.softplus(m.fc(d["x"])) + 0.3).sum() * 0.01),
    "grid_sample (a spatial transformer; padding modes, corners, nearest)": lambda m, d: (
        _warp(m, d, "bilinear", "zeros", False) + _warp(m, d, "bilinear", "border", True)
        + _warp(m, d, "bilinear", "reflection", False) + _warp(m, d, "nearest", "zeros", True)),
    "bicubic resizing (by a factor; to a size, corners aligned)": lambda m, d: (
        F.interpolate(m.conv(d["img"]), scale_factor=2, mode="bicubic").pow(2).sum()
        + F.interpolate(m.conv(d["img"]), size=(9, 20), mode="bicubic",
                        align_corners=True).mul(d["img"][:, :4, :9, :4].sum()).sum()),
    "LocalResponseNorm (3-D average pooling over channels)": lambda m, d: (
        m.lrn(m.conv(d["img"])).pow(2).sum()
        + F.avg_pool3d(m.conv(d["img"]).unsqueeze(1), (2, 3, 3), (1, 2, 2), (1, 1, 0))
        .pow(2).sum()),
    "sliding windows (Tensor.unfold, overlapping and not, on two dims)": lambda m, d: (
        m.fc(d["x"]).unfold(1, 3, 1).pow(2).sum()
        + m.conv(d["img"]).unfold(2, 4, 3).unfold(3, 2, 2).pow(2).mean()),
    "repeat_interleave by a tensor of repeats (read on the host)": lambda m, d: (
        m.fc(d["x"]).repeat_interleave(d["y"], dim=0).pow(2).sum()),
    "Embedding(scale_grad_by_freq=True) (its indices counted in int64)": lambda m, d: (
        F.embedding(d["bag_2d"], m.capped.weight, scale_grad_by_freq=True).pow(2).sum()),
    "Embedding(max_norm=...) (rows renormalized in place, one named twice)": lambda m, d: (
        m.capped(d["bag_idx"]).pow(2).sum() + m.capped(d["bag_2d"]).sum()
        + m.capped.weight.sum()),
    "CTC loss (padded and concatenated targets, a repeat, an empty and an impossible one)":
        lambda m, d: _ctc(m, d),
    "strided slices and writes into them (interleaved pairs)": lambda m, d: _strided(m, d),
    "math from what the engine has (sinh, cosh, tan, asin, acos, exp2, log2, log10, trunc, "
    "hypot, fmax, nan_to_num)": lambda m, d: (
        (torch.sinh(m.fc(d["x"])) + torch.cosh(m.fc(d["x"])) + torch.tan(m.fc(d["x"]) * 0.3)
         + torch.asin(m.fc(d["x"]).tanh() * 0.9) * torch.acos(m.fc(d["x"]).tanh() * 0.9)
         + torch.exp2(m.fc(d["x"])) + torch.log2(m.fc(d["x"]).exp())
         + torch.log10(m.fc(d["x"]).exp()) * torch.trunc(m.fc(d["x"]) * 3)
         + torch.hypot(m.fc(d["x"]), m.fc(d["x"]).roll(1, 0))
         + torch.fmax(m.fc(d["x"]), m.fc(d["x"]).roll(1, 0))
         + torch.nan_to_num(m.fc(d["x"]).log(), nan=0.5, neginf=-3.0)).sum()),
    "median and kthvalue (their gradients), bucketize, searchsorted": lambda m, d: (
        m.fc(d["x"]).median(1).values.pow(2).sum() + m.fc(d["x"]).median().pow(2)
        + m.fc(d["x"]).kthvalue(2, 0, keepdim=True).values.pow(2).sum()
        + (torch.bucketize(m.fc(d["x"]).detach(), torch.tensor([-0.5, 0.0, 0.5]).to(
            d["x"].device), right=True) * m.fc(d["x"])).sum()
        # a row of boundaries per sample (sorted on the device); a 1-D sequence given unsorted
        # with its sorter, values equal to boundaries on either side
        + (torch.searchsorted(m.fc(d["x"]).detach().sort(1).values, m.fc(d["x"]).detach()
                              * 0.5) * m.fc(d["x"])).sum()
        + (torch.searchsorted(torch.tensor([0.5, -0.5, 0.0]).to(d["x"].device),
                              torch.tensor([[0.0, 0.7], [-0.5, -2.0]]).to(d["x"].device),
                              side="right", sorter=torch.tensor([1, 2, 0]).to(d["x"].device))
           .float().sum() * m.fc(d["x"]).mean())
        + (torch.searchsorted(torch.tensor([-0.5, 0.0, 0.5]).to(d["x"].device),
                              torch.tensor([0.0, 0.5, 1.0]).to(d["x"].device), out_int32=True)
           .float() * m.fc(d["x"])[0, :3]).sum()),
    "indexing by index tensors on dims apart": lambda m, d: (
        m.conv(d["img"])[torch.tensor([0, 2, 3, 2]), :, :, torch.tensor([1, 5, 9, 13])]
        .pow(2).sum()
        + m.conv(d["img"])[torch.tensor([[1], [3]]), 1:3, torch.tensor([4, 0, 7])].sum()),
    "nearest resizing by ratios that are not whole (sizes, a scale of 1.5, shrinking)":
        lambda m, d: (
            F.interpolate(m.conv(d["img"]), size=(20, 9), mode="nearest").pow(2).sum()
            + F.interpolate(m.conv(d["img"]), scale_factor=1.5, mode="nearest").sum()
            + (F.interpolate(m.conv(d["img"]), size=(5, 31)) * d["img"][:, :1, :5, :1]).sum()),
    "packed sequences (LSTM and GRU, unsorted lengths, padded again)": lambda m, d: _packed(
        m, d),
    "scaled_dot_product_attention (fused: causal, a float mask and scale; 3-D, bool mask)":
        lambda m, d: _attention(m, d),
    "nn.Bilinear": lambda m, d: m.bilinear(d["x"], m.fc(d["x"])).pow(2).sum(),
    "multi_margin_loss (p 1 and 2, margins, class weights, reductions)": lambda m, d: (
        F.multi_margin_loss(m.fc(d["x"]), d["y"])
        + F.multi_margin_loss(m.fc(d["x"]), d["y"], p=2, margin=0.5,
                              weight=torch.arange(1.0, 6.0).to(d["x"].device),
                              reduction="sum")),
    "3-D convolutions and max pooling (grouped, dilated, transposed; ceil_mode)": lambda m, d: (
        m.conv3d(_volume(m, d)).pow(2).sum() + m.deconv3d(_volume(m, d)).pow(2).sum()
        + m.grouped_deconv3d(_volume(m, d)).pow(2).sum()
        + F.max_pool3d(_volume(m, d), (2, 3, 3), 2, (1, 1, 0)).pow(2).sum()
        + F.max_pool3d(F.relu(_volume(m, d)), 3, 2, 1, ceil_mode=True).sum()),
    "indexing by bool masks (x[mask], writes through one, masked_select and _scatter, nonzero)":
        lambda m, d: _masks(m, d),
    "unique and bincount (on the host; inverse, counts, dim, consecutive, weights)":
        lambda m, d: _counted(m, d),
    "overwriting index_put (trace's gradient, x[i] = v, repeated positions of one value)":
        lambda m, d: (
            torch.trace(m.fc(d["x"])[:5]).pow(2)
            + _put(m.fc(d["x"]), torch.tensor([3, 0, 5]), m.fc(d["x"])[:3] * 2).pow(2).sum()
            + _put(m.fc(d["x"]), d["y"], 1.5).pow(2).sum()),
    "scans (cummax, cummin and their indices, logcumsumexp with -inf, cumprod along 150)":
    lambda m, d: (
        m.fc(d["x"]).cummax(1).values.pow(2).sum() + m.fc(d["x"]).cummin(0).values.sum()
        + torch.where(d["bits"].repeat(1, 30) > 0, 0.0, m.fc(d["x"]).repeat(1, 30) * 0.3 + 1)
        .cumprod(1)[:, ::9].pow(2).sum()
        + (m.fc(d["x"]).relu().cummax(1).indices * m.fc(d["x"])).sum()
        + m.fc(d["x"]).masked_fill(d["bits"] > 0, float("-inf")).logcumsumexp(1)
        .clamp_min(-50).sum()),
    "linear and trilinear resizing (their gradients)": lambda m, d: (
        F.interpolate(m.conv(d["img"]).unsqueeze(1), scale_factor=(1, 2, 2), mode="trilinear")
        .pow(2).sum()
        + F.interpolate(m.conv(d["img"]).unsqueeze(1), size=(3, 5, 7), mode="trilinear",
                        align_corners=True).sum()
        + F.interpolate(d["seq"] * m.fc.weight[0, 0], scale_factor=2, mode="linear")
        .pow(2).sum()),
}


def _volume(m: Net, d: dict[str, torch.Tensor]) -> torch.Tensor:
    """A [batch, channels, depth, height, width] volume from the 2-D layers' output."""
    return m.conv(d["img"]).reshape(4, 4, 2, 7, 14)


def _counted(m: Net, d: dict[str, torch.Tensor]) -> torch.Tensor:
    """Class counts as a loss's weights, as imbalanced-data scripts compute them in the step."""
    out = m.fc(d["x"])
    classes, inverse, counts = torch.unique(d["y"], return_inverse=True, return_counts=True)
    weights = 1.0 / torch.bincount(d["y"], minlength=5).float().clamp_min(1)
    weighted = F.cross_entropy(out, d["y"], weight=weights)
    return (weighted + (out[:, :1] * counts[inverse].float().unsqueeze(1)).sum()
            + out.sum() * (classes.float().sum() + torch.unique(d["bag_2d"], dim=1).sum()
                           + torch.unique_consecutive(d["bag_idx"]).sum()
                           + torch.bincount(d["y"], weights=d["bag_psw"]).sum()))


def _put(x: torch.Tensor, at: torch.Tensor, value: torch.Tensor | float) -> torch.Tensor:
    """`x[at] = value` on a copy."""
    x = x.clone()
    x[at.to(x.device)] = value
    return x


def _masks(m: Net, d: dict[str, torch.Tensor]) -> torch.Tensor:
    """Masks made in the step (so reading them splits it): the valid rows' loss, elements
    selected and overwritten (through a mask with no true element too), a masked_scatter, and
    nonzero's positions."""
    out = m.fc(d["x"])
    valid = d["y"] != 2
    loss = F.cross_entropy(out[valid], d["y"][valid])
    picked = out[d["bits"] > 0].pow(2).sum() + out.masked_select(out > 0).sum()
    written = _put(out, d["bits"] > 0, 0.0)
    written[out < -0.3] = written[out < -0.3] * 3 + 1
    written[d["y"] > 100] = out[:0]  # a mask with no true element: empty feeds
    scattered = torch.zeros(8, 5).to(out.device).masked_scatter(d["bits"] > 0, out * 3)
    rows = out[torch.nonzero(d["y"] > 1).squeeze(1)]
    return loss + picked + written.pow(2).sum() + scattered.pow(2).sum() + rows.pow(2).sum()


def _ctc(m: Net, d: dict[str, torch.Tensor]) -> torch.Tensor:
    """CTC over a per-step classifier of a sequence (6 steps, 3 samples, 5 classes, 0 the
    blank): padded targets with a repeated label, concatenated targets with an empty one, and
    a target too long for its input, whose infinite loss zero_infinity drops."""
    log_probs = m.fc(d["seq"]).permute(1, 0, 2).log_softmax(-1)  # (T, N, C)
    padded = torch.tensor([[1, 2, 2], [3, 4, 0], [4, 0, 0]]).to(log_probs.device)
    joined = torch.tensor([2, 3, 1, 4, 2]).to(log_probs.device)
    impossible = torch.tensor([[1, 1, 1, 1], [2, 3, 2, 3], [4, 4, 4, 4]]).to(log_probs.device)
    return (F.ctc_loss(log_probs, padded, torch.tensor([6, 5, 4]), torch.tensor([3, 2, 1]))
            + F.ctc_loss(log_probs, joined, (6, 6, 3), (2, 0, 3), reduction="sum")
            + F.ctc_loss(log_probs, impossible, (6, 6, 6), (4, 4, 2), zero_infinity=True))


def _strided(m: Net, d: dict[str, torch.Tensor]) -> torch.Tensor:
    """Slices with steps (interleaved pairs rotated, as some rotary embeddings do) and an
    assignment into a strided view: their gradients scatter with a step."""
    y = m.fc(d["x"])
    even, odd = y[:, ::2], y[:, 1::2]
    pairs = torch.stack([-odd, even[:, :2]], -1).flatten(1)
    z = m.conv(d["img"])
    w = z.clone()
    w[:, :, ::3, 1::2] = 0.5 * z[:, :, 1::3, ::2]
    return (pairs * y[:, :4]).sum() + even.pow(2).sum() + w.pow(2).sum() + z[..., 2:9:4].sum()


def _packed(m: Net, d: dict[str, torch.Tensor]) -> torch.Tensor:
    """LSTM and GRU layers over padded sequences of different lengths, packed (unsorted, and
    sorted) and padded again."""
    from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence
    packed = pack_padded_sequence(d["seq"], torch.tensor([4, 6, 2]), batch_first=True,
                                  enforce_sorted=False)
    out, (h, c) = m.lstm(packed)
    padded, lengths = pad_packed_sequence(out, batch_first=True)
    assert lengths.tolist() == [4, 6, 2]
    g_out, g_h = m.gru(pack_padded_sequence(d["seq"], torch.tensor([6, 5, 3]), batch_first=True))
    return (padded.pow(2).sum() + h.sum() + c.pow(2).sum() + g_h.pow(2).sum()
            + (g_out.data * d["x"][:1, :8]).sum())


def _warp(m: Net, d: dict[str, torch.Tensor], mode: str, padding: str,
          align_corners: bool) -> torch.Tensor:
    """A spatial transformer: an affine grid from a layer's output, the image sampled there."""
    theta = 0.3 * m.fc(d["x"][:6]).reshape(-1)[:24].reshape(4, 2, 3) + torch.tensor(
        [[1.0, 0, 0], [0, 1, 0]]).to(d["x"].device)
    grid = F.affine_grid(theta, [4, 4, 10, 12], align_corners=align_corners)
    out = F.grid_sample(m.conv(d["img"]), grid, mode=mode, padding_mode=padding,
                        align_corners=align_corners)
    return (out * d["img"][:, :1, :10, :12]).sum()


def _run(case: Case, device: str) -> tuple[float, dict[str, torch.Tensor]]:
    m = Net().to(device)
    data = {k: v.to(device) for k, v in _data().items()}
    loss = case(m, data)
    loss.backward()
    grads = {n: p.grad.cpu() for n, p in m.named_parameters() if p.grad is not None}
    return loss.item(), grads


@pytest.mark.parametrize("name", list(CASES))
def test_loss_and_gradients_match_eager(daemon: Daemon, name: str) -> None:
    want, want_grads = _run(CASES[name], "cpu")
    got, got_grads = _run(CASES[name], "salus")
    assert got == pytest.approx(want, rel=1e-4, abs=1e-6)
    assert got_grads.keys() == want_grads.keys() and want_grads
    # A gradient that cancels to nearly 0 (a bias before a normalisation) is rounding noise on
    # both sides: the absolute tolerance follows the case's largest gradient.
    scale = max(g.abs().max().item() for g in want_grads.values())
    for n, g in want_grads.items():
        torch.testing.assert_close(got_grads[n], g, rtol=1e-4, atol=1e-5 + 1e-6 * scale, msg=n)


def test_log1p_and_expm1_keep_small_values_and_their_limits(daemon: Daemon) -> None:
    """Note [log1p and expm1] in aten_importer.cc: no digits lost near 0, the limits at the
    ends, NaN passed on."""
    x = torch.tensor([0.0, 1e-10, -1e-8, 3e-7, 1e-3, -0.5, 2.0, 80.0, -80.0, -1.0, float("inf"),
                      -float("inf"), float("nan"), -2.0])
    for f in (torch.log1p, torch.expm1):
        got, want = f(x.to("salus")).cpu(), f(x)
        torch.testing.assert_close(got, want, rtol=2e-6, atol=0, equal_nan=True,
                                   msg=f.__name__)


def test_lgamma_digamma_polygamma_and_erfinv_over_their_domains(daemon: Daemon) -> None:
    """The engine's special functions (element_math.h) against PyTorch's, poles, tails and
    the values outside their domains included."""
    x = torch.tensor([-2.5, -0.5, -1e-3, 1e-4, 0.1, 0.5, 1.0, 1.5, 2.0, 3.7, 9.9, 10.0, 30.0,
                      1e4, 0.0, -0.0, -1.0, -3.0, float("inf"), float("nan")])
    for f in (torch.lgamma, torch.digamma):
        got, want = f(x.to("salus")).cpu(), f(x)
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6, equal_nan=True,
                                   msg=f.__name__)
    # PyTorch's trigamma is finite at the negative integers (about 1e15: sin(pi x) in float
    # is not 0 there) and its higher orders are NaN at +inf; the engine gives the poles and
    # the limit 0 instead.
    finite = ~((x < 0) & (x == x.floor())) & (x != float("inf"))
    for n in (1, 2, 3):
        got, want = torch.polygamma(n, x.to("salus")).cpu(), torch.polygamma(n, x)
        torch.testing.assert_close(got[finite], want[finite], rtol=1e-5, atol=1e-6,
                                   equal_nan=True, msg=f"polygamma {n}")
        sign = 1.0 if n % 2 else -1.0
        assert got[~finite].tolist() == [sign * float("inf")] * 2 + [0.0], n
    y = torch.tensor([-1.0, -0.9999999, -0.9, -0.3, 0.0, -0.0, 1e-6, 0.2, 0.5, 0.7, 0.99,
                      0.99999, 0.9999999, 1.0, 1.5, -2.0, float("nan")])
    got, want = torch.erfinv(y.to("salus")).cpu(), torch.erfinv(y)
    torch.testing.assert_close(got, want, rtol=2e-6, atol=0, equal_nan=True)


def test_accuracy_and_label_smoothing_in_a_training_loop(daemon: Daemon) -> None:
    """A classification loop as users write it: label smoothing, the running accuracy read
    every step (argmax, ==, sum, .item()), top-1 probability and accuracy in an eval pass."""
    results = {}
    for device in ("cpu", "salus"):
        m = Net().to(device)
        opt = torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9)
        d = {k: v.to(device) for k, v in _data().items()}
        log = []
        for _ in range(3):
            opt.zero_grad()
            logits = m.fc(d["x"])
            loss = F.cross_entropy(logits, d["y"], label_smoothing=0.1)
            loss.backward()
            opt.step()
            log.append((loss.item(), (logits.argmax(dim=1) == d["y"]).sum().item()))
        with torch.no_grad():
            out = m.fc(d["x"])
            top, index = F.softmax(out, -1).max(dim=-1)
            log.append((top.mean().item(), (index == d["y"]).float().mean().item(),
                        out.argmin(-1).tolist(), out.argmax().item()))
        results[device] = log
    for k, (got, want) in enumerate(zip(results["salus"], results["cpu"], strict=True)):
        assert got[0] == pytest.approx(want[0], rel=1e-4), f"entry {k}"
        assert got[1:] == want[1:], f"entry {k}"


def test_a_loss_over_masked_tokens_trains_as_eager(daemon: Daemon) -> None:
    """Note [Values that give shapes] in device.py: a loop whose loss covers only the tokens a
    mask made in the step keeps (another count each step) trains as eager PyTorch does, and
    the graphs of earlier counts do not pile up as open sessions."""
    g = torch.Generator().manual_seed(5)
    batches = [(torch.randn(8, 16, generator=g), torch.randint(0, 5, (8,), generator=g))
               for _ in range(4)]
    results = {}
    for device in ("cpu", "salus"):
        m = Net().to(device)
        opt = torch.optim.Adam(m.parameters(), lr=0.01)
        log = []
        for x, y in batches + batches[:1]:
            x, y = x.to(device), y.to(device)
            opt.zero_grad()
            out = m.fc(x)
            keep = y != 0
            loss = F.cross_entropy(out[keep], y[keep])
            loss.backward()
            opt.step()
            log.append((loss.item(), int(keep.sum().item())))
            if device == "salus":
                assert len(salus_torch.device.runtime().sessions) <= 3
        results[device] = log
    assert len({n for _, n in results["cpu"]}) > 1  # the counts differ between steps
    for k, (got, want) in enumerate(zip(results["salus"], results["cpu"], strict=True)):
        assert got[0] == pytest.approx(want[0], rel=1e-4), f"step {k}"
        assert got[1] == want[1], f"step {k}"


@pytest.mark.parametrize("name,make", [
    ("adam, foreach", lambda p: torch.optim.Adam(p, lr=0.01, foreach=True)),
    ("adamw, amsgrad, foreach", lambda p: torch.optim.AdamW(p, lr=0.01, amsgrad=True,
                                                             foreach=True)),
    ("sgd, nesterov, foreach", lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9, nesterov=True,
                                                         weight_decay=0.01, foreach=True)),
    ("rmsprop, centered", lambda p: torch.optim.RMSprop(p, lr=0.01, momentum=0.9,
                                                        centered=True)),
    ("adagrad, foreach", lambda p: torch.optim.Adagrad(p, lr=0.1, foreach=True)),
    ("nadam", lambda p: torch.optim.NAdam(p, lr=0.01)),
    ("radam, foreach", lambda p: torch.optim.RAdam(p, lr=0.01, foreach=True)),
    ("adamax, foreach", lambda p: torch.optim.Adamax(p, lr=0.01, foreach=True)),
    ("adadelta", lambda p: torch.optim.Adadelta(p)),
    ("rprop (masked writes), foreach", lambda p: torch.optim.Rprop(p, lr=0.01, foreach=True)),
])
def test_optimizers_match_eager_in_one_graph_per_step(daemon: Daemon, name: str,
                                                      make: Callable) -> None:
    """torch.optim's other optimizers, and their foreach=True forms (Note [Foreach ops] in
    device.py), with clip_grad_norm_(foreach=True): five steps match eager, and after the
    second (the first makes the optimizer's state) each step is one iteration of the graph
    already traced (the step sizes that change every step are lifted, Rprop's masked writes
    are masked_fill)."""
    results = {}
    for device in ("cpu", "salus"):
        m = Net().to(device)
        opt = make(m.fc.parameters())
        d = {k: v.to(device) for k, v in _data().items()}
        losses = []
        for step in range(5):
            if device == "salus" and step == 2:
                before = (salus_torch.device.runtime().traces,
                          salus_torch.device.runtime().flushes)
            opt.zero_grad()
            loss = F.cross_entropy(m.fc(d["x"]), d["y"])
            loss.backward()
            torch.nn.utils.clip_grad_norm_(m.fc.parameters(), 0.5, foreach=True)
            opt.step()
            losses.append(loss.item())
        results[device] = (losses, m.fc.weight.detach().cpu())
        if device == "salus":
            rt = salus_torch.device.runtime()
            assert (rt.traces, rt.flushes) == (before[0], before[1] + 3)
    assert results["salus"][0] == pytest.approx(results["cpu"][0], rel=1e-4)
    torch.testing.assert_close(results["salus"][1], results["cpu"][1], rtol=1e-4, atol=1e-5)


def test_top_k_for_metrics(daemon: Daemon) -> None:
    """topk under no_grad, as a top-5 accuracy reads it: values sorted, indices, both ends."""
    g = torch.Generator().manual_seed(3)
    logits, labels = torch.randn(16, 10, generator=g), torch.randint(0, 10, (16,), generator=g)
    for device in ("cpu", "salus"):
        with torch.no_grad():
            x = logits.to(device)
            values, index = x.topk(5, dim=1)
            low = x.topk(3, dim=0, largest=False)
            hits = (index == labels.to(device).unsqueeze(1)).any(dim=1).float().sum().item()
        if device == "cpu":
            want = (values, index, low.values, low.indices, hits)
        else:
            got = (values.cpu(), index.cpu(), low.values.cpu(), low.indices.cpu(), hits)
    for a, b in zip(got[:4], want[:4], strict=True):
        assert torch.equal(a, b)
    assert got[4] == want[4]


def test_position_ids_from_a_mask(daemon: Daemon) -> None:
    """A language model's position ids: an int64 cumsum of the attention mask, also over a
    context of 6000 tokens (cumsum in blocks)."""
    mask = torch.tensor([[1, 1, 1, 0, 0], [0, 1, 1, 1, 1]])
    long = (torch.arange(2 * 6000).reshape(2, 6000) % 7 != 3).long()
    for m in (mask, long):
        for f in (lambda m: m.cumsum(1) * m - 1, lambda m: (m > 0).cumsum(-1),
                  lambda m: m.cumsum(0)):
            assert torch.equal(f(m.to("salus")).cpu(), f(m))


def test_ops_that_reshape_a_tensor_in_place(daemon: Daemon) -> None:
    """Note [Reshaped in place] in device.py: t_, transpose_, unsqueeze_ and squeeze_ give the
    tensor its new shape, on a value made on the host and on one the device computed; what
    read the old shape keeps it."""
    results = {}
    for device in ("cpu", "salus"):
        a = torch.arange(6.0).reshape(2, 3).to(device)
        b = a * 2
        before = b + 1
        a.t_()
        b.unsqueeze_(0).transpose_(1, 2)
        after = b.squeeze_(0) @ torch.ones(2, 1).to(device)
        results[device] = [t.cpu() for t in (a, b, before, after)] + [a.shape, b.shape]
    for got, want in zip(results["salus"], results["cpu"], strict=True):
        assert torch.equal(got, want) if isinstance(want, torch.Tensor) else got == want


def test_transformer_layers_evaluate_under_no_grad(daemon: Daemon) -> None:
    """In eval under no_grad the Transformer layers would take PyTorch's fused fast path, whose
    ops the device cannot record; the adaptor turns it off, and the plain ops match eager."""
    assert not torch.backends.mha.get_fastpath_enabled()
    out = {}
    for device in ("cpu", "salus"):
        torch.manual_seed(2)
        layer = nn.TransformerEncoderLayer(16, 2, 32, batch_first=True).to(device).eval()
        mha = nn.MultiheadAttention(16, 2, batch_first=True).to(device).eval()
        x = _data()["seq"].to(device)
        with torch.no_grad():
            y = layer(x)
            out[device] = (y.cpu(), mha(y, y, y, need_weights=False)[0].cpu())
    for got, want in zip(out["salus"], out["cpu"], strict=True):
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)


def test_clip_grad_value(daemon: Daemon) -> None:
    grads = {}
    for device in ("cpu", "salus"):
        m = Net().to(device)
        m.fc(_data()["x"].to(device)).pow(2).sum().backward()
        torch.nn.utils.clip_grad_value_(m.fc.parameters(), 0.5)
        grads[device] = [p.grad.cpu() for p in m.fc.parameters()]
    for got, want in zip(grads["salus"], grads["cpu"], strict=True):
        assert want.abs().max() == 0.5
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)


def test_bool_and_integer_logic(daemon: Daemon) -> None:
    a = torch.tensor([True, False, True, False])
    b = torch.tensor([True, True, False, False])
    n = torch.tensor([0, 5, -7, 2**40])
    for f in (lambda a, b, n: ~a, lambda a, b, n: a & b, lambda a, b, n: a | b,
              lambda a, b, n: a ^ b, lambda a, b, n: ~n, lambda a, b, n: torch.sign(n),
              lambda a, b, n: torch.isnan(n.float() / 0)):
        want = f(a, b, n)
        got = f(a.to("salus"), b.to("salus"), n.to("salus")).cpu()
        assert torch.equal(got, want)


def test_largest_and_smallest_integers_are_exact(daemon: Daemon) -> None:
    """max, min, amax, amin, max/min along a dim and argmin of int64 tensors whose values
    float32 cannot tell apart (2**40 and 2**40 + 1), and one_hot without a class count (which
    reads the labels' max): equal to eager PyTorch."""
    n = torch.tensor([[3, 2**40 + 1, -7, 2**40], [5, 5, -2**35, 0], [1, 9, 9, -2**35]])
    for f in (lambda n: n.max(), lambda n: n.min(), lambda n: n.amax(0),
              lambda n: n.amin(1, keepdim=True), lambda n: n.amax((0, 1)),
              lambda n: torch.stack(n.max(1)), lambda n: torch.stack(n.min(0, keepdim=True)),
              lambda n: n.argmin(1), lambda n: n.argmin(),
              lambda n: F.one_hot(n[0].clamp(0, 9) % 5)):
        want = f(n)
        got = f(n.to("salus") + 0).cpu()  # (+ 0: a value the device computes)
        assert torch.equal(got, want), (got, want)


def test_sort_and_argsort_keep_ties_in_order_and_put_nan_last(daemon: Daemon) -> None:
    """The engine's sort is stable and sorts NaN as the largest value, as PyTorch's stable
    sort does: values and indices equal along any dim, both directions, float and int64."""
    x = torch.tensor([[3.0, float("nan"), 1.0, 3.0, -0.0, 0.0, 1.0, -2.0],
                      [5.0, 5.0, 5.0, float("nan"), float("nan"), -1.0, 7.0, 5.0]])
    n = torch.tensor([[4, -1, 4, 2**40, 0, -1], [1, 1, 1, 0, 9, 1]])
    for t in (x, n, x.t().contiguous(), torch.randn(3, 4, 70)):
        for dim in range(-t.dim(), t.dim()):
            for descending in (False, True):
                want = torch.sort(t, dim=dim, descending=descending, stable=True)
                got = torch.sort(t.to("salus"), dim=dim, descending=descending, stable=True)
                assert torch.equal(got.values.cpu().nan_to_num(9e9), want.values.nan_to_num(9e9))
                assert torch.equal(got.indices.cpu(), want.indices)
    assert torch.equal(n.to("salus").argsort(dim=1, stable=True).cpu(),
                       n.argsort(dim=1, stable=True))


def test_remainder_and_fmod_take_their_signs_from_divisor_and_dividend(daemon: Daemon) -> None:
    """Python's % on tensors (remainder: the divisor's sign) against fmod (the dividend's), for
    floats and int64, every sign combination, exact multiples and a scalar on either side."""
    x = torch.tensor([7.5, -7.5, 7.5, -7.5, 6.0, -6.0, 0.25, 5.0])
    y = torch.tensor([2.0, 2.0, -2.0, -2.0, 3.0, -3.0, -4.0, 0.75])
    i, j = torch.tensor([7, -7, 7, -7, 6, 0, 2**40 + 3]), torch.tensor([3, 3, -3, -3, -3, 5, 4])
    for f in (lambda a, b: a % b, lambda a, b: torch.fmod(a, b), lambda a, b: a % 2.5,
              lambda a, b: 10.0 % (b * b + 1), lambda a, b: torch.remainder(a, -3)):
        torch.testing.assert_close(f(x.to("salus"), y.to("salus")).cpu(), f(x, y),
                                   rtol=1e-6, atol=1e-6)
        assert torch.equal(f(i.to("salus"), j.to("salus")).cpu(), f(i, j))


@pytest.mark.parametrize("what,case", [
    ("topk with k over 16", lambda x: x.flatten(1).topk(20).values),
    ("3-D max pooling's indices", lambda x: F.max_pool3d(x.unsqueeze(1), 2,
                                                         return_indices=True)[1]),
    ("max_unpool2d", lambda x: F.max_unpool2d(*F.max_pool2d(x, 2, return_indices=True), 2)),
])
def test_what_the_lowerings_leave_out_is_refused_by_name(daemon: Daemon, what: str,
                                                         case: Callable) -> None:
    x = torch.randn(2, 3, 8, 8).to("salus").requires_grad_()
    with pytest.raises(Exception, match=what):
        case(x).cpu()
