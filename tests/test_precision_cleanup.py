"""precision: low-precision islands with Casts only where they end, graph I/O dtypes kept,
constants converted once; cleanup: duplicate initializers merged."""
import numpy as np
import onnx
import onnx_graphsurgeon as gs
import pytest
from onnx import TensorProto, helper, numpy_helper

from optimizer.passes.cleanup import merge_duplicate_initializers
from optimizer.passes.precision import precision
from optimizer.report import Report
from tests.helpers import ops, rel_l2, run_ort


def _chain(ops_in_order, opset=17):
    nodes, x = [], "x"
    inits = [numpy_helper.from_array(np.float32([0.5, -1.0, 2.0, 3.0]).reshape(1, 4), "k")]
    for i, op in enumerate(ops_in_order):
        inputs = [x, "k"] if op in ("Add", "Mul") else [x]
        nodes.append(helper.make_node(op, inputs, [f"t{i}"], name=f"n{i}"))
        x = f"t{i}"
    nodes[-1].output[0] = "y"
    g = helper.make_graph(nodes, "t", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [3, 4])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [3, 4])], inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])
    m.ir_version = 8
    return onnx.shape_inference.infer_shapes(m)


def _convert(model, prec, target):
    out = gs.export_onnx(precision(gs.import_onnx(model), Report(), prec, target))
    out.ir_version = model.ir_version
    onnx.checker.check_model(out)
    return out


def test_fp16_on_gpu_targets_casts_only_at_the_edges():
    m = _chain(["Relu", "Add", "Mul", "Sigmoid"])
    out = _convert(m, "fp16", "ort-cuda")
    assert ops(out) == ["Cast", "Relu", "Add", "Mul", "Sigmoid", "Cast"]
    assert out.graph.input[0].type.tensor_type.elem_type == TensorProto.FLOAT
    assert out.graph.output[0].type.tensor_type.elem_type == TensorProto.FLOAT
    assert {i.data_type for i in out.graph.initializer} == {TensorProto.FLOAT16}
    feeds = {"x": np.random.default_rng(0).standard_normal((3, 4)).astype(np.float32)}
    assert rel_l2(run_ort(out, feeds)[0], run_ort(m, feeds)[0]) < 2e-3



def test_scalar_constants_stay_scalars_in_fp16():
    """Clip's bounds must be scalars (ONNX's schema; ORT lets a 1-element vector pass): converted to fp16
    they keep their empty shape."""
    g = helper.make_graph([helper.make_node("Clip", ["x", "lo", "hi"], ["y"])], "t",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [3, 4])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [3, 4])],
                          [numpy_helper.from_array(np.float32(0), "lo"), numpy_helper.from_array(np.float32(6), "hi")])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    out = _convert(m, "fp16", "ort-cuda")
    bounds = [i for i in out.graph.initializer if i.name.startswith(("lo", "hi"))]
    assert [(i.data_type, list(i.dims)) for i in bounds] == [(TensorProto.FLOAT16, [])] * 2

@pytest.mark.parametrize("opset, expected", [
    (17, ["Cast", "Relu", "Cast", "HardSwish", "Cast", "Add", "Cast"]),  # HardSwish takes bfloat16 from opset 22
    (22, ["Cast", "Relu", "HardSwish", "Add", "Cast"]),
])
@pytest.mark.parametrize("target", ["ort-cuda", "tensorrt"])
def test_bf16_on_gpu_targets_only_where_the_schema_admits_it(opset, expected, target):
    """A node whose ONNX schema at the model's opset has no bfloat16 (at 17: Conv, MaxPool,
    GlobalAveragePool, HardSwish) stays float32 between Casts: as bf16 the model would be invalid and
    no runtime would load it."""
    out = _convert(_chain(["Relu", "HardSwish", "Add"], opset=opset), "bf16", target)
    assert ops(out) == expected
    onnx.checker.check_model(out, full_check=True)


