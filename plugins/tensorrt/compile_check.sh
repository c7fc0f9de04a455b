#!/usr/bin/env bash
# Compiles both TensorRT plugin libraries against a TensorRT include folder and checks what they
# export. Needs only TensorRT's headers (no TensorRT library) plus what the project needs anyway
# (CUDA toolkit, the fetched CUTLASS/ORT/Eigen dependencies).
#
#   plugins/tensorrt/compile_check.sh INCLUDE_DIR [BUILD_DIR]
#
# INCLUDE_DIR holds NvInferRuntime.h, e.g. include/ of an NVIDIA/TensorRT checkout at tag v10.16
# or v11.1, or /usr/include/x86_64-linux-gnu of a TensorRT install. BUILD_DIR (default
# ${TMPDIR:-/tmp}/epifuse-trt-check) is reused: checking another header version recompiles only
# the plugin. EPIFUSE_CUDA_ARCHS (default 80) keeps the kernel compile short; JOBS (default 2).
set -euo pipefail
include_dir=${1:?usage: compile_check.sh INCLUDE_DIR [BUILD_DIR]}
build_dir=${2:-${TMPDIR:-/tmp}/epifuse-trt-check}
src=$(cd "$(dirname "$0")/.." && pwd)
include_dir=$(cd "$include_dir" && pwd)
[[ -f $include_dir/NvInferRuntime.h ]] || { echo "compile_check: $include_dir has no NvInferRuntime.h" >&2; exit 2; }
version=$(sed -n 's/^#define TRT_\(MAJOR\|MINOR\|PATCH\)_ENTERPRISE \([0-9]*\).*/\2/p' "$include_dir/NvInferVersion.h" | paste -sd.)
echo "== TensorRT headers $version: $include_dir"

cmake -S "$src" -B "$build_dir" -DEPIFUSE_CUDA=ON -DEPIFUSE_CUDA_ARCHS="${EPIFUSE_CUDA_ARCHS:-80}" \
      -DEPIFUSE_TRT_INCLUDE_DIR="$include_dir" > "$build_dir.configure.log" 2>&1 \
  || { cat "$build_dir.configure.log" >&2; exit 1; }
grep -E "epifuse: (TensorRT|skipping plugins/tensorrt)" "$build_dir.configure.log" || true
cmake --build "$build_dir" --target epifuse_trt epifuse_trt_static -j"${JOBS:-2}" > "$build_dir.build.log" 2>&1 \
  || { tail -50 "$build_dir.build.log" >&2; exit 1; }
if grep -E "warning:" "$build_dir.build.log" | grep -E "plugins/(tensorrt|core)/"; then
  echo "compile_check: warnings in the plugin sources (above)" >&2
  exit 1
fi

# Defined dynamic symbols, without the ELF version nodes (A) and weak libstdc++ leftovers (W, V, u).
exports() { nm -D --defined-only "$1" | awk '$2 ~ /^[TDBR]$/ {print $3}' | sort | paste -sd' '; }
undefined_trt() { nm -D --undefined-only "$1" | awk '{print $2}' | grep -E '^(getPluginRegistry|getLogger)$' | sort | paste -sd' '; }

status=0
check() {  # library, expected exports, expected undefined TensorRT symbols (empty: none)
  local lib=$build_dir/$1 got undef
  got=$(exports "$lib")
  undef=$(undefined_trt "$lib" || true)
  printf '%-26s exports: [%s]  needs from TensorRT: [%s]  NEEDED: %s\n' "$1" "$got" "$undef" \
    "$(readelf -d "$lib" | sed -n 's/.*NEEDED.*\[\(.*\)\]/\1/p' | paste -sd' ')"
  if [[ $got != "$2" ]]; then echo "  FAIL: expected exports [$2]" >&2; status=1; fi
  if [[ $undef != "$3" ]]; then echo "  FAIL: expected undefined TensorRT symbols [$3]" >&2; status=1; fi
}
check libepifuse_trt.so "getCreators setLoggerFinder" ""
# Static registration calls libnvinfer's getPluginRegistry()/getLogger(): NEEDED when libnvinfer was
# found at configure time, otherwise resolved from the TensorRT the loading process has loaded.
check libepifuse_trt_static.so "" "getLogger getPluginRegistry"
[[ $status == 0 ]] && echo "== OK: both libraries compiled against TensorRT $version headers"
exit $status
