"""Zoo group 'torch', first half: every model builds for x86 fp32 and int8 and matches ONNX Runtime (see zoo_checks.py)."""
import pytest

from zoo_checks import check_fp32, check_int8, params


@pytest.mark.parametrize("m", params("torch", 0, 2))
def test_fp32_matches_onnxruntime(m, tmp_path, request):
    check_fp32(m, tmp_path, request)


@pytest.mark.parametrize("m", params("torch", 0, 2))
def test_int8_sqnr_at_least_onnxruntime_quantize_static(m, tmp_path, request):
    check_int8(m, tmp_path, request)
