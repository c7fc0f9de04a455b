"""One conv layer, launched a few times, for Nsight Compute: ours (any registry kernel) or cuDNN's.

    python bench/ncu_layer.py N H W C K R [--stride S] [--pad P] [--groups G] [--kernel NAME | --cudnn] [--act silu]

fp16, NHWC, square filter and stride, symmetric padding; random data. Meant to run under ncu, e.g.
whether a 3x3 conv is bound by L2→SM traffic (docs/history/bench-kernels-2026-11-30-to-12-01.md):

    ncu --profile-from-start off --launch-skip 2 --launch-count 1 \\
        --section SpeedOfLight --section MemoryWorkloadAnalysis \\
        --metrics lts__t_bytes.sum,lts__t_sectors_srcunit_tex_op_read.sum,dram__bytes.sum \\
        python bench/ncu_layer.py 32 80 80 64 64 3 --pad 1 --kernel sm90_f16_conv_128x64x64_c2x1_2cta

Without --kernel or --cudnn it runs the registry's first choice. Warm-up launches (cuDNN's benchmark
trials among them) run before cudaProfilerStart, so `--profile-from-start off` skips them. Needs torch with CUDA and
libepifuse_cuda.so (EPIFUSE_LIB_DIR).
"""
from __future__ import annotations

import argparse
import math

import torch
import torch.nn.functional as F

from optimizer import cuda
from optimizer.registry import FLOAT16, ConvDesc


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    for name in ("N", "H", "W", "C", "K", "R"):
        ap.add_argument(name, type=int)
    ap.add_argument("--stride", type=int, default=1)
    ap.add_argument("--pad", type=int, default=0)
    ap.add_argument("--groups", type=int, default=1, help="C for a depthwise conv")
    ap.add_argument("--act", default="silu")
    ap.add_argument("--launches", type=int, default=4)
    who = ap.add_mutually_exclusive_group()
    who.add_argument("--kernel", help="a registry kernel name (default: the registry's first choice)")
    who.add_argument("--cudnn", action="store_true", help="cuDNN's conv alone (no bias) instead of ours")
    a = ap.parse_args()
    p = (a.H + 2 * a.pad - a.R) // a.stride + 1
    q = (a.W + 2 * a.pad - a.R) // a.stride + 1
    x = torch.randn(a.N, a.H, a.W, a.C, device="cuda", dtype=torch.half)
    w = torch.randn(a.K, a.R, a.R, a.C // a.groups, device="cuda", dtype=torch.half) / math.sqrt(a.C // a.groups * a.R * a.R)
    b = torch.randn(a.K, device="cuda", dtype=torch.half)
    y = torch.empty(a.N, p, q, a.K, device="cuda", dtype=torch.half)
    if a.cudnn:
        torch.backends.cudnn.benchmark = True
        xc, wc = x.permute(0, 3, 1, 2), w.permute(0, 3, 1, 2)
        F.conv2d(xc, wc, None, a.stride, a.pad, 1, a.groups)  # benchmark trials, before the profiled range
        torch.cuda.synchronize()
        torch.cuda.profiler.start()
        for _ in range(a.launches):
            F.conv2d(xc, wc, None, a.stride, a.pad, 1, a.groups)
    else:
        desc = ConvDesc(FLOAT16, a.N, a.H, a.W, a.C, a.K, a.R, a.R, a.groups, a.stride, a.stride, 1, 1,
                        a.pad, a.pad, a.pad, a.pad, a.act, (), "none")
        kernel = a.kernel or cuda.kernels(desc)[0]
        ws = torch.empty(max(cuda.workspace_size(kernel, desc), 1), device="cuda", dtype=torch.uint8)
        torch.cuda.profiler.start()
        for _ in range(a.launches):
            cuda.fused_conv(desc, x.data_ptr(), w.data_ptr(), b.data_ptr(), None, y.data_ptr(), kernel=kernel,
                            workspace=ws.data_ptr(), workspace_bytes=ws.numel(),
                            stream=torch.cuda.current_stream().cuda_stream)
        print(f"ran {kernel} x{a.launches}")
    torch.cuda.synchronize()
    torch.cuda.profiler.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
