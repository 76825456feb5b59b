"""A bundle's sample shards read within bounds stated in advance: the footer, the rows and the bytes a
shard decodes to, each refused by name before the memory it would take is taken.

A Parquet file's footer is the submitter's word, and a small file can decode to far more than its size
(a long string stored once in a dictionary and referenced from every row). So the footer's own size, its
row counts and its uncompressed sizes are checked first, and the rows are then decoded a batch at a time,
counting the bytes and rows really decoded, so that a footer that lies is caught one batch past its
bound, not after the whole table. Text columns are read as dictionaries (each distinct string once) and
their dense size computed from the lengths, so a string repeated on every row is counted, not built:
decoded dense, Arrow builds a whole row group at once, whatever the batch size.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from kvbench.store.records import SAMPLE_SCHEMA
from kvbench.store.shards import shard_rows

MAX_FOOTER_BYTES = 1 << 20
"""The largest Parquet footer (its metadata) a shard may have: a shard's is a few kB (one schema of
about forty columns, one row group)."""
MAX_SHARD_ROWS = 10_000
"""The most rows one shard may hold: a shard is one problem's k samples."""
MAX_SHARD_DECODED_BYTES = 256 * 2**20
"""The most bytes one shard may decode to in memory (Arrow's sizes): four times the largest member, room
for honest text compressed a few times over, and far from a dictionary string repeated on every row."""
MAX_DECODED_BYTES = 4 * 2**30
"""The most bytes all of a bundle's shards may decode to together (they are held in one DuckDB)."""
MAX_LIST_VALUES = 1 << 16
"""The most values one sample's list may hold (a per-head or per-layer measurement: 64 layers × 64 KV heads
is 4,096)."""
BATCH_ROWS = 256
"""Rows decoded at a time, so that a lying footer is caught within one batch of its bound."""
_THRIFT_LIMITS = {"thrift_string_size_limit": MAX_FOOTER_BYTES, "thrift_container_size_limit": 10_000}


@dataclass(frozen=True)
class OverBound:
    """A shard past one of the bounds: the rule that names it and what was found."""

    rule: str
    message: str


def read_bounded_shard(path: Path, budget: int) -> pa.Table | OverBound | str:
    """A shard's rows in the current schema, decoded only while its footer, rows and decoded bytes stay
    within their bounds and ``budget`` (the bytes the bundle's shards may still decode to); OverBound
    naming the bound crossed, or why the shard cannot be used."""
    try:
        metadata = pq.ParquetFile(path, **_THRIFT_LIMITS).metadata
        claimed = _footer_over(metadata)
        if claimed is not None:
            return claimed
        schema = metadata.schema.to_arrow_schema()
        older = [name for name in SAMPLE_SCHEMA.names if name not in schema.names]
        if older:  # a bundle is exported by this kvbench, from runs of its runner: its own schema
            return f"lacks the columns {', '.join(older)} of the sample schema this kvbench stores"
        cap = min(MAX_SHARD_DECODED_BYTES, budget)
        counted = _values_over(metadata, cap)
        if counted is not None:
            return counted
        # strings and bytes read as dictionaries: a value repeated on many rows is held once until the
        # decoded size is known
        texts = [f.name for f in schema if _is_bytes(f.type)]
        shard = pq.ParquetFile(path, read_dictionary=texts, **_THRIFT_LIMITS)
        batches, rows, decoded = [], 0, 0
        for batch in shard.iter_batches(batch_size=BATCH_ROWS, use_threads=False):
            rows, decoded = rows + batch.num_rows, decoded + _dense_bytes(batch)
            if rows > MAX_SHARD_ROWS:
                return _rows_over(f"at least {rows:,}")
            if decoded > cap:
                return _bytes_over(f"at least {decoded:,}", cap)
            longest = _longest_list(batch)
            if longest > MAX_LIST_VALUES:
                return OverBound(
                    "table-size",
                    f"a list of {longest:,} values in one sample, over the bound of {MAX_LIST_VALUES:,} "
                    "(MAX_LIST_VALUES)",
                )
            batches.append(batch)
        table = _dense(pa.Table.from_batches(batches, schema=shard.schema_arrow))
    except (OSError, pa.ArrowException) as exc:
        return f"does not read back as Parquet ({exc})"
    return shard_rows(table)


