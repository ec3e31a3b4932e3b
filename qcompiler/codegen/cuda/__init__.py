"""CUDA: ahead-of-time device code (nvcc, the driver stub), the int8 tensor-core and direct
schedules, and the CUDA-only int8 kernels (s8 x s8 GEMMs)."""
