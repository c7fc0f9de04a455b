"""Times one fusion group on ONNX Runtime, both ways, on the machine that optimizes.

Each side is a micro-model: the group's original nodes in NCHW (what ONNX Runtime runs for them,
under its own graph optimizations and kernel choice) and the one FusedConv node in NHWC (what the
epifuse library runs), with the group's real weights in the dtype it will run in.

- CPU EP: ONNX Runtime's profiler gives each node's kernel time, so the layout glue ORT adds around
  a lone conv (NCHWc ReorderInput/ReorderOutput) is left out, as it is inside a real model's regions.
  The reorders of the group's input and output are timed apart: where the whole model reorders them
  too (`OrtCpuTimer.reordered_tensors`: an NCHWc conv next to an op ORT runs in NCHW, as around every
  squeeze-excite Mul), they are the runtime's cost of that group and go when it is fused.
  The two micro-models run interleaved; sampling stops early once the two sides clearly differ.
- CUDA EP: CUDA-graph replays, timed on the host, the two sides interleaved; each side holds k
  independent copies of the group in one graph, and the fixed cost of a replay is taken off before
  dividing by k. The runtime side is the better of prefer_nhwc off (NCHW) and on (an NHWC
  micro-model whose Transposes ORT cancels against its own), as ORT's best configuration would run it.
"""
from __future__ import annotations

import ctypes
import hashlib
import itertools
import json
import math
import os
import platform
import statistics
import tempfile
import time

import numpy as np
import onnx
import onnx_graphsurgeon as gs

from . import __version__, contract
from .costs import NHWC_POOL, NHWC_POOL_GEMV, FusionGroup
from .graph import constant_value, shape_of
from .libraries import CUDA_LIBRARY, ORT_LIBRARY, LibraryNotFound, library_path
from .runtime import cpu_cores

ONNX_DTYPE = {"fp32": onnx.TensorProto.FLOAT, "fp16": onnx.TensorProto.FLOAT16, "bf16": onnx.TensorProto.BFLOAT16}
LAYOUT_GLUE = {"ReorderInput", "ReorderOutput", "Transpose"}  # ops ORT adds around a lone NCHWc conv
RESIDUAL_SOURCE = "epifuse_residual_source"
INPUT_SOURCE = "epifuse_input_source"  # left out of the timing, like the residual's source
OUTPUT_SINK = "epifuse_output_sink"  # likewise
OPSET = 17


class NotMeasurable(Exception):
    """The group cannot be cut out as a micro-model (an input that is neither X, Z nor a constant)."""


def _np_dtype(dtype: str):
    if dtype == "bf16":
        import ml_dtypes

        return np.dtype(ml_dtypes.bfloat16)
    return np.dtype(np.float16 if dtype == "fp16" else np.float32)


def _random(shape, dtype: str, rng) -> np.ndarray:
    return rng.standard_normal(shape).astype(np.float32).astype(_np_dtype(dtype))


def _model(graph: gs.Graph) -> onnx.ModelProto:
    model = gs.export_onnx(graph, do_type_check=False)
    model.ir_version = 8
    del model.opset_import[:]
    model.opset_import.extend([onnx.helper.make_opsetid("", OPSET),
                               onnx.helper.make_opsetid(contract.DOMAIN, contract.OPSET_VERSION)])
    return model


