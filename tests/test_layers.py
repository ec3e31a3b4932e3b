"""The package layers of qcompiler import one way: each module imports only from its own package or
from a layer below its own. The graph is read from the source with ``ast`` (every ``import`` and
``from ... import`` anywhere in a module, inside functions and ``if TYPE_CHECKING`` too; relative
imports resolved), so an import hidden in a function to dodge a cycle counts like any other.

Bottom to top (packages on one line are siblings: neither imports the other):

    errors, progress, version   no qcompiler imports
    ir                          types, graph, op registry, interpreter, text form
    frontend, runtime           ONNX import/export (QDQ export too); loading and running an artifact
    quant                       quantization maths: qparams, requant, observers, calibration, data,
                                the reference interpreter, the HardSwish epilogue
    sparse                      sparse weight formats and the dense-vs-sparse cost model
    passes                      the graph passes and the pass manager
    codegen                     lowering to TVM, kernels, schedules, artifacts
    plan                        planners that compile and time or evaluate (mixed precision,
                                sensitivity, selection, layer costs, DFQ recipe) and the reports
    verify                      qcompile verify: an artifact against ONNX Runtime
    driver                      the compile pipeline
    api                         the Python API
    qcompiler (its __init__)    the package's public names
    cli                         qcompile

A module whose package is not declared here fails the test: declare its layer.
"""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "qcompiler"
LAYERS: tuple[tuple[str, ...], ...] = (
    ("errors", "progress", "version"),
    ("ir",),
    ("frontend", "runtime"),
    ("quant",),
    ("sparse",),
    ("passes",),
    ("codegen",),
    ("plan",),
    ("verify",),
    ("driver",),
    ("api",),
    ("qcompiler",),
    ("cli",),
)
LEVEL = {pkg: i for i, layer in enumerate(LAYERS) for pkg in layer}
MAX_LINES = 600


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def unit(module: str) -> str:
    """The layer unit of a dotted module name: its subpackage or top-level module of qcompiler
    (``qcompiler`` itself for the package's ``__init__``)."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "qcompiler"


def is_module(dotted: str) -> bool:
    p = ROOT.joinpath(*dotted.split("."))
    return p.with_suffix(".py").is_file() or (p / "__init__.py").is_file()


def imports(path: Path, names: bool = False):
    """``(line, imported module)`` for every import of a qcompiler module in ``path``; with
    ``names``, ``(line, module, name)`` for each name a ``from ... import`` takes from a module."""
    mod = module_name(path)
    package = mod.split(".") if path.name == "__init__.py" else mod.split(".")[:-1]
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] == "qcompiler":
                    yield node.lineno, alias.name
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = ".".join(package[:len(package) - node.level + 1] + ([node.module] if node.module else []))
            else:
                base = node.module or ""
            if base.split(".")[0] != "qcompiler":
                continue
            for alias in node.names:                 # ``from pkg import module`` imports the module
                full = f"{base}.{alias.name}"
                if names:
                    if not is_module(full):
                        yield node.lineno, base, alias.name
                else:
                    yield node.lineno, full if is_module(full) else base


def sources() -> list[Path]:
    return sorted(PACKAGE.rglob("*.py"))


def test_the_package_graph_is_read():
    edges = [(p, m) for p in sources() for _, m in imports(p)]
    assert len(edges) > 300                          # the walk sees the imports (relative ones resolved)
    assert ("qcompiler.ir.graph" in {m for p, m in edges if p.name == "interp.py"})


def test_every_package_has_a_layer():
    missing = sorted({unit(module_name(p)) for p in sources()} - set(LEVEL))
    assert not missing, f"declare the layer of {', '.join(missing)} in tests/test_layers.py LAYERS"


def test_imports_run_down_the_layers():
    bad = []
    for path in sources():
        src = unit(module_name(path))
        for line, target in imports(path):
            dst = unit(target)
            if dst == src or dst not in LEVEL or src not in LEVEL:
                continue
            if LEVEL[dst] >= LEVEL[src]:
                how = "a sibling" if LEVEL[dst] == LEVEL[src] else "a higher layer"
                bad.append(f"{path.relative_to(ROOT)}:{line}: {src} -> {dst} ({target}: {how})")
    assert not bad, "imports that run up the layers:\n" + "\n".join(bad)


def test_no_private_names_across_packages():
    """A name another package uses is public: no ``from qcompiler.x import _name`` across packages."""
    bad = [f"{path.relative_to(ROOT)}:{line}: {target}.{name}"
           for path in sources() for line, target, name in imports(path, names=True)
           if name.startswith("_") and not name.startswith("__") and unit(target) != unit(module_name(path))]
    assert not bad, "private names imported from another package:\n" + "\n".join(bad)


@pytest.mark.parametrize("path", sources(), ids=lambda p: str(p.relative_to(PACKAGE)))
def test_module_is_short(path):
    n = len(path.read_text().splitlines())
    assert n <= MAX_LINES, f"{path.relative_to(ROOT)} has {n} lines (at most {MAX_LINES}): split it along a seam"
