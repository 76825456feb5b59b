"""Each key's newest near-duplicate, as R-KV's redundancy needs it (``rkv-official``), found without an
n × n fp32 similarity matrix.

For unit keys u and a row i, the answer is the newest j ≠ i with u_i·u_j > threshold. Comparing every pair
is an n × n × D product per KV head; it is screened in bfloat16 instead, where a CPU with AMX (or a GPU)
multiplies several times faster, and only the pairs the screen cannot settle are computed in fp32:

- a bf16 similarity is within SCREEN_MARGIN of the fp32 one, so a pair screened at most
  threshold − margin is not similar, and one above threshold + margin is;
- the columns are searched from the newest block back, and a row stops at its first block with a match:
  on a language model's keys nearly every row finds one among the newest 256 (measured on SmolLM2-135M's
  keys: 93-99.9% of rows, by layer), on isotropic random keys no row does and the screen covers all.

The pairs left in between are computed in fp32 one dot product each, so the result is that of the fp32
matrix up to the order of summation inside a dot product.
"""

from __future__ import annotations

import torch
from torch import Tensor

SCREEN_MARGIN = 1 / 32
"""Above the largest gap between a bf16 product of unit vectors and the fp32 one: rounding each input to
bf16 moves a product by at most 2·2⁻⁸ of Σ|u_i||u_j| ≤ 1, rounding the fp32 sum to bf16 by 2⁻⁸; 0.012
in all (the fp32 accumulation adds ~1e-5). Tested on a million pairs."""

COLUMNS = 256
"""Columns per screened block."""

EXACT_COLUMNS = 64
"""The newest columns, compared in fp32 without a screen: on SmolLM2-135M's keys 64-99% of rows (by layer)
find their match there, and the rest search the screened blocks."""

_MASKED = -(2**15)  # the smallest int16: a bf16 -0.0, below every level compared with


