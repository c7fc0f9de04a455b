#!/usr/bin/env bash
# Builds the epifuse wheel (the optimizer plus the plugin libraries in optimizer/lib) into OUT_DIR.
# The one build entry point: CI (.ci/run) runs it for the CPU parts, the Dockerfile's build stage
# for the CUDA build. Dependencies come from the project's fetch scripts, fetched once and passed
# to CMake, so the wheel build does not fetch them again.
#
#   usage: .ci/build.sh OUT_DIR
#   EPIFUSE_CUDA_ARCHS   set: build the CUDA kernels, the ORT CUDA EP op and the TensorRT plugin
#   EPIFUSE_REQUIRE_TRT  1: fail unless the TensorRT plugin libraries were built (the image needs them)
#   EPIFUSE_TRT_INCLUDE_DIR, EPIFUSE_DEPS_DIR, PYTHON   as for CMake and the fetch scripts
set -euo pipefail
out=${1:?usage: .ci/build.sh OUT_DIR}
src=$(cd "$(dirname "$0")/.." && pwd)
PY=${PYTHON:-python3}

deps=$(bash "$src/plugins/scripts/fetch_deps.sh")
args=(-DEPIFUSE_ORT_INCLUDE_DIR="$deps/usr/include/onnxruntime" -DEPIFUSE_EIGEN_INCLUDE_DIR="$deps/usr/include/eigen3")
required=(libepifuse_core.so libepifuse_ort.so)
# pyproject.toml brings oneDNN to the build on x86-64 Linux: a wheel without it there is a broken build
[[ $(uname -m) == x86_64 && $(uname -s) == Linux ]] && args+=(-DEPIFUSE_ONEDNN=ON)
if [[ -n ${EPIFUSE_CUDA_ARCHS:-} ]]; then
  cutlass=$(bash "$src/plugins/scripts/fetch_cutlass.sh")
  args+=(-DEPIFUSE_CUDA=ON -DEPIFUSE_CUDA_ARCHS="$EPIFUSE_CUDA_ARCHS" -DEPIFUSE_CUTLASS_DIR="$cutlass")
  [[ -n ${EPIFUSE_TRT_INCLUDE_DIR:-} ]] && args+=(-DEPIFUSE_TRT_INCLUDE_DIR="$EPIFUSE_TRT_INCLUDE_DIR")
  required+=(libepifuse_cuda.so)
  [[ ${EPIFUSE_REQUIRE_TRT:-0} == 1 ]] && required+=(libepifuse_trt.so libepifuse_trt_static.so)
fi

mkdir -p "$out"
CMAKE_ARGS="${args[*]}" "$PY" -m pip wheel --quiet --no-deps --wheel-dir "$out" "$src"
wheel=$(ls -t "$out"/epifuse-*.whl | head -1)
"$PY" - "$wheel" "${required[@]}" <<'PY'
import sys, zipfile
wheel, required = sys.argv[1], sys.argv[2:]
libs = sorted(n.rsplit("/", 1)[1] for n in zipfile.ZipFile(wheel).namelist() if n.startswith("optimizer/lib/"))
missing = [r for r in required if r not in libs]
if missing:
    sys.exit(f".ci/build.sh: {wheel} lacks {', '.join(missing)} (has {', '.join(libs) or 'no libraries'})")
print(f"{wheel}: {', '.join(libs)}")
PY
