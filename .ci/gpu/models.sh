#!/usr/bin/env bash
# GPU machine (carry .stage/ort .stage/lib, the latter from build.sh): one model's row of bench/gpu_models.py at batch 1 and 16,
# its table and log written under $OUT as it goes (a call cut off at its time limit keeps what it wrote).
#   bash .ci/gpu/models.sh MODEL PRECISION TAG [more gpu_models.py arguments]
set -uo pipefail
. "$(dirname "$0")/env.sh"
model=$1 precision=$2 tag=$3
shift 3
python3 -u bench/gpu_models.py --models "$model" --precision "$precision" --batches 1,16 --rounds 10 \
  --markdown "$OUT/$tag.md" "$@" > "$OUT/$tag.log" 2>&1
rc=$?
grep -v '^\s*$' "$OUT/$tag.log" | tail -25
exit $rc
