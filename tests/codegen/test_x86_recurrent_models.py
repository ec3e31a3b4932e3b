"""Recurrent and control-flow real models built for x86 fp32 against onnxruntime (1e-4 * max|ref|):
the silero_vad variants (LSTM unrolled at import, 16 kHz/8 kHz If resolved by binding ``sr``,
If-on-shape squeezes) and ddddocr's common OCR model (CNN + bidirectional LSTM). Inputs: a
deterministic audio-like signal (a modulated tone plus a random walk) and a synthetic text line.
Skipped when the wheels are not installed."""
from __future__ import annotations

import importlib.util
import os

import numpy as np
import pytest
import tvm
from tvm import relax

import realmodels as rm
from qcompiler.codegen.lower import build_module
from qcompiler.codegen.target import TargetSpec
from qcompiler.frontend.onnx_import import import_onnx


def _data_dir(pkg: str, sub: str = "") -> str | None:
    spec = importlib.util.find_spec(pkg)
    if spec is None or not spec.submodule_search_locations:
        return None
    return os.path.join(list(spec.submodule_search_locations)[0], sub)


SILERO = _data_dir("silero_vad", "data")
DDDDOCR = _data_dir("ddddocr")


def audio(n: int, rate: int = 16000, seed: int = 0) -> np.ndarray:
    """1 x n float32: a 220 Hz tone under a 3 Hz envelope plus a small random walk."""
    t = np.arange(n) / rate
    walk = np.cumsum(np.random.default_rng(seed).standard_normal(n)) * 0.002
    return (0.3 * np.sin(2 * np.pi * 220 * t) * np.sin(2 * np.pi * 3 * t) + walk).astype(np.float32)[None]


STATE = (np.random.default_rng(1).standard_normal((2, 1, 128)) * 0.3).astype(np.float32)
# file -> (input shapes, bound inputs, feeds); 576 = 512 samples + 64 of context at 16 kHz, 288 at 8 kHz
SILERO_CASES = {
    "silero_vad.onnx": ({"input": (1, 576), "state": (2, 1, 128)}, {"sr": 16000},
                        {"input": audio(576), "state": STATE}),
    "silero_vad.onnx@8k": ({"input": (1, 288), "state": (2, 1, 128)}, {"sr": 8000},
                           {"input": audio(288, 8000), "state": STATE}),
    "silero_vad_16k_op15.onnx": ({"input": (1, 576), "state": (2, 1, 128)}, {"sr": 16000},
                                 {"input": audio(576), "state": STATE}),
    "silero_vad_16k_sequence.onnx": ({"input": (3, 576)}, None,
                                     {"input": audio(3 * 576).reshape(3, 576), "h": STATE[:1] * 0.5,
                                      "c": STATE[1:] * 0.5}),
    "silero_vad_half.onnx": ({"input": (1, 576), "state": (2, 1, 128)}, None, {"input": audio(576), "state": STATE}),
    "silero_vad_op18_ifless.onnx": ({"input": (1, 576), "state": (2, 1, 128)}, {"sr": 16000},
                                    {"input": audio(576), "state": STATE}),
    "silero_vad_openvino_16k.onnx": ({}, None, {"input": audio(576), "state": STATE}),
}


def build_and_run(path, shapes, values, feeds):
    g = import_onnx(path, shapes, values)
    vm = relax.VirtualMachine(build_module(g, TargetSpec("x86", dtype="fp32")), tvm.cpu())
    out = vm["main"](*[tvm.runtime.tensor(feeds[v.name]) for v in g.inputs])
    got = [o.numpy() for o in out] if not isinstance(out, tvm.runtime.Tensor) else [out.numpy()]
    return g, got


@pytest.mark.skipif(SILERO is None, reason="silero_vad is not installed")
@pytest.mark.parametrize("case", sorted(SILERO_CASES))
def test_silero_vad_fp32(case):
    shapes, values, feeds = SILERO_CASES[case]
    path = os.path.join(SILERO, case.split("@")[0])
    g, got = build_and_run(path, shapes, values, feeds)
    assert not set(values or {}) & {v.name for v in g.inputs}        # bound inputs are gone
    ref_feeds = {**feeds, **{k: np.array(v, np.int64) for k, v in (values or {}).items()}}
    rm.assert_close_to_ort(case, got, rm.ort_run(path, ref_feeds), 1e-4, top1=False)


@pytest.mark.skipif(DDDDOCR is None, reason="ddddocr is not installed")
def test_ddddocr_common_fp32():
    path = os.path.join(DDDDOCR, "common.onnx")
    img = rm.text_image(64, 256).mean(-1) / 255.0
    feeds = {"input1": ((img - 0.5) / 0.5).astype(np.float32)[None, None]}
    _, got = build_and_run(path, {"input1": (1, 1, 64, 256)}, None, feeds)
    ref = rm.ort_run(path, feeds)
    rm.assert_close_to_ort("ddddocr common", got, ref, 1e-4, top1=False)
    assert (got[0].argmax(-1) == ref[0].argmax(-1)).all()              # the same decoded characters
