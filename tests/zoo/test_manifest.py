"""The zoo manifest itself: enough real graphs in each group, every entry complete and obtainable,
inputs of the declared shapes and dtypes, nothing redistributed that may not be."""
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from zoo_checks import ROOT, zoo  # noqa: F401 - zoo_checks puts the repository on sys.path

from zoo.data import GENERATORS  # noqa: E402
from zoo.loader import STAGES, _parse_spec  # noqa: E402


def test_at_least_35_models_in_three_groups():
    ms = zoo.models()
    assert len(ms) >= 35
    groups = {m.group for m in ms}
    assert groups == {"wheel", "torch", "transformers"}
    assert len(zoo.models("wheel")) >= 17          # every trained model of ../shared/real-data.md


def test_every_entry_is_complete():
    for m in zoo.models():
        assert m.licence and m.exercises, m.name
        assert m.data in GENERATORS, (m.name, m.data)
        assert m.layout in ("nchw", "nhwc"), m.name
        assert set(m.known) <= set(STAGES), m.name
        for name, (dtype, shape) in m.inputs.items():
            assert shape and all(d > 0 for d in shape), (m.name, name)


def test_input_specs_parse():
    assert _parse_spec("float32[1,3,224,224]") == ("float32", (1, 3, 224, 224))
    assert _parse_spec("int64[1,128]") == ("int64", (1, 128))
    with pytest.raises(TypeError):
        _parse_spec("floatish[1]")


@pytest.mark.parametrize("m", [m for m in zoo.models() if m.group == "wheel"], ids=lambda m: m.name)
def test_wheel_models_give_inputs_of_their_declared_types(m):
    """Every trained model's file exists and its generator gives feeds that ONNX Runtime accepts
    and that differ between samples (real data, not one array repeated)."""
    assert m.path().is_file()
    feeds = m.feeds(3, seed=0)
    assert len(feeds) == 3
    for f in feeds:
        assert set(f) == set(m.inputs)
        for k, (dtype, shape) in m.inputs.items():
            assert f[k].dtype == np.dtype(dtype) and f[k].shape == shape, (m.name, k)
            assert np.isfinite(f[k]).all() if f[k].dtype.kind == "f" else True
    first = next(iter(m.inputs))
    assert not np.array_equal(feeds[0][first], feeds[1][first]), m.name
    assert feeds[0][first].std() > 0
    zoo.ort_run(m.path(), m.ort_feeds(feeds[0]))
    assert not np.array_equal(m.feeds(1, seed=1)[0][first], feeds[0][first]), "seed 1 (evaluation) = seed 0"


def test_agpl_models_are_never_in_the_repository():
    """nudenet's YOLOv8n carries an AGPL licence in its metadata: it is read from the installed
    wheel at test time only, never copied into the repository."""
    agpl = [m for m in zoo.models() if "AGPL" in m.licence]
    assert agpl
    tracked = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True).stdout.split()
    for m in agpl:
        assert not m.source.startswith("repo:"), m.name
        assert not any(Path(t).name == m.path().name for t in tracked), m.name


def test_speech_is_real_speech():
    """The audio inputs are espeak-ng speech: voiced frames with energy, and pauses."""
    from zoo.data import speech
    s = speech(0)
    assert s.dtype == np.float32 and 16000 < len(s) < 16000 * 10
    frames = s[: len(s) // 400 * 400].reshape(-1, 400)
    energy = (frames ** 2).mean(axis=1)
    assert (energy > 1e-3).mean() > 0.3 and (energy < 1e-5).any()


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q"]))
