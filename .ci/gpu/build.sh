#!/usr/bin/env bash
# GPU machine (carry .stage/build): the CUDA library built for sm_90a in $HOME/src (the checkout copied
# there), packed as $OUT/epifuse-lib.tar.xz for later calls (.stage/lib/ here); then the command given,
# if any, with PYTHONPATH and EPIFUSE_LIB_DIR set (onnx-graphsurgeon installed; no onnxruntime-gpu).
# EPIFUSE_CUDA_DTYPES (default f16) picks the 16-bit kernels; bf16 doubles the size and the build.
set -euo pipefail
mkdir -p "$HOME/deps" "$HOME/src"
tar -xJf .stage/build/deps.tar.xz -C "$HOME/deps"
python3 -m pip install -q --no-index --no-deps --target "$HOME/site" .stage/build/*.whl
tar --exclude=./.stage --exclude=./.git -cf - . | tar -xf - -C "$HOME/src"
cutlass=$HOME/deps/$(cat .stage/build/cutlass_dir)
repo=$PWD
cd "$HOME/src"
cmake -S plugins -B build-dev -G Ninja -DEPIFUSE_CUDA=ON -DEPIFUSE_CUDA_ARCHS=90a -DCMAKE_BUILD_TYPE=Release \
  -DEPIFUSE_CUDA_DTYPES="${EPIFUSE_CUDA_DTYPES:-f16}" \
  -DEPIFUSE_ORT_INCLUDE_DIR="$HOME/deps/root/usr/include/onnxruntime" \
  -DEPIFUSE_EIGEN_INCLUDE_DIR="$HOME/deps/root/usr/include/eigen3" -DEPIFUSE_CUTLASS_DIR="$cutlass" \
  > "$HOME/cmake.log" 2>&1 || { tail -30 "$HOME/cmake.log"; exit 1; }
start=$(date +%s)
cmake --build build-dev -j"$(nproc)" > "$HOME/build.log" 2>&1 || { grep -m5 -A12 "error" "$HOME/build.log"; exit 1; }
echo "built in $(( $(date +%s) - start )) s: $(ls build-dev/*.so | xargs -n1 basename | tr '\n' ' ')"
tar -C build-dev -cf - libepifuse_core.so libepifuse_cuda.so libepifuse_ort.so | xz -T0 -6 > "$OUT/epifuse-lib.tar.xz"
ls -la "$OUT/epifuse-lib.tar.xz"
cd "$repo"
if [ $# -gt 0 ]; then
  export PYTHONPATH=$HOME/site:$PWD:$PWD/bench EPIFUSE_LIB_DIR=$HOME/src/build-dev
  "$@"
fi
