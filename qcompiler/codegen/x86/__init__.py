"""x86: the CPU hand schedules and their thread rule, the dot-product intrinsics (VNNI, vpmaddwd),
the x86-only int8 kernels (Winograd on vpmaddwd, the squeeze-excite multiply) and the CPU TIR
pipeline (stack tiles, work claiming). ARM reuses the schedules and the pipeline (:mod:`..arm`)."""
