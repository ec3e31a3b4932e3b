"""The before/after example in each pass's docstring is true: parse Before, run the pass, get After."""
import importlib
import re
import textwrap

import pytest
from ir_check import assert_ir, run_ir

PASSES = {"const_fold": "const-fold", "dce": "dce", "cse": "cse", "simplify": "simplify", "fold_bn": "fold-bn",
          "fold_pad": "fold-pad", "crop_dead_taps": "crop-dead-taps", "fuse_act": "fuse-act", "expand_fused": "expand-fused",
          "relu6_to_relu": "relu6-to-relu", "equalize": "equalize", "fold_qdq": "fold-qdq",
          "quantize_dynamic": "quantize-dynamic", "quantize_weights": "quantize-weights"}   # absorb-bias, bias-correct need recorded BN statistics: tested in their own files


def example(doc: str, label: str) -> str:
    m = re.search(label + r"::\n\n((?:    .*\n|\n)+?)(?:\n\S|\Z)", doc + "\n")
    assert m, f"no '{label}::' example block"
    return textwrap.dedent(m.group(1))


@pytest.mark.parametrize("module", sorted(PASSES))
def test_docstring_example(module):
    doc = importlib.import_module(f"qcompiler.passes.{module}").__doc__
    assert_ir(run_ir(example(doc, "Before"), PASSES[module]), example(doc, "After"))
