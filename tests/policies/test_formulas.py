"""Each built-in policy's score against a straightforward, independent computation of its formula."""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch

from kvbench.core.contract import LayerState
from kvbench.errors import SpecError
from kvbench.registry import make_policy
from support import random_view, row_generators

ATOL = 1e-5


def loop_window_attention(queries, keys, pool: str, group: str):
    """window_attention with loops over rows, KV heads and query heads."""
    batch, q_heads, _, dim = queries.shape
    kv_heads, n = keys.shape[1], keys.shape[2]
    g = q_heads // kv_heads
    out = torch.zeros(batch, kv_heads, n)
    for b in range(batch):
        for h in range(kv_heads):
            logits = torch.stack(
                [queries[b, h * g + j] @ keys[b, h].T / math.sqrt(dim) for j in range(g)]
            )  # [G, W, n]
            if group == "max":
                out[b, h] = loop_pool(logits.max(dim=0).values.softmax(-1).mean(0), pool)
            else:
                out[b, h] = torch.stack(
                    [loop_pool(logits[j].softmax(-1).mean(0), pool) for j in range(g)]
                ).mean(0)
    return out


def loop_pool(x, pool: str):
    n = x.shape[0]
    if pool == "avg5":
        return torch.stack([sum(x[j] for j in range(i - 2, i + 3) if 0 <= j < n) / 5 for i in range(n)])
    if pool == "max7":
        return torch.stack([max(x[j] for j in range(i - 3, i + 4) if 0 <= j < n) for i in range(n)])
    return x


def cosine_matrix(k):
    return torch.stack(
        [torch.stack([torch.nn.functional.cosine_similarity(a, b, dim=0) for b in k]) for a in k]
    )


def per_head(keys, head_fn):
    """Apply head_fn to each (row, KV head)'s cosine matrix with its diagonal zeroed."""
    batch, heads, n, _ = keys.shape
    out = torch.zeros(batch, heads, n)
    for b in range(batch):
        for h in range(heads):
            cos = cosine_matrix(keys[b, h])
            cos.fill_diagonal_(0)
            out[b, h] = head_fn(cos, n)
    return out


def loop_redundancy(keys):
    return per_head(keys, lambda cos, n: (cos.sum(dim=1) / n).softmax(0))


def loop_rkv_official_redundancy(keys, threshold):
    def head(cos, n):
        for i in range(n):
            similar = [j for j in range(n) if cos[i, j] > threshold]
            cos[i, max(similar) if similar else 0] = 0
        return (cos.sum(dim=0) / n).softmax(0)

    return per_head(keys, head)


def loop_leverage(x, g):
    return torch.stack(
        [torch.stack([(x[b, h] @ g[b]).pow(2).sum(-1) for h in range(x.shape[1])]) for b in range(x.shape[0])]
    )


def test_random_is_the_rows_uniform_draws() -> None:
    view = random_view(make_policy("random"))
    expected = torch.stack(
        [torch.rand(view.keys.shape[1], view.num_candidates, generator=g) for g in row_generators(view)]
    )
    assert torch.equal(make_policy("random").score(view), expected)


def test_streaming_is_recency() -> None:
    view = random_view(make_policy("streaming"))
    assert torch.equal(make_policy("streaming").score(view), view.positions.float())


def test_evict_range_is_minus_value_range() -> None:
    view = random_view(make_policy("evict-range"))
    v = view.values
    expected = torch.tensor(
        [[[-(max(s.tolist()) - min(s.tolist())) for s in head] for head in row] for row in v]
    )
    assert torch.allclose(make_policy("evict-range").score(view), expected, atol=ATOL)


@pytest.mark.parametrize("params", [{}, {"pool": "max7", "group": "max", "window": 5}, {"pool": "none"}])
def test_snapkv(params: dict) -> None:
    policy = make_policy("snapkv", **params)
    view = random_view(policy)
    q = view.queries[:, :, -policy.window :]
    expected = loop_window_attention(q, view.keys, policy.pool, policy.group)
    assert torch.allclose(policy.score(view), expected, atol=ATOL)


@pytest.mark.parametrize("lam", [0.5, 0.1, 1.0])
def test_rkv(lam: float) -> None:
    policy = make_policy("rkv", lam=lam, window=8)
    view = random_view(policy)
    importance = loop_window_attention(view.queries[:, :, -8:], view.keys, "avg5", "mean")
    expected = lam * importance - (1 - lam) * loop_redundancy(view.keys)
    assert torch.allclose(policy.score(view), expected, atol=ATOL)


