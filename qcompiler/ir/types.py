"""Value types of the IR: shape, element dtype and, when quantized, the quantization parameters.

In the spirit of MLIR's ``quant.uniform`` type, quantization parameters are part of a value's
*type*: frozen, validated at construction, printed with the IR::

    tensor<1x8x28x28xf32>                                  a float tensor
    tensor<1x8x28x28x!quant.uniform<u8:f32, 0.0235:128>>   per-tensor affine uint8
    tensor<8x3x3x3x!quant.uniform<i8:f32:0, {0.01:0, 0.02:0, ...}>>   per-channel int8 along axis 0
    tensor<1x8x28x28x!quant.uniform<f8E4M3FN:f32, 0.0021>>            per-tensor float8 (E4M3, no inf; zero point 0)

A real value r is represented by the stored integer q through r = scale * (q - zero_point). Float8
storage (``float8_e4m3fn``: OCP E4M3, max 448, NaN but no inf; ``float8_e5m2``: max 57344, with inf)
holds the 8-bit float q itself, zero point 0: r = scale * q (ONNX opset 19's float8 QuantizeLinear).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

# short name <-> numpy dtype name. Short names follow MLIR (f32, i8, ...); i1 is bool.
_SHORT = {
    "float32": "f32", "float16": "f16", "bfloat16": "bf16", "float64": "f64",
    "int8": "i8", "uint8": "u8", "int16": "i16", "uint16": "u16",
    "int32": "i32", "uint32": "u32", "int64": "i64", "uint64": "u64", "bool": "i1",
    "float8_e4m3fn": "f8E4M3FN", "float8_e5m2": "f8E5M2",
}
_LONG = {v: k for k, v in _SHORT.items()}
DTYPES = tuple(_SHORT)
FLOAT_DTYPES = ("float32", "float16", "bfloat16", "float64")
INT_RANGES = {"int8": (-128, 127), "uint8": (0, 255), "int16": (-32768, 32767),
              "uint16": (0, 65535), "int32": (-2**31, 2**31 - 1)}
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
    for per-channel parameters (one scale and zero point per index along that axis).
    """
    storage: str                      # stored dtype: int8, uint8, int16, int32, float8_e4m3fn, float8_e5m2
    scale: tuple[float, ...]
    zero_point: tuple[int, ...]
    axis: int | None = None
    expressed: str = "float32"        # the float type the integers stand for

    def __post_init__(self):
        object.__setattr__(self, "scale", tuple(f32(s) for s in self.scale))
        object.__setattr__(self, "zero_point", tuple(int(z) for z in self.zero_point))
        if self.storage not in QUANT_STORAGE:
            raise ValueError(f"illegal quantized storage type '{self.storage}'")
        if self.expressed not in FLOAT_DTYPES:
            raise ValueError(f"illegal expressed type '{self.expressed}'")
        if len(self.scale) == 0 or len(self.scale) != len(self.zero_point):
            raise ValueError("quant params need as many zero points as scales (at least one)")
        if self.axis is None and len(self.scale) != 1:
            raise ValueError("per-tensor quant params take exactly one scale")
        lo, hi = storage_range(self.storage)
        if self.storage in FP8_MAX:
            lo = hi = 0                   # float8 quantization is scale only
        for s in self.scale:
            if not (np.isfinite(s) and s > 0):
                raise ValueError(f"quant scale must be finite and > 0, got {s}")
        for z in self.zero_point:
            if not lo <= z <= hi:
                raise ValueError(f"zero point {z} outside the {self.storage} range [{lo}, {hi}]"
                             if self.storage not in FP8_MAX else f"{self.storage} quantization takes zero point 0, got {z}")

    @property
    def per_channel(self) -> bool:
        return self.axis is not None

    def check_shape(self, shape: tuple[int, ...]) -> str | None:
        """Return a message if these parameters do not fit a tensor of ``shape``."""
        if self.axis is None:
            return None
        if not -len(shape) <= self.axis < len(shape):
            return f"quant axis {self.axis} out of range for rank {len(shape)}"
        n = shape[self.axis]
        if n != len(self.scale):
            return f"quant axis {self.axis} has {n} channels but {len(self.scale)} scales"
        return None

    def scale_array(self) -> np.ndarray:
        return np.asarray(self.scale, np.float32)

    def zero_point_array(self) -> np.ndarray:
        return np.asarray(self.zero_point, np_dtype(self.storage))

    def __str__(self) -> str:
        head = f"{short_dtype(self.storage)}:{short_dtype(self.expressed)}"
        pairs = [f"{_fmt_float(s)}" if self.storage in FP8_MAX else f"{_fmt_float(s)}:{z}"   # float8: scale only
                 for s, z in zip(self.scale, self.zero_point)]
        if self.axis is None:
            return f"!quant.uniform<{head}, {pairs[0]}>"
        return f"!quant.uniform<{head}:{self.axis}, {{{', '.join(pairs)}}}>"


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
        return self.size * np_dtype(self.dtype).itemsize

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
def _broadcast(values: np.ndarray, qp: QuantParams, ndim: int) -> np.ndarray:
    if qp.axis is None:
        return values.reshape(())
    shape = [1] * ndim
    shape[qp.axis % ndim] = values.size
    return values.reshape(shape)


