"""Running an artifact compiled with dynamic input dims (``qcompile --dynamic S=1..512``).

The artifact holds one function per *bucket* (the model compiled at fixed sizes of its dynamic
dims; :mod:`qcompiler.driver.shapes`). A call reads each dynamic dim's size from the inputs (every
input with that dim must agree, and the size must lie in the compiled range), takes the smallest
bucket that holds every size, pads each input with zeros along its dynamic dims to the bucket's
sizes, runs that bucket's function, and slices the outputs back to the sizes given:

    model = load("OUT")                                 # --dynamic S=1..512, buckets 16..512
    (h,) = model(input_ids=ids, attention_mask=mask)    # ids: (1, 77) -> runs main_S128, h: (1, 77, 384)

The zeros are padding to an attention mask; the compiler checked that padding leaves the real
positions' results unchanged before it built the artifact.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np

from ..errors import UserError


@dataclass(frozen=True)
class Buckets:
    """The manifest's ``dynamic`` entry: each dim's range, and the function of each bucket."""
    dims: dict[str, tuple[int, int]]
    buckets: tuple[tuple[dict[str, int], str], ...]

    @staticmethod
    def from_json(d: dict[str, Any]) -> "Buckets":
        dims = {str(k): (int(v[0]), int(v[1])) for k, v in d["dims"].items()}
        buckets = tuple(({str(k): int(v) for k, v in b["sizes"].items()}, str(b["function"])) for b in d["buckets"])
        if not buckets or any(set(s) != set(dims) for s, _ in buckets):
            raise ValueError("dynamic.buckets")
        return Buckets(dims, buckets)

    def to_json(self) -> dict[str, Any]:
        return {"dims": {k: list(v) for k, v in self.dims.items()},
                "buckets": [{"sizes": dict(s), "function": f} for s, f in self.buckets]}

    def __str__(self) -> str:
        return ", ".join(f"{k}={lo}..{hi}" for k, (lo, hi) in self.dims.items())

    # ---- one call ----------------------------------------------------------------------------------
    def sizes(self, specs: Sequence, arrays: Sequence[np.ndarray], where: str) -> dict[str, int]:
        """Each dynamic dim's size in ``arrays`` (checked against ``specs`` and the ranges)."""
        sizes: dict[str, tuple[int, str]] = {}
        for spec, a in zip(specs, arrays):
            for i, d in enumerate(spec.shape):
                if not isinstance(d, str):
                    continue
                n = int(a.shape[i])
                lo, hi = self.dims[d]
                if not lo <= n <= hi:
                    raise UserError(f"input '{spec.name}' has {d} = {n} (dim {i}), outside the compiled range "
                                    f"{lo}..{hi}", where, f"give {lo} to {hi}, or compile with a wider --dynamic {d}=..")
                if d in sizes and sizes[d][0] != n:
                    raise UserError(f"inputs disagree on {d}: '{sizes[d][1]}' has {sizes[d][0]}, '{spec.name}' has {n}",
                                    where, f"give every input the same {d}")
                sizes[d] = (n, spec.name)
        return {k: n for k, (n, _) in sizes.items()}

    def pick(self, sizes: dict[str, int]) -> tuple[dict[str, int], str]:
        """The bucket with the least padded work that holds ``sizes``."""
        fits = [b for b in self.buckets if all(b[0][k] >= n for k, n in sizes.items())]
        return min(fits, key=lambda b: int(np.prod(list(b[0].values()), dtype=np.int64)))

    @staticmethod
    def pad(shape: Sequence[int | str], a: np.ndarray, bucket: dict[str, int]) -> np.ndarray:
        widths = [(0, bucket[d] - a.shape[i]) if isinstance(d, str) else (0, 0) for i, d in enumerate(shape)]
        return np.ascontiguousarray(np.pad(a, widths)) if any(w for _, w in widths) else a

    @staticmethod
    def unpad(shape: Sequence[int | str], a: np.ndarray, sizes: dict[str, int]) -> np.ndarray:
        if not any(isinstance(d, str) for d in shape):
            return a
        return np.ascontiguousarray(a[tuple(slice(0, sizes[d]) if isinstance(d, str) else slice(None) for d in shape)])


def shape_matches(shape: Sequence[int], want: Sequence[int | str]) -> bool:
    """``shape`` fits ``want``, where a dim name matches any size."""
    return len(shape) == len(want) and all(isinstance(w, str) or int(s) == w for s, w in zip(shape, want))
