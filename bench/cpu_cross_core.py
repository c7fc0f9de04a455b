"""How fast a core reads what another core last wrote, against what it wrote itself: the cost that decides
how the CPU kernels cut a layer among threads (a thread that reads the rows or channels it wrote in the
layer before reads them from its own L2; another thread's come through the other core). A buffer is
written (filled) on CPU 0, then read (its maximum) on CPU 0 or on CPU 1, turn by turn; the read is timed.

    python bench/cpu_cross_core.py [--reps 300]

Linux only (thread affinity); needs two CPUs. numpy's fill and max release the GIL and run vectorized.
"""
from __future__ import annotations

import argparse
import os
import platform
import statistics
import threading
import time

import numpy as np

from optimizer.measure import _cpu_name


def _reads(nbytes: int, reps: int, reader_cpu: int) -> list[float]:
    """Seconds of each read of a buffer of `nbytes` that CPU 0 has just written, read on `reader_cpu`."""
    buf = np.zeros(nbytes // 4, np.float32)
    written, read = threading.Semaphore(0), threading.Semaphore(0)
    times: list[float] = []

    def reader():
        os.sched_setaffinity(0, {reader_cpu})
        for _ in range(reps):
            written.acquire()
            start = time.perf_counter()
            buf.max()
            times.append(time.perf_counter() - start)
            read.release()

    def writer():
        os.sched_setaffinity(0, {0})
        for rep in range(reps):
            buf.fill(rep)
            written.release()
            read.acquire()

    threads = [threading.Thread(target=reader), threading.Thread(target=writer)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return times[reps // 10:]  # the first reads warm the pages and the code


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--reps", type=int, default=300)
    args = ap.parse_args()
    if not hasattr(os, "sched_setaffinity") or len(os.sched_getaffinity(0)) < 2:
        raise SystemExit("needs Linux and two CPUs")
    print(f"{_cpu_name()}, numpy {np.__version__}, Python {platform.python_version()}")
    print("| bytes | written and read on one core µs | read on the other core µs | ratio |")
    print("|---:|---:|---:|---:|")
    for kb in (100, 400, 1000):
        same = statistics.median(_reads(kb * 1024, args.reps, 0)) * 1e6
        other = statistics.median(_reads(kb * 1024, args.reps, 1)) * 1e6
        print(f"| {kb} KB | {same:.1f} | {other:.1f} | {other / same:.1f}x |")


if __name__ == "__main__":
    main()
