"""qcompiler's typed SSA dataflow IR: types, graph, op registry, verifier, text form."""
from .types import QuantParams, TensorType
from .graph import Graph, IRError, Op, Value
from .ops import REGISTRY, InferError, infer_types, register_op
from . import quant_ops  # noqa: F401  (registers the quantized op kinds)
from . import nbits_ops  # noqa: F401  (registers the weight-only quantized op kinds)
from .printer import print_graph
from .parser import ParseError, parse_graph
from .verifier import collect_errors, verify

__all__ = ["Graph", "Op", "Value", "TensorType", "QuantParams", "IRError", "InferError", "ParseError",
           "REGISTRY", "register_op", "infer_types", "print_graph", "parse_graph", "verify", "collect_errors"]
