// The CPU runner (float32) against Hugging Face float32 on tiny random-weight checkpoints of each family: Qwen3
// (q/k norms, head_dim apart from hidden / heads, tied and untied, attention_bias), sliding-window Mistral, Qwen2 and
// Qwen3, Phi-3 (fused projections, partial rotary, LongRoPE short and long), Gemma 3 text (four (1 + weight) norms
// per layer, GeGLU, scaled embeddings, the sliding layers' own RoPE, soft-capping). The checkpoints and references come
// from tools/gpu/make_family_refs.py (run where transformers is installed) under tests/models/<name>/; a model
// folder that is absent is skipped with a warning.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <memory>
#include <thread>

#include "kernels/cpu/cpu_runner.h"
#include "kernels/cpu/local_all_reduce.h"
#include "model/loader/config.h"
#include "model/loader/safetensors.h"
#include "model/loader/weight_map.h"
#include "model/kv/kv_groups.h"
#include "tests/kernels/step_chunks.h"
#include "tests/test_data.h"

using namespace paged;
using namespace paged::test;

namespace {

const std::string kFamilyModels = std::string(PAGED_SOURCE_DIR) + "/tests/models/";

// One prompt of refs.json: HF's greedy tokens, its top-1 minus top-2 margins and two rows of logits.
struct RefCase {
  std::vector<TokenId> prompt, tokens;
  std::vector<double> margins;
  std::vector<float> prompt_logits, last_logits;
  int max_model_len = 0;
};

std::vector<float> floats_of(const boost::json::value& v) {
  std::vector<float> out;
  for (const auto& x : v.as_array()) out.push_back(static_cast<float>(x.to_number<double>()));
  return out;
}

// The cases of tests/models/<name>/refs.json; empty (with a warning) when the folder is absent.
std::vector<RefCase> ref_cases(const std::string& name) {
  const std::string dir = kFamilyModels + name;
  if (!std::filesystem::exists(dir + "/refs.json")) {
    WARN("skipped: " << dir << " is absent (python3 tools/gpu/make_family_refs.py --out tests/models)");
    return {};
  }
  std::vector<RefCase> cases;
  const boost::json::value refs = read_json(dir + "/refs.json");
  for (const auto& c : refs.at("cases").as_array()) {
    RefCase r;
    r.prompt = ids_of(c.at("prompt"));
    r.tokens = ids_of(c.at("tokens"));
    for (const auto& m : c.at("margins").as_array()) r.margins.push_back(m.to_number<double>());
    r.prompt_logits = floats_of(c.at("prompt_logits"));
    r.last_logits = floats_of(c.at("last_logits"));
    r.max_model_len = static_cast<int>(c.at("max_model_len").to_number<int64_t>());
    cases.push_back(std::move(r));
  }
  return cases;
}

double rel_l2(const std::vector<float>& a, const std::vector<float>& b) {
  double err = 0, norm = 0;
  for (size_t i = 0; i < b.size(); ++i) {
    err += (double(a[i]) - b[i]) * (double(a[i]) - b[i]);
    norm += double(b[i]) * b[i];
  }
  return std::sqrt(err / std::max(norm, 1e-30));
}

TokenId argmax(const std::vector<float>& logits) {
  return static_cast<TokenId>(std::max_element(logits.begin(), logits.end()) - logits.begin());
}

// What a runner computed for one case: the logits after the prompt, the greedy tokens, and the logits that chose the
// last of them.
struct Run {
  std::vector<float> prompt_logits, last_logits;
  std::vector<TokenId> tokens;
};

// Greedy decoding of `c` on tp_size CPU ranks (threads, LocalAllReduce), block size 16: the prompt in chunks of
// `chunk` tokens (a chunk boundary inside the sliding window and one crossing it), then one token a step. Each KV
// group of the model (model/kv/kv_groups.h) has its own blocks, the groups' tables interleaved in the pool. With
// `release`, each step's tables mark the blocks before their group's window released (kReleasedBlock), as the cache
// manager does: the runner must not read them.
Run run_case(const ModelConfig& cfg, const SafeTensors& weights, const RefCase& c, int tp_size, int chunk,
             bool release = false) {
  const int B = 16;
  const KvGroups groups = kv_groups_of(cfg);
  const int per_group = (c.max_model_len + B - 1) / B + 1;
  const int blocks = groups.num_groups() * per_group;
  LocalAllReduce reduce(tp_size);
  std::vector<std::unique_ptr<CpuModelRunner>> ranks;
  for (int r = 0; r < tp_size; ++r)
    ranks.push_back(std::make_unique<CpuModelRunner>(
        cfg, weights,
        CpuRunnerOptions{.block_size = B, .num_blocks = blocks, .tp_rank = r, .tp_size = tp_size,
                         .all_reduce = tp_size > 1 ? &reduce : nullptr, .max_model_len = c.max_model_len}));
  std::vector<std::vector<int32_t>> tables = test::group_tables_for(groups, per_group);
  SamplingParams greedy;
  greedy.temperature = 0;
  std::vector<TokenId> output;
  // The logits after `tokens` at start_pos (rank 0's; the other ranks run the same step beside it).
  auto step = [&](const std::vector<TokenId>& tokens, int start_pos, bool sample) {
    StepBatch batch;
    SeqChunk s = test::with_tables({.seq = 0, .tokens = tokens, .start_pos = start_pos}, tables, groups, B, release);
    if (sample) s.samples = {SampleSpec{.params = &greedy, .prompt = &c.prompt, .output = &output}};
    batch.seqs.push_back(std::move(s));
    std::vector<std::vector<float>> logits;
    std::vector<std::thread> others;
    for (int r = 1; r < tp_size; ++r) others.emplace_back([&, r] { ranks[r]->forward(batch); });
    logits = ranks[0]->forward(batch);
    for (auto& t : others) t.join();
    return sample ? logits.at(0) : std::vector<float>{};
  };
  Run run;
  const int n = static_cast<int>(c.prompt.size());
  for (int at = 0; at < n; at += chunk) {
    const int end = std::min(n, at + chunk);
    run.prompt_logits = step({c.prompt.begin() + at, c.prompt.begin() + end}, at, end == n);
  }
  std::vector<float> logits = run.prompt_logits;
  for (size_t k = 0; k < c.tokens.size(); ++k) {
    run.last_logits = logits;
    run.tokens.push_back(argmax(logits));
    output.push_back(run.tokens.back());
    if (k + 1 < c.tokens.size()) logits = step({run.tokens.back()}, n + static_cast<int>(k), true);
  }
  return run;
}

// Checks one run against HF: prompt logits within 1e-4 (relative L2), the greedy tokens equal up to a near-tie (HF's
// own margin under 1e-3, where float32 rounding may pick either), the last logits too when every token agreed.
void check_against_hf(const Run& run, const RefCase& c) {
  CHECK(rel_l2(run.prompt_logits, c.prompt_logits) < 1e-4);
  size_t agree = 0;
  while (agree < c.tokens.size() && run.tokens[agree] == c.tokens[agree]) ++agree;
  if (agree < c.tokens.size()) {
    INFO("first difference at token " << agree << ", HF margin " << c.margins[agree]);
    CHECK(c.margins[agree] < 1e-3);
    return;
  }
  CHECK(rel_l2(run.last_logits, c.last_logits) < 1e-4);
}

}  // namespace

