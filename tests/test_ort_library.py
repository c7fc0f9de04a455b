"""libepifuse_ort.so on ONNX Runtime CPU: one epifuse::FusedConv node against the float64 reference."""
from __future__ import annotations

import ctypes

import ml_dtypes
import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from conv_reference import fused_conv, output_size, rel_l2
from optimizer import runtime
from optimizer.contract import ACTIVATIONS

# dtype -> (numpy type, ONNX element type, rel L2 tolerance)
DTYPES = {
    "float32": (np.float32, TensorProto.FLOAT, 1e-5),
    "float16": (np.float16, TensorProto.FLOAT16, 1e-3),
    "bfloat16": (ml_dtypes.bfloat16, TensorProto.BFLOAT16, 1e-2),
}


def make_model(x_shape, w, b, z_shape=None, *, elem_type=TensorProto.FLOAT, node_name="fused", **attrs) -> bytes:
    """A model with one FusedConv node; W and B are initializers, Z a graph input when given."""
    inputs = ["X", "W", "B"] + (["Z"] if z_shape is not None else [])
    node = helper.make_node("FusedConv", inputs, ["Y"], name=node_name, domain="epifuse",
                            plugin_namespace="epifuse", plugin_version="1", **attrs)
    graph_inputs = [helper.make_tensor_value_info("X", elem_type, x_shape)]
    if z_shape is not None:
        graph_inputs.append(helper.make_tensor_value_info("Z", elem_type, z_shape))
    graph = helper.make_graph(
        [node], "fused_conv", graph_inputs, [helper.make_tensor_value_info("Y", elem_type, None)],
        initializer=[numpy_helper.from_array(w, "W"), numpy_helper.from_array(b, "B")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("epifuse", 1)])
    model.ir_version = 9
    return model.SerializeToString()


def run_session(sess, feeds: dict) -> np.ndarray:
    """The first output of sess.run, also for bfloat16, which ORT's Python binding cannot
    convert to or from numpy: bfloat16 tensors travel as their uint16 bits."""
    if all(a.dtype != ml_dtypes.bfloat16 for a in feeds.values()):
        return sess.run(None, feeds)[0]
    values = {k: ort.OrtValue.ortvalue_from_numpy_with_onnx_type(a.view(np.uint16), TensorProto.BFLOAT16)
              for k, a in feeds.items()}
    y = sess.run_with_ort_values(None, values)[0]
    out = np.empty(y.shape(), np.uint16)
    ctypes.memmove(out.ctypes.data, y.data_ptr(), out.nbytes)
    return out.view(ml_dtypes.bfloat16)


