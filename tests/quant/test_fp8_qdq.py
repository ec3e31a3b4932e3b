"""FP8 Q/DQ ONNX in and out: a hand-made opset-19 float8 QDQ model (tests/quant/fp8_models.py)
imports into the float8 quantized types, fold-qdq makes its convs/gemms float8 QLinear ops, the
reference and the compiled artifact match ONNX Runtime's CPU execution of the file within one float8
step per element (``qcompile verify --qdq``, each kernel alone on ORT's inputs, x86 and ARM under
qemu), and ``--export-qdq`` of an fp8 build folds back to the same IR."""
from __future__ import annotations

import shutil
import subprocess

import numpy as np
import onnx
import pytest
from fp8_models import ZERO_POINT_TYPE, fp8_qdq_model, ort_session, with_outputs

import qcompiler as qc
from qcompiler.errors import UserError
from qcompiler.frontend.onnx_qdq import prequantized_formats
from qcompiler.frontend.qdq_export import export_qdq, fp8_clamps_as_max_min
from qcompiler.ir import print_graph
from qcompiler.ir.types import round_fp8
from qcompiler.quant import reference
from qcompiler.quant.fp8 import noise_floor, ulps

FP8 = ("float8_e4m3fn", "float8_e5m2")
QUANTIZED = ["in_q", "a1_q", "a2_q", "a3_q"]


def _imported(tmp_path, model) -> qc.ir.Graph:
    path = tmp_path / "m.onnx"
    onnx.save(model, path)
    g = qc.import_onnx(str(path))
    qc.run_passes(g, "default,fold-qdq")
    g.verify()
    return g


@pytest.mark.parametrize("storage", FP8)
@pytest.mark.parametrize("per_channel", [True, False])
def test_import_folds_convs_and_gemm_into_float8_ops(tmp_path, storage, per_channel):
    g = _imported(tmp_path, fp8_qdq_model(storage, per_channel=per_channel))
    linear = [op for op in g.ops if op.kind in ("QLinearConv", "QLinearGemm")]
    assert [op.name for op in linear] == ["c1", "c2", "fc"]
    for op in linear:
        assert op.operands[0].dtype == op.operands[1].dtype == storage and op.result.dtype == "float32"
        assert op.operands[1].type.quant.per_channel == per_channel
    assert linear[0].attrs["activation"] == "Relu"                 # the Relu before a1's Q: the clamp
    assert [v.dtype for v in linear[0].operands[2:]] == ["float32"]
    assert [op.kind for op in g.ops].count("QuantizeLinear") == 4   # each stays, fused by the kernels
    meta = g.meta["quant"]
    assert meta["layers"]["c1"]["precision"] == "fp8" and meta["scheme"]["bias"] == "float32"
    assert meta["scheme"]["weights"] == f"{storage} per {'channel' if per_channel else 'tensor'}"


def _alone(g, x: np.ndarray, theirs: dict, target: str, storage: str) -> np.ndarray:
    """The reference's value ``target`` computed from ORT's values of every other float8 tensor
    (each layer alone on ORT's inputs, as ``qcompile verify`` measures it)."""
    env = {v.name: v.data for v in g.consts.values()}
    env["x"] = x
    for op in g.ops:
        for r, a in zip(op.results, reference.evaluate_op(op, [env[v.name] for v in op.operands])):
            env[r.name] = round_fp8(theirs[r.name], storage) if r.name in theirs and r.name != target else a
    return env[target]


