#!/usr/bin/env bash
# GPU machine, first call (carry .stage/c0 .stage/c5): headers unpacked to $HOME/deps, the checkout
# copied to $HOME/src (later calls carry other things), the CUDA library built for sm_90a there.
set -euo pipefail
mkdir -p "$HOME/deps" "$HOME/stage" "$HOME/src"
tar -xJf .stage/c5/deps.tar.xz -C "$HOME/deps"
cp .stage/c0/* .stage/c5/*.whl .stage/c5/ort_wheel "$HOME/stage/"
tar --exclude=./.stage --exclude=./.git -cf - . | tar -xf - -C "$HOME/src"
cutlass=$HOME/deps/$(cat .stage/c5/cutlass_dir)
cd "$HOME/src"
cmake -S plugins -B build-dev -G Ninja -DEPIFUSE_CUDA=ON -DEPIFUSE_CUDA_ARCHS=90a -DCMAKE_BUILD_TYPE=Release \
  -DEPIFUSE_ORT_INCLUDE_DIR="$HOME/deps/root/usr/include/onnxruntime" \
  -DEPIFUSE_EIGEN_INCLUDE_DIR="$HOME/deps/root/usr/include/eigen3" -DEPIFUSE_CUTLASS_DIR="$cutlass" \
  > "$HOME/cmake.log" 2>&1 || { tail -30 "$HOME/cmake.log"; exit 1; }
start=$(date +%s)
cmake --build build-dev -j"$(nproc)" > "$HOME/build.log" 2>&1 || { grep -m5 -A12 "error" "$HOME/build.log"; exit 1; }
echo "built in $(( $(date +%s) - start )) s: $(ls build-dev/*.so | xargs -n1 basename | tr '\n' ' ')"