def test_key_redundancy_handles_zero_keys_and_large_n() -> None:
    from kvbench.policies.scoring import key_redundancy

    keys = torch.randn(1, 2, 50, 8)
    keys[0, 1, 7] = 0.0  # a zero key has no direction: similarity 0 to everything
    assert torch.allclose(key_redundancy(keys), loop_redundancy(keys), atol=1e-6)
    big = key_redundancy(torch.randn(1, 1, 20_000, 8))  # would be a 1.6 GB matrix in fp32
    assert big.shape == (1, 1, 20_000) and torch.isclose(big.sum(), torch.tensor(1.0))


def test_rkv_official() -> None:
    policy = make_policy("rkv-official")
    view = random_view(policy, dim=4, n=30)  # low dimension: many near-duplicates above 0.5
    importance = loop_window_attention(view.queries[:, :, -8:], view.keys, "max7", "max")
    redundancy = loop_rkv_official_redundancy(view.keys, 0.5)
    expected = 0.1 * importance - 0.9 * redundancy
    assert torch.allclose(policy.score(view), expected, atol=ATOL)


def test_rkv_official_redundancy_across_row_chunks() -> None:
    """n spans several 256-row chunks; the reference builds the whole matrix at once."""
    from kvbench.policies.rkv_official import thresholded_redundancy

    keys = torch.randn(2, 2, 700, 3)
    unit = torch.nn.functional.normalize(keys, dim=-1)
    cos = unit @ unit.transpose(-1, -2)
    cos.diagonal(dim1=-2, dim2=-1).zero_()
    similar = cos > 0.5
    newest = torch.where(similar.any(-1), 699 - similar.flip(-1).int().argmax(-1), 0)
    cos.scatter_(-1, newest.unsqueeze(-1), 0.0)
    expected = (cos.sum(dim=2) / 700).softmax(-1)
    assert torch.allclose(thresholded_redundancy(keys, 0.5), expected, atol=1e-6)


def test_curdkv_uses_the_stored_projection() -> None:
    policy = make_policy("curdkv")
    state = LayerState()
    view = random_view(policy, state=state)
    scores = policy.score(view)
    g = state.row("projection")
    assert g.shape == (view.keys.shape[0], view.keys.shape[-1], 20)
    joint = loop_leverage(view.keys, g) * loop_leverage(view.values, g)
    expected = (joint / joint.sum(-1, keepdim=True)).masked_fill(view.positions < 4, float("inf"))
    assert torch.allclose(scores, expected, atol=1e-6)


def test_vase_dkv_draws_g_from_the_rows_generators() -> None:
    policy = make_policy("vase-dkv")
    view = random_view(policy)
    dim = view.keys.shape[-1]
    g = torch.stack([torch.randn(dim, 20, generator=gen) / math.sqrt(20) for gen in row_generators(view)])
    joint = loop_leverage(view.keys, g) * loop_leverage(view.values, g)
    expected = (joint / joint.sum(-1, keepdim=True)).masked_fill(view.positions < 4, float("inf"))
    assert torch.allclose(policy.score(view), expected, atol=1e-6)


def expected_reserve(view, mode: str, n_reserved: int = 16) -> list[list[set[int]]]:
    """Per (row, KV head), the candidate indices VASE-AttnV must reserve, by an independent loop."""
    value_range = view.values.amax(-1) - view.values.amin(-1)
    out = []
    for b in range(view.keys.shape[0]):
        heads = []
        for h in range(view.keys.shape[1]):
            everyone = set(range(view.num_candidates))
            if mode == "all":  # VaSE's original: the first 4 slots are sinks inside N_v
                sinks = {i for i in everyone if view.positions[b, h, i] < 4}
                by_range = sorted(everyone - sinks, key=lambda i: -value_range[b, h, i])
                heads.append(sinks | set(by_range[: n_reserved - len(sinks)]))
            else:  # among the unprotected candidates, at most K − B − P of them
                protected = {i for i in everyone if view.protected[b, h, i]}
                room = min(n_reserved, view.keep - len(protected))
                by_range = sorted(everyone - protected, key=lambda i: -value_range[b, h, i])
                heads.append(set(by_range[:room]))
        out.append(heads)
    return out


