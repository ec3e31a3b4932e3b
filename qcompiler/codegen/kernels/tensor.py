"""Logical tensors inside a kernel being built: views over TE tensors, and lazy expressions.

Kernels are written in *logical* coordinates (the IR's shapes, NCHW for images). A value's
*physical* storage may differ:

* plain: row-major, possibly under another shape of the same size (a reshape is then free);
* blocked ``NCHW{b}c``: a rank-4 value (N, C, H, W) stored as (N, C/b, H, W, b).

:class:`Buf` maps a logical index onto its storage; :class:`Lazy` is an injective expression
(elementwise ops, reshapes, slices...) that is composed into its consumer instead of being
stored. Values are produced in the *compute* dtype (float32 for every float storage type), and
cast to the storage dtype only when written.
"""
from __future__ import annotations

from typing import Callable, Sequence

import numpy as np
import tvm
from tvm import te, tirx

from ...ir.types import is_fp8

FLOATS = ("float32", "float16", "bfloat16", "float64")


def compute_dtype(dtype: str) -> str:
    """The dtype arithmetic is done in: float32 for every float type, the type itself otherwise;
    float8 values are carried as their uint8 bits (stored so too), which :mod:`.fp8` decodes."""
    if is_fp8(dtype):
        return "uint8"
    return "float32" if dtype in FLOATS else dtype


def dtype_of(x) -> str:
    """The element dtype of a PrimExpr (or a te tensor element)."""
    if isinstance(x, te.TensorSlice):
        return x.tensor.dtype
    return str(x.ty)


def cast(x, dtype: str):
    if isinstance(x, te.TensorSlice):
        x = x.asobject()
    return x if dtype_of(x) == dtype else x.astype(dtype)


def divisor_at_most(n: int, cap: int) -> int:
    """The largest divisor of ``n`` that is <= ``cap`` (a register-tile extent that splits ``n``)."""
    return max(d for d in range(1, min(n, cap) + 1) if n % d == 0)


