// Exact conversions between fp32 and the 16-bit storage types. Tensors of float16/bfloat16 are
// computed in fp32, so only load/store conversions are needed; rounding is to nearest even.
#pragma once
#include <cstdint>
#include <cstring>

namespace epifuse {

struct float16_t { uint16_t bits; };
struct bfloat16_t { uint16_t bits; };

inline float bits_to_float(uint32_t u) {
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}
inline uint32_t float_to_bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  return u;
}

inline float to_float(float v) { return v; }

inline float to_float(bfloat16_t v) { return bits_to_float(uint32_t(v.bits) << 16); }

inline float to_float(float16_t v) {
  const uint32_t sign = uint32_t(v.bits & 0x8000u) << 16;
  const uint32_t exp = (v.bits >> 10) & 0x1fu;
  uint32_t mant = v.bits & 0x3ffu;
  if (exp == 0x1f) return bits_to_float(sign | 0x7f800000u | (mant << 13));  // inf / nan
  if (exp != 0) return bits_to_float(sign | ((exp + 112) << 23) | (mant << 13));
  if (mant == 0) return bits_to_float(sign);
  // Subnormal half: renormalise into a normal float.
  int e = 113;
  while ((mant & 0x400u) == 0) {
    mant <<= 1;
    --e;
  }
  return bits_to_float(sign | (uint32_t(e) << 23) | ((mant & 0x3ffu) << 13));
}

template <class T>
T from_float(float v);

template <>
inline float from_float<float>(float v) { return v; }

template <>
inline bfloat16_t from_float<bfloat16_t>(float v) {
  const uint32_t u = float_to_bits(v);
  if ((u & 0x7fffffffu) > 0x7f800000u) return {uint16_t((u >> 16) | 0x40u)};  // keep NaN quiet
  return {uint16_t((u + 0x7fffu + ((u >> 16) & 1u)) >> 16)};
}

template <>
inline float16_t from_float<float16_t>(float v) {
  const uint32_t u = float_to_bits(v);
  const uint16_t sign = uint16_t((u >> 16) & 0x8000u);
  const uint32_t abs = u & 0x7fffffffu;
  if (abs > 0x7f800000u) return {uint16_t(sign | 0x7e00u)};  // NaN
  if (abs >= 0x477ff000u) return {uint16_t(sign | 0x7c00u)};  // rounds to >= 65536: inf
  if (abs >= 0x38800000u) {                                    // normal half
    const uint32_t r = abs + 0xfffu + ((abs >> 13) & 1u) - 0x38000000u;
    return {uint16_t(sign | (r >> 13))};
  }
  if (abs < 0x33000000u) return {sign};  // below half the smallest subnormal: zero
  // Subnormal half: shift the implicit-one mantissa right, rounding to nearest even.
  const uint32_t exp = abs >> 23;
  const uint32_t mant = (abs & 0x7fffffu) | 0x800000u;
  const uint32_t shift = 126 - exp;  // 14..24
  const uint32_t half_ulp = 1u << (shift - 1);
  const uint32_t rest = mant & ((1u << shift) - 1u);
  uint32_t r = mant >> shift;
  if (rest > half_ulp || (rest == half_ulp && (r & 1u))) ++r;
  return {uint16_t(sign | r)};
}

}  // namespace epifuse
