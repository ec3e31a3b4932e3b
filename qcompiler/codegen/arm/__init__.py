"""arm (aarch64): the cross toolchain and emulation, the ``sdot`` intrinsics, and the schedule rules
(the CPU rules of :mod:`..x86` with 4-lane NEON vectors)."""
