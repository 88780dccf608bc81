// The half-precision codecs the loader converts bf16 and f16 checkpoints with.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdint>

#include "model/loader/safetensors.h"

using namespace paged;

TEST_CASE("loader: the half-precision decoders handle special values", "[loader]") {
  CHECK(bf16_to_float(0x3f80) == 1.0f);
  CHECK(bf16_to_float(0xc000) == -2.0f);
  CHECK(std::isinf(bf16_to_float(0x7f80)));
  CHECK(std::isnan(bf16_to_float(0x7fc0)));
  CHECK(f16_to_float(0x3c00) == 1.0f);
  CHECK(f16_to_float(0x7bff) == 65504.0f);
  CHECK(f16_to_float(0x0001) == std::ldexp(1.0f, -24));  // smallest subnormal
  CHECK(f16_to_float(0x03ff) == std::ldexp(1023.0f, -24));  // largest subnormal
  CHECK(f16_to_float(0x8000) == 0.0f);
  CHECK(std::signbit(f16_to_float(0x8000)));
  CHECK(std::isinf(f16_to_float(0xfc00)));
  CHECK(std::isnan(f16_to_float(0x7e00)));
  for (uint32_t h = 0; h < 0x10000; ++h) {  // every finite f16 round-trips through float
    const auto b = static_cast<uint16_t>(h);
    if (((b >> 10) & 0x1f) == 0x1f) continue;
    if (float_to_f16(f16_to_float(b)) != b) {
      FAIL_CHECK("f16 " << h << " does not round-trip");
      break;
    }
  }
}