TEST_CASE("model families: CPU float32 equals Hugging Face float32", "[model][families]") {
  for (const std::string name :
       {"qwen3", "qwen3-tied-bias", "qwen3-sliding", "mistral-sliding", "qwen2-sliding", "phi3-longrope", "gemma3",
        "gemma3-softcap", "mixtral", "mixtral-fused", "qwen3-moe", "qwen3-moe-fused", "qwen3-moe-unnormalised",
        "qwen3-moe-unnormalised-fused"}) {
    const std::vector<RefCase> cases = ref_cases(name);
    if (cases.empty()) continue;
    const ModelConfig cfg = load_model_config(kFamilyModels + name);
    const SafeTensors weights(kFamilyModels + name);
    for (size_t i = 0; i < cases.size(); ++i) {
      const RefCase& c = cases[i];
      INFO(name << " case " << i << ": prompt of " << c.prompt.size() << ", max_model_len " << c.max_model_len);
      for (const int chunk : {1 << 20, 21}) {  // the prompt whole, and in chunks of 21
        INFO("chunk " << chunk);
        check_against_hf(run_case(cfg, weights, c, 1, chunk), c);
      }
      if (kv_groups_of(cfg).num_sliding() > 0) {  // the sliding groups' blocks before their window released
        INFO("released blocks, chunks of 21");
        check_against_hf(run_case(cfg, weights, c, 1, 21, true), c);
      }
      // Two tensor-parallel ranks: q_norm / k_norm replicated, o_proj's bias added once.
      if (cfg.num_kv_heads % 2 == 0) {
        INFO("tensor_parallel_size 2");
        check_against_hf(run_case(cfg, weights, c, 2, 1 << 20), c);
      }
    }
  }
}

