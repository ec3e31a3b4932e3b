"""``qcompile --tune TRIALS``: MetaSchedule tuning of the float x86 kernels (qcompiler/codegen/tune.py).

mnistnet with --tune 16 into a fresh database: the trials are shared by the estimated work (sum of
shares == 16), records are written, the artifact matches ONNX Runtime (fp32: 1e-4 * max|ref|),
including a build that takes *every* tuned schedule (prefer_tuned), and a second compile with the
same database runs no trials and reuses the records. Bad values are one error line, exit code 2.
Cost on the 2-core host: ~40 s for TVM's import of its tensor intrinsics (once per process, in
MetaSchedule's TuneContext), ~10 s of trials, a few seconds per compile.
"""
from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest

from qcompiler.cli import main
from qcompiler.codegen import tune
from qcompiler.codegen.target import TargetSpec
from qcompiler.driver import CompileOptions, TuneOptions, compile
from realmodels import mnist_inputs, ort_run

MODEL = "models/mnistnet.onnx"
TRIALS = 16


def _feeds() -> np.ndarray:
    """4 real digits (random ones where the digits data set is missing), 1x1x28x28 each."""
    d = mnist_inputs(4)
    return d[0] if d is not None else np.random.default_rng(0).standard_normal((4, 1, 28, 28)).astype(np.float32)


def _check_artifact(out) -> None:
    """fp32: max error <= 1e-4 * max|ref| against ONNX Runtime on the original model, same top-1."""
    import onnx
    from qcompiler.runtime import load
    m = load(str(out))
    name = onnx.load(MODEL).graph.input[0].name
    for x in _feeds():
        (got,) = m(x[None])
        (ref,) = ort_run(MODEL, {name: x[None]})
        err = float(np.abs(got.astype(np.float64) - ref).max())
        assert err <= 1e-4 * float(np.abs(ref).max()), err
        assert got.argmax() == ref.argmax()


@pytest.fixture(scope="module")
def tuned(tmp_path_factory):
    """Two compiles with one database: (db, log of the first, log of the second, outs)."""
    root = tmp_path_factory.mktemp("tune")
    db = root / "db"
    logs, outs = [], []
    for i in range(2):
        out = root / f"out{i}"
        lines: list[str] = []
        compile(MODEL, out, CompileOptions(tune=TuneOptions(TRIALS, str(db))), log=lines.append)
        logs.append("\n".join(lines))
        outs.append(out)
    return db, logs, outs


def test_first_compile_tunes_and_writes_records(tuned):
    db, logs, outs = tuned
    assert f"tune: {TRIALS} new trials, reused 0 records" in logs[0], logs[0]
    index = json.loads((db / tune.INDEX).read_text())
    assert sum(e["trials"] for e in index.values()) == TRIALS            # the shares add up to TRIALS
    records = (db / "database_tuning_record.json").read_text().splitlines()
    assert len(records) == TRIALS                                        # one record per measured trial
    assert "kernels took the tuned schedule; summed kernel time" in logs[0]


def test_tuned_artifact_matches_ort(tuned):
    _check_artifact(tuned[2][0])


def test_second_compile_reuses_records_without_trials(tuned):
    db, logs, _ = tuned
    assert "tune: 0 new trials, reused" in logs[1], logs[1]
    reused = int(logs[1].split("reused ")[1].split(" records")[0])
    index = json.loads((db / tune.INDEX).read_text())
    assert reused == sum(1 for e in index.values() if e["trials"] > 0) > 0
    assert sum(e["trials"] for e in index.values()) == TRIALS            # no trial was added
    assert len((db / "database_tuning_record.json").read_text().splitlines()) == TRIALS


def test_every_tuned_schedule_matches_ort(tuned, tmp_path):
    """Take every tuned kernel (whatever its speed) from the same records: still ORT's numbers."""
    from qcompiler.codegen.artifact import write_artifact
    from qcompiler.frontend.onnx_import import import_onnx
    from qcompiler.passes import PassContext, PassManager, parse_pipeline
    db = tuned[0]
    spec = TargetSpec("x86")
    opts = dataclasses.replace(tune.check_options(TRIALS, str(db), spec), prefer_tuned=True)
    summaries = []
    g = import_onnx(MODEL)
    PassManager(parse_pipeline(None), ctx=PassContext(log=lambda m: None)).run(g)
    out = write_artifact(g, spec, tmp_path / "all_tuned", build=tune.build_fn(opts, summaries=summaries))
    (s,) = summaries
    assert s.trials_run == 0 and s.tuned and all(k.rel_diff <= 1e-5 for k in s.tuned)
    _check_artifact(out)


def test_allocate_is_largest_remainder():
    assert tune.allocate(16, [185817.6, 20102.4, 17786.6, 1254.4, 784.0, 627.2, 66.5]) == [13, 2, 1, 0, 0, 0, 0]
    assert sum(tune.allocate(7, [1, 1, 1])) == 7 and tune.allocate(7, [1, 1, 1]) == [3, 2, 2]
    assert tune.allocate(3, []) == []


@pytest.mark.parametrize("extra, needle", [
    (["--tune", "0"], "--tune needs a positive number of trials, got 0"),
    (["--tune", "-3"], "--tune needs a positive number of trials, got -3"),
    (["--tune", "8", "--target", "cuda"], "runs for --target x86 only"),
    (["--tune", "8", "--tune-db", "/proc/qcompiler-tune-db"], "cannot write the tuning database"),
    (["--tune-db", "/tmp/x"], "--tune-db needs --tune"),
    (["--tune", "many"], "invalid int value"),
])
def test_bad_tune_values(extra, needle, tmp_path, capsys):
    rc = main([MODEL, "-o", str(tmp_path / "out"), *extra])
    err = capsys.readouterr().err
    assert rc == 2
    assert err.count("\n") == 1 and err.startswith("qcompile: error:") and needle in err, err
    assert not (tmp_path / "out").exists()

