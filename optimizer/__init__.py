"""epifuse: make exported CNN .onnx models fast (BN folding, conv+activation(+residual) fusion
into epifuse::FusedConv, NHWC layout). `optimizer.pipeline.optimize_file` is the main entry point."""
from onnx_graphsurgeon.logger import G_LOGGER

from .errors import EpifuseError
from .pipeline import PRECISIONS, TARGETS, optimize_file, optimize_model

G_LOGGER.severity = G_LOGGER.ERROR  # gs warns about optional colour output on first use
__version__ = "0.1.0"
__all__ = ["EpifuseError", "optimize_file", "optimize_model", "TARGETS", "PRECISIONS", "__version__"]