def runtime_model(group: FusionGroup, copies: int = 1, nhwc_io: bool = False,
                  residual_source: bool = False, output_sink: bool = False,
                  dtype: str | None = None) -> onnx.ModelProto:
    """The group's original nodes, `copies` times side by side on the same inputs. With `nhwc_io`,
    inputs and outputs are NHWC with Transposes around the nodes (for ORT's prefer_nhwc). With
    `residual_source`, the residual comes out of a 1x1 MaxPool (node RESIDUAL_SOURCE, left out of the
    timing): ORT's CPU EP folds a residual Add into an NCHWc conv only when the other operand is itself
    produced in NCHWc, as it is inside a real model, never when it is a graph input. With `output_sink`,
    the output goes into a 1x1 MaxPool (nodes OUTPUT_SINK..., left out of the timing) as into a model's
    next layer: ORT's CPU EP folds a HardSwish into an NCHWc conv only where something reads it; one
    that is a graph output it runs as HardSigmoid and Mul after the conv (2-3x the fused conv's time for
    a 3x3 depthwise conv at 14x14x480), which a model never pays. A pool of pattern NHWC_POOL(_GEMV) is
    built in the form the model runs it unfused (NHWC in and out already). `dtype`: the dtype the runtime
    runs the nodes in, where it is not the group's (float32 on the CPU EP for a bf16 group)."""
    if group.pattern in (NHWC_POOL, NHWC_POOL_GEMV):
        return _nhwc_pool_model(group, copies, dtype)
    dtype = _np_dtype(dtype or group.dtype)
    x = gs.Variable("x", dtype, _nhwc(group.x_shape) if nhwc_io else group.x_shape)
    z = gs.Variable("z", dtype, _nhwc(group.z_shape) if nhwc_io else group.z_shape) if _separate_z(group) else None
    graph = gs.Graph(inputs=[t for t in (x, z) if t is not None], opset=OPSET)
    x_in, z_in = x, z
    if nhwc_io:
        x_in = _transpose(graph, x, (0, 3, 1, 2), "x_nchw")
        z_in = _transpose(graph, z, (0, 3, 1, 2), "z_nchw") if z is not None else None
    if residual_source and z is not None and len(group.z_shape) == 4:
        # the output named like the node: ORT renames a pool it moves into NCHWc after its output
        z_in = gs.Variable(f"{RESIDUAL_SOURCE}_z", dtype=dtype)
        graph.nodes.append(gs.Node("MaxPool", RESIDUAL_SOURCE, {"kernel_shape": [1, 1]}, [z], [z_in]))
    if group.z is not None and z is None:
        z_in = x_in  # the conv's own input is the residual
    constants: dict[str, gs.Constant] = {}
    for copy in range(copies):
        mapped = {id(group.x): x_in}
        if group.z is not None:
            mapped[id(group.z)] = z_in
        pending = list(group.nodes)  # an activation's nodes come in match order, not data order
        while pending:
            ready = next((n for n in pending if all(not t.name or id(t) in mapped or constant_value(t) is not None
                                                    for t in n.inputs)), None)
            if ready is None:
                t = next(t for n in pending for t in n.inputs if t.name and id(t) not in mapped
                         and constant_value(t) is None)
                raise NotMeasurable(f"'{t.name}' is read by the group but is not its input")
            pending.remove(ready)
            inputs = [gs.Variable.empty() if not t.name else mapped[id(t)] if id(t) in mapped
                      else _constant(constants, t, dtype, copy) for t in ready.inputs]
            outputs = []
            for t in ready.outputs:
                out = gs.Variable(f"{t.name}_{copy}", dtype=None)
                mapped[id(t)] = out
                outputs.append(out)
            attrs = dict(ready.attrs)
            if ready.op == "Split" and not ready.domain:
                inputs = _split_sizes_as_input(ready, attrs, inputs, f"{ready.name}_{copy}_sizes")
            graph.nodes.append(gs.Node(ready.op, f"{ready.name}_{copy}", attrs, inputs, outputs, domain=ready.domain))
        y = mapped.get(id(group.y))
        if y is None:
            raise NotMeasurable(f"the group's nodes do not write '{group.y.name}'")
        y.dtype, y.shape = dtype, group.y_shape
        if output_sink and not nhwc_io and len(group.y_shape) == 4:
            # the output named like the node, as the residual's source is
            sunk = gs.Variable(f"{OUTPUT_SINK}_{copy}", dtype, group.y_shape)
            graph.nodes.append(gs.Node("MaxPool", f"{OUTPUT_SINK}_{copy}", {"kernel_shape": [1, 1]}, [y], [sunk]))
            y = sunk
        graph.outputs.append(_transpose(graph, y, (0, 2, 3, 1), f"y{copy}") if nhwc_io else y)
    return _model(graph)


def _split_sizes_as_input(node: gs.Node, attrs: dict, inputs: list, name: str) -> list:
    """A Split written for opset 11-12 (sizes as the `split` attribute) or 18 (`num_outputs`) in the micro-
    model's opset 17 form: the sizes as an int64 input (`attrs` loses the attribute)."""
    sizes = attrs.pop("split", None)
    if attrs.pop("num_outputs", None) is not None and sizes is None and not (len(inputs) > 1 and inputs[1].name):
        axis = int(attrs.get("axis", 0))
        shapes = [shape_of(t) or [] for t in node.outputs]
        sizes = [shape[axis] if -len(shape) <= axis < len(shape) else None for shape in shapes]
        if not all(isinstance(d, int) and d >= 0 for d in sizes):
            raise NotMeasurable(f"Split '{node.name}': the sizes of its outputs are not known")
    if sizes is None:
        return inputs
    return [inputs[0], gs.Constant(name, np.array(list(sizes), np.int64))]


def _nhwc_pool_model(group: FusionGroup, copies: int, dtype: str | None = None) -> onnx.ModelProto:
    """A global average pool as the pipeline leaves it unfused inside an NHWC region: ReduceMean over
    H and W of the NHWC tensor (the layout pass), then, for NHWC_POOL_GEMV, passes.nhwc_pools' GEMV. Each
    copy reads an input of its own, so ORT cannot merge the copies."""
    from .passes.nhwc_pools import pools_to_gemv  # noqa: PLC0415 (passes import the costs this module serves)

    dtype = _np_dtype(dtype or group.dtype)
    graph = gs.Graph(opset=OPSET)
    for copy in range(copies):
        x = gs.Variable("x" if copy == 0 else f"x{copy}", dtype, _nhwc(group.x_shape))
        y = gs.Variable(f"y{copy}", dtype, _nhwc(group.y_shape))
        graph.inputs.append(x)
        graph.nodes.append(gs.Node("ReduceMean", f"pool{copy}", {"axes": [1, 2], "keepdims": 1}, [x], [y]))
        graph.outputs.append(y)
    if group.pattern == NHWC_POOL_GEMV:
        pools_to_gemv(graph)
    for node in graph.nodes:  # its GEMV row is float32 until the precision pass, which this model skips
        for i, t in enumerate(node.inputs):
            if isinstance(t, gs.Constant) and t.values.dtype == np.float32 and dtype != np.float32:
                node.inputs[i] = gs.Constant(t.name, t.values.astype(dtype))
    # nhwc_pools keeps an output's name with an Identity: read its source instead (ORT would run a copy)
    for i, y in enumerate(graph.outputs):
        if y.inputs and y.inputs[0].op == "Identity":
            source = y.inputs[0].inputs[0]
            source.dtype, source.shape = y.dtype, y.shape
            graph.outputs[i] = source
    return _model(graph.cleanup())


