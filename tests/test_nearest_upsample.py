"""nearest_upsample: on ort-cpu, a nearest Resize of a channels-last tensor by integer factors on H and W
becomes Reshape → Expand → Reshape, exactly where ONNX's index mapping copies whole pixels (checked
against ONNX Runtime's own Resize on random inputs); other modes, factors, small C, symbolic sizes and
other targets keep the Resize."""
import numpy as np
import onnx
import onnx_graphsurgeon as gs
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from models import zoo
from optimizer.passes.nearest_upsample import nearest_upsample
from optimizer.pipeline import FusionPolicy, optimize_model
from optimizer.report import Report
from optimizer.verify import verify
from tests.helpers import ops


def _resize_model(shape, *, scales=None, sizes=None, opset=17, **attrs):
    """[N, H, W, C] → Resize → y. `shape[0]` may be a name (a symbolic batch)."""
    inits, inputs = [], ["x", ""]
    if scales is not None:
        inits.append(numpy_helper.from_array(np.array(scales, np.float32), "scales"))
        inputs.append("scales")
    else:
        inits.append(numpy_helper.from_array(np.array(sizes, np.int64), "sizes"))
        inputs += ["", "sizes"]
    node = helper.make_node("Resize", inputs, ["y"], name="up", **attrs)
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, shape)],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    return onnx.shape_inference.infer_shapes(model)


def _rewritten(model, target="ort-cpu"):
    report = Report()
    graph = nearest_upsample(gs.import_onnx(model), report, target)
    return gs.export_onnx(graph), report


def _run(model, x):
    return ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]


@pytest.mark.parametrize("transform,nearest,factors", [
    ("asymmetric", "floor", (2, 2)),             # torch's nn.Upsample(mode="nearest") export: YOLO necks
    ("asymmetric", "floor", (3, 2)),
    ("half_pixel", "round_prefer_floor", (2, 4)),  # the ONNX defaults
    ("pytorch_half_pixel", "round_prefer_ceil", (3, 3)),
    ("tf_half_pixel_for_nn", "floor", (2, 3)),
    ("asymmetric", "round_prefer_floor", (2, 2)),  # ties at every odd index, rounded down: still floor(i / 2)
])
def test_whole_pixel_upsampling_becomes_an_exact_broadcast_copy(transform, nearest, factors):
    a, b = factors
    model = _resize_model(["N", 5, 7, 24], scales=[1, a, b, 1], mode="nearest",
                          coordinate_transformation_mode=transform, nearest_mode=nearest)
    rewritten, report = _rewritten(model)
    assert ops(rewritten) == ["Reshape", "Expand", "Reshape"]
    assert report.canonicalized["NHWC nearest Resize → Expand (ort-cpu)"] == 1
    x = np.random.default_rng(0).standard_normal((3, 5, 7, 24)).astype(np.float32)  # batch 3: the symbolic N
    expected = _run(model, x)
    assert expected.shape == (3, 5 * a, 7 * b, 24)
    np.testing.assert_array_equal(_run(rewritten, x), expected)


def test_sizes_are_read_as_factors():
    model = _resize_model([2, 4, 6, 16], sizes=[2, 8, 18, 16], mode="nearest",
                          coordinate_transformation_mode="asymmetric", nearest_mode="floor")
    rewritten, _ = _rewritten(model)
    assert "Expand" in ops(rewritten)
    x = np.random.default_rng(1).standard_normal((2, 4, 6, 16)).astype(np.float32)
    np.testing.assert_array_equal(_run(rewritten, x), _run(model, x))


@pytest.mark.parametrize("why,shape,kw", [
    ("not a whole-pixel mapping", [1, 5, 5, 32], dict(scales=[1, 4, 4, 1], coordinate_transformation_mode="asymmetric",
                                                      nearest_mode="round_prefer_floor")),
    ("align_corners", [1, 5, 5, 32], dict(scales=[1, 2, 2, 1], coordinate_transformation_mode="align_corners")),
    ("half_pixel with floor", [1, 5, 5, 32], dict(scales=[1, 2, 2, 1], nearest_mode="floor")),
    ("linear", [1, 5, 5, 32], dict(scales=[1, 2, 2, 1], mode="linear")),
    ("a fractional factor", [1, 4, 4, 32], dict(scales=[1, 1.5, 2, 1], coordinate_transformation_mode="asymmetric",
                                                nearest_mode="floor")),
    ("the last axis scaled (NCHW)", [1, 32, 5, 5], dict(scales=[1, 1, 2, 2], coordinate_transformation_mode="asymmetric",
                                                        nearest_mode="floor")),
    ("few channels", [1, 5, 5, 8], dict(scales=[1, 2, 2, 1], coordinate_transformation_mode="asymmetric",
                                        nearest_mode="floor")),
    ("symbolic H", [1, "H", 5, 32], dict(scales=[1, 2, 2, 1], coordinate_transformation_mode="asymmetric",
                                         nearest_mode="floor")),
    ("sizes kept to the aspect ratio", [1, 4, 4, 32], dict(sizes=[1, 8, 12, 32], keep_aspect_ratio_policy="not_larger",
                                                          coordinate_transformation_mode="asymmetric", nearest_mode="floor",
                                                          opset=18)),
    ("sizes with a symbolic batch", ["N", 4, 4, 32], dict(sizes=[1, 8, 8, 32], coordinate_transformation_mode="asymmetric",
                                                          nearest_mode="floor")),
])
def test_other_resizes_are_left_alone(why, shape, kw):
    kw.setdefault("mode", "nearest")
    rewritten, report = _rewritten(_resize_model(shape, **kw))
    assert ops(rewritten) == ["Resize"], why
    assert not report.canonicalized


@pytest.mark.parametrize("target", ["ort-cuda", "tensorrt"])
def test_other_targets_keep_the_resize(target):
    model = _resize_model([1, 5, 5, 32], scales=[1, 2, 2, 1], mode="nearest",
                          coordinate_transformation_mode="asymmetric", nearest_mode="floor")
    assert ops(_rewritten(model, target)[0]) == ["Resize"]


def test_yolo_neck_upsample_in_the_nhwc_region():
    """The zoo YOLO's neck Upsample (NCHW in the export) is moved into the NHWC region by the layout pass
    and becomes the copy; the optimized model matches ONNX Runtime on the original."""
    original = onnx.shape_inference.infer_shapes(zoo.yolo_tiny())
    optimized, report = optimize_model(original, target="ort-cpu", policy=FusionPolicy(mode="always"))
    assert report.canonicalized["NHWC nearest Resize → Expand (ort-cpu)"] == 1
    assert "Resize" not in ops(optimized) and "Expand" in ops(optimized)
    result = verify(original, optimized, precision="fp32")
    assert result["passed"] and result["worst_rel_l2"] < 1e-5, result