@pytest.mark.parametrize("storage", FP8)
def test_reference_within_one_step_of_onnxruntime(tmp_path, storage):
    """Every float8 value of the model, each layer alone on ORT's inputs, within one float8 step
    of ORT's (ORT_ENABLE_BASIC: see test_onnxruntime_relu_before_float8_quantize), >= 99 % equal;
    the output (a float gemm) to float32 rounding. Without the noise floor E5M2's depthwise conv
    is 25 steps off on one element in 6144: an exact cancellation, 0 here, 4.5e-8 in ORT (its
    products of dequantized values are rounded), 6.4e-4 float8 units, where E5M2 still has ~20
    values between it and 0."""
    m = fp8_qdq_model(storage)
    g = _imported(tmp_path, m)
    sess = ort_session(with_outputs(m, QUANTIZED))
    rng = np.random.default_rng(4)
    steps = {n: [] for n in QUANTIZED}
    for _ in range(6):
        x = rng.standard_normal((1, 3, 16, 16)).astype(np.float32)
        got = dict(zip(["y"] + QUANTIZED, sess.run(None, {"x": x})))
        for n in QUANTIZED:
            steps[n].append(ulps(_alone(g, x, got, n, storage), got[n], storage, noise_floor(got[n], storage)))
        np.testing.assert_allclose(_alone(g, x, got, "y", storage), got["y"], rtol=1e-5, atol=1e-5)
    for n, s in steps.items():
        s = np.concatenate([a.ravel() for a in s])
        assert s.max() <= 1 and np.mean(s == 0) > 0.99, (n, s.max(), np.mean(s == 0))


def test_prequantized_dtype_and_refusals(tmp_path):
    onnx.save(fp8_qdq_model("float8_e5m2"), tmp_path / "f8.onnx")
    assert prequantized_formats(str(tmp_path / "f8.onnx"))[0] == "fp8"
    m = fp8_qdq_model()
    for n in m.graph.node:
        if n.op_type == "QuantizeLinear":
            n.attribute.append(onnx.helper.make_attribute("saturate", 0))
            break
    onnx.save(m, tmp_path / "nosat.onnx")
    with pytest.raises(UserError, match="saturate = 0"):
        qc.import_onnx(str(tmp_path / "nosat.onnx"))
    m = fp8_qdq_model()
    z = next(t for t in m.graph.initializer if t.name == "in_z")
    z.data_type = onnx.TensorProto.FLOAT8E4M3FNUZ
    onnx.save(m, tmp_path / "fnuz.onnx")
    with pytest.raises(UserError, match="no FNUZ float8"):
        qc.import_onnx(str(tmp_path / "fnuz.onnx"))


def test_onnxruntime_relu_before_float8_quantize(tmp_path):
    """ONNX Runtime 1.32 with its default optimizations (ReluQuantFusion) drops a Relu before a
    QuantizeLinear whose zero point is 0, which for float8 (signed, no clamp at 0) changes the model;
    written as Max(x, 0) (fp8_clamps_as_max_min, what --export-qdq and verify do) the same model
    computes what ORT_ENABLE_BASIC computes."""
    m = fp8_qdq_model("float8_e4m3fn")
    x = np.random.default_rng(1).standard_normal((1, 3, 16, 16)).astype(np.float32)
    (basic,) = ort_session(m, "basic").run(None, {"x": x})
    fixed = onnx.ModelProto()
    fixed.CopyFrom(m)
    assert fp8_clamps_as_max_min(fixed) == 1
    assert "Relu" not in [n.op_type for n in fixed.graph.node]
    (everything,) = ort_session(fixed, "all").run(None, {"x": x})
    np.testing.assert_allclose(everything, basic, rtol=1e-6, atol=1e-6)
    clip = fp8_qdq_model("float8_e5m2", relu="")
    (want,) = ort_session(clip, "basic").run(None, {"x": x})
    assert fp8_clamps_as_max_min(clip) == 0                          # nothing to rewrite without one