def padded_extent(n: int, tile: int) -> int:
    """``n`` rounded up to a multiple of ``tile`` when ``n`` has no divisor of at least half the
    tile (a sequence length of 197 has none), else ``n``: a kernel computes the extra rows (they
    repeat the last one) and its view cuts them off, so that the register tile stays whole."""
    if n <= tile or divisor_at_most(n, tile) * 2 >= tile:
        return n
    return -(-n // tile) * tile


def repeat_last(m: int, mpad: int):
    """The row index map of a kernel computing ``mpad >= m`` rows of an ``m``-row operand
    (:func:`padded_extent`): rows past the end read the last one."""
    return (lambda i: i) if mpad == m else (lambda i: tirx.min(i, m - 1))


def const(v, dtype: str):
    if dtype == "bool":
        return tirx.const(bool(v), "bool")
    if dtype in FLOATS:
        return tirx.const(float(v), dtype)
    return tirx.const(int(v), dtype)


class LTensor:
    """A logical tensor: ``shape`` and ``dtype`` as in the IR; ``at(idx)`` gives an element."""
    shape: tuple[int, ...]
    dtype: str

    @property
    def cdtype(self) -> str:
        return compute_dtype(self.dtype)

    @property
    def rank(self) -> int:
        return len(self.shape)

    def at(self, idx: Sequence) -> tirx.PrimExpr:
        raise NotImplementedError

    @property
    def block(self) -> int:
        return 0


class Buf(LTensor):
    """A stored tensor. ``block`` > 0 means NCHW{block}c storage of a rank-4 logical value (the last
    block may be padded past the channel count: an accumulator over padded output channels)."""

    def __init__(self, tensor: te.Tensor, shape, dtype: str, block: int = 0):
        self.tensor = tensor
        self.shape = tuple(int(d) for d in shape)
        self.dtype = dtype
        self._block = int(block)
        self.phys_shape = tuple(int(d) for d in tensor.shape)
        if block:
            n, c, h, w = self.shape
            # channels padded up to the block (an accumulator over padded output channels) are allowed
            assert self.phys_shape == (n, -(-c // block), h, w, block), (self.shape, self.phys_shape)
        else:
            assert int(np.prod(self.phys_shape)) == int(np.prod(self.shape)), (self.shape, self.phys_shape)

    @property
    def block(self) -> int:
        return self._block

    def phys_index(self, idx: Sequence) -> tuple:
        idx = tuple(idx)
        if self._block:
            n, c, h, w = idx
            b = self._block
            return (n, c // b, h, w, c % b)
        if self.phys_shape == self.shape:
            return idx
        return unravel(linearize(idx, self.shape), self.phys_shape)

    def at(self, idx: Sequence) -> tirx.PrimExpr:
        p = tuple(_simplify(i) for i in self.phys_index(idx))
        return cast(self.tensor[p if p else (0,)], self.cdtype)


class Lazy(LTensor):
    """An injective expression of other logical tensors, inlined into its consumer."""

    def __init__(self, shape, dtype: str, fn: Callable[[tuple], tirx.PrimExpr]):
        self.shape = tuple(int(d) for d in shape)
        self.dtype = dtype
        self.fn = fn

    def at(self, idx: Sequence) -> tirx.PrimExpr:
        return cast(self.fn(tuple(idx)), self.cdtype)


def scalar(value, dtype: str, shape=()) -> Lazy:
    c = const(value, compute_dtype(dtype))
    return Lazy(shape, dtype, lambda idx: c)


def linearize(idx: Sequence, shape: Sequence[int]):
    flat = tirx.const(0, "int32")
    for i, d in zip(idx, shape):
        flat = flat * int(d) + i
    return flat


def unravel(flat, shape: Sequence[int]) -> tuple:
    out = []
    for d in reversed(shape):
        out.append(flat % int(d) if d != 1 else tirx.const(0, "int32"))
        flat = flat // int(d)
    return tuple(reversed(out))


def broadcast_index(idx: Sequence, in_shape: Sequence[int]) -> tuple:
    """Numpy broadcasting: the index into an operand of ``in_shape`` for output index ``idx``."""
    r = len(in_shape)
    tail = tuple(idx)[len(idx) - r:] if r else ()
    return tuple(tirx.const(0, "int32") if d == 1 else i for i, d in zip(tail, in_shape))


_ANALYZER: list = []


def _simplify(e):
    """Simplify an index expression with the bounds of the enclosing te.compute's loop variables."""
    if not _ANALYZER or isinstance(e, int):
        return e
    try:
        return _ANALYZER[-1].simplify(e)
    except Exception:  # noqa: BLE001 - e.g. an index that loads from a tensor (Gather)
        return e


def simplified(shape: Sequence[int], fn: Callable[..., tirx.PrimExpr]) -> Callable[..., tirx.PrimExpr]:
    """Wrap a te.compute body so that the index arithmetic of every stored-tensor access is
    simplified knowing the loop bounds (so that ``(co*16 + ci) // 16`` becomes ``co`` in blocked
    layouts)."""
    def body(*vars_):
        ana = tvm.sym.Analyzer()
        for v, e in zip(vars_, shape):
            ana.bind(v, tvm.ir.Range(0, int(e)))
        _ANALYZER.append(ana)
        try:
            return fn(*vars_)
        finally:
            _ANALYZER.pop()
    return body


def compute(shape, fn, name: str) -> te.Tensor:
    shape = tuple(int(d) for d in shape) or (1,)
    return te.compute(shape, simplified(shape, fn), name=name)


def logical_of_phys(phys: Sequence, shape: Sequence[int], block: int) -> tuple:
    """The logical index of a physical index of a value stored with ``block`` (0: plain, same shape)."""
    if block:
        n, co, h, w, ci = phys
        return (n, co * block + ci, h, w)
    return tuple(phys)[:len(shape)]


def phys_shape(shape: Sequence[int], block: int) -> tuple[int, ...]:
    if block:
        n, c, h, w = shape
        return (n, c // block, h, w, block)
    return tuple(shape) or (1,)


def materialize(x: LTensor, block: int, dtype: str, name: str) -> te.Tensor:
    """A te.compute that stores logical tensor ``x`` with the given layout and storage dtype."""
    shape = phys_shape(x.shape, block)
    if x.shape == ():
        return te.compute((1,), lambda i: cast(x.at(()), dtype), name=name)
    return compute(shape, lambda *p: cast(x.at(logical_of_phys(p, x.shape, block)), dtype), name)
