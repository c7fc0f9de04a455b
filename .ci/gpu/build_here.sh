#!/usr/bin/env bash
# Here (no GPU, 2 cores): the same sm_90a library build.sh makes on the GPU machine, packed as
# .stage/lib/epifuse-lib.tar.xz for env.sh, so a GPU call only runs tests and models. The device time
# a build there costs (~190 s a call) is what this saves; here it takes ~17 minutes cold and well under
# a minute after a change to a few kernels (the build folder is kept).
#   bash .ci/gpu/build_here.sh [build folder, default .stage/build-h200]
set -euo pipefail
cd "$(dirname "$0")/../.."
build=${1:-.stage/build-h200}
deps=$(bash plugins/scripts/fetch_deps.sh | tail -1)/usr/include  # the unpacked Debian packages
cutlass=$(bash plugins/scripts/fetch_cutlass.sh | tail -1)  # .../cutlass-<ver>/cutlass_library/source
cmake -S plugins -B "$build" -G Ninja -DEPIFUSE_CUDA=ON -DEPIFUSE_CUDA_ARCHS=90a -DCMAKE_BUILD_TYPE=Release \
  -DEPIFUSE_CUDA_DTYPES="${EPIFUSE_CUDA_DTYPES:-f16}" -DEPIFUSE_ORT_INCLUDE_DIR="$deps/onnxruntime" \
  -DEPIFUSE_EIGEN_INCLUDE_DIR="$deps/eigen3" -DEPIFUSE_CUTLASS_DIR="$cutlass" > "$build.cmake.log" || { tail -30 "$build.cmake.log"; exit 1; }
cmake --build "$build" -j"$(nproc)"
mkdir -p .stage/lib
tar -C "$build" -cf - libepifuse_core.so libepifuse_cuda.so libepifuse_ort.so | xz -T0 -6 > .stage/lib/epifuse-lib.tar.xz
ls -la .stage/lib/epifuse-lib.tar.xz
