"""Compile progress: the stages of ``qcompile compile`` (passes, sensitivity N layers, layer sets
evaluated by the selection, lower N kernels, tvm.compile, link, write) reported to whoever
listens, as one line on a terminal (calibration has its own bar).

The codegen calls :func:`report` at each step; it costs nothing when nobody listens. The CLI
listens with a :class:`StageLine` for the length of a compile (``with listening(line): ...``)::

    compile: lower 41/58 [##############      ] 3.1 s

Like the calibration bar (:class:`qcompiler.quant.data.Progress`), the line is drawn only on a
terminal, redrawn in place at most every 0.2 s, and not at all with ``-q``; each finished stage
leaves no trace but its time, which ``--time-passes`` and the report hold anyway.
"""
from __future__ import annotations

import sys
import time
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Callable, Iterator

Listener = Callable[[str, int, "int | None"], None]
_listener: ContextVar[Listener | None] = ContextVar("qcompiler_progress", default=None)


def report(stage: str, done: int = 0, total: int | None = None) -> None:
    """Stage ``stage`` has done ``done`` of ``total`` steps (total None: one step, no count)."""
    fn = _listener.get()
    if fn is not None:
        fn(stage, done, total)


def erase() -> None:
    """Clear the listener's line, if it draws one, before other text goes to the terminal (the
    next :func:`report` draws it again)."""
    fn = _listener.get()
    if fn is not None and hasattr(fn, "erase"):
        fn.erase()


@contextmanager
def listening(fn: Listener) -> Iterator[Listener]:
    """Send every :func:`report` made inside the ``with`` block to ``fn``."""
    token = _listener.set(fn)
    try:
        yield fn
    finally:
        _listener.reset(token)


class StageLine:
    """A listener drawing ``<desc>: <stage> done/total [bar] elapsed`` on a terminal stream."""

    def __init__(self, desc: str = "compile", *, quiet: bool = False, stream=None, interval: float = 0.2):
        self.desc, self.interval = desc, interval
        self.stream = stream if stream is not None else sys.stderr
        self.quiet = quiet or not bool(getattr(self.stream, "isatty", lambda: False)())
        self.stages: list[str] = []          # in the order first seen
        self._start = time.monotonic()
        self._last = -1e9
        self._width = 0

    def __call__(self, stage: str, done: int, total: int | None) -> None:
        if not self.stages or self.stages[-1] != stage:
            self.stages.append(stage)
            self._last = -1e9                # a new stage is drawn at once
        now = time.monotonic()
        if self.quiet or (now - self._last < self.interval and not (total and done >= total)):
            return
        self._last = now
        self._draw(self.line(stage, done, total, now - self._start, self.desc))

    @staticmethod
    def line(stage: str, done: int, total: int | None, elapsed: float, desc: str = "compile") -> str:
        if total:
            filled = int(20 * min(done, total) / total)
            return f"{desc}: {stage} {done}/{total} [{'#' * filled}{' ' * (20 - filled)}] {elapsed:.1f} s"
        return f"{desc}: {stage}{f' {done}' if done else ''} {elapsed:.1f} s"

    def _draw(self, text: str) -> None:
        pad = max(0, self._width - len(text))
        self._width = len(text)
        self.stream.write("\r" + text + " " * pad)
        self.stream.flush()

    def erase(self) -> None:
        """Clear the line (log messages print on a clean line; the next update redraws)."""
        if not self.quiet and self._width:
            self.stream.write("\r" + " " * self._width + "\r")
            self.stream.flush()
            self._width = 0
            self._last = -1e9

    def close(self) -> None:
        """Erase the line (the compile's own summary follows)."""
        self.erase()
        self.quiet = True

    def __enter__(self) -> "StageLine":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