def newest_near_duplicates(unit: Tensor, threshold: float) -> Tensor:
    """[G, n] index of each row's newest other row with cosine > threshold, −1 where none; unit [G, n, D]
    holds a few groups (KV heads of batch rows) at a time, so that a [G, n, COLUMNS] block stays small."""
    groups, n, _ = unit.shape
    newest = torch.full((groups, n), -1, dtype=torch.long, device=unit.device)
    screened = max(0, n - EXACT_COLUMNS)  # columns [0, screened) are screened first
    middle = max(0, n - EXACT_COLUMNS // 4)
    for start, end in ((middle, n), (screened, middle)):
        if end > start and bool((newest < 0).any()):
            _match_exactly(unit, _compacted(newest < 0), start, end, threshold, newest)
    if screened == 0:
        return newest
    coarse = unit.bfloat16()
    levels = _level(threshold - SCREEN_MARGIN, below=True), _level(threshold + SCREEN_MARGIN, below=False)
    # where every row still searches (keys with few near-duplicates), the screen's symmetry halves it
    maxima = _block_maxima(coarse, screened) if bool((newest < 0).all()) else None
    pad = (-screened) % COLUMNS
    for block in reversed(range((screened + pad) // COLUMNS)):
        start, end = max(0, block * COLUMNS - pad), (block + 1) * COLUMNS - pad
        searching = newest < 0
        if maxima is not None:
            searching &= maxima[:, :, block] > levels[0]
        if bool(searching.any()):
            _match_screened(unit, coarse, _compacted(searching), start, end, threshold, levels, newest)
    return newest


def _block_maxima(coarse: Tensor, region: int) -> Tensor:
    """[G, n, blocks] int16: each row's largest screened similarity (as bf16 bits) in each block of
    COLUMNS of the columns [0, region), blocks counted from a start padded with zero keys. The rows of
    the region are screened against one another once, row block a against blocks ≤ a: the same product
    gives row block a's maxima (along its rows) and the older rows' maxima in block a (along its
    columns)."""
    groups, n, dim = coarse.shape
    pad = (-region) % COLUMNS
    blocks = (region + pad) // COLUMNS
    padded = torch.cat([coarse.new_zeros(groups, pad, dim), coarse[:, :region]], dim=1)
    maxima = torch.empty(groups, pad + n, blocks, dtype=torch.int16, device=coarse.device)
    diagonal = torch.arange(COLUMNS, device=coarse.device)
    for a in range(blocks):
        rows = slice(a * COLUMNS, (a + 1) * COLUMNS)
        products = torch.bmm(padded[:, rows], padded[:, : rows.stop].mT).view(torch.int16)
        products[:, diagonal, rows.start + diagonal] = _MASKED
        maxima[:, rows, : a + 1] = products.view(groups, COLUMNS, a + 1, COLUMNS).amax(dim=-1)
        maxima[:, : rows.start, a] = products[:, :, : rows.start].amax(dim=1)
    later = torch.bmm(coarse[:, region:], padded.mT).view(torch.int16)  # the exact columns' own rows
    maxima[:, pad + region :] = later.view(groups, n - region, blocks, COLUMNS).amax(dim=-1)
    return maxima[:, pad:]


def rows_of(source: Tensor, rows: Tensor) -> Tensor:
    """source [G, n, D] at rows [G, w] → [G, w, D]; one row copy each (``gather`` on a broadcast index is
    several times slower on the CPU)."""
    groups, n, dim = source.shape
    flat = (rows + torch.arange(groups, device=rows.device)[:, None] * n).reshape(-1)
    return source.reshape(groups * n, dim).index_select(0, flat).view(groups, -1, dim)


class _Rows:
    """The rows [G, w] a block is searched for, first in each group, and which of them are real (the
    others pad the groups with fewer); ``every``: all rows, in order."""

    def __init__(self, rows: Tensor, real: Tensor, every: bool) -> None:
        self.rows, self.real, self.every = rows, real, every

    def of(self, source: Tensor) -> Tensor:
        return source if self.every else rows_of(source, self.rows)

    def own_column(self, start: int, end: int) -> tuple[Tensor, Tensor, Tensor]:
        """(group, row, column) of the entries where a row meets itself in the block: never a match."""
        own = self.rows - start
        g_own, r_own = ((own >= 0) & (own < end - start)).nonzero(as_tuple=True)
        return g_own, r_own, own[g_own, r_own]


def _compacted(searching: Tensor) -> _Rows:
    groups, n = searching.shape
    counts = searching.sum(dim=-1)
    width = int(counts.max())
    real = torch.arange(width, device=searching.device) < counts[:, None]
    if width == n:
        return _Rows(torch.arange(n, device=searching.device).expand(groups, n), real, every=True)
    return _Rows(searching.byte().argsort(dim=-1, descending=True, stable=True)[:, :width], real, every=False)


def _match_exactly(unit: Tensor, rows: _Rows, start: int, end: int, threshold: float, newest: Tensor) -> None:
    exact = torch.bmm(rows.of(unit), unit[:, start:end].mT)  # [g, w, c] fp32
    exact[rows.own_column(start, end)] = -torch.inf
    column = torch.arange(end - start, device=unit.device, dtype=torch.int16)
    matched = torch.where(exact > threshold, column, -1).amax(dim=-1)
    g_idx, r_idx = ((matched >= 0) & rows.real).nonzero(as_tuple=True)
    newest[g_idx, rows.rows[g_idx, r_idx]] = start + matched[g_idx, r_idx].long()


def _match_screened(
    unit: Tensor,
    coarse: Tensor,
    rows: _Rows,
    start: int,
    end: int,
    threshold: float,
    levels: tuple[int, int],
    newest: Tensor,
) -> None:
    low, high = levels
    screen = torch.bmm(rows.of(coarse), coarse[:, start:end].mT).view(torch.int16)  # bf16 bits
    screen[rows.own_column(start, end)] = _MASKED
    flagged = (screen.amax(dim=-1) > low) & rows.real
    if not bool(flagged.any()):
        return
    g_idx, r_idx = flagged.nonzero(as_tuple=True)
    values = screen[g_idx, r_idx]  # [P, c]
    column = torch.arange(end - start, device=unit.device, dtype=torch.int16)
    surely = torch.where(values > high, column, -1).amax(dim=-1)  # the newest sure match in the block
    p_idx, j_idx = ((values > low) & (column > surely[:, None])).nonzero(as_tuple=True)
    row_of = rows.rows[g_idx, r_idx]
    exact = (unit[g_idx[p_idx], row_of[p_idx]] * unit[g_idx[p_idx], start + j_idx]).sum(dim=-1)
    checked = torch.where(exact > threshold, j_idx, -1).to(torch.int16)
    matched = surely.scatter_reduce(0, p_idx, checked, "amax").long()
    found = matched >= 0
    newest[g_idx[found], row_of[found]] = start + matched[found]


def _level(value: float, below: bool) -> int:
    """``value`` as bf16 bits compared as int16, rounded outward so that the screen only errs by asking
    for an exact check. Levels at or below zero (where negative bf16 bits order backwards) flag every pair
    or settle none."""
    if value <= 0:
        return _MASKED if below else 2**15 - 1
    bits = int(torch.tensor(value).bfloat16().view(torch.int16))
    rounded = float(torch.tensor(bits, dtype=torch.int16).view(torch.bfloat16))
    if below and rounded > value:
        bits -= 1
    if not below and rounded < value:
        bits += 1
    return bits
