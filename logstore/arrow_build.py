"""Arrow arrays from Python values without ``pa.array``.

``pa.array`` asks pandas whether its input is a pandas object, and so imports pandas on
its first call, whatever the input (0.15-0.25 s here: the log's first flush at the close of
a one-shot ``flywheel classify``, issue 44). :func:`build` makes the same arrays from
buffers (``pa.Array.from_buffers``), which never does: for the types the log's segments use
(strings, float64/float32/int64/timestamp numbers, booleans, lists, structs and maps of
them), ``None`` as null at any level. ``tests/logstore/test_arrow_build.py`` checks it
against ``pa.array`` value for value.
"""

from __future__ import annotations

from typing import Any, Sequence, cast

import numpy as np
import pyarrow as pa

__all__ = ["build", "buffer_of", "numeric"]

_NUMPY = {pa.float64(): np.float64, pa.float32(): np.float32, pa.int64(): np.int64, pa.int32(): np.int32}


def build(values: Sequence[Any], t: pa.DataType) -> pa.Array:
    """``values`` (``None`` for null) as an Arrow array of type ``t``, as ``pa.array(values, t)``
    makes it. Raises ``TypeError`` for a type it does not build."""
    n = len(values)
    valid = np.fromiter((v is not None for v in values), dtype=bool, count=n)
    validity = None if valid.all() else buffer_of(np.packbits(valid, bitorder="little"))
    if pa.types.is_string(t):
        data = [v.encode("utf-8") for v in values if v is not None]
        lengths = np.zeros(n, dtype=np.int64)
        lengths[valid] = [len(b) for b in data]
        return pa.Array.from_buffers(t, n, [validity, _offsets(lengths), buffer_of(b"".join(data))])
    if pa.types.is_boolean(t):
        bits = np.fromiter((bool(v) for v in values), dtype=bool, count=n)
        return pa.Array.from_buffers(t, n, [validity, buffer_of(np.packbits(bits, bitorder="little"))])
    if t in _NUMPY or pa.types.is_timestamp(t):
        dtype = _NUMPY.get(t, np.int64)
        arr = np.fromiter((0 if v is None else v for v in values), dtype=dtype, count=n)
        return pa.Array.from_buffers(t, n, [validity, buffer_of(arr)])
    if pa.types.is_map(t):
        entries = [[{"key": k, "value": x} for k, x in v] if v is not None else None for v in values]
        return _nested(t, entries, validity, pa.struct([t.key_field, t.item_field]))
    if pa.types.is_list(t):
        return _nested(t, values, validity, t.value_type)
    if pa.types.is_struct(t):
        children = [build([None if v is None else v[f.name] for v in values], f.type) for f in t]
        return pa.Array.from_buffers(t, n, [validity], children=children)
    raise TypeError(f"no Arrow builder for {t}")


def numeric(arr: np.ndarray, t: pa.DataType, valid: np.ndarray | None = None) -> pa.Array:
    """A numpy array of ``t``'s width as an Arrow array (``valid``: False where null)."""
    validity = None if valid is None or valid.all() else buffer_of(np.packbits(valid, bitorder="little"))
    return pa.Array.from_buffers(t, len(arr), [validity, buffer_of(np.ascontiguousarray(arr))])


def _nested(t: pa.DataType, values: Sequence[Any], validity: pa.Buffer | None, child_t: pa.DataType) -> pa.Array:
    """A list or map array: offsets from each row's length, one child of every element."""
    lengths = np.fromiter((0 if v is None else len(v) for v in values), dtype=np.int64, count=len(values))
    child = build([x for v in values if v is not None for x in v], child_t)
    return pa.Array.from_buffers(t, len(values), [validity, _offsets(lengths)], children=[child])


def buffer_of(data: np.ndarray | bytes) -> pa.Buffer:
    """An Arrow buffer over ``data`` (a numpy array is not copied)."""
    return pa.py_buffer(cast(Any, data))   # numpy arrays export the buffer protocol; pyarrow's stubs miss it


def _offsets(lengths: np.ndarray) -> pa.Buffer:
    offsets = np.zeros(len(lengths) + 1, dtype=np.int32)
    np.cumsum(lengths, out=offsets[1:])
    return buffer_of(offsets)