def test_bf16_on_the_cpu_moves_in_bf16_only_what_bf16_nodes_wrote():
    """The CPU EP has bfloat16 kernels only for ops that move data: a Transpose of a bf16 FusedConv's
    output runs bf16 (the Cast after it then moves half the bytes), while a Flatten between two float32
    ops stays float32 (in bf16 it would get two Casts and a rounding for nothing)."""
    from optimizer import contract

    w = numpy_helper.from_array(np.ones((4, 1, 1, 4), np.float32), "w")
    b = numpy_helper.from_array(np.zeros(4, np.float32), "b")
    nodes = [helper.make_node(contract.OP_TYPE, ["x", "w", "b"], ["c"], name="fused", domain=contract.DOMAIN),
             helper.make_node("Transpose", ["c"], ["t"], name="to_nchw", perm=[0, 3, 1, 2]),
             helper.make_node("Relu", ["t"], ["r"], name="relu"),
             helper.make_node("Flatten", ["r"], ["y"], name="flatten")]
    g = helper.make_graph(nodes, "t", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 3, 4])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 36])], [w, b],
                          value_info=[helper.make_tensor_value_info("c", TensorProto.FLOAT, [1, 3, 3, 4])])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17),
                                            helper.make_opsetid(contract.DOMAIN, contract.OPSET_VERSION)])
    m.ir_version = 8
    out = _convert(onnx.shape_inference.infer_shapes(m), "bf16", "ort-cpu")
    assert ops(out) == ["Cast", contract.OP_TYPE, "Transpose", "Cast", "Relu", "Flatten"]
    types = {v.name: v.type.tensor_type.elem_type for v in onnx.shape_inference.infer_shapes(out).graph.value_info}
    assert types["t"] == TensorProto.BFLOAT16 and types["r"] == TensorProto.FLOAT


@pytest.mark.parametrize("target", ["ort-cpu", "ort-cuda"])
def test_a_shape_of_low_precision_data_reads_it_without_a_cast(target):
    """Shape reads only the dims, of any dtype: a Cast before it would copy the whole map to learn them."""
    nodes = [helper.make_node("Relu", ["x"], ["r"], name="relu"),
             helper.make_node("Shape", ["r"], ["s"], name="shape"),
             helper.make_node("Reshape", ["r", "s"], ["y"], name="reshape")]
    g = helper.make_graph(nodes, "t", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [3, 4])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [3, 4])])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    out = _convert(onnx.shape_inference.infer_shapes(m), "fp16", target)
    producers = {o: n.op_type for n in out.graph.node for o in n.output}
    shape = next(n for n in out.graph.node if n.op_type == "Shape")
    assert producers[shape.input[0]] == "Relu"
    feeds = {"x": np.random.default_rng(0).standard_normal((3, 4)).astype(np.float32)}
    assert rel_l2(run_ort(out, feeds)[0], run_ort(m, feeds)[0]) < 2e-3


def test_cpu_target_keeps_ops_without_fp16_kernels_in_fp32():
    m = _chain(["Relu", "Mish", "Relu"], opset=18)  # the CPU EP has no float16 Mish
    out = _convert(m, "fp16", "ort-cpu")
    assert ops(out) == ["Cast", "Relu", "Cast", "Mish", "Cast", "Relu", "Cast"]
    feeds = {"x": np.random.default_rng(0).standard_normal((3, 4)).astype(np.float32)}
    assert rel_l2(run_ort(out, feeds)[0], run_ort(m, feeds)[0]) < 2e-3


def test_fp32_is_a_no_op():
    m = _chain(["Relu", "Add"])
    assert ops(_convert(m, "fp32", "ort-cpu")) == ["Relu", "Add"]


