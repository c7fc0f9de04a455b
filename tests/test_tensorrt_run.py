"""Where TensorRT runs (its Python API, a GPU it supports, torch with CUDA): every zoo model
optimized for --target tensorrt is built into an engine with the plugin and run, and its outputs
are compared with ONNX Runtime on the original model. Skipped with the reason elsewhere — in this
project's workplace always (no TensorRT runtime; TensorRT-RTX refuses the H200's sm_90)."""
import numpy as np
import pytest

from models import zoo

pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module")
def trt_runtime():
    from optimizer.errors import EpifuseError
    from optimizer.tensorrt.api import is_rtx, load_tensorrt

    try:
        trt = load_tensorrt()
    except EpifuseError as e:
        pytest.skip(str(e))
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    if is_rtx(trt) and torch.cuda.get_device_capability() == (9, 0):
        pytest.skip("TensorRT-RTX's runtime refuses sm_90 (H100/H200); its builder is tested by "
                    "tests/test_tensorrt_build.py")
    from optimizer.libraries import TRT_LIBRARY, LibraryNotFound, library_path

    try:
        library_path(TRT_LIBRARY)
    except LibraryNotFound:
        pytest.skip("TensorRT runs here but the plugin library was not built (CMake found no TensorRT headers)")
    return trt


@pytest.mark.parametrize("name", sorted(zoo.ZOO))
def test_zoo_engine_matches_onnx_runtime(trt_runtime, name, tmp_path):
    import onnx

    from optimizer.passes.load import validate
    from optimizer.pipeline import FusionPolicy, optimize_model
    from optimizer.runtime import open_plan
    from optimizer.tensorrt import build_engine
    from optimizer.verify import random_inputs, rel_l2
    from tests.helpers import run_ort

    original = validate(zoo.build(name, batch=2))
    # every candidate with a kernel fused: the plugin is what this runs (by cost, TensorRT keeps them)
    optimized, report = optimize_model(original, target="tensorrt", policy=FusionPolicy(mode="always"))
    assert report.fused_count() > 0
    onnx.save(optimized, tmp_path / "m.onnx")
    first = original.graph.input[0]
    shape = [d.dim_value or 2 for d in first.type.tensor_type.shape.dim]
    shapes = {first.name: tuple(shape)}
    build_engine(tmp_path / "m.onnx", tmp_path / "m.plan", min_shapes=shapes, opt_shapes=shapes, max_shapes=shapes)
    feeds = random_inputs(original, seed=3)
    actual = open_plan(tmp_path / "m.plan").run(feeds)
    expected = dict(zip([o.name for o in original.graph.output], run_ort(original, feeds)))
    for out, value in expected.items():
        # TensorRT may pick TF32 for its own layers in an fp32 network: 1e-3, not the CPU's 1e-5
        assert rel_l2(actual[out], value) < 1e-3, (name, out)
        assert np.isfinite(actual[out]).all()


def test_build_engine_keeps_the_faster_of_the_plugin_and_tensorrts_own(trt_runtime, tmp_path):
    import onnx

    from optimizer.cli import main
    from optimizer.passes.load import validate
    from optimizer.pipeline import FusionPolicy, optimize_model
    from optimizer.runtime import open_plan
    from optimizer.verify import random_inputs, rel_l2
    from tests.helpers import run_ort

    original = validate(zoo.build("yolo_tiny", batch=2))
    optimized, _ = optimize_model(original, target="tensorrt", policy=FusionPolicy(mode="always"))
    onnx.save(original, tmp_path / "orig.onnx")
    onnx.save(optimized, tmp_path / "m.onnx")
    assert main(["build-engine", str(tmp_path / "m.onnx"), "-o", str(tmp_path / "m.plan"), "--original",
                 str(tmp_path / "orig.onnx"), "--rounds", "4", "--report", str(tmp_path / "r.json")]) == 0
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.onnx", "m.plan", "orig.onnx", "r.json"]  # no leftovers
    feeds = random_inputs(original, seed=5)
    actual = open_plan(tmp_path / "m.plan").run(feeds)
    expected = dict(zip([o.name for o in original.graph.output], run_ort(original, feeds)))
    for out, value in expected.items():
        assert rel_l2(actual[out], value) < 1e-3, out
