"""Value types of the IR: shape, element dtype and, when quantized, the quantization parameters.

In the spirit of MLIR's ``quant.uniform`` type, quantization parameters are part of a value's
*type*: frozen, validated at construction, printed with the IR::

    tensor<1x8x28x28xf32>                                  a float tensor
    tensor<1x8x28x28x!quant.uniform<u8:f32, 0.0235:128>>   per-tensor affine uint8
    tensor<8x3x3x3x!quant.uniform<i8:f32:0, {0.01:0, 0.02:0, ...}>>   per-channel int8 along axis 0
    tensor<1x8x28x28x!quant.uniform<f8E4M3FN:f32, 0.0021>>            per-tensor float8 (E4M3, no inf; zero point 0)
    tensor<2x64x!quant.uniform<u4:f32:{1:32}, {0.01:8, 0.02:7, 0.01:9, 0.03:8}>>   uint4, blocks of 32 along axis 1
    tensor<2x64x!quant.uniform<i4:f32:{1:32}, scales f16, {0.01:0, ...}>>        int4, float16 scales

A real value r is represented by the stored integer q through r = scale * (q - zero_point). Float8
storage (``float8_e4m3fn``: OCP E4M3, max 448, NaN but no inf; ``float8_e5m2``: max 57344, with inf)
holds the 8-bit float q itself, zero point 0: r = scale * q (ONNX opset 19's float8 QuantizeLinear).

Blocked (ONNX opset 21's ``DequantizeLinear`` with ``block_size``; MLIR's sub-channel
``!quant.uniform<i4:f32:{1:32}, ...>``): ``block_size`` B > 0 with ``axis`` a gives one scale and
zero point per B consecutive elements along axis a, the scales forming a tensor of the value's shape
with dim a replaced by ceil(D_a / B) (the last block may be short), listed flat in its row-major
order: element x[..., i, ...] (i along a) uses scale[..., i // B, ...]. A weight [N, K] blocked
along K (axis 1) has scales [N, ceil(K / B)], what ``MatMulNBits`` (com.microsoft) stores.
4-bit storage (``int4``: -8..7, ``uint4``: 0..15) is held in numpy one value per byte (int8 /
uint8 arrays: :func:`np_dtype`), two per byte in the artifact and in ONNX (:attr:`TensorType.nbytes`
counts those). ``scale_dtype`` float16: every scale is a float16 value (stored so in the artifact
and ONNX, exact in float32, where the arithmetic stays). A block's scale may be negative (finite,
non-zero): ONNX Runtime's symmetric 4-bit quantizer maps each block's value of largest magnitude to
-8, with a negative scale where that value is positive, and its models import as they are.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

# short name <-> numpy dtype name. Short names follow MLIR (f32, i8, ...); i1 is bool.
_SHORT = {
    "float32": "f32", "float16": "f16", "bfloat16": "bf16", "float64": "f64",
    "int8": "i8", "uint8": "u8", "int16": "i16", "uint16": "u16",
    "int32": "i32", "uint32": "u32", "int64": "i64", "uint64": "u64", "bool": "i1",
    "float8_e4m3fn": "f8E4M3FN", "float8_e5m2": "f8E5M2", "int4": "i4", "uint4": "u4",
}
_LONG = {v: k for k, v in _SHORT.items()}
DTYPES = tuple(_SHORT)
FLOAT_DTYPES = ("float32", "float16", "bfloat16", "float64")
INT_RANGES = {"int8": (-128, 127), "uint8": (0, 255), "int16": (-32768, 32767),
              "uint16": (0, 65535), "int32": (-2**31, 2**31 - 1), "int4": (-8, 7), "uint4": (0, 15)}
INT4 = ("int4", "uint4")
"""The 4-bit storage types: numpy holds them one per byte (:func:`np_dtype`), the artifact two per byte."""
SCALE_DTYPES = ("float32", "float16")
FP8_MAX = {"float8_e4m3fn": 448.0, "float8_e5m2": 57344.0}
"""The float8 storage types (numpy: ml_dtypes) and their largest finite value, where quantization saturates."""
QUANT_STORAGE = tuple(INT_RANGES) + tuple(FP8_MAX)


def is_fp8(dtype: str | None) -> bool:
    return dtype in FP8_MAX


def storage_range(storage: str) -> tuple[float, float]:
    """The stored values' range: the integers of INT_RANGES, or [-max, max] of a float8 type."""
    if storage in FP8_MAX:
        return -FP8_MAX[storage], FP8_MAX[storage]
    return INT_RANGES[storage]


def short_dtype(dtype: str) -> str:
    return _SHORT[dtype]


