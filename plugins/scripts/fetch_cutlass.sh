#!/usr/bin/env bash
# Fetches the CUTLASS C++ headers from PyPI (nvidia-cutlass, whose wheel carries them under
# cutlass_library/source) into a cache folder. Idempotent. Prints the source root on stdout.
#
#   usage: fetch_cutlass.sh [DEPS_DIR]   (default ${EPIFUSE_DEPS_DIR:-$HOME/.cache/epifuse/deps})
set -euo pipefail

VERSION=${EPIFUSE_CUTLASS_VERSION:-4.2.0.0}
D=${1:-${EPIFUSE_DEPS_DIR:-$HOME/.cache/epifuse/deps}}/cutlass-$VERSION
ROOT=$D/cutlass_library/source
if [[ -f $ROOT/include/cutlass/cutlass.h ]]; then
  echo "$ROOT"
  exit 0
fi
PY=${PYTHON:-python3}
mkdir -p "$D"
"$PY" -m pip download --quiet --no-deps --only-binary=:all: "nvidia-cutlass==$VERSION" -d "$D" >&2
"$PY" -c "import sys, zipfile, glob; zipfile.ZipFile(glob.glob(sys.argv[1] + '/nvidia_cutlass-*.whl')[0]).extractall(sys.argv[1])" "$D"
if [[ ! -f $ROOT/include/cutlass/cutlass.h ]]; then
  echo "fetch_cutlass.sh: the nvidia-cutlass $VERSION wheel lacks $ROOT/include/cutlass/cutlass.h" >&2
  exit 1
fi
echo "$ROOT"
