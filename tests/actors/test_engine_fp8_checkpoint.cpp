// A pre-quantised FP8 checkpoint through the engine on the CPU: --quantization auto (the default) and none both
// load it dequantised to float32, generating what its dequantised float32 twin generates; fp8 is refused there, and
// so is a value --quantization does not know.
#include <catch2/catch.hpp>

#include "actors/engine.h"
#include "tests/fp8_checkpoints.h"
#include "tests/test_data.h"

using namespace paged;

namespace {

std::vector<std::vector<TokenId>> greedy_tokens(const std::string& dir, const std::string& quantization,
                                                std::string* format = nullptr) {
  EngineConfig c;
  c.model_dir = dir;
  c.device = "cpu";
  c.swap_space_gib = 0.25;
  c.quantization = quantization;
  Engine engine(c);
  if (format) *format = engine.summary().checkpoint_format;
  SamplingParams greedy;
  greedy.temperature = 0.0f;
  greedy.max_tokens = 24;
  std::vector<std::vector<TokenId>> out;
  const std::vector<std::string> prompts = {"Once upon a time", "The little dog"};
  for (const RequestOutput& r : engine.generate(prompts, greedy))
    out.push_back(r.outputs.at(0).token_ids);
  return out;
}

}  // namespace

TEST_CASE("the engine serves an FP8 checkpoint on the CPU dequantised, as its float32 twin", "[fp8ckpt][engine]") {
  const std::string out = test::fp8_checkpoints_once(
      test::kModel, std::string(PAGED_BINARY_DIR) + "/fp8_checkpoints/stories260K", test::all_fp8_layouts());
  const std::string dir = out + "/ct-channel";
  std::string format;
  const auto want = greedy_tokens(out + "/ct-channel-ref", "auto");
  CHECK(greedy_tokens(dir, "auto", &format) == want);
  CHECK_THAT(format, Catch::Contains("FP8 checkpoint (compressed-tensors") &&
                         Catch::Contains("dequantised to float32 at load"));
  CHECK(greedy_tokens(dir, "none") == want);
  CHECK_THROWS_WITH(greedy_tokens(dir, "fp8"), Catch::Contains("--quantization fp8 needs --device cuda"));
  CHECK_THROWS_WITH(greedy_tokens(dir, "int8"), Catch::Contains("quantization must be auto, fp8 or none"));
}