def quantize(x: np.ndarray, qp: QuantParams) -> np.ndarray:
    """ONNX QuantizeLinear: saturate(round_half_to_even(x / scale) + zero_point); for float8 storage
    (opset 19, ``saturate=1``) the float32 quotient clipped to [-max, max] and rounded to the nearest
    float8 value, ties to even (NaN stays NaN): bit-exact with ONNX Runtime 1.32 on every float8
    rounding boundary (tests/quant/test_fp8.py)."""
    x = np.asarray(x)
    if qp.per_channel and (msg := qp.check_shape(x.shape)):
        raise ValueError(msg)
    if qp.storage in FP8_MAX:
        return round_fp8(x.astype(np.float32) / _broadcast(qp.scale_array(), qp, x.ndim), qp.storage)
    lo, hi = INT_RANGES[qp.storage]
    ftype = np.float64 if qp.storage == "int32" else np.float32
    scale = _broadcast(qp.scale_array().astype(ftype), qp, x.ndim)
    zp = _broadcast(np.asarray(qp.zero_point, ftype), qp, x.ndim)
    with np.errstate(over="ignore", invalid="ignore"):
        y = np.rint(x.astype(ftype) / scale) + zp
    return np.clip(np.nan_to_num(y, nan=0.0), lo, hi).astype(np_dtype(qp.storage))


def dequantize(q: np.ndarray, qp: QuantParams) -> np.ndarray:
    """ONNX DequantizeLinear: (q - zero_point) * scale, in float32."""
    q = np.asarray(q)
    if qp.per_channel and (msg := qp.check_shape(q.shape)):
        raise ValueError(msg)
    scale = _broadcast(qp.scale_array(), qp, q.ndim)
    if qp.storage in FP8_MAX:                  # f32(q) * scale: the float8 value is exact in float32
        q = q.view(np_dtype(qp.storage)) if q.dtype == np.uint8 else q.astype(np_dtype(qp.storage), copy=False)
        return q.astype(np.float32) * scale
    zp = _broadcast(np.asarray(qp.zero_point, np.int64), qp, q.ndim)
    return (q.astype(np.int64) - zp).astype(np.float32) * scale


def round_fp8(x: np.ndarray, storage: str) -> np.ndarray:
    """float32 ``x`` as the nearest ``storage`` float8 value, ties to even, saturating at +-max (inf
    included; NaN stays NaN). ml_dtypes' cast rounds to nearest even but does not saturate (e4m3fn:
    above 464 becomes NaN; e5m2: from 61440 inf), hence the clip first: clipping to the largest finite
    value and then rounding is rounding and then saturating, that value being representable."""
    m = np.float32(FP8_MAX[storage])
    with np.errstate(invalid="ignore"):
        return np.clip(np.asarray(x, np.float32), -m, m).astype(np_dtype(storage))
