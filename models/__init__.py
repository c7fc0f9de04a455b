"""Embedded default models: tiny random-weight CNNs built by code, covering the patterns real
exporters write. `build(name, batch=...)` returns an `onnx.ModelProto`; `python -m models OUTDIR`
writes them all."""
from models.zoo import DEFAULT_MODEL, ZOO, build, default_model

__all__ = ["DEFAULT_MODEL", "ZOO", "build", "default_model"]
