"""Dynamic input dimensions, compiled as shape buckets: ``--dynamic S=1..512``.

One artifact runs every size in the range. The model is compiled once per *bucket* size; at run
time each input is padded with zeros along the dimension to the smallest bucket that holds it,
that bucket's function runs, and the padded positions are sliced off the outputs
(:mod:`qcompiler.runtime.shapes`). The buckets share their weights: a weight packed the same way
for two buckets is stored once in ``model.so`` (the Relax VM's constant pool deduplicates equal
constants), so only the kernels and the VM code are per bucket.

    qcompile encoder.onnx --dynamic sequence=1..512 -o out       # a dim the model names 'sequence'
    qcompile encoder.onnx --input-shape input_ids=1xS --input-shape attention_mask=1xS \\
        --dynamic S=1..512:64,128,512 -o out                      # a symbol of --input-shape, own buckets

Buckets: the given sizes, or by default the powers of two and their 1.5 multiples from
max(16, LO) up to HI, and HI (1..512: 16, 24, 32, 48, ..., 256, 384, 512; eleven builds): a size
is padded to at most 1.5x itself (measured with powers of two alone, all-MiniLM-L6 at length 77
ran 1.54x its own build's time in the 128 bucket), and the shortest inputs share one bucket.
With several dynamic dims every combination of their buckets is built (at most :data:`MAX_BUCKETS`).

Padding must not change the real positions' results. An encoder whose attention masks its padding
(the zero an ``attention_mask`` input is padded with means "padding" to BERT-class models) is
invariant: the masked scores are -1e4 or -inf before the softmax, whose exp is exactly 0. A model
that attends to or pools over every position is not. So before any compilation the ONNX model runs
on ONNX Runtime twice, at a size L and padded from L to the bucket above it, and the outputs at the
real positions must agree within :data:`PAD_TOLERANCE` of their largest magnitude; the same two
runs tell which output dims follow which dynamic dim (the ones sliced at run time).
This is what TensorRT's optimization profiles (min/opt/max shapes, one engine per profile) and
TVM Relax's symbolic shapes give their users, done with our static-shape kernels.
"""
from __future__ import annotations

import itertools
import re
from dataclasses import dataclass
from typing import Mapping, Sequence

import numpy as np

from ..errors import UserError
from ..runtime.shapes import Buckets

MAX_BUCKETS = 16
"""The most builds one artifact may hold (all dynamic dims' bucket combinations)."""

PAD_TOLERANCE = 1e-4
"""Padded vs unpadded outputs of ONNX Runtime, max |difference| / max |unpadded|: float32
reassociation over a longer (zero-padded) reduction stays near 1e-6; a model that reads its
padding differs by 1e-2 or more."""

SMALLEST_DEFAULT_BUCKET = 16

Shape = tuple  # of int (a size) or str (a dynamic dim's name)


@dataclass(frozen=True)
class DynamicDim:
    """One dynamic input dimension: its name, the sizes it takes (``lo..hi``) and the bucket
    sizes compiled (``()``: :func:`default_buckets`)."""
    name: str
    lo: int
    hi: int
    buckets: tuple[int, ...] = ()

    def __post_init__(self):
        flag = f"--dynamic {self.name}"
        if not 1 <= self.lo < self.hi:
            raise UserError(f"the range {self.lo}..{self.hi} is empty or fixed", flag,
                            "give LO..HI with 1 <= LO < HI, e.g. 1..512")
        b = self.buckets
        if b and (list(b) != sorted(set(b)) or b[0] < self.lo or b[-1] != self.hi):
            raise UserError(f"buckets {','.join(map(str, b))} must increase, start at {self.lo} or above and end "
                            f"at {self.hi}", flag, f"e.g. {self.name}={self.lo}..{self.hi}:{self.hi}")

    @property
    def sizes(self) -> tuple[int, ...]:
        return self.buckets or default_buckets(self.lo, self.hi)

    def bucket_for(self, n: int) -> int:
        return next(b for b in self.sizes if b >= n)

    def __str__(self) -> str:
        return f"{self.name}={self.lo}..{self.hi}:{','.join(map(str, self.sizes))}"


