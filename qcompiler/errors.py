"""The one exception type for problems with what the user gave us.

The CLI prints it as a single line on stderr, ``qcompile: error: <where>: <what>. <fix>``, and
exits with code 2. Everything else that escapes is a bug in qcompiler (exit code 1)."""
from __future__ import annotations


class UserError(Exception):
    """Bad input: a model, a flag, a data file or an output path. Say what, where and how to fix."""

    def __init__(self, what: str, where: str | None = None, fix: str | None = None):
        super().__init__(what)
        self.what, self.where, self.fix = what, where, fix

    def __str__(self) -> str:
        s = f"{self.where}: {self.what}" if self.where else self.what
        if self.fix:
            s += f" ({self.fix})" if not self.fix[0].isupper() else f". {self.fix}"
        return s.replace("\n", " ")