def _separate_z(group: FusionGroup) -> bool:
    """A residual that is not the conv's own input (a 1x1 conv on x with x added back shares it)."""
    return group.z is not None and group.z is not group.x


def _nhwc(shape):
    return (shape[0], shape[2], shape[3], shape[1])


def _transpose(graph: gs.Graph, t: gs.Tensor, perm, name: str) -> gs.Variable:
    out = gs.Variable(name, dtype=t.dtype, shape=[t.shape[p] for p in perm] if t.shape else None)
    graph.nodes.append(gs.Node("Transpose", f"{name}_transpose", {"perm": list(perm)}, [t], [out]))
    return out


def _constant(cache: dict, t: gs.Tensor, dtype, copy: int) -> gs.Constant:
    """The constant in the micro-model's dtype. Every copy gets weights of its own (scaled by 1 + copy/1000):
    identical nodes on identical inputs would be merged into one by ORT's common-subexpression
    elimination, and a real model's layers each read their own weights anyway."""
    v = constant_value(t)
    key = (t.name, copy if v.size > 1 and v.dtype.kind == "f" else 0)
    if key not in cache:
        if v.dtype == np.float32 and dtype != np.float32:
            v = v.astype(dtype)
        v = _own(v, key[1])
        cache[key] = gs.Constant(f"c{len(cache)}_{t.name}", v if v.flags.c_contiguous else np.ascontiguousarray(v))
    return cache[key]


def _own(values: np.ndarray, copy: int) -> np.ndarray:
    return values if copy == 0 else (values.astype(np.float32) * (1 + copy / 1000)).astype(values.dtype)


def fused_model(group: FusionGroup, copies: int = 1, input_source: bool = False,
                float32_io: bool = False) -> onnx.ModelProto:
    """The FusedConv that would replace the group, NHWC, `copies` times on the same inputs. With
    `input_source`, its inputs come out of a 1x1 MaxPool each (nodes INPUT_SOURCE..., left out of the
    timing), written just before it as a model's previous layer writes them: on ORT's CPU EP the
    runtime's conv reads the output of the ReorderInput just before it, and a large layer read 20-27%
    faster from such a fresh tensor than from the session's input (a 3x3 depthwise conv at 112x112).
    With `float32_io` (and `input_source`), the model's inputs and outputs are float32 and the sources
    and sinks Casts (for bf16, which ONNX Runtime's Python API cannot feed or fetch); likewise left out."""
    d, dtype = group.desc, _np_dtype(group.dtype)
    io_dtype = np.dtype(np.float32) if float32_io else dtype
    x = gs.Variable("x", io_dtype, (d.N, d.H, d.W, d.C))
    z = gs.Variable("z", io_dtype, d.output_nhwc()) if _separate_z(group) else x if d.residual != "none" else None
    krsc = np.ascontiguousarray(np.transpose(group.weight, (0, 2, 3, 1)).astype(dtype))
    bias = np.ascontiguousarray(group.bias.astype(dtype))
    graph = gs.Graph(inputs=[x] + ([z] if _separate_z(group) else []), opset=OPSET)
    if input_source:
        fresh = {}
        for t in [x] + ([z] if z is not None and z is not x else []):
            fresh[id(t)] = gs.Variable(f"{INPUT_SOURCE}_{t.name}_out", dtype, t.shape)  # as the residual's
            graph.nodes.append(gs.Node("Cast", f"{INPUT_SOURCE}_{t.name}", {"to": ONNX_DTYPE[group.dtype]}, [t],
                                       [fresh[id(t)]]) if float32_io else
                               gs.Node("MaxPool", f"{INPUT_SOURCE}_{t.name}", {"kernel_shape": [1, 1]}, [t],
                                       [fresh[id(t)]]))
        x = fresh[id(x)]
        z = fresh[id(z)] if z is not None else None
    attrs = {"strides": [d.stride_h, d.stride_w], "pads": [d.pad_top, d.pad_left, d.pad_bottom, d.pad_right],
             "dilations": [d.dil_h, d.dil_w], "group": d.group, "activation": d.activation, "residual": d.residual,
             "plugin_namespace": contract.PLUGIN_NAMESPACE, "plugin_version": contract.PLUGIN_VERSION}
    if d.activation_params:
        attrs["activation_params"] = [float(p) for p in d.activation_params]
    if d.allow_tf32:
        attrs["allow_tf32"] = 1
    for copy in range(copies):  # each copy with weights of its own, as in runtime_model
        y = gs.Variable(f"y{copy}", dtype, d.output_nhwc())
        w, b = gs.Constant(f"w{copy}", _own(krsc, copy)), gs.Constant(f"b{copy}", _own(bias, copy))
        graph.nodes.append(gs.Node(contract.OP_TYPE, f"fused{copy}", dict(attrs), [x, w, b] + ([z] if z else []), [y],
                                   domain=contract.DOMAIN))
        if float32_io:
            y.name = f"y{copy}_{group.dtype}"
            sunk = gs.Variable(f"y{copy}", np.float32, d.output_nhwc())
            graph.nodes.append(gs.Node("Cast", f"{OUTPUT_SINK}_{copy}", {"to": onnx.TensorProto.FLOAT}, [y], [sunk]))
            y = sunk
        graph.outputs.append(y)
    return _model(graph)