def run_case(dtype_name="float32", *, N=1, H=7, W=9, C=8, K=6, R=3, S=3, residual="none", seed=0,
             symbolic_input=False, **attrs):
    dtype, elem_type, tol = DTYPES[dtype_name]
    rng = np.random.default_rng(seed)
    group = attrs.get("group", 1)
    strides, dil = attrs.get("strides", (1, 1)), attrs.get("dilations", (1, 1))
    pads = attrs.get("pads", (0, 0, 0, 0))
    P = output_size(H, pads[0], pads[2], dil[0], R, strides[0])
    Q = output_size(W, pads[1], pads[3], dil[1], S, strides[1])
    # Inputs are rounded to the dtype first, so the reference sees exactly what the kernel sees.
    x = rng.standard_normal((N, H, W, C)).astype(dtype)
    w = (rng.standard_normal((K, R, S, C // group)) / np.sqrt(R * S * C // group)).astype(dtype)
    b = (0.5 * rng.standard_normal(K)).astype(dtype)
    z = rng.standard_normal((N, P, Q, K)).astype(dtype) if residual != "none" else None
    if residual != "none":
        attrs["residual"] = residual
    x_shape = ["n", "h", "w", C] if symbolic_input else [N, H, W, C]
    model = make_model(x_shape, w, b, None if z is None else list(z.shape), elem_type=elem_type, **attrs)
    sess = runtime.create_session(model, intra_op_num_threads=2)
    y = run_session(sess, {"X": x} if z is None else {"X": x, "Z": z})
    assert y.dtype == dtype and y.shape == (N, P, Q, K)
    f64 = [None if a is None else a.astype(np.float64) for a in (x, w, b, z)]
    ref = fused_conv(*f64, **{k: v for k, v in attrs.items() if k != "allow_tf32"})  # math, not the result
    err = rel_l2(y, ref)
    assert err <= tol, f"rel L2 {err:.2e} > {tol:.0e}"


# Non-default parameters, so a kernel that ignores activation_params fails.
EXPLICIT_PARAMS = {"leaky_relu": [0.2], "clip": [-0.5, 0.7], "hardsigmoid": [0.3, 0.4], "elu": [0.7]}


@pytest.mark.parametrize("activation", sorted(ACTIVATIONS))
def test_activation(activation):
    params = EXPLICIT_PARAMS.get(activation)
    run_case(activation=activation, pads=[1, 1, 1, 1], **({"activation_params": params} if params else {}))


@pytest.mark.parametrize("activation", sorted(EXPLICIT_PARAMS))
def test_activation_default_params(activation):
    run_case(activation=activation, pads=[1, 1, 1, 1], seed=1)


GEOMETRIES = {
    "residual_pre": dict(N=3, residual="pre", activation="relu", pads=[1, 1, 1, 1]),
    "residual_post": dict(N=3, residual="post", activation="silu", pads=[1, 1, 1, 1]),
    "grouped_stride2": dict(C=8, K=12, group=4, strides=[2, 2], pads=[1, 1, 1, 1], activation="relu"),
    "depthwise": dict(C=16, K=16, group=16, pads=[1, 1, 1, 1], activation="clip", activation_params=[0.0, 6.0]),
    "depthwise_multiplier": dict(C=4, K=8, group=4, strides=[2, 1], pads=[0, 1, 2, 1], activation="hardswish"),
    "stride3_dilation2_asym_pads": dict(H=13, W=11, strides=[3, 3], dilations=[2, 2], pads=[0, 1, 2, 3], activation="gelu"),
    "dilation2_grouped": dict(C=6, K=9, group=3, dilations=[2, 2], pads=[2, 2, 2, 2], residual="post", activation="mish"),
    "pointwise": dict(N=3, R=1, S=1, C=12, K=20, activation="relu", residual="pre"),
    "pointwise_grouped": dict(R=1, S=1, C=12, K=8, group=2, activation="sigmoid"),
    "pointwise_stride2": dict(R=1, S=1, H=9, W=9, C=16, K=24, strides=[2, 2]),
    "stem_7x7": dict(H=23, W=21, C=3, K=16, R=7, S=7, strides=[2, 2], pads=[3, 3, 3, 3], activation="relu"),
    # Many output rows: several M tiles with a ragged last one.
    "many_tiles": dict(N=2, H=33, W=31, C=16, K=40, pads=[1, 1, 1, 1], residual="pre", activation="elu"),
    # Few rows, many channels: output channels split across tasks, ragged last chunk.
    "channel_chunks": dict(H=4, W=3, C=40, K=290, pads=[1, 1, 1, 1], activation="tanh"),
    "filter_larger_than_input": dict(H=2, W=3, R=5, S=5, pads=[2, 2, 2, 2], activation="softplus"),
    "symbolic_input": dict(N=3, symbolic_input=True, pads=[1, 0, 1, 0], activation="gelu_tanh"),
    # allow_tf32 permits TF32 on the CUDA kernels only: the CPU kernel stays within fp32's bound
    "allow_tf32": dict(N=2, pads=[1, 1, 1, 1], activation="silu", residual="pre", allow_tf32=1),
}


@pytest.mark.parametrize("case", sorted(GEOMETRIES))
def test_geometry_float32(case):
    run_case("float32", **GEOMETRIES[case])


@pytest.mark.parametrize("dtype_name", ["float16", "bfloat16"])
@pytest.mark.parametrize("case", ["residual_pre", "residual_post", "grouped_stride2", "depthwise",
                                  "depthwise_multiplier", "pointwise", "stride3_dilation2_asym_pads",
                                  "many_tiles"])
def test_geometry_16bit(dtype_name, case):
    run_case(dtype_name, **GEOMETRIES[case])


def test_empty_batch():
    w, b = np.ones((4, 3, 3, 4), np.float32), np.zeros(4, np.float32)
    sess = runtime.create_session(make_model(["n", 5, 5, 4], w, b, pads=[1, 1, 1, 1]))
    (y,) = sess.run(None, {"X": np.zeros((0, 5, 5, 4), np.float32)})
    assert y.shape == (0, 5, 5, 4)


# --- errors: never a crash, always a message naming the node and the bad value ----------------

def _session(node_name="bad_node", x_shape=(1, 5, 5, 4), w_shape=(4, 3, 3, 4), z_shape=None, **attrs):
    w = np.zeros(w_shape, np.float32)
    b = np.zeros(w_shape[0], np.float32)
    return runtime.create_session(make_model(list(x_shape), w, b, z_shape, node_name=node_name, **attrs))


@pytest.mark.parametrize("attrs, z_shape, detail", [
    (dict(activation="swish"), None, "swish"),
    (dict(activation="leaky_relu", activation_params=[0.1, 0.2]), None, "leaky_relu"),
    (dict(residual="pre"), None, "pre"),
    (dict(residual="sideways"), (1, 3, 3, 4), "sideways"),
    (dict(), (1, 3, 3, 4), "residual"),
    (dict(strides=[0, 1]), None, "strides"),
    (dict(pads=[1, 1, -1, 1]), None, "pads"),
    (dict(pads=[1, 1]), None, "pads"),
    (dict(group=2.0), None, "group"),
    (dict(allow_tf32=2), None, "allow_tf32 must be 0 or 1, got 2"),
    (dict(allow_tf32="yes"), None, "allow_tf32"),
])
def test_bad_attributes_fail_session_creation(attrs, z_shape, detail):
    with pytest.raises(Exception) as info:
        _session(z_shape=z_shape, **attrs)
    assert "bad_node" in str(info.value) and detail in str(info.value)


def test_group_not_dividing_c_fails_session_creation():
    with pytest.raises(Exception) as info:
        _session(x_shape=(1, 5, 5, 6), w_shape=(8, 3, 3, 1), group=4)
    assert "bad_node" in str(info.value) and "group 4 does not divide C = 6" in str(info.value)


def test_shape_error_at_run_names_node():
    sess = _session(x_shape=("n", "h", "w", "c"), w_shape=(4, 3, 3, 4))
    with pytest.raises(Exception) as info:
        sess.run(None, {"X": np.zeros((1, 5, 5, 6), np.float32)})
    assert "bad_node" in str(info.value) and "C = 6" in str(info.value)
    with pytest.raises(Exception) as info:
        sess.run(None, {"X": np.zeros((1, 2, 5, 4), np.float32)})
    assert "bad_node" in str(info.value) and "output height" in str(info.value)


def test_unnamed_node_is_described_by_its_output():
    with pytest.raises(Exception) as info:
        _session(node_name="", activation="swish")
    assert "output 'Y'" in str(info.value)


# A model file can name any input "" (an absent optional input to ORT, which then hands the kernel
# no tensor): session creation must fail naming the node, never crash the host process, so each case
# runs in a child process whose death would fail the test.
_EMPTY_INPUT_CASE = r"""
import sys
import numpy as np
from onnx import TensorProto, helper, numpy_helper
from optimizer import runtime
inputs = sys.argv[1].split(",")
op = sys.argv[2]
attrs = dict(domain="epifuse", name="empty_input_node")
if op == "FusedConv":
    attrs.update(plugin_namespace="epifuse", plugin_version="1", residual=sys.argv[3])
node = helper.make_node(op, inputs, ["Y"], **attrs)
graph = helper.make_graph([node], "g", [helper.make_tensor_value_info(n, TensorProto.FLOAT, [1, 5, 5, 4])
                                        for n in ("X", "Z") if n in inputs],
                          [helper.make_tensor_value_info("Y", TensorProto.FLOAT, None)],
                          [numpy_helper.from_array(np.zeros((4, 3, 3, 4), np.float32), "W"),
                           numpy_helper.from_array(np.zeros(4, np.float32), "B")])
model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("epifuse", 1)])
model.ir_version = 9
try:
    sess = runtime.create_session(model.SerializeToString())
    feeds = {n: np.zeros((1, 5, 5, 4), np.float32) for n in ("X", "Z") if n in inputs}
    sess.run(None, feeds)
    print("RAN")
except Exception as e:
    print("ERROR", str(e).splitlines()[0])
"""


@pytest.mark.parametrize("inputs, op, residual, detail", [
    (",W,B", "FusedConv", "none", "input 0 (X) is missing"),
    ("X,,B", "FusedConv", "none", "input 1 (W) is missing"),
    ("X,W,", "FusedConv", "none", "input 2 (B) is missing"),
    ("X,W,B,", "FusedConv", "pre", "input 3 (Z) is named"),
    ("X,W,B,", "FusedConv", "post", "input 3 (Z) is named"),
    ("X,W,B,", "FusedConv", "none", "input 3 (Z) is named"),
    ("", "NchwToNhwc", "", "input 0 (X) is missing"),
])
def test_inputs_named_empty_fail_session_creation_without_a_crash(inputs, op, residual, detail):
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-c", _EMPTY_INPUT_CASE, inputs, op, residual],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, f"the process died ({done.returncode}): {done.stderr[-500:]}"
    assert done.stdout.startswith("ERROR") and "empty_input_node" in done.stdout and detail in done.stdout, done.stdout


def test_a_complete_node_runs_in_the_same_harness():
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-c", _EMPTY_INPUT_CASE, "X,W,B", "FusedConv", "none"],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and done.stdout.startswith("RAN"), done.stdout + done.stderr[-300:]


@pytest.mark.parametrize("attrs, detail", [
    (dict(dilations=[2**62, 1]), "dilations must be in [1, 2^31 - 1]"),
    (dict(pads=[2**62, 0, 2**62, 0]), "pads must be in [0, 2^31 - 1]"),
    (dict(strides=[1, 2**40]), "strides must be in [1, 2^31 - 1]"),
])
def test_attributes_past_int32_fail_instead_of_overflowing(attrs, detail):
    with pytest.raises(Exception) as info:
        _session(**attrs)
    assert "bad_node" in str(info.value) and detail in str(info.value)
