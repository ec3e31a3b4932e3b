"""The arm (aarch64) schedule rules: the CPU rules of :mod:`..x86.rules`, with 4-lane NEON vectors
(blocks of 4 channels) and, where the target has ``dotprod``, the ``sdot`` intrinsics the kernel
builders name (:mod:`.intrin`)."""
from __future__ import annotations

from ..x86.rules import RULES

__all__ = ["RULES"]