def transpose_model(shape, dtype: str, copies: int = 1, cast_to_float32: bool = False) -> onnx.ModelProto:
    """NHWC -> NCHW of a tensor of NCHW shape `shape` (the Transpose a region edge costs); each copy
    reads an input of its own (ORT would merge identical Transposes of one input). With
    `cast_to_float32`, the edge of a low-precision region on a runtime that goes on in float32: the
    Transpose and a Cast to float32; the input is float32 and its Cast to `dtype` (node INPUT_SOURCE...)
    is left out of the timing."""
    np_dtype = _np_dtype(dtype)
    graph = gs.Graph(opset=OPSET)
    for copy in range(copies):
        x = gs.Variable("x" if copy == 0 else f"x{copy}", np.float32 if cast_to_float32 else np_dtype, _nhwc(shape))
        graph.inputs.append(x)
        if cast_to_float32:
            low = gs.Variable(f"{x.name}_{dtype}", np_dtype, x.shape)
            graph.nodes.append(gs.Node("Cast", f"{INPUT_SOURCE}_{copy}", {"to": ONNX_DTYPE[dtype]}, [x], [low]))
            y = _transpose(graph, low, (0, 3, 1, 2), f"y{copy}_{dtype}")
            out = gs.Variable(f"y{copy}", np.float32, y.shape)
            graph.nodes.append(gs.Node("Cast", f"cast{copy}", {"to": onnx.TensorProto.FLOAT}, [y], [out]))
            graph.outputs.append(out)
        else:
            graph.outputs.append(_transpose(graph, x, (0, 3, 1, 2), f"y{copy}"))
    return _model(graph)


def _build_of(library: str) -> str:
    """Which build of an epifuse library times are for (its file's size and time): kernels change
    between builds of one version, and the costs cache must not answer for another build's."""
    try:
        st = os.stat(library_path(library))
    except (LibraryNotFound, OSError):
        return "(not built)"
    return f"build {hashlib.sha1(f'{st.st_size}:{st.st_mtime_ns}'.encode()).hexdigest()[:8]}"


def _feeds(model: onnx.ModelProto, dtype: str, rng) -> dict[str, np.ndarray]:
    return {i.name: _random([d.dim_value for d in i.type.tensor_type.shape.dim], dtype, rng)
            for i in model.graph.input}


