"""Each key's newest near-duplicate, as R-KV's redundancy needs it (``rkv-official``), found without an
n × n fp32 similarity matrix.

For unit keys u and a row i, the answer is the newest j ≠ i with u_i·u_j > threshold. Comparing every pair
is an n × n × D product per KV head; it is screened in the dtype the machine multiplies fastest
(kvbench.core.hardware: bfloat16 where a CPU has AMX or AVX-512 BF16, or on a GPU; fp32 on a CPU that
would emulate bf16), and only the pairs the screen cannot settle are computed one by one in fp32:

- a screened similarity is within its dtype's SCREEN_MARGINS of the fp32 one, so a pair screened at most
  threshold − margin is not similar, and one above threshold + margin is;
- the columns are searched from the newest block back, and a row stops at its first block with a match:
  on a language model's keys nearly every row finds one among the newest 256 (measured on SmolLM2-135M's
  keys: 93-99.9% of rows, by layer), on isotropic random keys no row does and the screen covers all;
  then every block is screened at once, each pair once (the lower triangle, as the products are
  symmetric), and only the blocks where a row's maximum reaches the screen's lower level are searched.

The pairs left in between are computed in fp32 one dot product each, so the result is that of the fp32
matrix up to the order of summation inside a dot product.
"""

from __future__ import annotations

import torch
from torch import Tensor

from kvbench.core.hardware import screen_dtype, screen_strip
from kvbench.policies.scoring import Scratch

SCREEN_MARGINS = {torch.bfloat16: 1 / 32, torch.float32: 1 / 4096}
"""Above the largest gap between a screened product of unit vectors and the fp32 dot product. bf16:
rounding each input to bf16 moves a product by at most 2·2⁻⁸ of Σ|u_i||u_j| ≤ 1, rounding the fp32 sum
to bf16 by 2⁻⁸; 0.012 in all (the fp32 accumulation adds ~1e-5). fp32: only the order of summation
differs, ~1e-6 at D = 128. Tested on a million pairs."""

BITS = {torch.bfloat16: torch.int16, torch.float32: torch.int32}
"""The integers a screened product is compared as: a positive float orders as its bits do."""

COLUMNS = 256
"""Columns per screened block. The screen's products are symmetric, so only the lower triangle is computed:
each strip of columns (a multiple of COLUMNS wide, its width the machine's choice, kvbench.core.hardware)
against the rows from its first one on, about 5/8 of the square at n = 2048 in strips of 512."""

NEWEST_COLUMNS = 64
"""The newest columns, searched first for every row: on SmolLM2-135M's keys 64-99% of rows (by layer) find
their match there, and only the rest search the older blocks."""


def _masked(screen: torch.dtype) -> int:
    """The smallest integer of the screen's bits (a -0.0), below every level compared with."""
    return torch.iinfo(BITS[screen]).min