TEST_CASE("model families: the references see the window (without it the logits differ)", "[model][families]") {
  for (const std::string name : {"qwen3-sliding", "mistral-sliding", "qwen2-sliding", "gemma3"}) {
    const std::vector<RefCase> cases = ref_cases(name);
    if (cases.empty()) continue;
    ModelConfig cfg = load_model_config(kFamilyModels + name);
    REQUIRE(cfg.has_sliding_window());
    const int window = *std::max_element(cfg.sliding_windows.begin(), cfg.sliding_windows.end());
    cfg.sliding_windows.assign(cfg.num_layers, 0);
    const SafeTensors weights(kFamilyModels + name);
    for (const RefCase& c : cases) {
      if (static_cast<int>(c.prompt.size()) <= window) continue;  // the window hides nothing of a shorter prompt
      INFO(name << ": prompt of " << c.prompt.size());
      CHECK(rel_l2(run_case(cfg, weights, c, 1, 1 << 20).prompt_logits, c.prompt_logits) > 1e-2);
    }
  }
}

TEST_CASE("model families: the MoE references see the routing weights and the fused layout", "[model][families][moe]") {
  for (const std::string name : {"mixtral", "qwen3-moe", "qwen3-moe-unnormalised", "mixtral-fused"}) {
    const std::vector<RefCase> cases = ref_cases(name);
    if (cases.empty()) continue;
    const SafeTensors weights(kFamilyModels + name);
    ModelConfig cfg = with_expert_layout(load_model_config(kFamilyModels + name), weights);
    REQUIRE(cfg.is_moe());
    if (name.ends_with("-fused")) CHECK(cfg.moe.fused_experts);
    // Renormalising where HF does not (or not where it does) moves the logits: the references tell them apart.
    cfg.moe.renormalize = !cfg.moe.renormalize;
    const RefCase& c = cases.front();
    INFO(name << ": renormalize " << cfg.moe.renormalize);
    CHECK(rel_l2(run_case(cfg, weights, c, 1, 1 << 20).prompt_logits, c.prompt_logits) > 1e-2);
  }
}

TEST_CASE("model families: the Gemma 3 references see the local RoPE, the final soft-cap and the embedding scale",
          "[model][families][gemma]") {
  // Each change of the config alone moves the prompt logits away from HF's: what the runner does with it matters.
  const std::vector<std::pair<std::string, void (*)(ModelConfig&)>> changes = {
      {"local RoPE as the full layers'", [](ModelConfig& m) { m.local_rope_layers.clear(); }},
      {"no final soft-cap", [](ModelConfig& m) { m.final_logit_softcap = 0; }},
      {"embeddings unscaled", [](ModelConfig& m) { m.embedding_scale = 1; }},
      {"head_dim^-0.5 as attention scale", [](ModelConfig& m) { m.query_pre_attn_scalar = 0; }}};
  const std::vector<RefCase> cases = ref_cases("gemma3-softcap");
  if (cases.empty()) return;
  const ModelConfig cfg = load_model_config(kFamilyModels + "gemma3-softcap");
  REQUIRE(cfg.final_logit_softcap > 0);
  const SafeTensors weights(kFamilyModels + "gemma3-softcap");
  const RefCase& c = cases.back();  // the longest prompt
  for (const auto& [what, change] : changes) {
    INFO(what);
    ModelConfig changed = cfg;
    change(changed);
    CHECK(rel_l2(run_case(changed, weights, c, 1, 1 << 20).prompt_logits, c.prompt_logits) > 1e-3);
  }
}
