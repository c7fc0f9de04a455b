#!/usr/bin/env bash
# Fetches the ONNX Runtime C/C++ headers (Debian trixie libonnxruntime-dev 1.21) and Eigen
# (libeigen3-dev) as .deb files and unpacks them into a cache folder. A private apt
# configuration keeps the machine's apt sources and state untouched. Idempotent: does nothing
# when the headers are already unpacked. Prints the unpacked root on stdout (for CMake).
#
#   usage: fetch_deps.sh [DEPS_DIR]   (default ${EPIFUSE_DEPS_DIR:-$HOME/.cache/epifuse/deps})
set -euo pipefail

D=${1:-${EPIFUSE_DEPS_DIR:-$HOME/.cache/epifuse/deps}}
ROOT=$D/root
ORT_HEADER=$ROOT/usr/include/onnxruntime/onnxruntime_lite_custom_op.h
EIGEN_HEADER=$ROOT/usr/include/eigen3/Eigen/Core

if [[ -f $ORT_HEADER && -f $EIGEN_HEADER ]]; then
  echo "$ROOT"
  exit 0
fi

for tool in apt-get dpkg; do
  if ! command -v "$tool" >/dev/null; then
    echo "fetch_deps.sh: '$tool' not found. Install the ONNX Runtime 1.21 headers and Eigen 3 by hand" \
         "and pass -DEPIFUSE_ORT_INCLUDE_DIR=... -DEPIFUSE_EIGEN_INCLUDE_DIR=... to CMake." >&2
    exit 1
  fi
done

KEYRING=/usr/share/keyrings/debian-archive-keyring.gpg
if [[ ! -f $KEYRING ]]; then
  echo "fetch_deps.sh: $KEYRING not found (install debian-archive-keyring), or pass" \
       "-DEPIFUSE_ORT_INCLUDE_DIR=... -DEPIFUSE_EIGEN_INCLUDE_DIR=... to CMake." >&2
  exit 1
fi

mkdir -p "$D/apt/state/lists/partial" "$D/apt/cache/archives/partial" "$D/debs" "$ROOT"
echo "deb [signed-by=$KEYRING] http://deb.debian.org/debian trixie main" > "$D/apt/sources.list"
O=(-o "Dir::Etc::SourceList=$D/apt/sources.list" -o Dir::Etc::SourceParts=/nonexistent
   -o "Dir::State=$D/apt/state" -o "Dir::Cache=$D/apt/cache" -o Debug::NoLocking=1
   -o APT::Sandbox::User=root)  # downloads land in a folder the _apt user may not be able to write

# apt's chatter goes to stderr so that stdout carries only the result path.
apt-get "${O[@]}" update >&2
(cd "$D/debs" && apt-get "${O[@]}" download libonnxruntime-dev libeigen3-dev >&2)
for deb in "$D"/debs/*.deb; do
  dpkg -x "$deb" "$ROOT"
done

if [[ ! -f $ORT_HEADER || ! -f $EIGEN_HEADER ]]; then
  echo "fetch_deps.sh: downloaded packages lack $ORT_HEADER or $EIGEN_HEADER" >&2
  exit 1
fi
echo "$ROOT"
