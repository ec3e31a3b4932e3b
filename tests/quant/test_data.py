"""Calibration data: images, .npy, .npz, random; every bad input is a one-line UserError naming the file."""
import io

import numpy as np
import pytest

from qcompiler.errors import UserError
from qcompiler.quant.data import Color, Layout, Preprocess, Progress, open_dataset, progress, random_dataset

Image = pytest.importorskip("PIL.Image")

X = [("x", (1, 3, 8, 8), "float32")]


def user_error(match, fn, *a, **kw):
    with pytest.raises(UserError, match=match) as e:
        ds = fn(*a, **kw)
        list(ds)                                   # some problems show while streaming
    assert "\n" not in str(e.value)
    return e.value


def test_npy_streams_samples_in_batches(tmp_path):
    a = np.random.default_rng(0).standard_normal((10, 3, 8, 8)).astype(np.float32)
    np.save(tmp_path / "x.npy", a)
    ds = open_dataset(tmp_path / "x.npy", X, batch=4)
    feeds = list(ds)
    assert len(ds) == 3 and [f["x"].shape[0] for f in feeds] == [4, 4, 2]
    assert np.array_equal(np.concatenate([f["x"] for f in feeds]), a)
    assert ds.num_samples == 10 and not ds.has_labels
    assert list(ds)[0]["x"].shape == (4, 3, 8, 8)               # iterable again
    assert open_dataset(tmp_path / "x.npy", X, samples=3).num_samples == 3


def test_npy_of_full_model_inputs_and_dtype_cast(tmp_path):
    a = np.arange(5 * 1 * 3 * 8 * 8).reshape(5, 1, 3, 8, 8).astype(np.int16)    # (N, B, ...) ints
    np.save(tmp_path / "x.npy", a)
    feeds = list(open_dataset(tmp_path / "x.npy", X))
    assert len(feeds) == 5 and feeds[0]["x"].dtype == np.float32 and feeds[0]["x"].shape == (1, 3, 8, 8)


def test_npz_multi_input_with_labels(tmp_path):
    specs = [("a", (2, 4), "float32"), ("b", (2, 3), "int64")]
    rng = np.random.default_rng(1)
    A, B, y = rng.standard_normal((7, 4)), rng.integers(0, 5, (7, 3)), np.arange(7)
    np.savez_compressed(tmp_path / "d.npz", a=A, b=B, y=y)
    ds = open_dataset(tmp_path / "d.npz", specs, batch=2)
    assert ds.has_labels and ds.num_samples == 7
    got = list(ds.with_labels())
    assert np.allclose(np.concatenate([f["a"] for f, _ in got]), A)
    assert np.array_equal(np.concatenate([f["b"] for f, _ in got]), B) and got[0][0]["b"].dtype == np.int64
    assert np.array_equal(np.concatenate([l for _, l in got]), y)
    assert got[0][0]["a"].dtype == np.float32


