"""Einsum, lowered at import to Transpose / ReduceSum / Reshape / MatMul / Mul (no Einsum op in
the IR): the common equations against onnxruntime, through the interpreter and an x86 build."""
from __future__ import annotations

import numpy as np
import pytest

from opcases import Case, check_case

RNG = np.random.default_rng(3)


def r(*shape):
    return RNG.uniform(-1, 1, shape).astype(np.float32)


EQUATIONS = [
    ("bij,bjk->bik", [(2, 3, 4), (2, 4, 5)]),
    ("bhqd,bhkd->bhqk", [(1, 2, 5, 8), (1, 2, 6, 8)]),
    ("bhqk,bhkd->bhqd", [(1, 2, 5, 6), (1, 2, 6, 8)]),
    ("ij,jk", [(3, 4), (4, 5)]),
    ("ij,jk->ik", [(3, 4), (4, 5)]),
    ("ij->ji", [(3, 4)]),
    ("i,i->", [(7,), (7,)]),
    ("i,j->ij", [(3,), (4,)]),
    ("ij,ij->ij", [(3, 4), (3, 4)]),
    ("ij->i", [(3, 4)]),
    ("ij->", [(3, 4)]),
    ("bid,bjd->bij", [(2, 3, 4), (2, 5, 4)]),
    ("bnd,dk->bnk", [(2, 3, 4), (4, 6)]),
    ("...ij,...jk->...ik", [(2, 3, 4, 5), (2, 3, 5, 2)]),
    ("bij,jk->bki", [(2, 3, 4), (4, 5)]),
    ("ijk,ikl,lm->jm", [(2, 3, 4), (2, 4, 5), (5, 3)]),
    ("bhwc,co->bhwo", [(1, 3, 4, 5), (5, 6)]),
    ("bi,bi->b", [(4, 8), (4, 8)]),
]


@pytest.mark.parametrize("eq,shapes", EQUATIONS, ids=[e for e, _ in EQUATIONS])
def test_einsum_matches_onnxruntime(eq, shapes):
    names = [f"x{i}" for i in range(len(shapes))]
    # the first operand is a run-time input, the others weights (Einsum of constants folds)
    c = Case(f"einsum {eq}", "Einsum", {names[0]: r(*shapes[0])}, {n: r(*s) for n, s in zip(names[1:], shapes[1:])},
             attrs={"equation": eq}, opset=13, tol=1e-5)
    check_case(c)


def test_einsum_two_inputs_is_one_matmul():
    """The attention form becomes one Transpose and one MatMul: no Einsum, no extra reshapes."""
    from qcompiler.frontend.onnx_import import import_onnx
    c = Case("qk", "Einsum", {"q": r(1, 2, 5, 8), "k": r(1, 2, 6, 8)}, attrs={"equation": "bhqd,bhkd->bhqk"})
    g = import_onnx(c.model())
    assert sorted(op.kind for op in g.ops) == ["MatMul", "Transpose"]
    check_case(c)


def test_einsum_diagonal_is_a_clear_error():
    from qcompiler.errors import UserError
    from qcompiler.frontend.onnx_import import import_onnx
    c = Case("diag", "Einsum", {"x": r(3, 3)}, attrs={"equation": "ii->i"})
    with pytest.raises(UserError, match="diagonal"):
        import_onnx(c.model())
