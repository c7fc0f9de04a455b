#!/usr/bin/env bash
# Stages what the GPU machine (no network) needs, in folders of .stage/ that each fit one call's carry
# (64 MiB with the checkout). Run here, once:
#   bash .ci/gpu/stage.sh
# .stage/build  the build's headers (ONNX Runtime, Eigen, CUTLASS) and onnx-graphsurgeon's wheel
# .stage/ort    onnxruntime-gpu cut to what a CNN on an H200 runs (ort_lite.py: 23 MB against 255)
# Then on the GPU machine, where nothing outlives a call (the machine goes back 30 s after one):
#   1. carry .stage/build: `bash .ci/gpu/build.sh [command]`: builds the CUDA library for sm_90a
#      (~4 min on 16 cores), returns it as $OUT/epifuse-lib.tar.xz, then runs `command` (e.g. the GPU
#      kernel tests: they need no onnxruntime-gpu). Copy that file to .stage/lib/ here. Or build the same
#      library here, out of device time: `bash .ci/gpu/build_here.sh` (17 min cold, seconds to a minute
#      after a change) writes .stage/lib/epifuse-lib.tar.xz.
#   2. carry .stage/ort .stage/lib: `. .ci/gpu/env.sh && <command>`, e.g. `bash .ci/gpu/models.sh resnet50 fp32
#      r50 --tune` (one model per call: a call ends at 600 s).
set -euo pipefail
cd "$(dirname "$0")/../.."
deps=$(bash plugins/scripts/fetch_deps.sh | tail -1)
cutlass=$(bash plugins/scripts/fetch_cutlass.sh | tail -1)  # .../cutlass-<ver>/cutlass_library/source
cache=$(dirname "$deps")
rel=${cutlass#"$cache"/}
mkdir -p .stage/wheels .stage/build .stage/ort .stage/lib
tar -cJf .stage/build/deps.tar.xz -C "$cache" root/usr/include "$rel/include" "$rel/tools/util/include"
echo "$rel" > .stage/build/cutlass_dir
pip() { python3 -m pip download -q --no-deps --only-binary=:all: -d .stage/wheels "$@"; }
pip --python-version 3.12 --implementation cp --platform manylinux_2_28_x86_64 onnxruntime-gpu==1.31.1
pip onnx_graphsurgeon
cp .stage/wheels/onnx_graphsurgeon-*.whl .stage/build/
cp .stage/wheels/onnx_graphsurgeon-*.whl .stage/ort/
python3 -m pip install -q --target .stage/zstd zstandard
PYTHONPATH=.stage/zstd python3 .ci/gpu/ort_lite.py .stage/wheels/onnxruntime_gpu-1.31.1-*.whl .stage/ort/onnxruntime.tar.xz
du -sh .stage/build .stage/ort