def test_npz_input_without_a_batch_axis_is_fed_whole(tmp_path):
    """A recurrent state (2, B, 128) beside an input (B, 576): its leading dimension is not the
    batch, so each feed takes one row of its array whole (Silero VAD's state, an LSTM's h/c)."""
    rng = np.random.default_rng(0)
    x, state = rng.random((5, 1, 576), np.float32), rng.random((5, 2, 1, 128), np.float32)
    np.savez(tmp_path / "c.npz", input=x, state=state)
    ds = open_dataset(tmp_path / "c.npz", [("input", (1, 576), "float32"), ("state", (2, 1, 128), "float32")])
    feeds = list(ds)
    assert ds.num_samples == 5 and len(feeds) == 5
    for k, f in enumerate(feeds):
        assert np.array_equal(f["input"], x[k]) and np.array_equal(f["state"], state[k])
    # a batch of 8 chunks (the sequence model): 3 feeds = 24 samples; h and c one row per feed
    seq, h = rng.random((3, 8, 576), np.float32), rng.random((3, 1, 1, 128), np.float32)
    np.savez(tmp_path / "s.npz", input=seq, h=h, c=h + 1)
    specs = [("input", (8, 576), "float32"), ("h", (1, 1, 128), "float32"), ("c", (1, 1, 128), "float32")]
    ds = open_dataset(tmp_path / "s.npz", specs, batch=8)
    feeds = list(ds)
    assert ds.num_samples == 24 and len(feeds) == 3
    for k, f in enumerate(feeds):
        assert np.array_equal(f["input"], seq[k]) and np.array_equal(f["h"], h[k]) and np.array_equal(f["c"], h[k] + 1)
    np.savez(tmp_path / "bad.npz", input=seq, h=h[:, 0], c=h)
    with pytest.raises(UserError, match=r"takes \[1, 1, 128\] whole in each feed"):
        open_dataset(tmp_path / "bad.npz", specs, batch=8)
    feed = next(iter(random_dataset(specs, 4, batch=8)))
    assert feed["input"].shape == (4, 576) and feed["h"].shape == (1, 1, 128)


def test_npz_single_unnamed_array(tmp_path):
    np.savez(tmp_path / "d.npz", np.ones((3, 3, 8, 8), np.float32))
    assert [f["x"].shape for f in open_dataset(tmp_path / "d.npz", X)] == [(1, 3, 8, 8)] * 3


def write_images(folder, n, size=(12, 10), classes=None):
    rng = np.random.default_rng(2)
    for i in range(n):
        d = folder / classes[i % len(classes)] if classes else folder
        d.mkdir(parents=True, exist_ok=True)
        img = Image.fromarray(rng.integers(0, 256, (size[1], size[0], 3), dtype=np.uint8))
        img.save(d / f"img{i}.{'png' if i % 2 else 'jpg'}")


def test_image_folder_with_preprocessing(tmp_path):
    write_images(tmp_path, 3)
    (tmp_path / "notes.txt").write_text("not an image")
    pre = Preprocess(resize=8, mean=(0.5,), std=(0.25,))
    ds = open_dataset(tmp_path, X, preprocess=pre, batch=2)
    feeds = list(ds)
    assert [f["x"].shape for f in feeds] == [(2, 3, 8, 8), (1, 3, 8, 8)] and not ds.has_labels
    # the same pipeline by hand: short side 10 -> 8, center-crop 8x8, scale, normalize
    im = Image.open(sorted(tmp_path.glob("img*"))[0]).convert("RGB").resize((10, 8), Image.BILINEAR)
    ref = (np.asarray(im, np.float32)[:, 1:9] / 255 - 0.5) / 0.25
    assert np.allclose(feeds[0]["x"][0], ref.transpose(2, 0, 1), atol=1e-5)


def test_image_nhwc_bgr_gray_and_class_labels(tmp_path):
    write_images(tmp_path, 4, classes=["cat", "dog"])
    ds = open_dataset(tmp_path, [("x", (1, 8, 8, 3), "float32")], preprocess=Preprocess.parse("raw,bgr"))
    assert ds.classes == ["cat", "dog"] and ds.has_labels
    pairs = list(ds.with_labels())
    assert pairs[0][0]["x"].shape == (1, 8, 8, 3) and pairs[0][0]["x"].max() > 1
    assert [int(l[0]) for _, l in pairs] == [0, 0, 1, 1]
    rgb = list(open_dataset(tmp_path, [("x", (1, 8, 8, 3), "float32")], preprocess=Preprocess.parse("raw")))
    assert np.array_equal(rgb[0]["x"][..., ::-1], pairs[0][0]["x"])
    gray = list(open_dataset(tmp_path, [("x", (1, 1, 8, 8), "float32")]))
    assert gray[0]["x"].shape == (1, 1, 8, 8)
    g2 = list(open_dataset(tmp_path, [("x", (2, 8, 8), "uint8")], preprocess=Preprocess(scale=1.0)))
    assert g2[0]["x"].shape == (1, 8, 8) and g2[0]["x"].dtype == np.uint8