def newest_near_duplicates(
    unit: Tensor,
    threshold: float,
    scratch: Scratch | None = None,
    screen: torch.dtype | None = None,
    strip: int | None = None,
) -> tuple[Tensor, Tensor]:
    """[G, n] index of each row's newest other row with cosine > threshold (−1 where none), and [G, n]
    that cosine in fp32 (0 where none); unit [G, n, D] holds a few groups (KV heads of batch rows) at a
    time, and ``scratch`` is reused from one call to the next. ``screen`` (the screen's dtype) and ``strip``
    (its columns per product): None for the machine's choice (kvbench.core.hardware); the answer is the
    same in any."""
    scratch = scratch or Scratch()
    search = _Search(unit, threshold, scratch, screen or screen_dtype(unit.device))
    n = unit.shape[1]
    # the newest columns first, for every row: a language model's keys mostly match there
    newest_start = max(0, n - NEWEST_COLUMNS // 4)
    search.block(search.newest < 0, newest_start, n)
    flagged = None
    if newest_start and bool((search.newest < 0).all()):  # few near-duplicates: screen all blocks at once
        # over every column, the newest (searched already) among them: a block flagged for them alone is
        # searched short of them
        strip = strip or screen_strip(unit.device)
        screened, flagged = newest_start, _flagged_blocks(search.coarse, search.low, scratch, strip)
    else:
        screened = max(0, n - NEWEST_COLUMNS)
        search.block(search.newest < 0, screened, newest_start)
    for block in reversed(range(-(-screened // COLUMNS))):
        searching = search.newest < 0
        if not bool(searching.any()):  # every row has its match: the older blocks cannot change it
            break
        if flagged is not None:
            searching &= flagged[:, :, block]
        search.block(searching, block * COLUMNS, min(screened, (block + 1) * COLUMNS))
    return search.newest, search.similarity


def screen_flops(n: int, dim: int, strip: int) -> int:
    """Multiply-adds × 2 of the symmetric screen over n keys of ``dim`` (one group), as _flagged_blocks
    computes it: each strip of columns against the rows from its first on. Random keys, where no row finds
    a match among the newest columns, take all of it."""
    return sum(2 * (n - start) * min(strip, n - start) * dim for start in range(0, n, strip))


def _flagged_blocks(coarse: Tensor, low: int, scratch: Scratch, strip: int) -> Tensor:
    """[G, n, blocks] bool: whether a row's screened similarity to some other row exceeds ``low`` (bf16
    bits) in each block of COLUMNS columns, the last block possibly shorter. Strip by strip: the
    products of rows [start, n) with the strip's columns give those rows' maxima over the strip's blocks
    and, read down the columns in groups of COLUMNS rows, the strip's own rows' maxima over the blocks
    from the strip on. A strip with no product above ``low``, as nearly every strip of unrelated keys,
    flags nothing and is not reduced further."""
    groups, n, _ = coarse.shape
    flagged = torch.zeros(groups, n, -(-n // COLUMNS), dtype=torch.bool, device=coarse.device)
    space = scratch.take("products", (n * strip,), coarse.dtype, coarse.device)
    masked = _masked(coarse.dtype)
    for group in range(groups):
        for start in range(0, n, strip):
            width = min(strip, n - start)
            products = space[: (n - start) * width].view(n - start, width)
            torch.mm(coarse[group, start:], coarse[group, start : start + width].mT, out=products)
            bits = products.view(BITS[coarse.dtype])
            bits.diagonal().fill_(masked)  # else every row would search its own block
            if bool(bits.amax() <= low):
                continue
            first = start // COLUMNS
            flagged[group, start:, first : first + -(-width // COLUMNS)] = _group_maxima(bits, 1) > low
            flagged[group, start : start + width, first:] = _group_maxima(bits, 0) > low
    return flagged


def _group_maxima(bits: Tensor, dim: int) -> Tensor:
    """[r, c] → the maxima of consecutive groups of COLUMNS along ``dim`` (the last possibly shorter), the
    groups last: [r, groups] for dim 1, [c, groups] for dim 0."""
    return torch.stack([part.amax(dim=dim) for part in bits.split(COLUMNS, dim=dim)], dim=-1)


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


class _Search:
    """One call's keys (fp32, and in the screen's dtype), the screen's levels as its bits, and what is
    found so far."""

    def __init__(self, unit: Tensor, threshold: float, scratch: Scratch, screen: torch.dtype) -> None:
        groups, n, dim = unit.shape
        self.unit, self.threshold, self.bits = unit, threshold, BITS[screen]
        self.coarse = scratch.take("coarse", (groups, n, dim), screen, unit.device)
        self.coarse.copy_(unit)
        margin = SCREEN_MARGINS[screen]
        self.low = _level(threshold - margin, screen, below=True)
        self.high = _level(threshold + margin, screen, below=False)
        self.newest = torch.full((groups, n), -1, dtype=torch.long, device=unit.device)
        self.similarity = torch.zeros(groups, n, device=unit.device)

    def block(self, searching: Tensor, start: int, end: int) -> None:
        """Each ``searching`` row's newest match among the columns [start, end), where it has one."""
        if end <= start or not bool(searching.any()):
            return
        rows = _compacted(searching)
        screen = torch.bmm(rows.of(self.coarse), self.coarse[:, start:end].mT).view(self.bits)
        screen[rows.own_column(start, end)] = torch.iinfo(self.bits).min
        flagged = (screen.amax(dim=-1) > self.low) & rows.real
        if not bool(flagged.any()):
            return
        g_idx, r_idx = flagged.nonzero(as_tuple=True)
        values = _at(screen, g_idx, r_idx)  # [P, c]
        column = torch.arange(end - start, device=screen.device, dtype=torch.int16)
        surely = torch.where(values > self.high, column, -1).amax(dim=-1)  # the newest sure match
        p_idx, j_idx = ((values > self.low) & (column > surely[:, None])).nonzero(as_tuple=True)
        row_of = rows.rows[g_idx, r_idx]
        exact = self._dot(g_idx[p_idx], row_of[p_idx], start + j_idx)
        checked = torch.where(exact > self.threshold, j_idx, -1).to(torch.int16)
        matched = surely.scatter_reduce(0, p_idx, checked, "amax").long()
        found = matched >= 0
        g_found, row_found, column_found = g_idx[found], row_of[found], start + matched[found]
        self.newest[g_found, row_found] = column_found
        self.similarity[g_found, row_found] = self._dot(g_found, row_found, column_found)

    def _dot(self, group: Tensor, row: Tensor, column: Tensor) -> Tensor:
        return _at(self.unit, group, row).mul_(_at(self.unit, group, column)).sum(dim=-1)


def _at(source: Tensor, group: Tensor, row: Tensor) -> Tensor:
    """source [G, r, ...] at the pairs (group, row) → [P, ...], as ``source[group, row]`` (the same values)
    through one flat row copy each: indexing by two index tensors took ten times as long on the CPU."""
    groups, rows = source.shape[:2]
    return source.reshape(groups * rows, *source.shape[2:]).index_select(0, group * rows + row)


def _level(value: float, screen: torch.dtype, below: bool) -> int:
    """``value`` as the screen dtype's bits compared as integers, rounded outward so that the screen only
    errs by asking for an exact check. Levels at or below zero (where negative floats' bits order
    backwards) flag every pair or settle none."""
    integers = torch.iinfo(BITS[screen])
    if value <= 0:
        return integers.min if below else integers.max
    bits = int(torch.tensor(value, dtype=torch.float64).to(screen).view(BITS[screen]))
    rounded = float(torch.tensor(bits, dtype=BITS[screen]).view(screen))
    if below and rounded > value:
        bits -= 1
    if not below and rounded < value:
        bits += 1
    return bits
