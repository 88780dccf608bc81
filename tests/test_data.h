// Where the tests find the shared model and golden outputs, and small JSON helpers for them.
#pragma once

#include <catch2/catch.hpp>

#include <stdlib.h>

#include <boost/json.hpp>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "kernels/cpu/cpu_runner.h"
#include "model/tokenizer/tokenizer.h"

namespace paged::test {

/// A fresh folder under the system's temporary directory, named `prefix` and six random characters; removed, with
/// what it holds, with the object.
class TempDir {
 public:
  explicit TempDir(const std::string& prefix) {
    std::string pattern = (std::filesystem::temp_directory_path() / (prefix + "XXXXXX")).string();
    REQUIRE(mkdtemp(pattern.data()) != nullptr);
    path_ = pattern;
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  const std::filesystem::path& path() const { return path_; }

 private:
  std::filesystem::path path_;
};

/// The default model and its Hugging Face golden outputs, both in the project (models/, tests/golden/).
inline const std::string kModel = std::string(PAGED_SOURCE_DIR) + "/models/stories260K";
inline const std::string kGolden = std::string(PAGED_SOURCE_DIR) + "/tests/golden/stories260K-greedy.json";

/// `relative` under the shared test data (larger models and their golden outputs): $PAGED_SHARED_DIR when set, else
/// ../shared beside the checkout. Empty when it is not there: the caller skips, saying what it needs.
inline std::string shared_path(const std::string& relative) {
  const char* env = getenv("PAGED_SHARED_DIR");
  const std::filesystem::path path =
      std::filesystem::path(env && *env ? env : std::string(PAGED_SOURCE_DIR) + "/../shared") / relative;
  return std::filesystem::exists(path) ? path.lexically_normal().string() : "";
}

/// The parsed JSON file; fails the test when it cannot be read.
inline boost::json::value read_json(const std::string& path) {
  std::ifstream in(path);
  REQUIRE(in);
  std::stringstream ss;
  ss << in.rdbuf();
  return boost::json::parse(ss.str());
}

/// A JSON array of integers as token ids.
inline std::vector<TokenId> ids_of(const boost::json::value& v) {
  std::vector<TokenId> out;
  for (const auto& x : v.as_array()) out.push_back(static_cast<TokenId>(x.to_number<int64_t>()));
  return out;
}

/// Greedy decoding of `prompts` as one batch straight on a runner (no engine); sequence s uses the blocks
/// tables[s]. When `prefill_logits` is given it receives the logits after the prompts.
inline std::vector<std::vector<TokenId>> greedy_on_runner(CpuModelRunner& runner,
                                                          const std::vector<std::vector<TokenId>>& prompts,
                                                          int max_tokens,
                                                          const std::vector<std::vector<int32_t>>& tables,
                                                          std::vector<std::vector<float>>* prefill_logits = nullptr,
                                                          const std::vector<std::vector<std::vector<int32_t>>>&
                                                              group_tables = {}) {
  SamplingParams greedy;
  greedy.temperature = 0;
  std::vector<std::vector<TokenId>> outputs(prompts.size());
  std::vector<int> computed(prompts.size(), 0);
  for (int step = 0; step < max_tokens; ++step) {
    StepBatch batch;
    for (size_t s = 0; s < prompts.size(); ++s) {
      SeqChunk c;
      c.seq = s;
      c.start_pos = computed[s];
      c.tokens = step == 0 ? prompts[s] : std::vector<TokenId>{outputs[s].back()};
      c.block_table = tables[s];
      if (!group_tables.empty()) c.group_tables = group_tables[s];  // a model of several KV groups: groups 1..
      SampleSpec spec;
      spec.params = &greedy;
      spec.prompt = &prompts[s];
      spec.output = &outputs[s];
      c.samples = {spec};
      computed[s] += static_cast<int>(c.tokens.size());
      batch.seqs.push_back(std::move(c));
    }
    // Running the same step twice on the same slots rewrites the same K/V, so the logits come for free.
    if (step == 0 && prefill_logits) *prefill_logits = runner.forward(batch);
    StepResult r = runner.execute(batch);
    for (size_t s = 0; s < prompts.size(); ++s) outputs[s].push_back(r.samples[s][0][0].token);
  }
  return outputs;
}

/// Writes into `dir` stories260K as a Mistral whose every layer sees the last `window` positions (its weights and
/// tokenizer under another attention mask): a model whose KV the cache manager releases behind the window. With
/// `layer_types` ("sliding_attention" / "full_attention" for each of its 5 layers), only those layers slide: a model
/// of several KV groups (model/kv/kv_groups.h).
inline void write_sliding_stories(const std::filesystem::path& dir, int window,
                                  const std::vector<std::string>& layer_types = {}) {
  for (const char* f : {"model.safetensors", "tokenizer.model", "tokenizer_config.json", "generation_config.json"})
    std::filesystem::copy_file(std::filesystem::path(kModel) / f, dir / f);
  boost::json::object config = read_json(kModel + "/config.json").as_object();
  config["model_type"] = "mistral";
  config["architectures"] = boost::json::array{"MistralForCausalLM"};
  config["sliding_window"] = window;
  if (!layer_types.empty()) config["layer_types"] = boost::json::value_from(layer_types);
  std::ofstream(dir / "config.json") << boost::json::serialize(config);
}

}  // namespace paged::test