def test_preprocess_parse():
    p = Preprocess.parse("imagenet,bgr,nhwc,resize=240x320,scale=1/127.5")
    assert p.resize == (240, 320) and p.mean == (0.485, 0.456, 0.406) and p.color is Color.BGR
    assert p.layout is Layout.NHWC and p.scale == pytest.approx(1 / 127.5)
    assert Preprocess.parse("mean=0.5:0.4:0.3,std=0.2").std == (0.2,)
    user_error("cannot read preprocessing item 'resize=big'", Preprocess.parse, "resize=big")
    user_error("cannot read preprocessing item 'sepia'", Preprocess.parse, "sepia")


def test_random_dataset_warns():
    specs = [("x", (2, 3), "float32"), ("i", (2, 4), "int64")]
    with pytest.warns(UserWarning, match="not representative"):
        ds = random_dataset(specs, 5, seed=3, batch=2)
    feeds = list(ds)
    assert [f["x"].shape for f in feeds] == [(2, 3), (2, 3), (1, 3)] and feeds[0]["i"].dtype == np.int64
    assert np.array_equal(feeds[0]["x"], list(ds)[0]["x"])          # seeded: the same stream again


# ---- bad input: each a one-line UserError naming the file ---------------------------------------
def test_wrong_shape(tmp_path):
    np.save(tmp_path / "x.npy", np.zeros((4, 3, 9, 9), np.float32))
    e = user_error(r"shape \[4, 3, 9, 9\] but model input 'x' takes \[1, 3, 8, 8\]", open_dataset,
                   tmp_path / "x.npy", X)
    assert "x.npy" in str(e) and "(N, 3, 8, 8)" in str(e)


@pytest.mark.parametrize("arr,what", [(np.array([["a"] * 3] * 2), "<U1"), (np.zeros((2, 3), complex), "complex")])
def test_wrong_dtype(tmp_path, arr, what):
    np.save(tmp_path / "x.npy", arr)
    user_error(f"holds {what}.* data, not numbers", open_dataset, tmp_path / "x.npy", [("x", (1, 3), "float32")])


def test_object_arrays_and_float_for_int_input(tmp_path):
    np.save(tmp_path / "o.npy", np.array([None, 1], dtype=object), allow_pickle=True)
    user_error("Python objects", open_dataset, tmp_path / "o.npy", [("x", (1,), "float32")])
    np.savez(tmp_path / "o.npz", x=np.array([None, 1], dtype=object))
    user_error("holds object data", open_dataset, tmp_path / "o.npz", [("x", (1,), "float32")])
    np.save(tmp_path / "f.npy", np.zeros((2, 3)))
    user_error("float64 data but model input 'i' takes int64", open_dataset, tmp_path / "f.npy",
               [("i", (1, 3), "int64")])


@pytest.mark.parametrize("bad", [np.nan, np.inf])
@pytest.mark.parametrize("ext", ["npy", "npz"])
def test_nan_and_inf(tmp_path, bad, ext):
    a = np.zeros((6, 3, 8, 8), np.float32)
    a[4, 1, 2, 3] = bad
    (np.save(tmp_path / "x.npy", a) if ext == "npy" else np.savez(tmp_path / "x.npz", x=a))
    e = user_error(f"holds {'NaN' if np.isnan(bad) else 'Inf'} in sample 4", open_dataset, tmp_path / f"x.{ext}", X,
                   batch=4)
    assert f"x.{ext}" in str(e)


