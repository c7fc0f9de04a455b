#!/usr/bin/env bash
# Stages what a GPU machine without network needs, in folders of .stage/ that each fit one call's carry
# (64 MiB with the checkout): c0-c4 the onnxruntime-gpu wheel in five parts, c5 the build's headers
# (ONNX Runtime, Eigen, CUTLASS) and the small wheels the optimizer imports. Run here, once:
#   bash .ci/gpu/stage.sh
# Then on the GPU machine, calls back to back (the machine is given back when idle):
#   1. carry .stage/c0 .stage/c5: bash .ci/gpu/build.sh        (~270 s on 16 cores: sm_90a, every kernel)
#   2. carry .stage/cN, N = 1..4: bash .ci/gpu/part.sh N
#   3. any command after `. .ci/gpu/env.sh` (installs the wheel once; EPIFUSE_LIB_DIR and PYTHONPATH set),
#      e.g. `. .ci/gpu/env.sh && python3 -m pytest -q -m gpu tests/test_cuda_kernels.py`.
# A benchmark of several models can outlast one call (600 s): run one model per call, with output
# written under $OUT as it goes.
set -euo pipefail
cd "$(dirname "$0")/../.."
deps=$(bash plugins/scripts/fetch_deps.sh | tail -1)
cutlass=$(bash plugins/scripts/fetch_cutlass.sh | tail -1)  # .../cutlass-<ver>/cutlass_library/source
cache=$(dirname "$deps")
rel=${cutlass#"$cache"/}
mkdir -p .stage/wheels .stage/c5
tar -cJf .stage/c5/deps.tar.xz -C "$cache" root/usr/include "$rel/include" "$rel/tools/util/include"
echo "$rel" > .stage/c5/cutlass_dir
pip() { python3 -m pip download -q --no-deps --only-binary=:all: -d .stage/wheels "$@"; }
pip --python-version 3.12 --implementation cp --platform manylinux_2_28_x86_64 onnxruntime-gpu==1.31.1
pip onnx_graphsurgeon rich markdown-it-py mdurl pygments
cp .stage/wheels/*none-any.whl .stage/c5/
whl=$(ls .stage/wheels/onnxruntime_gpu-*.whl)
basename "$whl" > .stage/c5/ort_wheel
rm -f .stage/part?
split -n 5 -d -a 1 "$whl" .stage/part
for i in 0 1 2 3 4; do mkdir -p .stage/c$i && mv .stage/part$i .stage/c$i/; done
du -sh .stage/c?