class OrtCpuTimer:
    """ONNX Runtime's CPU EP with its default graph optimizations and threads, as `epifuse compare` runs it.
    The sessions run in a worker process: their memory (thread pools, kernels' buffers) goes when the
    worker does instead of raising the optimizer's peak, and a micro-model that crashes the library
    costs its group's measurement, not the optimizer."""

    def __init__(self, threads: int | None = None):
        import onnxruntime as ort

        self.threads = threads  # the sessions' intra-op threads; None: ONNX Runtime's default, one per core
        self.device = f"{_cpu_name()} ({threads or cpu_cores()} threads)"
        self.library = f"onnxruntime {ort.__version__} cpu, epifuse {__version__} {_build_of(ORT_LIBRARY)}"
        self._worker = None

    times_reorders = True  # group_times gives (ours, runtime, (reorder in, reorder out))

    def time_pair(self, a: bytes, b: bytes, dtype: str, skip_ops=LAYOUT_GLUE,
                  edges: tuple | None = None) -> tuple[float, float] | tuple[float, float, float, float]:
        """Median kernel time per run (µs) of two serialized micro-models, run interleaved; nodes of
        the ops in `skip_ops` (and the residual's source) are not counted. With `edges` (the shapes of
        model a's input and output), also model a's ReorderInput of that input and ReorderOutput of
        that output (µs, 0 where ORT puts none)."""
        return self._request((a, b, dtype, tuple(skip_ops), edges))

    def reordered_tensors(self, model: bytes) -> tuple[set[str], set[str]]:
        """The tensors of `model` that ONNX Runtime's CPU EP reorders into its blocked NCHWc layout
        (ReorderInput reads them) and out of it (ReorderOutput writes them), under its default graph
        optimizations: where an NCHWc region meets an op ORT runs in NCHW."""
        into, out_of = self._request(("reordered", model))
        return set(into), set(out_of)

    def _request(self, request: tuple):
        import multiprocessing

        if self._worker is None:
            parent, child = multiprocessing.get_context("spawn").Pipe()
            process = multiprocessing.get_context("spawn").Process(target=_cpu_worker, args=(child, self.threads),
                                                                  daemon=True)
            process.start()
            child.close()
            self._worker = (process, parent)
        process, conn = self._worker
        try:
            conn.send(request)
            result = conn.recv()
        except (EOFError, OSError, BrokenPipeError):
            process.join(timeout=5)
            self._worker = None
            raise NotMeasurable(f"the measuring process died (exit code {process.exitcode})") from None
        if isinstance(result, str):
            raise NotMeasurable(result)
        return result

    def close(self) -> None:
        if self._worker is not None:
            process, conn = self._worker
            try:
                conn.send(None)
            except (OSError, BrokenPipeError):
                pass
            process.join(timeout=10)
            self._worker = None

    def group_times(self, group: FusionGroup) -> tuple[float, float]:
        # bf16: the CPU EP has no bfloat16 Conv, and the precision pass leaves the nodes it does not fuse in
        # float32 there, so its side is the float32 nodes, ours the bf16 FusedConv without the Casts at
        # its edges (inside a region there are none; the region step counts those at its edges)
        float32_runtime = group.dtype == "bf16"
        # serialized one at a time: a large layer's weights are copied into each model while it is built
        runtime = runtime_model(group, residual_source=True, output_sink=True,
                                dtype="fp32" if float32_runtime else None).SerializeToString()
        ours = fused_model(group, input_source=True, float32_io=float32_runtime).SerializeToString()
        runtime_us, ours_us, reorder_in_us, reorder_out_us = self.time_pair(
            runtime, ours, "fp32" if float32_runtime else group.dtype,
            edges=(tuple(group.x_shape), tuple(group.y_shape)))
        return ours_us, runtime_us, (reorder_in_us, reorder_out_us)

    def transpose_times(self, shape, dtype: str) -> float:
        """A region edge: the Transpose, and for bf16 (a region in a float32 model here) the Cast too."""
        m = transpose_model(shape, dtype, cast_to_float32=dtype == "bf16").SerializeToString()
        return self.time_pair(m, m, "fp32" if dtype == "bf16" else dtype, skip_ops=())[0]


MIN_RUNS, MAX_RUNS, GROUP_SECONDS = 3, 15, 2.0


def _cpu_worker(conn, threads: int | None = None) -> None:
    """The measuring process: (model bytes a, model bytes b, dtype, ops to skip) in, times or an error out.
    `threads`: the sessions' intra-op threads (None: ONNX Runtime's default)."""
    import functools

    import onnxruntime as ort

    from .runtime import session_options

    # The CPU kernel each FusedConv shape gets (a direct kernel or oneDNN, timed at its first run) goes to
    # the tuning cache, so that the optimized model runs on this machine with the kernels measured here.
    # The cache keeps one choice per machine, for its default threads: other counts leave it as it is.
    if threads is None:
        os.environ["EPIFUSE_TUNE"] = "1"
    else:
        session_options = functools.partial(session_options, threads=threads)
    with tempfile.TemporaryDirectory(prefix="epifuse-measure-") as folder:  # the profiles' folder goes with it
        _serve_cpu_requests(conn, folder, ort, session_options)


def _serve_cpu_requests(conn, folder: str, ort, session_options) -> None:
    rng = np.random.default_rng(0)
    sessions_made = itertools.count()

    def session(data: bytes):
        so = session_options(allow_spinning=False)  # two sessions take turns: see optimizer.compare
        so.enable_profiling = True
        # a prefix of its own: ORT names the profile by the millisecond it starts, and two sessions made
        # within one millisecond would write (and the first's reading would delete) one file
        so.profile_file_prefix = os.path.join(folder, f"profile{next(sessions_made)}")
        so.log_severity_level = 4  # a refused micro-model is reported as one line, not ORT's log
        return ort.InferenceSession(data, so, providers=["CPUExecutionProvider"])

    while True:
        request = conn.recv()
        if request is None:
            return
        if request[0] == "reordered":
            try:
                conn.send(_reordered_tensors(request[1], folder, ort, session_options))
            except Exception as e:  # noqa: BLE001 (a model ORT refuses: no reorders known, nothing else lost)
                conn.send(str(e).splitlines()[0][:200] if str(e) else type(e).__name__)
            continue
        data_a, data_b, dtype, skip_ops, edges = request
        try:
            sessions = [session(d) for d in (data_a, data_b)]
            feeds = [{i.name: _random([d if isinstance(d, int) else 1 for d in i.shape], dtype, rng)
                      for i in s.get_inputs()} for s in sessions]
            walls: list[list[float]] = [[], []]
            start = time.perf_counter()
            for run in range(MAX_RUNS + 1):
                for i, (s, f) in enumerate(zip(sessions, feeds)):
                    t = time.perf_counter()
                    s.run(None, f)
                    if run:  # the first run is the warm-up
                        walls[i].append(time.perf_counter() - t)
                if run >= MIN_RUNS and (_clearly_apart(walls) or time.perf_counter() - start > GROUP_SECONDS):
                    break
            times = []
            for i, s in enumerate(sessions):
                path = s.end_profiling()
                with open(path) as f:
                    events = json.load(f)
                os.unlink(path)
                times.append(_median_run_us(events, skip_ops))
                if i == 0 and edges is not None:
                    reorders = (_median_reorder_us(events, "ReorderInput", edges[0]),
                                _median_reorder_us(events, "ReorderOutput", edges[1]))
            conn.send(tuple(times) + (reorders if edges is not None else ()))
        except Exception as e:  # noqa: BLE001 (ORT refusing a micro-model: the group goes to the static policy)
            conn.send(str(e).splitlines()[0][:200] if str(e) else type(e).__name__)


