#!/usr/bin/env bash
# Fetch the aarch64 TVM runtime (what an ARM edge device needs to run a qcompiler artifact) from
# the official Linux aarch64 wheels, and lay it out for cross-compiling examples/deploy_cpp:
#
#   $DEST/lib/libtvm_runtime.so     (from apache-tvm 0.27.0.post1, manylinux_2_28_aarch64)
#   $DEST/lib/libtvm_ffi.so         (from apache-tvm-ffi 0.1.14.post1)
#   $DEST/include/                  (tvm_ffi + dlpack headers; C++17, headers only)
#
# DEST: $1, else $QCOMPILER_AARCH64_RUNTIME, else ${QCOMPILER_CACHE_DIR:-${XDG_CACHE_HOME:-~/.cache}/qcompiler}/aarch64-runtime.
# Idempotent (does nothing when DEST is complete); needs network once, pip, and unzip or python.
set -euo pipefail
TVM_VERSION=0.27.0.post1
FFI_VERSION=0.1.14.post1
CACHE="${QCOMPILER_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/qcompiler}"
DEST="${1:-${QCOMPILER_AARCH64_RUNTIME:-$CACHE/aarch64-runtime}}"

if [ -f "$DEST/lib/libtvm_runtime.so" ] && [ -f "$DEST/lib/libtvm_ffi.so" ] \
   && [ -f "$DEST/include/tvm/ffi/function.h" ] && [ -f "$DEST/VERSION" ] \
   && [ "$(cat "$DEST/VERSION")" = "apache-tvm==$TVM_VERSION apache-tvm-ffi==$FFI_VERSION" ]; then
  echo "aarch64 TVM runtime already in $DEST"
  exit 0
fi

PY="${PYTHON:-python3}"
if [ -x "$(dirname "$0")/../.venv/bin/python" ] && [ -z "${PYTHON:-}" ]; then
  PY="$(dirname "$0")/../.venv/bin/python"
fi
WORK="$(mktemp -d "${TMPDIR:-/tmp}/qc-aarch64-rt.XXXXXX")"
trap 'rm -rf "$WORK"' EXIT

"$PY" -m pip download -q --no-deps --only-binary=:all: --platform manylinux_2_28_aarch64 \
  --python-version 3.11 --implementation cp -d "$WORK/whl" \
  "apache-tvm==$TVM_VERSION" "apache-tvm-ffi==$FFI_VERSION"

# Unpack only what a deploy host needs (the wheels' Python parts are of no use on the device).
"$PY" - "$WORK/whl" "$WORK/out" <<'EOF'
import sys, zipfile, pathlib
whl, out = pathlib.Path(sys.argv[1]), pathlib.Path(sys.argv[2])
(out / "lib").mkdir(parents=True)
found = set()
for w in sorted(whl.glob("*.whl")):
    with zipfile.ZipFile(w) as z:
        for name in z.namelist():
            if name in ("tvm/lib/libtvm_runtime.so", "tvm_ffi/lib/libtvm_ffi.so"):
                (out / "lib" / pathlib.Path(name).name).write_bytes(z.read(name))
                found.add(pathlib.Path(name).name)
            elif name.startswith("tvm_ffi/include/") and not name.endswith("/"):
                p = out / "include" / name[len("tvm_ffi/include/"):]
                p.parent.mkdir(parents=True, exist_ok=True)
                p.write_bytes(z.read(name))
                found.add("include")
missing = {"libtvm_runtime.so", "libtvm_ffi.so", "include"} - found
if missing:
    sys.exit(f"fetch_aarch64_runtime: the wheels lack {sorted(missing)}")
EOF
chmod 755 "$WORK/out/lib/"*.so
echo "apache-tvm==$TVM_VERSION apache-tvm-ffi==$FFI_VERSION" > "$WORK/out/VERSION"

mkdir -p "$(dirname "$DEST")"
rm -rf "$DEST.old"
[ -e "$DEST" ] && mv "$DEST" "$DEST.old"
mv "$WORK/out" "$DEST"
rm -rf "$DEST.old"
echo "aarch64 TVM runtime in $DEST"
