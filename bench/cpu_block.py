"""MobileNetV3-Large's second inverted-residual block as FusedConv micro-models on ONNX Runtime's CPU EP
(NHWC, the library's own kernel choices), on one thread and two: the expand 1x1 16->64 at 112x112 (ReLU),
the depthwise 3x3 stride 2 over 64 channels (ReLU) and the project 1x1 64->24 at 56x56, each alone (run
over and over, its input where the run before left it) and the three in sequence, as a model runs them.
Equal sums say passing the 3.2 MB expanded tensor between the layers costs nothing beyond what each layer
pays alone: what computing two of them in bands of rows could save is the depthwise layer's own memory time.

    python bench/cpu_block.py

Prints each case's best time per run (15 blocks of 20 runs).
"""
import time

import numpy as np
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

from optimizer.libraries import library_path, preload_onednn

preload_onednn()
rng = np.random.default_rng(0)


# name: ((H, C) of its input, (K, C, R, stride, group, activation))
LAYERS = {
    "expand": ((112, 16), (64, 16, 1, 1, 1, "relu")),
    "depthwise": ((112, 64), (64, 64, 3, 2, 64, "relu")),
    "project": ((56, 64), (24, 64, 1, 1, 1, "identity")),
}


def model(names):
    """The layers `names` in sequence, NHWC, random filters; and the first one's input shape."""
    nodes, inits, x = [], [], "x"
    for i, name in enumerate(names):
        k, c, r, stride, group, activation = LAYERS[name][1]
        w = (rng.standard_normal((k, r, r, c // group)) * 0.2).astype(np.float32)
        b = (rng.standard_normal(k) * 0.1).astype(np.float32)
        inits += [numpy_helper.from_array(w, f"w{i}"), numpy_helper.from_array(b, f"b{i}")]
        nodes.append(helper.make_node("FusedConv", [x, f"w{i}", f"b{i}"], [f"y{i}"], domain="epifuse",
                                      activation=activation, group=group, strides=[stride] * 2, pads=[r // 2] * 4))
        x = f"y{i}"
    h, c = LAYERS[names[0]][0]
    graph = helper.make_graph(nodes, "block", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, h, h, c])],
                              [helper.make_tensor_value_info(x, TensorProto.FLOAT, None)], inits)
    opsets = [helper.make_opsetid("", 17), helper.make_opsetid("epifuse", 1)]
    return helper.make_model(graph, opset_imports=opsets), (1, h, h, c)


def best_us(names, threads):
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.register_custom_ops_library(str(library_path()))
    m, shape = model(names)
    session = ort.InferenceSession(m.SerializeToString(), options, providers=["CPUExecutionProvider"])
    feeds = {"x": rng.standard_normal(shape).astype(np.float32)}
    for _ in range(50):
        session.run(None, feeds)
    times = []
    for _ in range(15):
        start = time.perf_counter()
        for _ in range(20):
            session.run(None, feeds)
        times.append((time.perf_counter() - start) / 20 * 1e6)
    return min(times)


if __name__ == "__main__":
    print("| threads | expand µs | depthwise µs | project µs | the three alone | in sequence |")
    print("|---:|---:|---:|---:|---:|---:|")
    for threads in (1, 2):
        alone = [best_us([name], threads) for name in LAYERS]
        together = best_us(list(LAYERS), threads)
        print(f"| {threads} | " + " | ".join(f"{t:.0f}" for t in alone) + f" | {sum(alone):.0f} | {together:.0f} |")