def test_duplicate_initializers_are_merged():
    a = numpy_helper.from_array(np.arange(8, dtype=np.float32), "a")
    b = numpy_helper.from_array(np.arange(8, dtype=np.float32), "b")
    c = numpy_helper.from_array(np.arange(8, dtype=np.int64), "c")  # same bytes? no: different dtype
    nodes = [helper.make_node("Add", ["x", "a"], ["t"]), helper.make_node("Add", ["t", "b"], ["u"]),
             helper.make_node("Cast", ["c"], ["cf"], to=TensorProto.FLOAT), helper.make_node("Add", ["u", "cf"], ["y"])]
    g = helper.make_graph(nodes, "t", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [8])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [8])], [a, b, c])
    graph = gs.import_onnx(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]))
    assert merge_duplicate_initializers(graph) == 1
    graph.cleanup()
    assert sorted(t.name for t in graph.tensors().values() if isinstance(t, gs.Constant)) == ["a", "c"]


def _maxpool(dtype, opset, scale_first=False, reshape_to=None):
    """MaxPool of x [1,2,4,4]; `scale_first`: x is first multiplied by an initializer (an initializer as a
    node's first input); `reshape_to`: the output is reshaped to that shape by a constant, while the graph
    output keeps declaring [1,2,3,3] (a conflict strict inference refuses and ONNX Runtime runs)."""
    nodes, inits, x = [], [], "x"
    if scale_first:
        inits.append(helper.make_tensor("scale", dtype, [1], [2.0]))
        nodes.append(helper.make_node("Mul", ["scale", "x"], ["xs"], name="scale"))
        x = "xs"
    nodes.append(helper.make_node("MaxPool", [x], ["p" if reshape_to else "y"], name="pool", kernel_shape=[2, 2]))
    if reshape_to:
        inits.append(numpy_helper.from_array(np.int64(reshape_to), "shape"))
        nodes.append(helper.make_node("Reshape", ["p", "shape"], ["y"], name="reshape"))
    g = helper.make_graph(nodes, "t", [helper.make_tensor_value_info("x", dtype, [1, 2, 4, 4])],
                          [helper.make_tensor_value_info("y", dtype, [1, 2, 3, 3])], inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])
    m.ir_version = 8
    return m


def _cleanup(output, original):
    """cleanup as the pipeline calls it: `original`'s skeleton without initializers as the template and
    its structure (small constants, weights as inputs) for the strict check."""
    from optimizer.passes.cleanup import cleanup
    from optimizer.proto import skeleton

    return cleanup(gs.import_onnx(output), Report(), skeleton(original, keep_small=False, weights_as_inputs=False),
                   input_structure=skeleton(original))


@pytest.mark.parametrize("scale_first", [False, True], ids=["plain", "initializer_first_input"])
def test_cleanup_refuses_an_output_that_fails_strict_inference_where_the_input_passes(scale_first):
    """A bf16 MaxPool at opset 17 passes onnx.checker's default check but not the schema's type
    constraint (no runtime loads it): cleanup names the node instead of handing it to save. Also where
    the input has an initializer as a node's first input (its skeleton must keep the constant)."""
    from optimizer.errors import EpifuseError

    with pytest.raises(EpifuseError, match="strict type and shape inference.*MaxPool"):
        _cleanup(_maxpool(TensorProto.BFLOAT16, 17, scale_first), _maxpool(TensorProto.FLOAT, 17, scale_first))
    # written where the opset admits the type
    assert _cleanup(_maxpool(TensorProto.BFLOAT16, 22, scale_first), _maxpool(TensorProto.FLOAT, 22, scale_first))


def test_cleanup_writes_what_strict_inference_refuses_in_the_input_too():
    """A model whose declared output shape conflicts with a constant Reshape (ONNX Runtime runs it): the
    same conflict in the output is not ours, and the model is written."""
    original = _maxpool(TensorProto.FLOAT, 17, reshape_to=[2, 9])
    with pytest.raises(Exception):
        onnx.shape_inference.infer_shapes(original, check_type=True, strict_mode=True)
    assert _cleanup(original, original)