@pytest.mark.parametrize("storage", FP8)
def test_export_folds_back_to_the_same_ir(tmp_path, storage):
    g = _imported(tmp_path, fp8_qdq_model(storage))
    exported = export_qdq(g)
    assert exported.opset_import[0].version == 19
    zps = {t.data_type for t in exported.graph.initializer if t.name.endswith("zero_point")}
    assert zps == {ZERO_POINT_TYPE[storage]}
    onnx.save(exported, tmp_path / "again.onnx")
    back = qc.import_onnx(str(tmp_path / "again.onnx"))
    qc.run_passes(back, "default,fold-qdq")
    consts = lambda graph: sorted((str(v.type), v.data.tobytes()) for v in graph.consts.values())  # noqa: E731
    assert consts(back) == consts(g)
    assert [op.kind for op in back.ops] == [op.kind for op in g.ops]
    x = np.random.default_rng(2).standard_normal((1, 3, 16, 16)).astype(np.float32)
    np.testing.assert_array_equal(reference.run(back, {"x": x})[0], reference.run(g, {"x": x})[0])
    assert print_graph(g)          # prints (and so parses: tests/quant/test_fp8.py) with float8 blobs


def _compile_and_verify(tmp_path, storage, target):
    from qcompiler.cli import main
    onnx.save(fp8_qdq_model(storage), tmp_path / "m.onnx")
    out = tmp_path / f"art_{target}"
    args = [str(tmp_path / "m.onnx"), "-o", str(out), "--debug-layers", "-q", "--target", target]
    if target == "arm":
        args += ["--cpu", "cortex-a76"]
    assert main(args) == 0
    x = np.random.default_rng(5).standard_normal((8, 1, 3, 16, 16)).astype(np.float32)
    np.save(tmp_path / "x.npy", x)
    from qcompiler.verify import verify
    rep = verify(out, str(tmp_path / "x.npy"), qdq=str(tmp_path / "m.onnx"))
    return rep


@pytest.mark.parametrize("storage", FP8)
def test_artifact_matches_onnxruntime_within_one_step(tmp_path, storage):
    """qcompile M.onnx (a float8 QDQ model builds as fp8 by default) --debug-layers, then verify
    against ONNX Runtime running the file itself: every float8 activation, each kernel alone on
    ORT's inputs, within one float8 step, >= 99 % equal, and end to end (chained from the same
    model input) within one step; the output within one step of the float8 grid at ORT's value."""
    rep = _compile_and_verify(tmp_path, storage, "x86")
    assert rep.passed, rep.table()
    assert rep.dtype == "fp8" and {r.name for r in rep.compared} >= {"in_q", "a1_q", "a3_q"}
    assert all(r.max_lsb <= 1 for r in rep.compared + rep.outputs)
    # end to end from the same model input too: every float8 value within one step of ORT's
    assert all(r.chain_max_lsb <= 1 for r in rep.compared), [(r.name, r.chain_max_lsb) for r in rep.compared]


@pytest.mark.qemu
@pytest.mark.skipif(not (shutil.which("qemu-aarch64") and shutil.which("aarch64-linux-gnu-g++")),
                    reason="needs qemu-aarch64 and the aarch64 cross toolchain")
def test_arm_artifact_matches_onnxruntime_under_qemu(tmp_path):
    """The same kernels with NEON's 4-lane blocks (the code path is generic TIR), run under qemu."""
    rep = _compile_and_verify(tmp_path, "float8_e4m3fn", "arm")
    assert rep.passed and rep.runner == "qemu-aarch64", rep.table()


def test_cli_fp8_options(tmp_path, capsys):
    from qcompiler.cli import main
    onnx.save(fp8_qdq_model(), tmp_path / "m.onnx")
    r = subprocess.run(["qcompile", str(tmp_path / "m.onnx"), "--dtype", "int8", "--fp8-format", "e5m2",
                        "-o", str(tmp_path / "o")], capture_output=True, text=True)
    assert r.returncode != 0 and "--fp8-format e5m2 chooses the float8 format of an fp8 build" in r.stderr
    assert main([str(tmp_path / "m.onnx"), "--dtype", "fp8", "--target", "cuda", "--arch", "sm_86",
                 "-o", str(tmp_path / "o")]) == 2
    assert "--arch: --dtype fp8 on cuda runs on float8 tensor cores" in capsys.readouterr().err


