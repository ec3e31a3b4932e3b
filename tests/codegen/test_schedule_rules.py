"""codegen/schedule.py and the targets' rule tables: the first rule that applies schedules a kernel;
``TargetSpec.family`` is a :class:`Family` that still reads as its string; the code generator's
modules import one another without cycles."""
from __future__ import annotations

import ast
import dataclasses
import json
from pathlib import Path

import pytest

from qcompiler.codegen.arm import rules as arm_rules
from qcompiler.codegen.cuda import rules as cuda_rules
from qcompiler.codegen.lower import SCHEDULE_RULES, Lowering
from qcompiler.codegen.schedule import Kernel, Rule, apply_rules
from qcompiler.codegen.target import Family, TargetSpec
from qcompiler.codegen.x86 import rules as x86_rules
from qcompiler.errors import UserError
from qcompiler.ir import Graph

CODEGEN = Path(__file__).resolve().parents[2] / "qcompiler" / "codegen"


def test_family_is_an_enum_that_reads_as_its_string():
    spec = TargetSpec("cuda", dtype="bf16")
    assert spec.family is Family.CUDA and spec.family == "cuda" and f"{spec.family}" == "cuda"
    assert json.dumps({"family": spec.family}) == '{"family": "cuda"}'
    assert TargetSpec(Family.ARM) == TargetSpec("arm") and hash(TargetSpec(Family.ARM)) == hash(TargetSpec("arm"))
    assert dataclasses.replace(spec, family="x86", dtype="fp32").family is Family.X86
    with pytest.raises(UserError, match="unknown target 'riscv'"):
        TargetSpec("riscv")
    with pytest.raises(UserError, match="bf16 is supported on CUDA only"):
        TargetSpec(Family.X86, dtype="bf16")


def test_first_rule_that_applies_wins():
    seen = []

    def rule(name, result):
        return Rule(name, lambda k, spec: seen.append(name) or result)
    k = Kernel(func="f", kind="conv2d")
    assert apply_rules([rule("a", None), rule("b", "scheduled b"), rule("c", "scheduled c")], k, TargetSpec()) \
        == "scheduled b"
    assert seen == ["a", "b"]
    assert apply_rules([rule("d", None)], k, TargetSpec()) == "f"        # none applies: unscheduled


def test_rule_tables():
    names = {f: [r.name for r in rules] for f, rules in SCHEDULE_RULES.items()}
    assert names == {Family.X86: ["sparse", "hand"], Family.ARM: ["sparse", "hand"],
                     Family.CUDA: ["sparse", "wmma-int8", "mma-fp8", "direct"]}
    assert arm_rules.RULES is x86_rules.RULES
    assert Lowering(Graph("g"), TargetSpec("cuda"), gpu_schedules=False).rules == cuda_rules.BY_CONSTRUCTION
    assert Lowering(Graph("g"), TargetSpec("x86", cpu="znver3"), gpu_schedules=False).rules == x86_rules.RULES


def _imports(path: Path, module: str) -> set[str]:
    """The codegen modules ``path`` imports, at module level or inside functions."""
    package = module if path.name == "__init__.py" else module.rsplit(".", 1)[0]
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            base = package
            for _ in range(node.level - 1):
                base = base.rsplit(".", 1)[0]
            base = (base + "." + node.module if node.module else base) if node.level else node.module
            out |= {f"{base}.{a.name}" for a in node.names} | {base}
        elif isinstance(node, ast.Import):
            out |= {a.name for a in node.names}
    return out


def test_codegen_modules_import_without_cycles():
    mods = {}
    for p in CODEGEN.rglob("*.py"):
        name = ".".join(("qcompiler", "codegen", *p.relative_to(CODEGEN).with_suffix("").parts))
        mods[name.removesuffix(".__init__")] = p
    graph = {m: {t for t in _imports(p, m) if t in mods and t != m and not mods[t].name == "__init__.py"}
             for m, p in mods.items()}
    state: dict[str, int] = {}

    def visit(m, path):
        state[m] = 1
        for t in sorted(graph[m]):
            assert state.get(t) != 1, f"import cycle: {' -> '.join(path + [t])}"
            if t not in state:
                visit(t, path + [t])
        state[m] = 2
    for m in sorted(graph):
        if m not in state:
            visit(m, [m])
