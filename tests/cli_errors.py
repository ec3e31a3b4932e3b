"""The check of a refused ``qcompile compile``: exit code 2, one line ``qcompile: error: ...`` saying
``msg``, no traceback, nothing written (the tables of bad flags in test_sparse_cli.py and
test_weights_cli.py use it)."""
from __future__ import annotations

import os

from qcompiler.cli import main


def assert_refused(tmp_path, capsys, model: str, argv: list[str], msg: str) -> None:
    out = tmp_path / "out"
    code = main(["compile", model, "-o", str(out), "-q", *argv])
    err = capsys.readouterr().err
    assert code == 2, err
    assert err.count("\n") == 1 and err.startswith("qcompile: error: ") and msg in err, err
    assert not out.exists() and os.listdir(tmp_path) == []
