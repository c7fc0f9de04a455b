// Which vector ISA the CPU's hand-written code (the Winograd kernel, the SiLU pass) runs on.
#pragma once
#include <cpuid.h>

#include <cstdlib>
#include <cstring>

namespace epifuse {

enum class VectorIsa { kNone, kAvx2, kAvx512 };

// What the CPU has, asked once.
inline bool cpu_has_avx512f() {
  static const bool yes = __builtin_cpu_supports("avx512f");
  return yes;
}
// AVX-512 BW and VL: masked 16-bit loads and stores (the bf16 paths of the direct kernels).
inline bool cpu_has_avx512bw_vl() {
  static const bool yes = __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl");
  return yes;
}
inline bool cpu_has_avx2_fma() {
  static const bool yes = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  return yes;
}

// AMD family 1Ah (Zen 5), where oneDNN's depthwise kernel measured faster than the library's (and the
// Xeon measured the other way): the CPUID vendor string and the extended family.
inline bool cpu_is_amd_zen5() {
  static const bool yes = [] {
    unsigned a = 0, b = 0, c = 0, d = 0;
    if (!__get_cpuid(0, &a, &b, &c, &d)) return false;
    const bool amd = b == 0x68747541 && d == 0x69746e65 && c == 0x444d4163;  // "Auth" "enti" "cAMD"
    if (!amd || !__get_cpuid(1, &a, &b, &c, &d)) return false;
    const unsigned base = (a >> 8) & 0xf;
    return base + (base == 0xf ? (a >> 20) & 0xff : 0) == 0x1a;
  }();
  return yes;
}

// The widest this CPU has (AVX-512F; AVX2 with FMA), capped by EPIFUSE_CPU_ISA=avx2 (to run the AVX2
// kernels on an AVX-512 CPU, for tests and comparisons).
inline VectorIsa best_vector_isa() {
  const char* cap = std::getenv("EPIFUSE_CPU_ISA");
  if (cpu_has_avx512f() && !(cap && std::strcmp(cap, "avx2") == 0)) return VectorIsa::kAvx512;
  return cpu_has_avx2_fma() ? VectorIsa::kAvx2 : VectorIsa::kNone;
}

inline const char* isa_name(VectorIsa isa) {
  return isa == VectorIsa::kAvx512 ? "avx512" : isa == VectorIsa::kAvx2 ? "avx2" : "none";
}

}  // namespace epifuse