def test_empty_folder_and_unreadable_images(tmp_path):
    user_error("holds no PNG/JPEG/BMP images", open_dataset, tmp_path, X)
    write_images(tmp_path, 2)
    (tmp_path / "broken.png").write_bytes(b"\x89PNG\r\n\x1a\n not really")
    e = user_error("cannot read the image", open_dataset, tmp_path, X)
    assert "broken.png" in str(e)
    (tmp_path / "broken.png").unlink()
    data = (tmp_path / "img1.png").read_bytes()
    (tmp_path / "img1.png").write_bytes(data[: len(data) // 2])      # truncated
    user_error("cannot read the image", open_dataset, tmp_path, X)


def test_image_problems(tmp_path):
    write_images(tmp_path, 1, size=(6, 6))
    user_error("smaller than the model's 8x8", open_dataset, tmp_path, X, preprocess=Preprocess(resize=6))
    user_error("does not look like an image", open_dataset, tmp_path, [("x", (1, 5, 8, 8), "float32")])
    user_error("single-input", open_dataset, tmp_path, X + [("y", (1, 2), "float32")])
    user_error("mean/std have 2/1 values for 3", open_dataset, tmp_path, X, preprocess=Preprocess(mean=(0.1, 0.2)))
    user_error("gray images have 1 channel", open_dataset, tmp_path, X, preprocess=Preprocess.parse("gray"))


def test_no_samples_missing_inputs_and_files(tmp_path):
    np.save(tmp_path / "x.npy", np.zeros((0, 3, 8, 8), np.float32))
    user_error("no samples", open_dataset, tmp_path / "x.npy", X)
    specs = [("a", (1, 2), "float32"), ("b", (1, 2), "float32")]
    np.savez(tmp_path / "d.npz", a=np.zeros((3, 2)), c=np.zeros((3, 2)))
    user_error(r"no array for model input\(s\) b \(the file holds a, c\)", open_dataset, tmp_path / "d.npz", specs)
    np.savez(tmp_path / "n.npz", a=np.zeros((3, 2)), b=np.zeros((4, 2)))
    user_error("different numbers of samples", open_dataset, tmp_path / "n.npz", specs)
    user_error("holds one array but the model has 2 inputs", open_dataset, tmp_path / "x.npy", specs)
    user_error("no such file", open_dataset, tmp_path / "missing.npy", X)
    (tmp_path / "d.csv").write_text("1,2")
    user_error("unsupported data file type '.csv'", open_dataset, tmp_path / "d.csv", X)
    (tmp_path / "g.npy").write_bytes(b"garbage")
    user_error("not an .npy file", open_dataset, tmp_path / "g.npy", X)
    (tmp_path / "g.npz").write_bytes(b"garbage")
    user_error("not a readable .npz", open_dataset, tmp_path / "g.npz", X)
    np.save(tmp_path / "s.npy", np.float32(3))
    user_error("scalar", open_dataset, tmp_path / "s.npy", X)
    np.save(tmp_path / "x.npy", np.zeros((3, 3, 8, 8), np.float32))
    user_error("batch must be at least 1", open_dataset, tmp_path / "x.npy", X, batch=0)
    with pytest.warns(UserWarning, match="asked for 5 samples but the data holds 3"):
        assert open_dataset(tmp_path / "x.npy", X, samples=5).num_samples == 3


class _Terminal(io.StringIO):
    def isatty(self):
        return True


def test_progress_bar_only_on_a_terminal():
    out = _Terminal()
    with Progress(4, "calibrate", stream=out, interval=0.0) as bar:
        for _ in range(4):
            bar.update()
    lines = out.getvalue().split("\r")[1:]
    assert len(lines) == 5 and lines[0].startswith("calibrate 1/4 [#####               ]")
    assert lines[-1].startswith("calibrate 4/4 [####################]") and lines[-1].endswith("/s\n")
    assert all("\n" not in l for l in lines[:-1])                          # one line, redrawn in place
    for stream, quiet in ((io.StringIO(), False), (_Terminal(), True)):    # a pipe or a log; -q
        with Progress(4, "x", stream=stream, quiet=quiet, interval=0.0) as bar:
            bar.update(4)
        assert stream.getvalue() == ""
    assert list(progress(range(3), quiet=True)) == [0, 1, 2]
