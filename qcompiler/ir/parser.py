"""Parser for the textual IR written by :mod:`.printer` (and by hand, in pass tests).

Hand-written IR may omit ``loc(...)`` and may give small constants inline, including a splat
``dense<0.5>`` that fills the constant's shape. Errors name the line and column.
"""
from __future__ import annotations

import base64
import json
import re

import numpy as np

from .graph import Graph, Value
from .types import QuantParams, TensorType, long_dtype, np_dtype


class ParseError(ValueError):
    pass


_ML_FLOATS = ("bfloat16", "float8_e4m3fn", "float8_e5m2")    # ml_dtypes floats (numpy kind 'V')
_WS = re.compile(r"(\s|//[^\n]*)*")
_IDENT = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.$]*")
_NUM = re.compile(r"[-+]?(inf|nan|(\d+\.?\d*|\.\d+)([eE][-+]?\d+)?)")
_STR = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*"')   # unrolled loop: ~15x faster on long blobs


class _Lexer:
    def __init__(self, text: str):
        self.s = text
        self.i = 0

    def ws(self):
        self.i = _WS.match(self.s, self.i).end()

    def where(self) -> str:
        line = self.s.count("\n", 0, self.i) + 1
        col = self.i - (self.s.rfind("\n", 0, self.i) + 1) + 1
        return f"line {line}, column {col}"

    def fail(self, msg: str):
        near = self.s[self.i:self.i + 30].split("\n")[0]
        raise ParseError(f"IR parse error at {self.where()}: {msg} (near '{near}')")

    def peek(self, lit: str) -> bool:
        self.ws()
        return self.s.startswith(lit, self.i)

    def accept(self, lit: str) -> bool:
        if self.peek(lit):
            self.i += len(lit)
            return True
        return False

    def expect(self, lit: str):
        if not self.accept(lit):
            self.fail(f"expected '{lit}'")

    def regex(self, rx, what: str) -> str:
        self.ws()
        m = rx.match(self.s, self.i)
        if not m:
            self.fail(f"expected {what}")
        self.i = m.end()
        return m.group(0)

    def name(self) -> str:
        self.ws()
        if self.peek('"'):
            return json.loads(self.regex(_STR, "a string"))
        return self.regex(_IDENT, "a name")

    def string(self) -> str:
        self.ws()
        if self.s.startswith('"', self.i):            # fast path: no escapes (e.g. base64 blobs)
            j = self.s.find('"', self.i + 1)
            if j > 0 and self.s.find("\\", self.i + 1, j) < 0:
                seg = self.s[self.i + 1:j]
                self.i = j + 1
                return seg
        return json.loads(self.regex(_STR, "a string"))

    def number(self):
        t = self.regex(_NUM, "a number")
        if any(c in t for c in ".eEn") or "inf" in t:
            return float(t)
        return int(t)


def _parse_type(lx: _Lexer) -> TensorType:
    lx.expect("tensor<")
    dims = []
    while True:
        lx.ws()
        m = re.compile(r"(\d+)x").match(lx.s, lx.i)
        if not m:
            break
        dims.append(int(m.group(1)))
        lx.i = m.end()
    if lx.accept("!quant.uniform<"):
        storage = long_dtype(lx.regex(_IDENT, "a storage type").split(":")[0])
        lx.expect(":")
        expressed = long_dtype(lx.regex(_IDENT, "an expressed type"))
        axis, block, scale_dtype = None, 0, "float32"
        if lx.accept(":"):
            if lx.accept("{"):                        # blocked: {axis:block_size}
                axis = int(lx.number())
                lx.expect(":")
                block = int(lx.number())
                lx.expect("}")
            else:
                axis = int(lx.number())
        lx.expect(",")
        if lx.accept("scales "):
            try:
                scale_dtype = long_dtype(lx.regex(_IDENT, "a scale type"))
            except ValueError as e:
                lx.fail(str(e))
            lx.expect(",")
        scales, zps = [], []
        if axis is not None:
            lx.expect("{")
        while True:
            scales.append(float(lx.number()))
            zps.append(int(lx.number()) if lx.accept(":") else 0)     # MLIR: the zero point defaults to 0
            if axis is None or not lx.accept(","):
                break
        if axis is not None:
            lx.expect("}")
        lx.expect(">")
        try:
            q = QuantParams(storage, tuple(scales), tuple(zps), axis, expressed, block, scale_dtype)
        except ValueError as e:
            lx.fail(str(e))
        dtype = storage
    else:
        q = None
        try:
            dtype = long_dtype(lx.regex(_IDENT, "an element type"))
        except ValueError as e:
            lx.fail(str(e))
    lx.expect(">")
    try:
        return TensorType(tuple(dims), dtype, q)
    except ValueError as e:
        lx.fail(str(e))


def _parse_literal_list(lx: _Lexer):
    if lx.accept("["):
        items = []
        if not lx.accept("]"):
            while True:
                items.append(_parse_literal_list(lx))
                if lx.accept("]"):
                    break
                lx.expect(",")
        return items
    return lx.number()


