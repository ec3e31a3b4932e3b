"""Compile progress: the stages qcompile reports (passes, lower N kernels, tvm.compile, link) and
the one-line terminal display, which draws nothing off a terminal or with -q."""
from __future__ import annotations

import io

from conftest import tiny_graph

from qcompiler.codegen.artifact import write_artifact
from qcompiler.codegen.target import TargetSpec
from qcompiler.passes import run_passes
from qcompiler.progress import StageLine, listening, report


class Tty(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_no_listener_is_a_no_op():
    report("lower", 1, 2)                                  # nothing listens: nothing happens


def test_compile_reports_passes_kernels_build_and_link(tmp_path):
    seen: list[tuple[str, int, int | None]] = []
    g = tiny_graph()
    with listening(lambda *a: seen.append(a)):
        run_passes(g, "default")
        write_artifact(g, TargetSpec("x86"), tmp_path / "OUT")
    stages = list(dict.fromkeys(s for s, _, _ in seen))
    passes = [s for s in stages if s.startswith("pass ")]
    assert len(passes) >= 3 and stages[len(passes):] == ["lower", "tvm.compile", "link"]
    lowered = [(d, t) for s, d, t in seen if s == "lower"]
    assert [d for d, _ in lowered] == list(range(1, lowered[0][1] + 1))   # every kernel group, in order
    assert (tmp_path / "OUT" / "model.so").exists()


def test_stage_line_draws_on_a_terminal_and_erases_itself():
    out = Tty()
    with StageLine("compile", stream=out, interval=0.0) as line:
        line("lower", 1, 4)
        line("lower", 4, 4)
        line("tvm.compile", 0, None)
    text = out.getvalue()
    assert "\rcompile: lower 1/4 [#####               ]" in text
    assert "\rcompile: lower 4/4 [####################]" in text
    assert "\rcompile: tvm.compile " in text
    assert text.endswith("\r")                               # the line is cleared at the end
    assert StageLine.line("link", 0, None, 2.04) == "compile: link 2.0 s"


def test_stage_line_is_silent_off_a_terminal_and_when_quiet():
    for stream, quiet in ((io.StringIO(), False), (Tty(), True)):
        with StageLine(stream=stream, quiet=quiet, interval=0.0) as line:
            line("lower", 1, 1)
        assert stream.getvalue() == ""