def _clearly_apart(walls) -> bool:
    a, b = statistics.median(walls[0]), statistics.median(walls[1])
    return abs(a - b) > 0.3 * min(a, b)


def kernel_times_by_run(events: list[dict], keep) -> list[list[float]]:
    """Each run's (after the warm-up run) kernel times (µs) of the nodes `keep(event)` accepts."""
    runs = sorted((e["ts"], e["ts"] + e["dur"]) for e in events if e.get("cat") == "Session"
                  and e.get("name") == "model_run")[1:]
    times: list[list[float]] = [[] for _ in runs]
    for e in events:
        if e.get("cat") != "Node" or not e.get("name", "").endswith("_kernel_time") or not keep(e):
            continue
        for i, (begin, end) in enumerate(runs):
            if begin <= e["ts"] <= end:
                times[i].append(e["dur"])
                break
    return times


def _median_run_us(events: list[dict], skip_ops) -> float:
    """The median over runs (after the warm-up run) of the summed kernel times of each run's nodes,
    without the ops in `skip_ops`, the inputs' sources and the outputs' sinks."""
    per_run = kernel_times_by_run(events, lambda e: e.get("args", {}).get("op_name") not in skip_ops
                                   and not e["name"].startswith((RESIDUAL_SOURCE, INPUT_SOURCE, OUTPUT_SINK)))
    if not per_run:
        raise RuntimeError("ONNX Runtime's profile holds no runs")
    return float(statistics.median(sum(times) for times in per_run))


def _median_reorder_us(events: list[dict], op: str, shape: tuple) -> float:
    """The median over runs of the time of one `op` node (ReorderInput or ReorderOutput) moving a
    tensor of `shape` (the mean where a run has several, as for a residual the size of the input)."""
    def moves_shape(e: dict) -> bool:
        args = e.get("args", {})
        shapes = args.get("input_type_shape" if op == "ReorderInput" else "output_type_shape") or [{}]
        return args.get("op_name") == op and tuple(next(iter(shapes[0].values()), ())) == tuple(shape)

    per_run = kernel_times_by_run(events, moves_shape)
    return float(statistics.median(statistics.fmean(t) if t else 0.0 for t in per_run)) if per_run else 0.0


def _reordered_tensors(model: bytes, folder: str, ort, session_options) -> tuple[list[str], list[str]]:
    """`OrtCpuTimer.reordered_tensors`, in the measuring process: ORT writes the model as it would run
    it (weights to a file of their own, left unread) and the reorders' outer tensors are read off."""
    optimized = os.path.join(folder, "reordered.onnx")
    so = session_options(allow_spinning=False)
    so.log_severity_level = 4  # ORT warns that the written model is for this machine only: it is
    so.optimized_model_filepath = optimized
    so.add_session_config_entry("session.optimized_model_external_initializers_file_name", "reordered.weights")
    so.add_session_config_entry("session.optimized_model_external_initializers_min_size_in_bytes", "1024")
    ort.InferenceSession(model, so, providers=["CPUExecutionProvider"])
    try:
        graph = onnx.load(optimized, load_external_data=False).graph
    finally:
        for name in ("reordered.onnx", "reordered.weights"):
            if os.path.exists(os.path.join(folder, name)):
                os.unlink(os.path.join(folder, name))
    into = [n.input[0] for n in graph.node if n.op_type == "ReorderInput"]
    out_of = [n.output[0] for n in graph.node if n.op_type == "ReorderOutput"]
    return into, out_of


