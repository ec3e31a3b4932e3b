"""Every shell and Python example in README.md and docs/ runs (issue #34).

The fenced code blocks of each markdown file are read in order. ```bash / ```sh / ```console blocks
run in bash (a ```console block: its ``$ `` lines), ```python blocks in a subprocess of this Python,
all of one file in one temporary folder, in order (a later block may use what an earlier one
wrote, as a reader following the page would). The folder has the repository's ``models``,
``examples``, ``bench``, ``scripts``, ``tests``, ``zoo`` and ``.venv`` linked in, ``qcompile`` on PATH (the package's entry point,
run by this Python) and the repository on PYTHONPATH, so the examples use the files that ship in
the repository, never the network.

A benchmark or a tuning run of minutes runs as a smaller run of the same command: the line before
it says which arguments the test appends to each ``python``/``qcompile`` command of the block (the
scripts' argparse takes the last value of a repeated flag)::

    <!-- run-with: --models mnist --rounds 1 --iters 2 -->

A block that cannot run here at all (it needs a CUDA GPU; it is the test suite itself) carries
an HTML comment on the line before it::

    <!-- not-run: needs a CUDA GPU -->

and the reason must not be empty. Every other fence needs a language (```text for output or
syntax sketches), so that no example escapes by being untagged. A block may start servers in the
background (``cmd &``): the block runs in its own session, and whatever it left running is ended
with it.
"""
from __future__ import annotations

import os
import re
import shlex
import signal
import subprocess
import sys
import time
import tomllib
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
FILES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
SHELL = {"bash", "sh", "console"}
PYTHON = {"python"}
RUN = SHELL | PYTHON
LINKED = ("models", "examples", "bench", "scripts", "tests", "zoo", ".venv")
TIMEOUT_S = 180            # per block; the examples are meant to take < 60 s each on an idle 2-core machine

FENCE = re.compile(r"^(?P<indent> *)(?P<ticks>`{3,})(?P<lang>[^`\s]*)\s*$")
NOT_RUN = re.compile(r"^\s*<!--\s*not-run:(?P<reason>.*?)-->\s*$")
RUN_WITH = re.compile(r"^\s*<!--\s*run-with:(?P<args>.*?)-->\s*$")
COMMANDS = ("python ", ".venv/bin/python ", "qcompile ")   # the lines run-with appends to


@dataclass
class Block:
    path: Path
    line: int               # 1-based line of the opening fence
    lang: str
    code: str
    not_run: str | None     # the reason, when marked not-run
    run_with: str | None    # the arguments appended to each command, when marked run-with

    def where(self) -> str:
        return f"{self.path.relative_to(ROOT)}:{self.line}"


def blocks(path: Path) -> list[Block]:
    """The fenced code blocks of a markdown file, with the not-run reason of the line before each."""
    lines = path.read_text().splitlines()
    out, i = [], 0
    while i < len(lines):
        m = FENCE.match(lines[i])
        if not m:
            i += 1
            continue
        indent, ticks, lang = len(m["indent"]), m["ticks"], m["lang"].lower()
        prev = next((lines[j] for j in range(i - 1, -1, -1) if lines[j].strip()), "")
        nr, rw = NOT_RUN.match(prev), RUN_WITH.match(prev)
        body, j = [], i + 1
        while j < len(lines) and not re.match(rf"^ {{0,{indent}}}{ticks}`*\s*$", lines[j]):
            body.append(lines[j][indent:] if lines[j][:indent].strip() == "" else lines[j])
            j += 1
        assert j < len(lines), f"{path.relative_to(ROOT)}:{i + 1}: code block not closed"
        out.append(Block(path, i + 1, lang, "\n".join(body) + "\n", nr["reason"].strip() if nr else None,
                         rw["args"].strip() if rw else None))
        i = j + 1
    return out


ALL = [b for f in FILES for b in blocks(f)]


def test_every_example_runs_or_says_why():
    untagged = [b.where() for b in ALL if not b.lang]
    assert not untagged, f"fences without a language (use ```text for output or sketches): {untagged}"
    skipped = [b for b in ALL if b.not_run is not None]
    assert all(b.not_run for b in skipped), [b.where() for b in skipped if not b.not_run]
    assert all(b.lang in RUN for b in skipped), [b.where() for b in skipped if b.lang not in RUN]
    runnable = [b for b in ALL if b.lang in RUN and b.not_run is None]
    print(f"\n{len(runnable)} examples run, {len(skipped)} not run:")
    for b in skipped:
        print(f"  {b.where()}: {b.not_run}")
    assert len(runnable) >= 10
    assert all(b.lang in SHELL for b in ALL if b.run_with), [b.where() for b in ALL if b.run_with and b.lang not in SHELL]
    assert not [b.where() for b in ALL if b.run_with is not None and not b.run_with]
    # the README's two fresh-machine commands: the demo runs here, the suite is what .ci/run calls
    readme = [b for b in ALL if b.path.name == "README.md"]
    demo = next(b for b in readme if "bash scripts/demo.sh" in b.code)
    suite = next(b for b in readme if "bash scripts/test.sh" in b.code)
    assert demo.not_run is None and suite.not_run
    assert "bash scripts/test.sh" in (ROOT / ".ci" / "run").read_text()


