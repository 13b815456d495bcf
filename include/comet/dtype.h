// comet/dtype.h: element types of activations and weights, and exact host conversions.
//
// Storage types are bf16 (default), fp16 and fp32; accumulation is always fp32 (DESIGN §2).
// The conversions round to nearest even, as the GPU's cvt.rn does, so the CPU backend rounds
// every stored value exactly as the device will. NaN stays NaN (quiet), infinities saturate
// to infinity.
#pragma once

#include <cstdint>
#include <cstring>
#include <string>

namespace comet {

enum class DType { kF32, kBF16, kF16 };

const char* dtype_name(DType dtype);         // "f32", "bf16", "f16"
DType parse_dtype(const std::string& name);  // throws comet::Error naming the bad value
int dtype_bytes(DType dtype);

inline uint32_t float_bits(float value) {
  uint32_t bits;
  std::memcpy(&bits, &value, sizeof bits);
  return bits;
}
inline float bits_float(uint32_t bits) {
  float value;
  std::memcpy(&value, &bits, sizeof value);
  return value;
}

// bf16 is the top half of an fp32; rounding adds 0x7fff plus the lowest kept bit (ties to even).
inline uint16_t float_to_bf16_bits(float value) {
  uint32_t bits = float_bits(value);
  if ((bits & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((bits >> 16) | 0x0040u);
  bits += 0x7fffu + ((bits >> 16) & 1u);
  return static_cast<uint16_t>(bits >> 16);
}
inline float bf16_bits_to_float(uint16_t bits) { return bits_float(static_cast<uint32_t>(bits) << 16); }

uint16_t float_to_f16_bits(float value);
float f16_bits_to_float(uint16_t bits);

// Round a float to the nearest value representable in `dtype` (identity for kF32).
float round_to(DType dtype, float value);

// Storage element types for templated CPU code. Each has to_float/from_float.
struct bf16_t {
  uint16_t bits;
  static bf16_t from_float(float v) { return {float_to_bf16_bits(v)}; }
  float to_float() const { return bf16_bits_to_float(bits); }
};
struct f16_t {
  uint16_t bits;
  static f16_t from_float(float v) { return {float_to_f16_bits(v)}; }
  float to_float() const { return f16_bits_to_float(bits); }
};
struct f32_t {
  float value;
  static f32_t from_float(float v) { return {v}; }
  float to_float() const { return value; }
};

}  // namespace comet