def long_dtype(short: str) -> str:
    try:
        return _LONG[short]
    except KeyError:
        raise ValueError(f"unknown element type '{short}' (known: {', '.join(_LONG)})") from None


def np_dtype(dtype: str):
    if dtype in INT4:                     # one value per byte in numpy (ml_dtypes' int4 does not sign-extend its bytes)
        return np.dtype("int8" if dtype == "int4" else "uint8")
    if dtype == "bfloat16" or dtype in FP8_MAX:
        import ml_dtypes
        return np.dtype(getattr(ml_dtypes, dtype))
    return np.dtype(dtype)


def dtype_of_array(a: np.ndarray) -> str:
    name = a.dtype.name
    if name not in _SHORT:
        raise ValueError(f"unsupported array dtype {name}")
    return name


def f32(x: float) -> float:
    """Round a Python float to the nearest float32 (scales are stored as float32, like ONNX)."""
    return float(np.float32(x))


@dataclass(frozen=True)
class QuantParams:
    """Uniform affine quantization: real = scale * (stored - zero_point).

    ``axis`` is None for per-tensor parameters (one scale, one zero point) or the channel axis
    for per-channel parameters (one scale and zero point per index along that axis); with
    ``block_size`` B > 0, one per block of B indices along ``axis`` and per index of every other
    axis (see the module docstring: scales [.., ceil(D/B), ..], flat, row-major).
    """
    storage: str                      # stored dtype: int8, uint8, int16, int32, int4, uint4, float8_e4m3fn, float8_e5m2
    scale: tuple[float, ...]
    zero_point: tuple[int, ...]
    axis: int | None = None
    expressed: str = "float32"        # the float type the integers stand for
    block_size: int = 0               # > 0: blocked along ``axis`` (ONNX opset 21 DequantizeLinear)
    scale_dtype: str = "float32"      # float16: every scale is a float16 value

    def __post_init__(self):
        sc = np.asarray(self.scale, np.float64).reshape(-1).astype(np.float32)
        zp = np.asarray(self.zero_point, np.float64).reshape(-1)
        object.__setattr__(self, "scale", tuple(sc.tolist()))
        object.__setattr__(self, "zero_point", tuple(int(z) for z in zp.tolist()))
        object.__setattr__(self, "block_size", int(self.block_size or 0))
        if self.storage not in QUANT_STORAGE:
            raise ValueError(f"illegal quantized storage type '{self.storage}'")
        if self.expressed not in FLOAT_DTYPES:
            raise ValueError(f"illegal expressed type '{self.expressed}'")
        if len(self.scale) == 0 or len(self.scale) != len(self.zero_point):
            raise ValueError("quant params need as many zero points as scales (at least one)")
        if self.axis is None and len(self.scale) != 1:
            raise ValueError("per-tensor quant params take exactly one scale")
        if self.block_size < 0 or (self.block_size and self.axis is None):
            raise ValueError(f"blocked quant params need an axis and a block size > 0, got block {self.block_size}")
        if self.block_size and (self.storage in FP8_MAX or self.storage == "int32"):
            raise ValueError(f"blocked quantization stores integers of 4 to 16 bits, not {self.storage}")
        if self.scale_dtype not in SCALE_DTYPES:
            raise ValueError(f"illegal scale dtype '{self.scale_dtype}' (known: {', '.join(SCALE_DTYPES)})")
        lo, hi = storage_range(self.storage)
        if self.storage in FP8_MAX:
            lo = hi = 0                   # float8 quantization is scale only
        bad = ~(np.isfinite(sc) & ((sc != 0) if self.blocked else (sc > 0)))
        if bad.any():
            raise ValueError(f"quant scale must be finite and {'non-zero' if self.blocked else '> 0'}, "
                             f"got {float(sc[bad][0])}")
        if self.scale_dtype == "float16" and not np.array_equal(sc.astype(np.float16).astype(np.float32), sc):
            s = float(sc[sc.astype(np.float16).astype(np.float32) != sc][0])
            raise ValueError(f"scale {s} is not a float16 value (scale dtype float16)")
        out = (zp < lo) | (zp > hi)
        if out.any():
            z = int(zp[out][0])
            raise ValueError(f"zero point {z} outside the {self.storage} range [{lo}, {hi}]"
                             if self.storage not in FP8_MAX else f"{self.storage} quantization takes zero point 0, got {z}")

    @property
    def per_channel(self) -> bool:
        return self.axis is not None

    @property
    def blocked(self) -> bool:
        return self.block_size > 0

    def scale_shape(self, shape: tuple[int, ...]) -> tuple[int, ...]:
        """The shape of the scale tensor for a value of ``shape``: () per tensor, (D_axis,) per
        channel, ``shape`` with D_axis -> ceil(D_axis / B) blocked."""
        if self.axis is None:
            return ()
        ax = self.axis % len(shape)
        if not self.blocked:
            return (shape[ax],)
        return tuple(-(-d // self.block_size) if i == ax else d for i, d in enumerate(shape))

    def check_shape(self, shape: tuple[int, ...]) -> str | None:
        """Return a message if these parameters do not fit a tensor of ``shape``."""
        if self.axis is None:
            return None
        if not -len(shape) <= self.axis < len(shape):
            return f"quant axis {self.axis} out of range for rank {len(shape)}"
        n = int(np.prod(self.scale_shape(shape), dtype=np.int64))
        if n != len(self.scale):
            if self.blocked:
                return (f"blocks of {self.block_size} along axis {self.axis} of {tuple(shape)} need "
                        f"{n} scales ({'x'.join(map(str, self.scale_shape(shape)))}), got {len(self.scale)}")
            return f"quant axis {self.axis} has {shape[self.axis]} channels but {len(self.scale)} scales"
        return None

    def scale_array(self) -> np.ndarray:
        return np.asarray(self.scale, np.float32)

    def zero_point_array(self) -> np.ndarray:
        return np.asarray(self.zero_point, np_dtype(self.storage))

    def element_params(self, shape: tuple[int, ...]) -> tuple[np.ndarray, np.ndarray]:
        """(scale float32, zero point int64) of every element of a value of ``shape``, broadcastable
        against it (per element for blocked params, the last block cut to the dim)."""
        ndim = len(shape)
        s, z = self.scale_array(), np.asarray(self.zero_point, np.int64)
        if self.axis is None:
            return s.reshape(()), z.reshape(())
        ax = self.axis % ndim
        if not self.blocked:
            b = [1] * ndim
            b[ax] = -1
            return s.reshape(b), z.reshape(b)
        sh = self.scale_shape(shape)
        idx = np.arange(shape[ax]) // self.block_size
        return np.take(s.reshape(sh), idx, axis=ax), np.take(z.reshape(sh), idx, axis=ax)

    def __str__(self) -> str:
        head = f"{short_dtype(self.storage)}:{short_dtype(self.expressed)}"
        pairs = [f"{_fmt_float(s)}" if self.storage in FP8_MAX else f"{_fmt_float(s)}:{z}"   # float8: scale only
                 for s, z in zip(self.scale, self.zero_point)]
        if self.axis is None:
            return f"!quant.uniform<{head}, {pairs[0]}>"
        scales = f"scales {short_dtype(self.scale_dtype)}, " if self.scale_dtype != "float32" else ""
        where = f"{{{self.axis}:{self.block_size}}}" if self.blocked else str(self.axis)
        return f"!quant.uniform<{head}:{where}, {scales}{{{', '.join(pairs)}}}>"


def _fmt_float(x: float) -> str:
    """Shortest text that parses back to the same float32."""
    return np.format_float_positional(np.float32(x), unique=True, trim="-") \
        if 1e-4 <= abs(x) < 1e6 or x == 0 else np.format_float_scientific(np.float32(x), unique=True, trim="-")


@dataclass(frozen=True)
class TensorType:
    """A statically shaped tensor type. ``dtype`` is the element type as stored (for a quantized
    value, the integer storage type, which must equal ``quant.storage``)."""
    shape: tuple[int, ...]
    dtype: str
    quant: QuantParams | None = None

    def __post_init__(self):
        object.__setattr__(self, "shape", tuple(int(d) for d in self.shape))
        if self.dtype not in _SHORT:
            raise ValueError(f"unknown dtype '{self.dtype}'")
        if any(d < 0 for d in self.shape):
            raise ValueError(f"negative dimension in shape {self.shape}")
        if self.quant is not None:
            if self.quant.storage != self.dtype:
                raise ValueError(f"quantized type stores {self.quant.storage} but element dtype is {self.dtype}")
            msg = self.quant.check_shape(self.shape)
            if msg:
                raise ValueError(msg)

    def __hash__(self) -> int:
        # the dataclass hash, computed once: types key the inference cache (qcompiler.ir.ops),
        # hashed for every op at creation and by every verify
        h = self.__dict__.get("_hash")
        if h is None:
            h = hash((self.shape, self.dtype, self.quant))
            object.__setattr__(self, "_hash", h)
        return h

    def __getstate__(self) -> dict:
        # not the cached hash: str hashes differ from one process to the next
        return {k: v for k, v in self.__dict__.items() if k != "_hash"}

    @property
    def rank(self) -> int:
        return len(self.shape)

    @property
    def size(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64))

    @property
    def nbytes(self) -> int:
        """Bytes as stored: 4-bit values two per byte (the artifact's and ONNX's packing)."""
        if self.dtype in INT4:
            return (self.size + 1) // 2
        return self.size * np_dtype(self.dtype).itemsize

    @property
    def stored_bytes(self) -> int:
        """:attr:`nbytes` plus, for blocked quantization, its scales (2 or 4 bytes each) and zero
        points (4-bit ones two per byte; none for int4, whose zero points are 0): what a constant of
        this type takes in the artifact."""
        q = self.quant
        if q is None or not q.blocked:
            return self.nbytes
        zps = 0 if q.storage == "int4" else (len(q.zero_point) + 1) // 2 if self.dtype in INT4 else len(q.zero_point)
        return self.nbytes + len(q.scale) * (2 if q.scale_dtype == "float16" else 4) + zps

    def with_shape(self, shape) -> "TensorType":
        return TensorType(tuple(shape), self.dtype, None)

    def with_dtype(self, dtype: str) -> "TensorType":
        return TensorType(self.shape, dtype, None)

    def with_quant(self, quant: QuantParams | None) -> "TensorType":
        return TensorType(self.shape, quant.storage if quant else self.dtype, quant)

    def __str__(self) -> str:
        dims = "".join(f"{d}x" for d in self.shape)
        elem = str(self.quant) if self.quant else short_dtype(self.dtype)
        return f"tensor<{dims}{elem}>"

    @staticmethod
    def of(a: np.ndarray) -> "TensorType":
        return TensorType(tuple(a.shape), dtype_of_array(a))


# ---- the reference quantizer: ONNX QuantizeLinear / DequantizeLinear of a QuantParams ----------
# q = saturate(round_half_to_even(x / scale) + zero_point), the division in float32 as ONNX Runtime
# computes it (bit-exact with it); int32 (bias) in float64, as ONNX has no int32 QuantizeLinear.
def quantize(x: np.ndarray, qp: QuantParams) -> np.ndarray:
    """ONNX QuantizeLinear: saturate(round_half_to_even(x / scale) + zero_point); for float8 storage
    (opset 19, ``saturate=1``) the float32 quotient clipped to [-max, max] and rounded to the nearest
    float8 value, ties to even (NaN stays NaN): bit-exact with ONNX Runtime 1.32 on every float8
    rounding boundary (tests/quant/test_fp8.py)."""
    x = np.asarray(x)
    if qp.per_channel and (msg := qp.check_shape(x.shape)):
        raise ValueError(msg)
    scale, zp = qp.element_params(x.shape)
    if qp.storage in FP8_MAX:
        return round_fp8(x.astype(np.float32) / scale, qp.storage)
    lo, hi = INT_RANGES[qp.storage]
    ftype = np.float64 if qp.storage == "int32" else np.float32
    scale, zp = scale.astype(ftype), zp.astype(ftype)
    with np.errstate(over="ignore", invalid="ignore"):
        y = np.rint(x.astype(ftype) / scale) + zp
    return np.clip(np.nan_to_num(y, nan=0.0), lo, hi).astype(np_dtype(qp.storage))


def dequantize(q: np.ndarray, qp: QuantParams) -> np.ndarray:
    """ONNX DequantizeLinear: (q - zero_point) * scale, in float32."""
    q = np.asarray(q)
    if qp.per_channel and (msg := qp.check_shape(q.shape)):
        raise ValueError(msg)
    scale, zp = qp.element_params(q.shape)
    if qp.storage in FP8_MAX:                  # f32(q) * scale: the float8 value is exact in float32
        q = q.view(np_dtype(qp.storage)) if q.dtype == np.uint8 else q.astype(np_dtype(qp.storage), copy=False)
        return q.astype(np.float32) * scale
    return (q.astype(np.int64) - zp).astype(np.float32) * scale


def round_fp8(x: np.ndarray, storage: str) -> np.ndarray:
    """float32 ``x`` as the nearest ``storage`` float8 value, ties to even, saturating at +-max (inf
    included; NaN stays NaN). ml_dtypes' cast rounds to nearest even but does not saturate (e4m3fn:
    above 464 becomes NaN; e5m2: from 61440 inf), hence the clip first: clipping to the largest finite
    value and then rounding is rounding and then saturating, that value being representable."""
    m = np.float32(FP8_MAX[storage])
    with np.errstate(invalid="ignore"):
        return np.clip(np.asarray(x, np.float32), -m, m).astype(np_dtype(storage))
