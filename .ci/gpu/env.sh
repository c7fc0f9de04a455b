# GPU machine, sourced (carry .stage/ort .stage/lib): `. .ci/gpu/env.sh`. Unpacks the staged onnxruntime-gpu,
# onnx-graphsurgeon and the CUDA library that build.sh returned, and points Python at them and at this checkout.
if [ ! -d "$HOME/ortsite/onnxruntime" ]; then
  mkdir -p "$HOME/ortsite" "$HOME/epifuse-lib"
  tar -xJf .stage/ort/onnxruntime.tar.xz -C "$HOME/ortsite"
  python3 -m pip install -q --no-index --no-deps --target "$HOME/ortsite" .stage/ort/*.whl
  tar -xJf .stage/lib/epifuse-lib.tar.xz -C "$HOME/epifuse-lib"
fi
export PYTHONPATH=$HOME/ortsite:$PWD:$PWD/bench EPIFUSE_LIB_DIR=$HOME/epifuse-lib