@pytest.mark.parametrize("mode", ["unprotected", "all"])
def test_vase_attnv(mode: str) -> None:
    policy = make_policy("vase-attnv", window=8, reserve=mode)
    view = random_view(policy, budget=64, buffer=8, n=60)
    scores = policy.score(view)
    # reserve: 64/4 = 16 slots per head
    for b, heads in enumerate(expected_reserve(view, mode)):
        for h, reserved in enumerate(heads):
            assert {i for i in range(view.num_candidates) if scores[b, h, i] == float("inf")} == reserved
    # the rest: log(attention) + Gumbel noise from the row's generator
    attention = loop_window_attention(view.queries[:, :, -8:], view.keys, "avg5", "mean")
    u = torch.stack(
        [torch.rand(view.keys.shape[1], view.num_candidates, generator=g) for g in row_generators(view)]
    )
    expected = attention.log() - torch.log(-torch.log(u))
    finite = scores.isfinite()
    assert torch.allclose(scores[finite], expected[finite], atol=1e-4)


def test_vase_attnv_spends_no_reserve_on_a_protected_prompt() -> None:
    # the prompt's values have by far the largest ranges: VaSE's original reserve is all prompt tokens
    # (which the protocol keeps anyway); the prompt-protected variant reserves generated tokens only
    default, original = (
        make_policy("vase-attnv", window=8),
        make_policy("vase-attnv", window=8, reserve="all"),
    )
    view = random_view(default, budget=64, buffer=8, n=60, prompt_len=20)
    loud = view.values.clone()
    loud[..., :20, :] = torch.linspace(-100, 100, loud.shape[-1])  # range 200; the others' is below 30
    view = dataclasses.replace(view, values=loud)
    for b in range(view.keys.shape[0]):
        for h in range(view.keys.shape[1]):
            new = default.reserved(view)[b, h]
            old = original.reserved(view)[b, h]
            assert int(new.sum()) == 16 and not (new & view.protected[b, h]).any()
            assert int(old.sum()) == int(old[:20].sum()) == 16  # prompt slots only: the reserve is wasted
    # a prompt leaving less room than N_v: the reserve shrinks to K − B − P
    crowded = random_view(default, budget=64, buffer=8, n=60, prompt_len=50)
    assert default.reserved(crowded).sum(dim=-1).tolist() == [[6, 6], [6, 6]]


def test_h2o_scores_its_accumulator_and_keeps_the_newest_by_recency() -> None:
    state = LayerState()
    view = random_view(make_policy("h2o"), state=state)  # K = 32, B = 8
    acc = torch.rand(view.keys.shape[0], view.keys.shape[1], view.num_candidates + 8)
    state.register_slot("acc", acc)
    assert torch.equal(make_policy("h2o", recent=0).score(view), acc[..., : view.num_candidates])
    scores = make_policy("h2o").score(view)  # recent = 0.5: the newest 16 − 8 candidates by recency
    for b in range(view.keys.shape[0]):
        for h in range(view.keys.shape[1]):
            newest = set(sorted(range(view.num_candidates), key=lambda i: -view.positions[b, h, i])[:8])
            for i in range(view.num_candidates):
                assert scores[b, h, i] == (float("inf") if i in newest else acc[b, h, i])
    with pytest.raises(SpecError, match="recent"):
        make_policy("h2o", recent=1.5)


def test_triattention_matches_the_trigonometric_series() -> None:
    policy = make_policy("triattention")
    view = random_view(policy, n=30, prompt_len=5)
    stats, model = view.calibration, view.model
    omega = model.rope_inv_freq.double()
    half = model.head_dim // 2
    batch, kv_heads, n, _ = view.keys.shape
    expected = torch.zeros(batch, kv_heads, n)
    for b in range(batch):
        for h in range(kv_heads):
            per_q = []
            for j in range(model.group):
                qh = h * model.group + j
                q_mean = stats.mean[view.layer, qh].to(torch.complex128)
                m = stats.mean_abs[view.layer, qh].double()
                row = []
                for i in range(n):
                    key, p = view.keys[b, h, i].double(), int(view.positions[b, h, i])
                    # un-rotate by −p·ω, band by band
                    c, s = torch.cos(p * omega), torch.sin(p * omega)
                    real = key[:half] * c + key[half:] * s
                    imag = key[half:] * c - key[:half] * s
                    k = torch.complex(real, imag)
                    amp = q_mean.abs() * k.abs()
                    phi = torch.angle(q_mean * k.conj())
                    trig = (
                        sum(
                            (amp * torch.cos(omega * (view.step - p + 2.0**e) + phi)).sum() for e in range(17)
                        )
                        / 17
                    )
                    row.append(trig + ((m - q_mean.abs()) * k.abs()).sum())
                row = torch.stack(row)
                decode = view.positions[b, h] >= view.prompt_len
                mu, sd = row[decode].mean(), row[decode].std(unbiased=False)
                per_q.append((row - mu) / sd)
            expected[b, h] = torch.stack(per_q).max(dim=0).values
    assert torch.allclose(policy.score(view), expected.float(), atol=1e-3)
