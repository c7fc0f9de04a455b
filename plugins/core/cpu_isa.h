// Which vector ISA the hand-written CPU kernels (Winograd, pointwise GEMM) run on.
#pragma once
#include <cstdlib>
#include <cstring>

namespace epifuse {

enum class VectorIsa { kNone, kAvx2, kAvx512 };

// The widest this CPU has (AVX-512F; AVX2 with FMA), capped by EPIFUSE_CPU_ISA=avx2 (to run the AVX2
// kernels on an AVX-512 CPU, for tests and comparisons).
inline VectorIsa best_vector_isa() {
  static const bool avx512 = __builtin_cpu_supports("avx512f");
  static const bool avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  const char* cap = std::getenv("EPIFUSE_CPU_ISA");
  if (avx512 && !(cap && std::strcmp(cap, "avx2") == 0)) return VectorIsa::kAvx512;
  return avx2 ? VectorIsa::kAvx2 : VectorIsa::kNone;
}

inline const char* isa_name(VectorIsa isa) {
  return isa == VectorIsa::kAvx512 ? "avx512" : isa == VectorIsa::kAvx2 ? "avx2" : "none";
}

}  // namespace epifuse