def _dense_array(lx: _Lexer, lit, t: TensorType) -> np.ndarray:
    dt = np_dtype(t.dtype)
    try:
        if isinstance(lit, list):
            a = np.array(lit, dtype=np.float64 if dt.kind == "f" or t.dtype in _ML_FLOATS else np.int64)
            if a.size != t.size:
                lx.fail(f"dense literal has {a.size} elements, type {t} needs {t.size}")
            return a.astype(dt).reshape(t.shape)
        return np.full(t.shape, lit).astype(dt)
    except (ValueError, OverflowError) as e:
        lx.fail(str(e))


def _parse_attr(lx: _Lexer):
    lx.ws()
    if lx.peek('"'):
        return lx.string()
    if lx.accept("none"):
        return None
    if lx.accept("dense<"):
        lit = _parse_literal_list(lx)
        lx.expect(">")
        lx.expect(":")
        return _dense_array(lx, lit, _parse_type(lx))
    if lx.accept("["):
        items = []
        if not lx.accept("]"):
            while True:
                items.append(_parse_attr(lx))
                if lx.accept("]"):
                    break
                lx.expect(",")
        return items
    return lx.number()


def _valref(lx: _Lexer) -> str:
    lx.expect("%")
    return lx.name()


def parse_graph(text: str) -> Graph:
    """Parse IR text into a Graph (not verified: call ``graph.verify()``)."""
    lx = _Lexer(text)
    lx.expect("graph")
    lx.expect("@")
    g = Graph(lx.name())
    lx.expect("(")
    if not lx.accept(")"):
        while True:
            n = _valref(lx)
            lx.expect(":")
            g.add_input(n, _parse_type(lx))
            if lx.accept(")"):
                break
            lx.expect(",")
    lx.expect("{")
    pending_blobs: dict[str, tuple[Value, TensorType]] = {}

    def lookup(n: str) -> Value:
        if not g.has_value(n):
            lx.fail(f"use of undefined value %{n}")
        return g.value(n)

    while not lx.peek("return"):
        names = [_valref(lx)]
        while lx.accept(","):
            names.append(_valref(lx))
        lx.expect("=")
        if lx.accept("const "):
            if lx.accept("blob<"):
                bname = lx.name()
                lx.expect(">")
                lx.expect(":")
                t = _parse_type(lx)
                data = np.zeros(t.shape, np_dtype(t.dtype))
                v = Value(names[0], t, data=data)
                pending_blobs[bname] = (v, t)
            else:
                lx.expect("dense<")
                lit = _parse_literal_list(lx)
                lx.expect(">")
                lx.expect(":")
                t = _parse_type(lx)
                v = Value(names[0], t, data=_dense_array(lx, lit, t))
            if g.has_value(v.name):
                lx.fail(f"value %{v.name} defined twice")
            g._register(v)
            g.consts[v.name] = v
            continue
        kind = lx.name()
        lx.expect("(")
        operands = []
        if not lx.accept(")"):
            while True:
                operands.append(lookup(_valref(lx)))
                if lx.accept(")"):
                    break
                lx.expect(",")
        attrs = {}
        if lx.accept("{"):
            if not lx.accept("}"):
                while True:
                    k = lx.name()
                    lx.expect("=")
                    attrs[k] = _parse_attr(lx)
                    if lx.accept("}"):
                        break
                    lx.expect(",")
        lx.expect(":")
        types = [_parse_type(lx)]
        while lx.accept(","):
            types.append(_parse_type(lx))
        if len(types) != len(names):
            lx.fail(f"{len(names)} results but {len(types)} types")
        opname = ""
        if lx.accept("loc("):
            opname = lx.string()
            lx.expect(")")
        for n in names:
            if g.has_value(n):
                lx.fail(f"value %{n} defined twice")
        g.create_op(kind, operands, attrs, result_types=types, name=opname, result_names=names)
    lx.expect("return")
    outs = [lookup(_valref(lx))]
    while lx.accept(","):
        outs.append(lookup(_valref(lx)))
    g.outputs = outs
    lx.expect("}")
    if lx.accept("blobs"):
        lx.expect("{")
        while not lx.accept("}"):
            bname = lx.name()
            lx.expect("=")
            raw = base64.b64decode(lx.string())
            if bname not in pending_blobs:
                lx.fail(f"blob '{bname}' is not referenced")
            v, t = pending_blobs.pop(bname)
            dt = np_dtype(t.dtype).newbyteorder("<")
            if len(raw) != t.size * dt.itemsize:
                lx.fail(f"blob '{bname}' has {len(raw)} bytes, {t} needs {t.size * dt.itemsize}")
            v.data = np.frombuffer(raw, dt).astype(np_dtype(t.dtype)).reshape(t.shape)
    if pending_blobs:
        lx.fail(f"missing blob data for {', '.join(sorted(pending_blobs))}")
    lx.ws()
    if lx.i != len(lx.s):
        lx.fail("unexpected text after the graph")
    return g
