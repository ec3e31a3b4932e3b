#!/usr/bin/env bash
# Set up (scripts/setup.sh), then run the main job on the bundled model: compile
# models/fashion_mobilenet.onnx for this x86 machine in fp32 and in int8 (calibrated on 256 bundled
# test images), check both against ONNX Runtime on the held-back Fashion-MNIST test images, and
# `qcompile verify` the int8 artifact against its QDQ export (examples/demo.py).
set -euo pipefail
cd "$(dirname "$(readlink -f "$0")")/.."
scripts/setup.sh
. .venv/bin/activate
exec python examples/demo.py "$@"
