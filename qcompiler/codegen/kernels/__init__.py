"""TE computes of the x86 code generator, written in logical coordinates (see tensor.py)."""
