// unit/dtype_test.cpp: bf16 / f16 conversions round to nearest even on known bit patterns,
// keep NaN, overflow to infinity, and round_to is idempotent (include/comet/dtype.h).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

#include "comet/dtype.h"
#include "comet/routing.h"

namespace comet {
namespace {

bool is_f16_nan(uint16_t b) { return (b & 0x7c00u) == 0x7c00u && (b & 0x03ffu) != 0; }
bool is_bf16_nan(uint16_t b) { return (b & 0x7f80u) == 0x7f80u && (b & 0x007fu) != 0; }

struct BitCase {
  float value;
  uint16_t bits;
  const char* what;
};

TEST(BF16, KnownPatternsRoundToNearestEven) {
  const float p7 = std::ldexp(1.0f, -7);  // bf16 ulp at 1
  const BitCase cases[] = {
      {1.0f, 0x3f80, "1"},
      {-1.0f, 0xbf80, "-1"},
      {0.0f, 0x0000, "+0"},
      {-0.0f, 0x8000, "-0"},
      {1.0f + std::ldexp(1.0f, -8), 0x3f80, "1 + 2^-8: tie, kept bit even -> down"},
      {1.0f + 3 * std::ldexp(1.0f, -9), 0x3f81, "1 + 3*2^-9: above half -> up"},
      {1.0f + std::ldexp(1.0f, -9), 0x3f80, "1 + 2^-9: below half -> down"},
      {1.0f + p7 + std::ldexp(1.0f, -8), 0x3f82, "1 + 2^-7 + 2^-8: tie, kept bit odd -> up"},
      {-(1.0f + p7 + std::ldexp(1.0f, -8)), 0xbf82, "negative tie, odd -> up in magnitude"},
      {3.140625f, 0x4049, "3.140625 exact"},
      {bits_float(0x7f7f0000u), 0x7f7f, "max finite bf16"},
      {std::numeric_limits<float>::max(), 0x7f80, "max finite f32 overflows to inf"},
      {bits_float(0x7f7f8000u), 0x7f80, "tie above max bf16 (odd) -> inf"},
      {std::numeric_limits<float>::infinity(), 0x7f80, "+inf"},
      {-std::numeric_limits<float>::infinity(), 0xff80, "-inf"},
      {bits_float(0x00010000u), 0x0001, "smallest bf16 subnormal"},
      {bits_float(0x00008000u), 0x0000, "half of smallest subnormal ties to even 0"},
      {bits_float(0x00018000u), 0x0002, "1.5 x smallest subnormal ties to even 2"},
  };
  for (const BitCase& c : cases) {
    EXPECT_EQ(float_to_bf16_bits(c.value), c.bits)
        << c.what << ": value bits 0x" << std::hex << float_bits(c.value);
    EXPECT_EQ(bf16_t::from_float(c.value).bits, c.bits) << c.what;
  }
}

TEST(BF16, NaNStaysNaN) {
  for (uint32_t bits : {0x7fc00000u, 0xffc00000u, 0x7f800001u, 0x7fffffffu, 0xff800001u, 0x7f80ffffu}) {
    const uint16_t b = float_to_bf16_bits(bits_float(bits));
    EXPECT_TRUE(is_bf16_nan(b)) << std::hex << bits << " -> " << b;
    EXPECT_TRUE(std::isnan(bf16_bits_to_float(b)));
    EXPECT_TRUE(std::isnan(round_to(DType::kBF16, bits_float(bits))));
  }
}

TEST(BF16, EveryPatternRoundTrips) {
  for (uint32_t b = 0; b <= 0xffff; ++b) {
    const uint16_t bits = uint16_t(b);
    const float f = bf16_bits_to_float(bits);
    EXPECT_EQ(float_bits(f), uint32_t(b) << 16);
    if (is_bf16_nan(bits)) {
      EXPECT_TRUE(is_bf16_nan(float_to_bf16_bits(f)));
    } else {
      ASSERT_EQ(float_to_bf16_bits(f), bits) << std::hex << b;
    }
  }
}

TEST(F16, KnownPatternsRoundToNearestEven) {
  const BitCase cases[] = {
      {1.0f, 0x3c00, "1"},
      {-2.0f, 0xc000, "-2"},
      {0.0f, 0x0000, "+0"},
      {-0.0f, 0x8000, "-0"},
      {0.5f, 0x3800, "0.5"},
      {1.0f + std::ldexp(1.0f, -11), 0x3c00, "1 + 2^-11: tie, even -> down"},
      {1.0f + 3 * std::ldexp(1.0f, -12), 0x3c01, "1 + 3*2^-12: above half -> up"},
      {1.0f + std::ldexp(1.0f, -10) + std::ldexp(1.0f, -11), 0x3c02, "tie, odd -> up"},
      {65504.0f, 0x7bff, "max finite"},
      {-65504.0f, 0xfbff, "-max finite"},
      {65519.0f, 0x7bff, "below the overflow tie"},
      {65520.0f, 0x7c00, "overflow tie (odd) -> inf"},
      {1.0e6f, 0x7c00, "overflow -> inf"},
      {-1.0e6f, 0xfc00, "overflow -> -inf"},
      {std::numeric_limits<float>::max(), 0x7c00, "max f32 -> inf"},
      {std::numeric_limits<float>::infinity(), 0x7c00, "+inf"},
      {-std::numeric_limits<float>::infinity(), 0xfc00, "-inf"},
      {std::ldexp(1.0f, -14), 0x0400, "smallest normal"},
      {std::ldexp(1.0f, -14) - std::ldexp(1.0f, -24), 0x03ff, "largest subnormal"},
      {std::ldexp(1.0f, -14) - std::ldexp(1.0f, -25), 0x0400, "tie between 0x3ff and 0x400 -> even"},
      {std::ldexp(1.0f, -24), 0x0001, "smallest subnormal 2^-24"},
      {-std::ldexp(1.0f, -24), 0x8001, "-2^-24"},
      {std::ldexp(1.0f, -25), 0x0000, "2^-25 ties to even 0"},
      {3 * std::ldexp(1.0f, -26), 0x0001, "0.75 x 2^-24 -> up"},
      {std::ldexp(1.0f, -26), 0x0000, "0.25 x 2^-24 -> 0"},
      {3 * std::ldexp(1.0f, -25), 0x0002, "1.5 x 2^-24 ties to even 2"},
      {5 * std::ldexp(1.0f, -25), 0x0002, "2.5 x 2^-24 ties to even 2"},
      {std::ldexp(1.0f, -30), 0x0000, "far below -> 0"},
      {-std::ldexp(1.0f, -30), 0x8000, "far below, negative -> -0"},
      {std::numeric_limits<float>::denorm_min(), 0x0000, "f32 subnormal -> 0"},
  };
  for (const BitCase& c : cases) {
    EXPECT_EQ(float_to_f16_bits(c.value), c.bits)
        << c.what << ": value " << c.value << " bits 0x" << std::hex << float_bits(c.value);
    EXPECT_EQ(f16_t::from_float(c.value).bits, c.bits) << c.what;
  }
}

TEST(F16, NaNStaysNaN) {
  for (uint32_t bits : {0x7fc00000u, 0xffc00000u, 0x7f800001u, 0x7fffffffu, 0xff800001u}) {
    const uint16_t b = float_to_f16_bits(bits_float(bits));
    EXPECT_TRUE(is_f16_nan(b)) << std::hex << bits << " -> " << b;
    EXPECT_TRUE(std::isnan(round_to(DType::kF16, bits_float(bits))));
  }
}

TEST(F16, EveryPatternRoundTrips) {
  for (uint32_t b = 0; b <= 0xffff; ++b) {
    const uint16_t bits = uint16_t(b);
    const float f = f16_bits_to_float(bits);
    if (is_f16_nan(bits)) {
      EXPECT_TRUE(std::isnan(f)) << std::hex << b;
      EXPECT_TRUE(is_f16_nan(float_to_f16_bits(f)));
      continue;
    }
    ASSERT_EQ(float_to_f16_bits(f), bits) << std::hex << b << " -> " << f;
    // The decoded value is exact: sign * mantissa * 2^exponent.
    const int exp = (b >> 10) & 0x1f;
    const int man = b & 0x3ff;
    double want = exp == 0 ? std::ldexp(double(man), -24)
                 : exp == 31 ? std::numeric_limits<double>::infinity()
                             : std::ldexp(double(man | 0x400), exp - 25);
    if (b & 0x8000) want = -want;
    ASSERT_EQ(double(f), want) << std::hex << b;
  }
}

#if defined(__FLT16_MAX__)
// The compiler's _Float16 conversion rounds to nearest even: an independent reference.
TEST(F16, MatchesCompilerFloat16OnRandomValues) {
  Rng rng(12345);
  for (int i = 0; i < 200000; ++i) {
    // Random bit patterns around the f16 range (exponents 2^-30 .. 2^17) plus random signs.
    const uint32_t exp = 97 + uint32_t(rng.uniform_int(48));
    const uint32_t bits = (uint32_t(rng.uniform_int(2)) << 31) | (exp << 23) |
                          uint32_t(rng.next_u64() & 0x7fffffu);
    const float f = bits_float(bits);
    const _Float16 h = static_cast<_Float16>(f);
    uint16_t want;
    std::memcpy(&want, &h, sizeof want);
    ASSERT_EQ(float_to_f16_bits(f), want) << "bits 0x" << std::hex << bits;
  }
}
#endif

TEST(RoundTo, IdempotentAndMatchesTheBitConversions) {
  Rng rng(777);
  for (int i = 0; i < 100000; ++i) {
    float f;
    if (i % 3 == 0) {
      f = bits_float(uint32_t(rng.next_u64()));  // any pattern, NaN and inf included
    } else {
      f = float(rng.normal() * std::ldexp(1.0, rng.uniform_int(40) - 20));
    }
    EXPECT_EQ(float_bits(round_to(DType::kF32, f)), float_bits(f));
    for (DType d : {DType::kBF16, DType::kF16}) {
      const float once = round_to(d, f);
      if (std::isnan(f)) {
        ASSERT_TRUE(std::isnan(once));
        continue;
      }
      const float twice = round_to(d, once);
      ASSERT_EQ(float_bits(twice), float_bits(once)) << dtype_name(d) << " " << f;
      const float via_bits = d == DType::kBF16 ? bf16_bits_to_float(float_to_bf16_bits(f))
                                               : f16_bits_to_float(float_to_f16_bits(f));
      ASSERT_EQ(float_bits(once), float_bits(via_bits)) << dtype_name(d) << " " << f;
    }
  }
}

}  // namespace
}  // namespace comet
