"""Sparse weights: encodings of gemm/conv weight matrices (format.py) and the dense-vs-sparse cost model (cost.py)."""