def _is_bytes(kind: pa.DataType) -> bool:
    return (
        pa.types.is_string(kind)
        or pa.types.is_large_string(kind)
        or pa.types.is_binary(kind)
        or (pa.types.is_large_binary(kind))
    )


def _values_over(metadata: pq.FileMetaData, cap: int) -> OverBound | None:
    """Before a value is decoded, from the footer's counts: the values each column chunk holds (a list's
    elements each count) at most MAX_LIST_VALUES per row, and the fixed-width ones within ``cap`` bytes. A
    footer's byte sizes are those of the encoded pages, which a run-length or dictionary encoding makes a
    thousand times smaller than what they decode to; its value counts are not."""
    fixed = 0
    for g in range(metadata.num_row_groups):
        group = metadata.row_group(g)
        for c in range(group.num_columns):
            chunk = group.column(c)
            if chunk.num_values > max(group.num_rows, 1) * MAX_LIST_VALUES:
                return OverBound(
                    "table-size",
                    f"column {chunk.path_in_schema} holds {chunk.num_values:,} values in {group.num_rows:,} "
                    f"row(s) (its footer says), over {MAX_LIST_VALUES:,} a sample (MAX_LIST_VALUES)",
                )
            fixed += chunk.num_values * _WIDTHS.get(chunk.physical_type, 0)
    if fixed > cap:
        return _bytes_over(f"at least {fixed:,} (its footer's value counts say)", cap)
    return None


_WIDTHS = {"BOOLEAN": 1, "INT32": 4, "FLOAT": 4, "INT64": 8, "DOUBLE": 8, "INT96": 12}
"""Bytes a decoded value of each fixed-width Parquet type takes."""


def _longest_list(batch: pa.RecordBatch) -> int:
    """The most values one sample's list holds, in any list column of ``batch``."""
    longest = 0
    for values in batch.columns:
        if pa.types.is_list(values.type) or pa.types.is_large_list(values.type):
            lengths = pc.list_value_length(values)
            longest = max(longest, pc.max(lengths).as_py() or 0)
    return longest


def _dense_bytes(batch: pa.RecordBatch) -> int:
    """The bytes ``batch`` takes once its dictionary columns are decoded: each row's string length and
    offset, computed without building them."""
    size = 0
    for values in batch.columns:
        if pa.types.is_dictionary(values.type):
            lengths = pc.take(pc.binary_length(values.dictionary), values.indices)
            size += (pc.sum(lengths).as_py() or 0) + 4 * len(values)
        else:
            size += values.nbytes
    return size


def _dense(table: pa.Table) -> pa.Table:
    """``table`` with its dictionary columns decoded, once their size is known to be within bounds."""
    for i, field in enumerate(table.schema):
        if pa.types.is_dictionary(field.type):
            table = table.set_column(i, field.name, table.column(i).cast(field.type.value_type))
    return table


def _footer_over(metadata: pq.FileMetaData) -> OverBound | None:
    """The first bound the footer itself claims past: its size, its rows, its uncompressed bytes."""
    if metadata.serialized_size > MAX_FOOTER_BYTES:
        return OverBound(
            "table-size",
            f"a Parquet footer of {metadata.serialized_size:,} bytes, over the {MAX_FOOTER_BYTES:,}-byte "
            "bound (MAX_FOOTER_BYTES)",
        )
    if metadata.num_rows > MAX_SHARD_ROWS:
        return _rows_over(f"{metadata.num_rows:,} (its footer says)")
    groups = [metadata.row_group(i) for i in range(metadata.num_row_groups)]
    if sum(g.num_rows for g in groups) > MAX_SHARD_ROWS:
        return _rows_over(f"{sum(g.num_rows for g in groups):,} (its row groups say)")
    claimed = sum(g.total_byte_size for g in groups)
    if claimed > MAX_SHARD_DECODED_BYTES:
        return _bytes_over(f"{claimed:,} (its footer says)", MAX_SHARD_DECODED_BYTES)
    return None


def _rows_over(found: str) -> OverBound:
    return OverBound("row-count", f"{found} rows, over the bound of {MAX_SHARD_ROWS:,} (MAX_SHARD_ROWS)")


def _bytes_over(found: str, cap: int) -> OverBound:
    which = (
        "MAX_SHARD_DECODED_BYTES" if cap == MAX_SHARD_DECODED_BYTES else "what is left of MAX_DECODED_BYTES"
    )
    return OverBound("table-size", f"decodes to {found} bytes, over the bound of {cap:,} bytes ({which})")
