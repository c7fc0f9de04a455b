// How the CPU kernel spreads work: the caller decides. The ORT adapter passes ORT's intra-op
// thread pool (so sessions honour intra_op_num_threads and nothing is oversubscribed); the C ABI
// uses plain std::threads.
#pragma once
#include <cstdint>
#include <functional>

namespace epifuse {

// Runs body(i) for every i in [0, n), possibly concurrently; returns when all have run.
// `body` must not throw.
using ParallelFor = std::function<void(int64_t n, const std::function<void(int64_t)>& body)>;

// The machine's hardware threads, at least 1, read once: std::thread::hardware_concurrency() reads
// /sys on every call (glibc's get_nprocs), tens of microseconds, as long as a small layer's convolution.
int64_t hardware_threads();

// One std::thread per hardware thread (the caller's thread included) pulling indices in turn.
void parallel_for_threads(int64_t n, const std::function<void(int64_t)>& body);

// Every index in turn on the calling thread: for work that already runs on one of the caller's threads (a
// band of a pair op).
void parallel_for_serial(int64_t n, const std::function<void(int64_t)>& body);

}  // namespace epifuse
