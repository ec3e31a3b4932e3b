#!/usr/bin/env bash
# Set up (scripts/setup.sh), then run the main job on the bundled model: compile
# models/fashion_mobilenet.onnx for this x86 machine and check the artifact against ONNX Runtime
# on the bundled held-back Fashion-MNIST test images.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
. .venv/bin/activate
exec python examples/demo.py "$@"