def _cpu_flags() -> set[str] | None:
    """The CPU's feature flags from /proc/cpuinfo, or None where it cannot be read."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("flags"):
                    return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return None


def cpu_bf16_unavailable() -> str | None:
    """Why bf16 candidates are not timed on this CPU, or None. oneDNN computes bfloat16 convolutions at speed
    with AVX512-BF16 or AMX; without them a bf16 FusedConv runs emulated or on the library's reference
    kernel, far slower than ORT's float32 conv, and timing each candidate would only spend the measuring
    budget to find that. Where the flags cannot be read, the measurements decide."""
    flags = _cpu_flags()
    if flags is None or flags & {"avx512_bf16", "amx_bf16"}:
        return None
    return "this CPU has neither AVX512-BF16 nor AMX, so bfloat16 convolutions run emulated here"


def _cpu_name() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


class OrtCudaTimer:
    """ONNX Runtime's CUDA EP, CUDA graph on, device-resident inputs and outputs. A micro-model holds
    independent copies of the group, so a replay takes long enough for host timing, and the fixed cost
    of a replay (measured once on a one-element model) is taken off before dividing by the copies.

    Our side holds enough copies for a replay of about TARGET_US. The runtime side holds at most
    RUNTIME_COPIES: ORT runs cuDNN's exhaustive algorithm search once per Conv node when a session
    starts (about 0.2 s a node on an H200, its per-kernel cache is not shared between nodes), which
    made 32 copies cost seconds per candidate. The sides are timed interleaved in the same sessions,
    so a win is read several times against the same runtime figure instead of in new sessions.

    Our copies' data stays within L2_SHARE_BYTES, as the runtime's few copies' does: in a model an op
    reads what the op before it just wrote, from L2 where it fits. 32 copies of a 112x112x32 fp32 pool
    (3.2 MB with its taps) read from HBM where ORT's 4 read from L2, and measured 0.4-1.0 µs of its
    5-6 µs slower than the same kernel at 4 copies (H200)."""

    TARGET_US, MAX_COPIES, RUNTIME_COPIES, ROUNDS = 300.0, 32, 4, 5
    L2_SHARE_BYTES = 16 << 20  # a third of an H100/H200's L2 (50-60 MB), 40% of an A100's
    confirms_wins = True  # MeasuredCosts need not measure a win again

    def __init__(self):
        from .runtime import providers_for

        import onnxruntime as ort

        self.ort = ort
        self.providers_for = providers_for
        self.device = cuda_device_name() or "CUDA device"
        self.library = f"onnxruntime {ort.__version__} cuda, epifuse {__version__} {_build_of(CUDA_LIBRARY)}"
        self.rng = np.random.default_rng(0)
        self._overhead: dict[bool, tuple] = {}  # library -> bound session of a one-Relu model

    def _bound(self, model: onnx.ModelProto, dtype: str, library: bool, prefer_nhwc: bool = False):
        """A session on `model` with device-resident inputs and outputs bound, warmed up (kernels chosen,
        graph captured), and the number of replays a timed batch of about 2 ms needs."""
        from .runtime import session_options

        ort = self.ort
        so = session_options() if library else ort.SessionOptions()
        session = ort.InferenceSession(model.SerializeToString(), so, providers=self.providers_for(
            "ort-cuda", cuda_graph=True, prefer_nhwc=prefer_nhwc))
        binding = session.io_binding()
        for name, value in _feeds(model, dtype, self.rng).items():
            binding.bind_ortvalue_input(name, ort.OrtValue.ortvalue_from_numpy(value, "cuda", 0))
        for out in model.graph.output:
            shape = [d.dim_value for d in out.type.tensor_type.shape.dim]
            binding.bind_ortvalue_output(out.name, ort.OrtValue.ortvalue_from_shape_and_type(
                shape, _np_dtype(dtype), "cuda", 0))
        for _ in range(3):  # the first runs choose kernels and capture the graph
            session.run_with_iobinding(binding)
        start = time.perf_counter()
        session.run_with_iobinding(binding)
        once = time.perf_counter() - start
        return session, binding, max(5, min(200, int(2e-3 / max(once, 1e-6))))

    @staticmethod
    def _batch_us(bound) -> float:
        session, binding, reps = bound
        start = time.perf_counter()
        for _ in range(reps):
            session.run_with_iobinding(binding)
        return (time.perf_counter() - start) / reps * 1e6

    def _interleaved_us(self, bounds) -> list[float]:
        """Host time per CUDA-graph replay (µs) of each session: the median of ROUNDS timed batches,
        the sessions taking turns so drift in the shared GPU's clock touches all alike."""
        batches = [[] for _ in bounds]
        for _ in range(self.ROUNDS):
            for i, b in enumerate(bounds):
                batches[i].append(self._batch_us(b))
        return [statistics.median(b) for b in batches]

    def _overhead_bound(self, library: bool):
        """A session whose replay is the fixed cost of one: a model of one Relu on one element."""
        if library not in self._overhead:
            x = gs.Variable("x", np.float16, (1,))
            y = gs.Variable("y", np.float16, (1,))
            graph = gs.Graph(nodes=[gs.Node("Relu", "relu", {}, [x], [y])], inputs=[x], outputs=[y], opset=OPSET)
            self._overhead[library] = self._bound(_model(graph), "fp16", library)
        return self._overhead[library]

    def _per_copy_us(self, timed: list[tuple[object, int, bool]]) -> list[float]:
        """µs per copy of each (bound session, copies, library): its replay less the fixed cost of one,
        read in the same interleaved rounds. The fixed cost is timed with every measurement, not once:
        read once at a moment the host was slow, it was ~8 µs too high and took that from every runtime
        time of the run (ORT's 4 µs squeeze-excite convs read as 0.07 µs, nothing fused)."""
        libraries = sorted({library for _, _, library in timed})
        totals = self._interleaved_us([b for b, _, _ in timed] + [self._overhead_bound(lib) for lib in libraries])
        overhead = dict(zip(libraries, totals[len(timed):]))
        return [max(total - overhead[library], 0.01 * total) / copies
                for total, (_, copies, library) in zip(totals, timed)]

    @classmethod
    def copies_for(cls, group: FusionGroup) -> tuple[int, int]:
        """(ours, the runtime's): ours for a replay of about TARGET_US with their data within
        L2_SHARE_BYTES, never fewer than the runtime's; the runtime's at most RUNTIME_COPIES."""
        copies = _copies_for(group, cls.TARGET_US, cls.MAX_COPIES)
        runtime = min(copies, cls.RUNTIME_COPIES)
        return max(runtime, min(copies, int(cls.L2_SHARE_BYTES // _group_bytes(group)))), runtime

    def group_times(self, group: FusionGroup) -> tuple[float, float]:
        if group.dtype == "bf16":
            raise NotMeasurable("bfloat16 inputs cannot be bound from numpy")
        copies, runtime_copies = self.copies_for(group)
        try:
            ours_bound = self._bound(fused_model(group, copies), group.dtype, library=True)
            nchw = self._bound(runtime_model(group, runtime_copies), group.dtype, library=False)
            ours, runtime = self._per_copy_us([(ours_bound, copies, True), (nchw, runtime_copies, False)])
            # ORT's NHWC convs (prefer_nhwc) might beat ours; a pool's runtime form is NHWC already
            if ours < runtime and len(group.x_shape) == 4 and group.pattern not in (NHWC_POOL, NHWC_POOL_GEMV):
                nhwc = self._bound(runtime_model(group, runtime_copies, nhwc_io=True), group.dtype, library=False,
                                   prefer_nhwc=True)
                ours_again, nhwc_us = self._per_copy_us([(ours_bound, copies, True), (nhwc, runtime_copies, False)])
                ours = max(ours, ours_again)  # a win read twice, kept
                runtime = min(runtime, nhwc_us)  # at its worst
        except NotMeasurable:
            raise
        except Exception as e:
            raise NotMeasurable(str(e).splitlines()[0][:200]) from None
        return ours, runtime

    def transpose_times(self, shape, dtype: str) -> float:
        copies = int(min(self.MAX_COPIES, max(1, self.TARGET_US / (4 + 2 * math.prod(shape) * 2 / 2e3))))
        bound = self._bound(transpose_model(shape, dtype, copies), dtype, library=False)
        return self._per_copy_us([(bound, copies, False)])[0]


def _copies_for(group: FusionGroup, target_us: float, most: int) -> int:
    """Copies for a replay of about `target_us`, from a rough roofline of the group (100 TFLOP/s, 2 TB/s,
    4 µs a launch): only the number of copies depends on it, never the time measured."""
    d = group.desc
    n, p, q, k = d.output_nhwc()
    flops = 2.0 * n * p * q * k * d.R * d.S * d.C / d.group
    estimate = 4.0 * len(group.nodes) + max(flops / 100e12, _group_bytes(group) / 2e12) * 1e6
    return int(min(most, max(1, target_us // estimate)))


def _group_bytes(group: FusionGroup) -> float:
    """The bytes one copy of the fused group reads and writes: input, output and residual, filter."""
    d = group.desc
    n, p, q, k = d.output_nhwc()
    size = 2 if group.dtype != "fp32" else 4
    return size * (n * d.H * d.W * d.C + 2 * n * p * q * k + k * d.R * d.S * d.C / d.group)


def cuda_device_name() -> str | None:
    """The first CUDA device's name from the driver (libcuda), or None without a driver or device."""
    try:
        cuda = ctypes.CDLL("libcuda.so.1")
    except OSError:
        return None
    count, dev, name = ctypes.c_int(0), ctypes.c_int(0), ctypes.create_string_buffer(256)
    if cuda.cuInit(0) != 0 or cuda.cuDeviceGetCount(ctypes.byref(count)) != 0 or count.value < 1:
        return None
    if cuda.cuDeviceGet(ctypes.byref(dev), 0) != 0 or cuda.cuDeviceGetName(name, 256, dev) != 0:
        return None
    return name.value.decode()


def cuda_measuring_unavailable() -> str | None:
    """Why ort-cuda costs cannot be measured here (None when they can): a GPU, onnxruntime-gpu and a
    CUDA build of the epifuse library are all needed."""
    if cuda_device_name() is None:
        return "no CUDA device"
    try:
        import onnxruntime as ort

        if hasattr(ort, "preload_dlls"):
            ort.preload_dlls()
        if "CUDAExecutionProvider" not in ort.get_available_providers():
            return "onnxruntime has no CUDAExecutionProvider (install onnxruntime-gpu)"
    except ImportError:
        return "onnxruntime is not installed"
    from .libraries import CUDA_LIBRARY, library_path

    try:
        library_path(CUDA_LIBRARY)
    except FileNotFoundError:
        return "the epifuse library was built without CUDA"
    return None
