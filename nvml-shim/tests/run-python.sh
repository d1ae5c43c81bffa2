#!/usr/bin/env bash
# Runs the pynvml (nvidia-ml-py) test suite against the shim.
#   NVML_SHIM_LIB=/path/libnvidia_ml.so   use this build instead of building (release)
#   NVML_SHIM_CTL=/path/nvml-shim-ctl      ctl binary (default: next to the library)
#   CARGO_TARGET_DIR                       where cargo builds and where the venv lives
# Extra arguments go to unittest (e.g. -k TestMigDevices).
set -euo pipefail
PYNVML_VERSION=13.590.48
here=$(cd "$(dirname "$0")" && pwd)
crate=$(dirname "$here")
root=$(dirname "$crate")
target=${CARGO_TARGET_DIR:-$root/target}

if [ -z "${NVML_SHIM_LIB:-}" ]; then
    (cd "$root" && cargo build -p nvml-shim --release)
    NVML_SHIM_LIB=$target/release/libnvidia_ml.so
fi
if [ ! -f "$NVML_SHIM_LIB" ]; then
    echo "run-python.sh: shim library $NVML_SHIM_LIB not found" >&2
    exit 1
fi
if [ -z "${NVML_SHIM_CTL:-}" ] && [ -x "$(dirname "$NVML_SHIM_LIB")/nvml-shim-ctl" ]; then
    NVML_SHIM_CTL=$(dirname "$NVML_SHIM_LIB")/nvml-shim-ctl
fi

venv=$target/nvml-shim-pyenv
if ! "$venv/bin/python" -c "import importlib.metadata as m, sys; sys.exit(m.version('nvidia-ml-py') != '$PYNVML_VERSION')" 2>/dev/null; then
    python3 -m venv "$venv"
    "$venv/bin/pip" install --quiet "nvidia-ml-py==$PYNVML_VERSION"
fi

# Also expose the shim under its installed name, for clients that dlopen libnvidia-ml.so.1.
libdir=$target/nvml-shim-lib
mkdir -p "$libdir"
cp -f "$NVML_SHIM_LIB" "$libdir/libnvidia-ml.so.1"

export NVML_SHIM_LIB="$libdir/libnvidia-ml.so.1" NVML_SHIM_CTL="${NVML_SHIM_CTL:-}"
export LD_LIBRARY_PATH="$libdir${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
cd "$here/python"
exec "$venv/bin/python" -m unittest -v "$@"
