#!/usr/bin/env bash
# Entrypoint of the epifuse Triton image. `tritonserver ...` gets the epifuse TensorRT plugin
# (the static-registration library: it registers FusedConv when dlopen()ed) through the TensorRT
# backend's own loader, --backend-config=tensorrt,plugins=..., unless the command names plugins
# itself. The ONNX Runtime backend needs nothing here: each model's config.pbtxt names
# libepifuse_ort.so in model_operations. Anything else runs as given.
set -euo pipefail
plugin=${EPIFUSE_TRT_PLUGIN:-/opt/epifuse/lib/libepifuse_trt_static.so}
if [[ ${1:-} == tritonserver ]]; then
  if [[ " $* " == *" --backend-config=tensorrt,plugins="* ]]; then
    :  # the caller chose the plugins
  elif [[ -f $plugin ]]; then
    set -- "$@" "--backend-config=tensorrt,plugins=$plugin"
  else
    echo "entrypoint: $plugin not found: TensorRT plans with FusedConv layers will not load" >&2
  fi
fi
# NVIDIA's entrypoint prints the banner and checks the driver; keep it in front when present.
if [[ -x /opt/nvidia/nvidia_entrypoint.sh ]]; then
  exec /opt/nvidia/nvidia_entrypoint.sh "$@"
fi
exec "$@"
