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

from kvbench.policies.scoring import Scratch

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


def newest_near_duplicates(
    unit: Tensor, threshold: float, scratch: Scratch | None = None
) -> tuple[Tensor, Tensor]:
    """[G, n] index of each row's newest other row with cosine > threshold (−1 where none), and [G, n]
    that cosine in fp32 (0 where none); unit [G, n, D] holds a few groups (KV heads of batch rows) at a
    time, so that a [G, n, COLUMNS] block stays small, and ``scratch`` is reused from one call to the next."""
    scratch = scratch or Scratch()
    groups, n, dim = unit.shape
    newest = torch.full((groups, n), -1, dtype=torch.long, device=unit.device)
    similarity = torch.zeros(groups, n, device=unit.device)
    screened = max(0, n - EXACT_COLUMNS)  # columns [0, screened) are screened first
    middle = max(0, n - EXACT_COLUMNS // 4)
    for start, end in ((middle, n), (screened, middle)):
        if end > start and bool((newest < 0).any()):
            _match_exactly(unit, _compacted(newest < 0), start, end, threshold, newest, similarity)
    if screened == 0:
        return newest, similarity
    coarse = scratch.take("coarse", (groups, n, dim), torch.bfloat16, unit.device)
    coarse.copy_(unit)
    columns = scratch.take("columns", (groups, dim, n), torch.bfloat16, unit.device)
    columns.copy_(coarse.mT)  # a block of columns is then a slice the product reads in place
    levels = _level(threshold - SCREEN_MARGIN, below=True), _level(threshold + SCREEN_MARGIN, below=False)
    # where every row still searches (keys with few near-duplicates), the screen's symmetry halves it
    maxima = _block_maxima(coarse, columns, screened, scratch) if bool((newest < 0).all()) else None
    pad = (-screened) % COLUMNS
    for block in reversed(range((screened + pad) // COLUMNS)):
        start, end = max(0, block * COLUMNS - pad), (block + 1) * COLUMNS - pad
        searching = newest < 0
        if maxima is not None:
            searching &= maxima[:, :, block] > levels[0]
        if bool(searching.any()):
            rows = _compacted(searching)
            _match_screened(unit, coarse, columns, rows, start, end, threshold, levels, newest, similarity)
    return newest, similarity


def _block_maxima(coarse: Tensor, columns: Tensor, region: int, scratch: Scratch) -> Tensor:
    """[G, n, blocks] int16: each row's largest screened similarity (as bf16 bits) in each block of
    COLUMNS of the columns [0, region), blocks counted from a start padded with zero keys. The rows of
    the region are screened against one another once, row block a against blocks ≤ a: the same product
    gives row block a's maxima (along its rows) and the older rows' maxima in block a (along its
    columns)."""
    groups, n, dim = coarse.shape
    pad = (-region) % COLUMNS
    blocks = (region + pad) // COLUMNS
    padded, padded_columns = coarse[:, :region], columns[:, :, :region]
    if pad:
        padded = torch.cat([coarse.new_zeros(groups, pad, dim), padded], dim=1)
        padded_columns = torch.cat([columns.new_zeros(groups, dim, pad), padded_columns], dim=2)
    maxima = torch.empty(groups, pad + n, blocks, dtype=torch.int16, device=coarse.device)
    diagonal = torch.arange(COLUMNS, device=coarse.device)
    # one buffer for every block's products: growing sizes, each allocated anew, would each be mapped
    # and zeroed page by page (see kvbench.policies.scoring.CHUNK_BYTES)
    space = scratch.take("products", (groups * COLUMNS * (region + pad),), coarse.dtype, coarse.device)
    for a in range(blocks):
        rows = slice(a * COLUMNS, (a + 1) * COLUMNS)
        products = space[: groups * COLUMNS * rows.stop].view(groups, COLUMNS, rows.stop)
        torch.bmm(padded[:, rows], padded_columns[:, :, : rows.stop], out=products)
        products = products.view(torch.int16)
        products[:, diagonal, rows.start + diagonal] = _MASKED
        maxima[:, rows, : a + 1] = products.view(groups, COLUMNS, a + 1, COLUMNS).amax(dim=-1)
        maxima[:, : rows.start, a] = products[:, :, : rows.start].amax(dim=1)
    later = torch.bmm(coarse[:, region:], padded_columns).view(torch.int16)  # the exact columns' own rows
    maxima[:, pad + region :] = later.view(groups, n - region, blocks, COLUMNS).amax(dim=-1)
    return maxima[:, pad:]


def _rows_of(source: Tensor, rows: Tensor) -> Tensor:
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
        return source if self.every else _rows_of(source, self.rows)

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


def _match_exactly(
    unit: Tensor, rows: _Rows, start: int, end: int, threshold: float, newest: Tensor, similarity: Tensor
) -> None:
    exact = torch.bmm(rows.of(unit), unit[:, start:end].mT)  # [g, w, c] fp32
    exact[rows.own_column(start, end)] = -torch.inf
    column = torch.arange(end - start, device=unit.device, dtype=torch.int16)
    matched = torch.where(exact > threshold, column, -1).amax(dim=-1).long()
    g_idx, r_idx = ((matched >= 0) & rows.real).nonzero(as_tuple=True)
    row_of, column_of = rows.rows[g_idx, r_idx], matched[g_idx, r_idx]
    newest[g_idx, row_of] = start + column_of
    similarity[g_idx, row_of] = exact[g_idx, r_idx, column_of]


def _match_screened(
    unit: Tensor,
    coarse: Tensor,
    columns: Tensor,
    rows: _Rows,
    start: int,
    end: int,
    threshold: float,
    levels: tuple[int, int],
    newest: Tensor,
    similarity: Tensor,
) -> None:
    low, high = levels
    screen = torch.bmm(rows.of(coarse), columns[:, :, start:end]).view(torch.int16)  # bf16 bits
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
    g_found, row_found, column_found = g_idx[found], row_of[found], start + matched[found]
    newest[g_found, row_found] = column_found
    similarity[g_found, row_found] = (unit[g_found, row_found] * unit[g_found, column_found]).sum(dim=-1)


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
