"""epifuse: make exported CNN .onnx models fast (BN folding, conv+activation(+residual) fusion
into epifuse::FusedConv, NHWC layout). `optimizer.pipeline.optimize_file` is the main entry point.

The pipeline (and onnx-graphsurgeon) load on first use, so `optimizer.registry` and
`optimizer.cuda` stay importable with numpy alone (GPU test machines, benchmarks)."""
from .errors import EpifuseError

__version__ = "0.1.0"
__all__ = ["EpifuseError", "optimize_file", "optimize_model", "TARGETS", "PRECISIONS", "__version__"]


def __getattr__(name):
    if name in ("optimize_file", "optimize_model", "TARGETS", "PRECISIONS"):
        from . import pipeline

        return getattr(pipeline, name)
    raise AttributeError(f"module 'optimizer' has no attribute {name!r}")
