"""run_batches / load_inputs / save_outputs: what `qcompile run OUT --input X --output Y` does."""
from __future__ import annotations

import numpy as np
import pytest

from qcompiler.errors import UserError
from qcompiler.runtime import load, load_inputs, run_batches, save_outputs

XS = np.random.default_rng(2).standard_normal((5, 16)).astype(np.float32)


@pytest.fixture(scope="module")
def model(x86_artifact):
    return load(x86_artifact)


def test_slices_along_the_batch_axis(model, tiny):
    ref = tiny.reference(tiny.graph(), XS)
    done = []
    outs = run_batches(model, XS, progress=lambda i, n: done.append((i, n)))
    assert list(outs) == ["y"] and outs["y"].shape == (5, 8)
    np.testing.assert_allclose(outs["y"], ref, rtol=1e-5, atol=1e-6)
    assert done[-1] == (5, 5)


def test_one_full_input_per_sample(model, tiny):
    outs = run_batches(model, XS[:, None, :])                      # (N, 1, 16): N samples of (1, 16)
    assert outs["y"].shape == (5, 1, 8)
    np.testing.assert_allclose(outs["y"][:, 0], tiny.reference(tiny.graph(), XS), rtol=1e-5, atol=1e-6)


def test_npy_and_npz_files(model, tmp_path):
    np.save(tmp_path / "x.npy", XS)
    np.savez(tmp_path / "x.npz", x=XS)
    a = run_batches(model, tmp_path / "x.npy")["y"]
    b = run_batches(model, str(tmp_path / "x.npz"))["y"]
    np.testing.assert_array_equal(a, b)
    np.savez(tmp_path / "bad.npz", x=XS, z=XS)
    with pytest.raises(UserError, match="inputs are x but the data holds x, z"):
        load_inputs(tmp_path / "bad.npz", model.inputs)


@pytest.mark.parametrize("data,match", [
    (np.zeros((5, 15), np.float32), "does not split into runs"),
    (np.zeros((0, 16), np.float32), "does not split into runs"),
    (np.zeros((3, 16), np.float64), "dtype float64"),
])
def test_bad_data_is_refused(model, data, match):
    with pytest.raises(UserError, match=match):
        run_batches(model, data)


def test_unreadable_input_file(model, tmp_path):
    with pytest.raises(UserError, match="no such file"):
        run_batches(model, tmp_path / "none.npy")
    (tmp_path / "junk.npy").write_bytes(b"not numpy")
    with pytest.raises(UserError, match="cannot read it"):
        run_batches(model, tmp_path / "junk.npy")


def test_save_outputs(tmp_path):
    y = np.arange(6, dtype=np.float32).reshape(3, 2)
    save_outputs({"y": y}, tmp_path / "y.npy")
    np.testing.assert_array_equal(np.load(tmp_path / "y.npy"), y)
    save_outputs({"a": y, "b": y + 1}, tmp_path / "y.npz")
    with np.load(tmp_path / "y.npz") as z:
        assert z.files == ["a", "b"]
    with pytest.raises(UserError, match="ending in .npz"):
        save_outputs({"a": y, "b": y}, tmp_path / "two.npy")
    with pytest.raises(UserError, match=".npy or .npz"):
        save_outputs({"a": y}, tmp_path / "y.txt")
