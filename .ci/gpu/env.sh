# GPU machine, sourced: `. .ci/gpu/env.sh`. Installs the staged wheels once (onnxruntime-gpu joined from
# its parts) and points Python at them, at this checkout and at the CUDA build in $HOME/src.
if [ ! -d "$HOME/ortsite/onnxruntime" ]; then
  whl=$HOME/stage/$(cat "$HOME/stage/ort_wheel")
  cat "$HOME"/stage/part? > "$whl"
  python3 -m pip install -q --no-index --no-deps --target "$HOME/ortsite" "$whl" "$HOME"/stage/*none-any.whl
fi
export PYTHONPATH=$HOME/ortsite:$PWD:$PWD/bench EPIFUSE_LIB_DIR=$HOME/src/build-dev
