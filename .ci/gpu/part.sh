#!/usr/bin/env bash
# GPU machine (carry .stage/cN): one part of the onnxruntime-gpu wheel into $HOME/stage.
set -euo pipefail
cp ".stage/c$1/"* "$HOME/stage/"
echo "$(ls "$HOME"/stage/part? | wc -l) of 5 wheel parts there"