def _wrappers(bin_dir: Path) -> None:
    bin_dir.mkdir()
    entry = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]["qcompile"]
    module, func = entry.split(":")
    scripts = {
        "qcompile": f'exec "{sys.executable}" -c "import sys; from {module} import {func}; '
                    f'sys.argv[0] = \'qcompile\'; sys.exit({func}())" "$@"',
        "python": f'exec "{sys.executable}" "$@"',
    }
    for name, body in scripts.items():
        p = bin_dir / name
        p.write_text(f"#!/bin/sh\n{body}\n")
        p.chmod(0o755)


def _console(code: str) -> str:
    return "\n".join(line[2:] for line in code.splitlines() if line.startswith("$ ")) + "\n"


def with_args(code: str, args: str) -> str:
    """``code`` with ``args`` appended to each ``python``/``qcompile`` command (continuation lines
    joined, a trailing ``# comment`` dropped); other lines unchanged."""
    out = []
    for line in code.replace("\\\n", " ").splitlines():
        if line.lstrip().startswith(COMMANDS):
            words = shlex.split(line, comments=True)
            line = shlex.join(words) + " " + args
        out.append(line)
    return "\n".join(out) + "\n"


def test_run_with_appends_to_each_command():
    code = ("python bench/x.py --models a,b --rounds 5   # 3 min\n"
            "qcompile m.onnx --tune 64 \\\n    -o out\n"
            "mkdir -p out\n")
    assert with_args(code, "--rounds 1") == ("python bench/x.py --models a,b --rounds 5 --rounds 1\n"
                                             "qcompile m.onnx --tune 64 -o out --rounds 1\n"
                                             "mkdir -p out\n")


def _run(cmd: list[str], cwd: Path, env: dict, logs: Path) -> subprocess.CompletedProcess:
    """Run ``cmd`` in a session of its own; end whatever it left running in the background. The
    output goes to files (a server left running would hold a pipe open)."""
    with open(logs.with_suffix(".out"), "w+") as fo, open(logs.with_suffix(".err"), "w+") as fe:
        p = subprocess.Popen(cmd, cwd=cwd, env=env, stdout=fo, stderr=fe, text=True, start_new_session=True)
        try:
            p.wait(timeout=TIMEOUT_S)
        finally:
            _end_session(p)
        fo.seek(0)
        fe.seek(0)
        return subprocess.CompletedProcess(cmd, p.returncode, fo.read(), fe.read())


def _end_session(p: subprocess.Popen) -> None:
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(p.pid, sig)
        except ProcessLookupError:
            break
        time.sleep(0.5)
    if p.returncode is None:
        p.kill()
        p.wait()


_RAN: set[tuple] = set()   # a block repeated in another file (README and getting-started share the demo) runs once


@pytest.mark.parametrize("path", [f for f in FILES if any(b.lang in RUN and b.not_run is None for b in blocks(f))],
                         ids=lambda f: str(f.relative_to(ROOT)))
def test_examples_run(path, tmp_path):
    work = tmp_path / "work"
    work.mkdir()
    for name in LINKED:
        if (ROOT / name).exists():
            (work / name).symlink_to(ROOT / name)
    _wrappers(tmp_path / "bin")
    env = dict(os.environ, PATH=f"{tmp_path / 'bin'}{os.pathsep}{os.environ.get('PATH', '')}",
               PYTHONPATH=os.pathsep.join([str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])]))
    timings = []
    for k, b in enumerate(blocks(path)):
        if b.lang not in RUN or b.not_run is not None or (b.lang, b.code, b.run_with) in _RAN:
            continue
        _RAN.add((b.lang, b.code, b.run_with))
        if b.lang in PYTHON:
            script = tmp_path / f"block{k}.py"
            script.write_text(b.code)
            cmd = [sys.executable, str(script)]
        else:
            code = _console(b.code) if b.lang == "console" else b.code
            cmd = ["bash", "-euo", "pipefail", "-c", with_args(code, b.run_with) if b.run_with else code]
        t0 = time.perf_counter()
        try:
            r = _run(cmd, work, env, tmp_path / f"block{k}")
        except subprocess.TimeoutExpired:
            pytest.fail(f"{b.where()}: example ran past {TIMEOUT_S} s:\n{b.code}")
        timings.append((b.where(), time.perf_counter() - t0))
        assert r.returncode == 0, (f"{b.where()}: example failed (exit code {r.returncode}):\n{b.code}\n"
                                   f"--- stdout\n{r.stdout[-3000:]}\n--- stderr\n{r.stderr[-3000:]}")
    print("".join(f"\n  {w}: {s:.1f} s" for w, s in timings))
