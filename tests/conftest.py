"""GPU tests (marker `gpu`) need torch with CUDA; they are skipped elsewhere with the reason.

The tests of the rewrites fuse wherever a kernel exists (EPIFUSE_FUSE=always): what they check is the
graph a fusion writes, not whether it pays on this machine. The cost decision has its own tests
(test_decide.py, test_costs.py, test_measure.py), which choose the mode explicitly."""
import atexit
import os
import shutil
import tempfile

import pytest

os.environ.setdefault("EPIFUSE_FUSE", "always")
# Kernel choices that tests time (the optimizer's measuring process keeps them) go to a file of this run,
# and none from the developer's own cache steer a test's kernels.
if "EPIFUSE_TUNING_CACHE" not in os.environ:
    _tuning_folder = tempfile.mkdtemp(prefix="epifuse-tests-")
    atexit.register(shutil.rmtree, _tuning_folder, True)
    os.environ["EPIFUSE_TUNING_CACHE"] = os.path.join(_tuning_folder, "tuning.tsv")


def _cuda_available() -> tuple[bool, str]:
    try:
        import torch
    except ImportError:
        return False, "torch is not installed"
    if not torch.cuda.is_available():
        return False, "no CUDA device"
    return True, ""


def pytest_collection_modifyitems(config, items):
    ok, why = _cuda_available()
    if ok:
        return
    skip = pytest.mark.skip(reason=f"GPU test: {why}")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
