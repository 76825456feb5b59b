"""Value-state statistics: the VASE paper's analyses as functions of a layer's cached keys and values.

Range(v) is max − min of a token's value vector over the head dimension. The paper's evidence is that
its distribution is very skewed (a few tokens carry most of the range), and that it predicts how badly a
token quantizes. Here, per KV head:

- the Range(v) quantiles and the share of tokens above k × its median;
- Range(k), for contrast;
- the mean Range(v) in position bins;
- each token's quantization error at b bits: per-token asymmetric quantization in groups of channels,
  torch's fake-quantize op, with the error taken as the RMS of (v − dequantized v) over the head
  dimension.

Per layer, the Pearson and Spearman correlation of Range(v) with that error (scipy), over all the
layer's tokens and heads.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

from kvbench.policies.scoring import value_range

QUANTILES = (0.5, 0.9, 0.99, 1.0)
HISTOGRAM_BINS = 30
"""Bins of each layer's Range(v) histogram, kept in the table so that the leaderboard can draw it."""


def quantize_per_token(x: Tensor, bits: int, group: int) -> Tensor:
    """``x`` quantized and dequantized at ``bits`` per token, asymmetrically, in groups of ``group``
    channels: each group's minimum maps to 0 and its maximum to 2^bits − 1 (a float zero point, as
    KIVI-style caches do), through ``torch.fake_quantize_per_channel_affine``."""
    if x.shape[-1] % group:
        raise ValueError(f"group size {group} does not divide the head dimension {x.shape[-1]}")
    groups = x.reshape(-1, group).float()
    low, high = groups.amin(dim=-1), groups.amax(dim=-1)
    levels = 2**bits - 1
    scale = ((high - low) / levels).clamp_min(torch.finfo(torch.float32).tiny)
    zero = -low / scale
    out = torch.fake_quantize_per_channel_affine(groups, scale, zero, 0, 0, levels)
    return out.reshape(x.shape).to(x.dtype)


def quantization_error(x: Tensor, bits: int, group: int) -> Tensor:
    """Each token's RMS reconstruction error over the head dimension: [..., T]."""
    return (x.float() - quantize_per_token(x, bits, group).float()).pow(2).mean(dim=-1).sqrt()


@dataclass(frozen=True)
class Stat:
    layer: int
    head: int | None
    """None for a statistic of the whole layer (the correlations)."""
    statistic: str
    value: float


def layer_statistics(
    layer: int,
    keys: Tensor,
    values: Tensor,
    *,
    bits: tuple[int, ...] = (2, 4, 8),
    group: int = 32,
    above: float = 4.0,
    position_bins: int = 8,
) -> list[Stat]:
    """The statistics of one layer's cache, ``keys`` and ``values`` of shape [Hkv, T, D]."""
    from scipy.stats import pearsonr, spearmanr

    stats: list[Stat] = []
    v_range = value_range(values)  # [H, T], in float32
    k_range = value_range(keys)
    errors = {b: quantization_error(values, b, min(group, values.shape[-1])) for b in bits}
    tokens = v_range.shape[1]
    edges = torch.linspace(0, tokens, position_bins + 1).round().long().tolist()
    for head in range(v_range.shape[0]):
        r = v_range[head]
        median = float(r.median())
        for q in QUANTILES:
            stats.append(Stat(layer, head, f"range_v_q{q:g}", float(torch.quantile(r, q))))
            stats.append(Stat(layer, head, f"range_k_q{q:g}", float(torch.quantile(k_range[head], q))))
        share = float((r > above * median).float().mean())
        stats.append(Stat(layer, head, f"range_v_share_above_{above:g}x_median", share))
        for i in range(position_bins):
            part = r[edges[i] : edges[i + 1]]
            if len(part):
                stats.append(Stat(layer, head, f"range_v_mean_position_bin_{i}", float(part.mean())))
        for b, error in errors.items():
            stats.append(Stat(layer, head, f"quant_error_{b}bit_mean", float(error[head].mean())))
    flat_range = v_range.flatten().numpy()
    counts, edges_hist = np.histogram(flat_range, bins=HISTOGRAM_BINS)
    for i, (count, edge) in enumerate(zip(counts, edges_hist[:-1], strict=True)):
        stats.append(Stat(layer, None, f"range_v_hist_{i:02d}_count", float(count)))
        stats.append(Stat(layer, None, f"range_v_hist_{i:02d}_left", float(edge)))
    stats.append(Stat(layer, None, "range_v_hist_right", float(edges_hist[-1])))
    for b, error in errors.items():
        flat_error = error.flatten().numpy()
        pearson = float(pearsonr(flat_range, flat_error)[0])
        spearman = float(spearmanr(flat_range, flat_error)[0])
        stats.append(Stat(layer, None, f"pearson_range_v_error_{b}bit", pearson))
        stats.append(Stat(layer, None, f"spearman_range_v_error_{b}bit", spearman))
    return stats