def test_prequantized_model_builds_in_its_own_format(tmp_path, capsys):
    """A float8 QDQ model builds as fp8 of its zero points' format (E5M2 here, no flag needed);
    another --dtype or --fp8-format is refused with one line (the manifest would name one format
    and the kernels run another); an int8 QDQ model refuses --dtype fp8 alike."""
    from qcompiler.cli import main
    from qcompiler.runtime import read_manifest
    onnx.save(fp8_qdq_model("float8_e5m2"), tmp_path / "m5.onnx")
    assert main([str(tmp_path / "m5.onnx"), "-o", str(tmp_path / "o5"), "-q"]) == 0
    t = read_manifest(tmp_path / "o5")["target"]
    assert (t["dtype"], t["fp8_format"]) == ("fp8", "e5m2")
    capsys.readouterr()
    for extra, says in ((["--dtype", "int8"], "--dtype int8, but this model arrives quantized to float8_e5m2"),
                        (["--dtype", "fp8", "--fp8-format", "e4m3"], "--fp8-format e4m3, but this model arrives")):
        assert main([str(tmp_path / "m5.onnx"), "-o", str(tmp_path / "bad"), "-q", *extra]) == 2
        assert says in capsys.readouterr().err
    from qdq_models import qdq_conv
    onnx.save(qdq_conv(), tmp_path / "int8.onnx")
    assert main([str(tmp_path / "int8.onnx"), "--dtype", "fp8", "-o", str(tmp_path / "bad"), "-q"]) == 2
    assert "--dtype fp8, but this model arrives quantized to integers" in capsys.readouterr().err


def test_onnxruntime_quantizer_fp8_model_compiles_and_verifies(tmp_path):
    """fashion_mobilenet quantized by ONNX Runtime's own quantizer to FP8 (``quantize_static``,
    QFLOAT8E4M3FN activations and per-channel weights, opset 19; it keeps BatchNormalization
    unfolded with Q/DQ before it, float8 BN scales and biases behind a Cast, and drops the ReLU6
    Clips before the float8 QuantizeLinear) builds as fp8 by default, and ``qcompile verify --qdq``
    against ONNX Runtime running that file passes: every float8 value, each kernel alone on ORT's
    inputs, within one float8 step (every float8 QuantizeLinear is a stored value, so no kernel
    holds two float8 roundings)."""
    import realmodels as rm
    from onnxruntime.quantization import (CalibrationDataReader, CalibrationMethod, QuantFormat, QuantType,
                                          quantize_static)

    from qcompiler.cli import main
    from qcompiler.verify import verify
    data = rm.fashion_test()
    model = rm.MODELS_DIR / "fashion_mobilenet.onnx"
    if data is None or not model.exists():
        pytest.skip("models/fashion_mobilenet.onnx or fashion_test.npz not present")
    x = data[0]
    m = onnx.version_converter.convert_version(onnx.load(str(model)), 19)
    onnx.save(m, tmp_path / "f19.onnx")
    name = m.graph.input[0].name

    class Reader(CalibrationDataReader):
        def __init__(self):
            self.feeds = iter([{name: x[i:i + 1]} for i in range(16)])

        def get_next(self):
            return next(self.feeds, None)
    quantize_static(str(tmp_path / "f19.onnx"), str(tmp_path / "q8.onnx"), Reader(), quant_format=QuantFormat.QDQ,
                    calibrate_method=CalibrationMethod.Distribution, activation_type=QuantType.QFLOAT8E4M3FN,
                    weight_type=QuantType.QFLOAT8E4M3FN, per_channel=True)
    assert prequantized_formats(str(tmp_path / "q8.onnx"))[0] == "fp8"
    assert main([str(tmp_path / "q8.onnx"), "--debug-layers", "-o", str(tmp_path / "out"), "-q"]) == 0
    np.save(tmp_path / "x.npy", x[500:564])
    rep = verify(tmp_path / "out", str(tmp_path / "x.npy"), qdq=str(tmp_path / "q8.onnx"))
    assert rep.passed, rep.table()
    assert len(rep.compared) >= 40 and rep.compared[0].chain_max_lsb == 0