def default_buckets(lo: int, hi: int) -> tuple[int, ...]:
    """The powers of two and their 1.5 multiples (16, 24, 32, 48, 64, 96, ...) from max(16, lo)
    up to ``hi`` exclusive, then ``hi``: a size pads to at most 1.5x itself (below 16, to 16)."""
    grid, p = set(), SMALLEST_DEFAULT_BUCKET
    while p < hi:
        grid |= {p, p * 3 // 2}
        p *= 2
    return (*sorted(b for b in grid if lo <= b < hi), hi)


_SPEC = re.compile(r"^([A-Za-z_][\w.]*)=(\d+)\.\.(\d+)(?::(\d+(?:,\d+)*))?$")


def parse_dynamic(text: str) -> DynamicDim:
    """``NAME=LO..HI`` or ``NAME=LO..HI:B1,B2,...`` (bucket sizes, the last = HI)."""
    m = _SPEC.match(text.strip())
    if m is None:
        raise UserError(f"bad --dynamic '{text}'", "--dynamic",
                        "write NAME=LO..HI (e.g. S=1..512), optionally :BUCKETS (e.g. S=1..512:64,128,512)")
    name, lo, hi, buckets = m.groups()
    return DynamicDim(name, int(lo), int(hi), tuple(int(b) for b in buckets.split(",")) if buckets else ())


def assignments(dims: Sequence[DynamicDim]) -> list[dict[str, int]]:
    """Every combination of the dims' bucket sizes, smallest first."""
    names = [d.name for d in dims]
    if len(set(names)) != len(names):
        raise UserError(f"--dynamic names '{next(n for n in names if names.count(n) > 1)}' twice", "--dynamic",
                        "give each dynamic dim once")
    combos = [dict(zip(names, c)) for c in itertools.product(*(d.sizes for d in dims))]
    if len(combos) > MAX_BUCKETS:
        raise UserError(f"{len(combos)} bucket combinations ({' x '.join(str(len(d.sizes)) for d in dims)}), more "
                        f"than the {MAX_BUCKETS} one artifact holds", "--dynamic",
                        "give fewer buckets, e.g. --dynamic S=1..512:128,512")
    return combos


def symbolic_shapes(model, given: Mapping[str, Shape], dims: Sequence[DynamicDim], where: str
                    ) -> dict[str, Shape]:
    """Each input that a dynamic dim sizes, with its shape in sizes and dim names: from
    ``--input-shape`` (``input_ids=1xS``), or from the model's own dim names (``sequence``),
    the model's other dynamic dims (a batch) set to 1."""
    names = {d.name for d in dims}
    inits = {t.name for t in model.graph.initializer}
    inputs = {v.name: v for v in model.graph.input if v.name not in inits}
    out: dict[str, Shape] = {}
    for k, shape in given.items():
        unknown = [d for d in shape if isinstance(d, str) and d not in names]
        if unknown:
            raise UserError(f"--input-shape {k} uses '{unknown[0]}', which has no --dynamic range", "--input-shape",
                            f"add --dynamic {unknown[0]}=LO..HI")
        if k not in inputs:
            raise UserError(f"--input-shape names '{k}', which is not an input of the model", where,
                            f"the model's inputs are: {', '.join(inputs) or '(none)'}")
        declared = [d.dim_value if d.dim_value > 0 else None for d in inputs[k].type.tensor_type.shape.dim]
        fixed = [(i, n) for i, (d, n) in enumerate(zip(shape, declared)) if isinstance(d, str) and n is not None]
        if fixed:
            raise UserError(f"input '{k}' dim {fixed[0][0]} is fixed at {fixed[0][1]} by the model; it cannot be dynamic",
                            "--input-shape", f"give {fixed[0][1]} there")
        if any(isinstance(d, str) for d in shape):
            out[k] = tuple(shape)
    for v in model.graph.input:
        if v.name in inits or v.name in given or not v.type.tensor_type.HasField("shape"):
            continue
        dd = v.type.tensor_type.shape.dim
        params = [d.dim_param if d.dim_param in names else None for d in dd]
        if not any(params):
            continue
        shape = []
        for i, (d, p) in enumerate(zip(dd, params)):
            if p is not None:
                shape.append(p)
            elif d.HasField("dim_value") and d.dim_value > 0:
                shape.append(d.dim_value)
            elif i == 0:
                shape.append(1)                  # a dynamic batch not named in --dynamic: 1, as without it
            else:
                raise UserError(f"input '{v.name}' has another dynamic dim ({i}: '{d.dim_param or '?'}')", where,
                                f"give --input-shape {v.name}=... with sizes and --dynamic names")
        out[v.name] = tuple(shape)
    for d in dims:
        if not any(d.name in s for s in out.values()):
            raise UserError(f"--dynamic names '{d.name}', which no input's shape uses", "--dynamic",
                            "name a dim of the model's inputs (see qcompile inspect) or use it in --input-shape, "
                            "e.g. --input-shape input_ids=1xS --dynamic S=1..512")
    return out


def concrete(shapes: Mapping[str, Shape], sizes: Mapping[str, int]) -> dict[str, tuple[int, ...]]:
    return {k: tuple(sizes[d] if isinstance(d, str) else int(d) for d in s) for k, s in shapes.items()}


# ---- the padding check (ONNX Runtime) -------------------------------------------------------------
def probe_sizes(dims: Sequence[DynamicDim]) -> tuple[dict[str, int], dict[str, int]]:
    """(L, bucket) per dim: a size that the first bucket able to pad pads, and that bucket; no two
    dims get the same pair (so that an output dim's sizes tell which dim it follows)."""
    small, big = {}, {}
    for d in dims:
        prev = d.lo - 1
        for b in d.sizes:
            lo = max(prev + 1, d.lo)
            taken = {(small[k], big[k]) for k in small}
            free = [n for n in range(max(lo, (prev + b) // 2 + 1), lo - 1, -1) if n < b and (n, b) not in taken]
            if free:
                small[d.name], big[d.name] = free[0], b
                break
            prev = b
        else:                                    # every size is a bucket: nothing is ever padded
            small[d.name] = big[d.name] = d.sizes[-1]
    return small, big


def _feed(model, shapes: dict[str, tuple[int, ...]], rng: np.random.Generator) -> dict[str, np.ndarray]:
    """Inputs for the check: integers 1 (a valid id, mask and segment for any vocabulary), floats normal."""
    from onnx import helper
    feed = {}
    inits = {t.name for t in model.graph.initializer}
    for v in model.graph.input:
        if v.name in inits:
            continue
        dt = helper.tensor_dtype_to_np_dtype(v.type.tensor_type.elem_type)
        shape = shapes.get(v.name) or tuple(d.dim_value if d.dim_value > 0 else 1
                                            for d in v.type.tensor_type.shape.dim)
        feed[v.name] = rng.standard_normal(shape).astype(dt) if np.dtype(dt).kind == "f" else np.ones(shape, dt)
    return feed


def check_padding(model, shapes: Mapping[str, Shape], dims: Sequence[DynamicDim], where: str,
                  fixed: Mapping[str, tuple[int, ...]] | None = None) -> list[tuple[int | str, ...]]:
    """Run ``model`` (an ONNX ModelProto, bound inputs folded in; ``fixed``: the other inputs'
    given shapes) on ONNX Runtime at the probe sizes, unpadded and padded; raise UserError if the
    real positions' outputs differ. Returns each output's shape with the dims that follow a
    dynamic dim named."""
    import onnxruntime as ort
    small, big = probe_sizes(dims)
    so = ort.SessionOptions()
    so.log_severity_level = 3
    sess = ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])
    feed = _feed(model, {**(fixed or {}), **concrete(shapes, small)}, np.random.default_rng(0))
    padded = {k: Buckets.pad(shapes[k], a, big) if k in shapes else a for k, a in feed.items()}
    try:
        ref, got = sess.run(None, feed), sess.run(None, padded)
    except Exception as e:  # noqa: BLE001 (ORT raises its own types)
        msg = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise UserError(f"ONNX Runtime cannot run the model at the sizes {small} and {big}: {msg}", where,
                        "check the --dynamic range against the sizes the model accepts") from None
    out_shapes = []
    for o, r, p in zip(sess.get_outputs(), ref, got):
        shape = []
        for i, (a, b) in enumerate(zip(r.shape, p.shape)):
            follows = [d.name for d in dims if small[d.name] != big[d.name] and a == small[d.name] and b == big[d.name]]
            if a == b:
                shape.append(int(a))
            elif len(follows) == 1:
                shape.append(follows[0])
            else:
                raise UserError(f"output '{o.name}' dim {i} is {a} at {small} and {b} at {big}: it does not follow one "
                                "dynamic dim, so padding cannot be sliced off", where,
                                "compile one artifact per size (no --dynamic)")
        real = Buckets.unpad(shape, p, small)
        scale = float(np.max(np.abs(r))) if r.size and r.dtype.kind == "f" else 1.0
        diff = float(np.max(np.abs(real.astype(np.float64) - r))) if r.size else 0.0
        if diff > PAD_TOLERANCE * max(scale, 1e-30):
            raise UserError(f"padding {small} to {big} changes output '{o.name}' at the real positions (max difference "
                            f"{diff:.3g}, {diff / max(scale, 1e-30):.2g} of its range): the model reads its padding "
                            "(no attention mask input, or pooling over every position)", where,
                            "compile one artifact per size (no --dynamic), or export the model with an attention mask")
        out_shapes.append(tuple(shape))
    return out_shapes
