// Host conversions between fp32 and the 16-bit storage types (round to nearest even).
#include "comet/dtype.h"

#include <cmath>

#include "comet/error.h"

namespace comet {

const char* dtype_name(DType dtype) {
  switch (dtype) {
    case DType::kF32: return "f32";
    case DType::kBF16: return "bf16";
    case DType::kF16: return "f16";
  }
  return "?";
}

DType parse_dtype(const std::string& name) {
  if (name == "f32" || name == "fp32" || name == "float32") return DType::kF32;
  if (name == "bf16" || name == "bfloat16") return DType::kBF16;
  if (name == "f16" || name == "fp16" || name == "float16") return DType::kF16;
  throw Error("unknown dtype '" + name + "' (expected bf16, f16 or f32)");
}

int dtype_bytes(DType dtype) { return dtype == DType::kF32 ? 4 : 2; }

// fp32 -> fp16: 1 sign, 5 exponent (bias 15), 10 mantissa bits. Normal results keep the top
// 10 mantissa bits with round-to-nearest-even on the rest; results below 2^-14 become
// subnormals (the implicit bit shifted into the mantissa before rounding).
uint16_t float_to_f16_bits(float value) {
  const uint32_t bits = float_bits(value);
  const uint16_t sign = static_cast<uint16_t>((bits >> 16) & 0x8000u);
  const uint32_t abs = bits & 0x7fffffffu;
  if (abs > 0x7f800000u) return sign | 0x7e00u;  // NaN
  // >= 2^16 (or inf) overflows; [65520, 2^16) overflows through the rounding carry below.
  if (abs >= 0x47800000u) return sign | 0x7c00u;
  const int exp = static_cast<int>(abs >> 23) - 127;
  if (exp >= -14) {
    // Normal half: rebias the exponent, round the 13 dropped mantissa bits.
    uint32_t h = ((static_cast<uint32_t>(exp + 15)) << 10) | ((abs >> 13) & 0x3ffu);
    const uint32_t rest = abs & 0x1fffu;
    if (rest > 0x1000u || (rest == 0x1000u && (h & 1u))) h += 1;  // may carry into inf: correct
    return sign | static_cast<uint16_t>(h);
  }
  if (exp < -25) return sign;  // below half the smallest subnormal: rounds to zero
  // Subnormal half: value = m * 2^-24 with m = mantissa_with_implicit >> shift.
  const uint32_t mant = (abs & 0x7fffffu) | 0x800000u;
  const int shift = -exp - 14 + 13;  // 14..24
  uint32_t h = mant >> shift;
  const uint32_t rest = mant & ((1u << shift) - 1u);
  const uint32_t half = 1u << (shift - 1);
  if (rest > half || (rest == half && (h & 1u))) h += 1;
  return sign | static_cast<uint16_t>(h);
}

float f16_bits_to_float(uint16_t bits) {
  const uint32_t sign = static_cast<uint32_t>(bits & 0x8000u) << 16;
  const uint32_t exp = (bits >> 10) & 0x1fu;
  const uint32_t mant = bits & 0x3ffu;
  if (exp == 0x1fu) return bits_float(sign | 0x7f800000u | (mant << 13));
  if (exp == 0) {
    const float magnitude = std::ldexp(static_cast<float>(mant), -24);
    return sign ? -magnitude : magnitude;
  }
  return bits_float(sign | ((exp + 112u) << 23) | (mant << 13));
}

float round_to(DType dtype, float value) {
  switch (dtype) {
    case DType::kF32: return value;
    case DType::kBF16: return bf16_bits_to_float(float_to_bf16_bits(value));
    case DType::kF16: return f16_bits_to_float(float_to_f16_bits(value));
  }
  return value;
}

}  // namespace comet
