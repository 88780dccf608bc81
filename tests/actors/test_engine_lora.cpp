// LoRA adapters through the engine (CPU executor, the real stories260K): a request of an adapter runs as the base
// checkpoint with the adapter merged into its weights (W + scale * B A, PEFT's merge_and_unload, computed by the test
// from the files), beside base requests in the same steps; tensor-parallel shards of a pair sum to the whole; the
// prefix cache keeps an adapter's KV apart; --max-loras holds requests of more adapters back; bad adapters are
// refused at start naming the problem.
#include <catch2/catch.hpp>

#include "actors/engine.h"
#include "actors/messages.h"
#include "actors/worker.h"
#include "tests/actors/engine_runs.h"
#include "tests/model/lora/lora_files.h"
#include "tests/test_data.h"

using namespace paged;
using namespace paged::test;

namespace {

EngineConfig cpu_config(const std::string& model) {
  EngineConfig c;
  c.model_dir = model;
  c.device = "cpu";
  c.max_num_seqs = 16;
  return c;
}

// The CPU config of stories260K serving two adapters of rank 4 on every projection, "a" and "b", written in `dir`.
EngineConfig two_adapters(const std::filesystem::path& dir, uint32_t seed) {
  const std::vector<LoraSpec> specs = every_projection(kModel, 4);
  write_lora_adapter(dir / "a", specs, 8.0, false, seed);
  write_lora_adapter(dir / "b", specs, 8.0, false, seed + 1);
  EngineConfig c = cpu_config(kModel);
  c.enable_lora = true;
  c.lora_modules = {{"a", (dir / "a").string()}, {"b", (dir / "b").string()}};
  return c;
}

// `reqs` with every request's lora set to `lora`.
std::vector<std::pair<std::vector<TokenId>, SamplingParams>> with_lora(
    std::vector<std::pair<std::vector<TokenId>, SamplingParams>> reqs, int32_t lora) {
  for (auto& r : reqs) r.second.lora = lora;
  return reqs;
}

}  // namespace

TEST_CASE("an adapter's requests run as the merged checkpoint does, base requests as the base model, in the same steps",
          "[engine][lora]") {
  TempDir dir("paged_lora_engine");
  const std::vector<LoraSpec> specs = every_projection(kModel, 8);
  REQUIRE(specs.size() == 35);  // 5 layers x 7 projections
  const auto pairs = write_lora_adapter(dir.path() / "adapter", specs, 16.0, false, 1);
  write_merged_checkpoint(kModel, dir.path() / "merged", specs, pairs, 16.0, false);
  // A second adapter (rsLoRA, attention only, rank 4), to mix two in one batch.
  std::vector<LoraSpec> attn;
  for (const LoraSpec& s : every_projection(kModel, 4))
    if (s.module.find("self_attn") != std::string::npos) attn.push_back(s);
  const auto pairs2 = write_lora_adapter(dir.path() / "adapter2", attn, 8.0, true, 2);
  write_merged_checkpoint(kModel, dir.path() / "merged2", attn, pairs2, 8.0, true);

  const auto reqs = varied_requests();
  Engine merged(cpu_config((dir.path() / "merged").string()));
  Engine merged2(cpu_config((dir.path() / "merged2").string()));
  Engine base(cpu_config(kModel));
  const auto want_lora = run_all(merged, reqs);
  const auto want_lora2 = run_all(merged2, reqs);
  const auto want_base = run_all(base, reqs);

  EngineConfig c = cpu_config(kModel);
  c.enable_lora = true;
  c.lora_modules = {{"stories-a", (dir.path() / "adapter").string()}, {"stories-b", (dir.path() / "adapter2").string()}};
  c.max_loras = 2;
  Engine engine(c);
  // All three kinds at once: the steps mix base rows and both adapters' rows.
  auto mixed = reqs;
  auto a = with_lora(reqs, 1), b = with_lora(reqs, 2);
  mixed.insert(mixed.end(), a.begin(), a.end());
  mixed.insert(mixed.end(), b.begin(), b.end());
  const auto got = run_all(engine, mixed);
  const size_t n = reqs.size();
  using Runs = std::vector<std::vector<Completion>>;
  check_same_completions(Runs(got.begin(), got.begin() + n), want_base, 1e-3);
  check_same_completions(Runs(got.begin() + n, got.begin() + 2 * n), want_lora, 1e-3);
  check_same_completions(Runs(got.begin() + 2 * n, got.end()), want_lora2, 1e-3);
  // The adapters change what the model says (else the comparison above proves nothing).
  int differ = 0;
  for (size_t i = 0; i < n; ++i) differ += want_lora[i][0].tokens != want_base[i][0].tokens;
  CHECK(differ >= static_cast<int>(n) / 2);

  // Speculation verifies an adapter's drafts with the adapter: the same completions.
  EngineConfig spec = c;
  spec.speculative_config = {.num_speculative_tokens = 3, .prompt_lookup_min = 1, .prompt_lookup_max = 3};
  Engine speculating(spec);
  check_same_completions(run_all(speculating, a), want_lora, 1e-3);

  // Tensor parallelism: each rank's shards of the pairs (B's rows of q/k/v and gate/up, A's columns of o and down).
  EngineConfig tp = c;
  tp.tensor_parallel_size = 2;
  Engine sharded(tp);
  check_same_completions(run_all(sharded, a), want_lora, 1e-3);
  engine.wait_idle();
  CHECK(engine.metrics().kv_blocks_free.load() == engine.metrics().kv_blocks_total.load());
}

TEST_CASE("the prefix cache keeps an adapter's KV apart from the base model's and other adapters'", "[engine][lora]") {
  TempDir dir("paged_lora_cache");
  Engine engine(two_adapters(dir.path(), 3));
  std::vector<TokenId> prompt{1};
  for (int i = 0; i < 80; ++i) prompt.push_back(static_cast<TokenId>(10 + (i * 7) % 400));
  SamplingParams p{.max_tokens = 4, .temperature = 0.0f};
  const auto cached = [&](int32_t lora) {
    SamplingParams q = p;
    q.lora = lora;
    return engine.generate(std::vector<std::vector<TokenId>>{prompt}, q).at(0).num_cached_tokens;
  };
  CHECK(cached(0) == 0);
  CHECK(cached(1) == 0);   // the base model's blocks are not the adapter's
  CHECK(cached(2) == 0);   // nor another adapter's
  CHECK(cached(1) == 80);  // its own are: 5 full blocks of 16
  CHECK(cached(0) == 80);
}

TEST_CASE("--max-loras holds a request of another adapter back until the running ones end", "[engine][lora]") {
  TempDir dir("paged_lora_max");
  EngineConfig c = two_adapters(dir.path(), 5);
  c.max_loras = 2;
  Engine both(c);
  c.max_loras = 1;
  Engine one(c);
  auto reqs = varied_requests();
  for (size_t i = 0; i < reqs.size(); ++i) reqs[i].second.lora = static_cast<int32_t>(i % 3);  // base, a, b
  // The same completions either way (each request's output depends on its own adapter only), and every one ends.
  check_same_completions(run_all(one, reqs), run_all(both, reqs), 1e-3);
}

TEST_CASE("a LoRA request names a loaded adapter; adapters are checked at start", "[engine][lora]") {
  TempDir dir("paged_lora_bad");
  const std::vector<LoraSpec> specs = every_projection(kModel, 8);
  write_lora_adapter(dir.path() / "ok", specs, 16.0, false, 7);
  EngineConfig c = cpu_config(kModel);
  c.enable_lora = true;
  c.lora_modules = {{"ok", (dir.path() / "ok").string()}};
  {
    Engine engine(c);
    SamplingParams p{.max_tokens = 2};
    p.lora = 2;
    CHECK_THROWS_AS(engine.submit({1, 2, 3}, p, [](RequestEvent) {}), InvalidRequest);
    p.lora = -1;
    CHECK_THROWS_AS(engine.submit({1, 2, 3}, p, [](RequestEvent) {}), InvalidRequest);
  }
  const auto refused = [&](const std::string& folder, const std::string& words) {
    EngineConfig bad = c;
    bad.lora_modules = {{"x", (dir.path() / folder).string()}};
    INFO(folder);
    CHECK_THROWS_WITH(Engine(bad), Catch::Contains(words));
  };
  EngineConfig small = c;
  small.max_lora_rank = 4;
  CHECK_THROWS_WITH(Engine(small), Catch::Contains("above --max-lora-rank 4"));
  write_lora_adapter(dir.path() / "dora", specs, 16.0, false, 8, {{"use_dora", true}});
  refused("dora", "DoRA");
  write_lora_adapter(dir.path() / "saved", specs, 16.0, false, 8, {{"modules_to_save", boost::json::array{"lm_head"}}});
  refused("saved", "modules_to_save");
  write_lora_adapter(dir.path() / "embed", {{"model.embed_tokens", 512, 64, 4}}, 8.0, false, 9);
  refused("embed", "adds to no linear layer");
  write_lora_adapter(dir.path() / "shape", {{"model.layers.0.self_attn.q_proj", 64, 32, 4}}, 8.0, false, 10);
  refused("shape", "expected for its base weight");
  refused("missing", "not a folder");
  EngineConfig twice = c;
  twice.lora_modules.push_back(c.lora_modules[0]);
  CHECK_THROWS_WITH(Engine(twice), Catch::Contains("names 'ok' twice"));
  // vLLM's rule: no adapter, at start or later, without --enable-lora.
  EngineConfig off = c;
  off.enable_lora = false;
  CHECK_THROWS_WITH(Engine(off), Catch::Contains("--enable-lora"));
  off.lora_modules.clear();
  Engine plain(off);
  CHECK_THROWS_WITH(plain.load_lora("ok", (dir.path() / "ok").string()), Catch::Contains("--enable-lora"));
}

TEST_CASE("adapters load and unload while the engine serves; a request in flight keeps its adapter to the end",
          "[engine][lora]") {
  TempDir dir("paged_lora_runtime");
  const std::vector<LoraSpec> specs = every_projection(kModel, 8);
  const auto pairs = write_lora_adapter(dir.path() / "adapter", specs, 16.0, false, 21);
  write_merged_checkpoint(kModel, dir.path() / "merged", specs, pairs, 16.0, false);
  Engine merged(cpu_config((dir.path() / "merged").string()));
  EngineConfig c = cpu_config(kModel);
  c.enable_lora = true;
  c.max_num_seqs = 4;
  Engine engine(c);
  CHECK(engine.lora_adapters().empty());
  CHECK(engine.lora_prometheus().empty());  // until an adapter is served
  CHECK_THROWS_WITH(engine.load_lora("bad", (dir.path() / "nothing").string()), Catch::Contains("not a folder"));
  CHECK(engine.lora_adapters().empty());
  const int32_t id = engine.load_lora("a", (dir.path() / "adapter").string());
  REQUIRE(engine.lora_adapters().size() == 1);
  CHECK(engine.lora_adapters()[0].name == "a");
  CHECK_THROWS_AS(engine.load_lora("a", (dir.path() / "adapter").string()), InvalidRequest);

  // A long request of the adapter; unloaded while it runs, it still ends as the merged checkpoint's does.
  const std::vector<TokenId> prompt = ids_of(read_json(kGolden).at("cases").at(0).at("prompt_ids"));
  SamplingParams p{.max_tokens = 200, .temperature = 0.0f, .ignore_eos = true};
  const auto want = merged.generate(std::vector<std::vector<TokenId>>{prompt}, p).at(0).outputs.at(0).token_ids;
  p.lora = id;
  std::mutex mu;
  std::condition_variable cv;
  std::vector<TokenId> got;
  bool done = false, started = false;
  engine.submit(prompt, p, [&](RequestEvent ev) {
    std::lock_guard lock(mu);
    for (const auto& d : ev.deltas) got.insert(got.end(), d.token_ids.begin(), d.token_ids.end());
    started = started || !got.empty();
    done = done || ev.done;
    cv.notify_all();
  });
  {
    std::unique_lock lock(mu);
    REQUIRE(cv.wait_for(lock, std::chrono::seconds(60), [&] { return started; }));
  }
  // vLLM's vllm:lora_requests_info names the adapter of the running request.
  CHECK_THAT(engine.lora_prometheus(), Catch::Contains("vllm:lora_requests_info{max_lora=\"1\","
                                                       "running_lora_adapters=\"a\",waiting_lora_adapters=\"\"}"));
  CHECK(engine.unload_lora("a"));
  CHECK_FALSE(engine.unload_lora("a"));
  CHECK(engine.lora_adapters().empty());
  CHECK_THROWS_AS(engine.submit(prompt, p, [](RequestEvent) {}), InvalidRequest);
  {
    std::unique_lock lock(mu);
    REQUIRE(cv.wait_for(lock, std::chrono::seconds(60), [&] { return done; }));
  }
  CHECK(got == want);
  engine.wait_idle();
  CHECK_THAT(engine.lora_prometheus(), Catch::Contains("running_lora_adapters=\"\",waiting_lora_adapters=\"\""));
  // The name is free again: loaded anew, under a new id.
  const int32_t again = engine.load_lora("a", (dir.path() / "adapter").string());
  CHECK(again != id);
  p.lora = again;
  CHECK(engine.generate(std::vector<std::vector<TokenId>>{prompt}, p).at(0).outputs.at(0).token_ids == want);
}

TEST_CASE("a worker serves the adapters of its --lora-modules: the head's requests of them cross the wire",
          "[engine][lora][remote]") {
  TempDir dir("paged_lora_worker");
  EngineConfig c = two_adapters(dir.path(), 31);
  c.max_num_seqs = 8;
  c.max_loras = 2;
  Worker worker(c, "127.0.0.1", 0);
  CHECK(worker.info().lora_names == std::vector<std::string>{"a", "b"});
  EngineConfig head = c;
  head.device = "auto";
  head.workers = {"127.0.0.1:" + std::to_string(worker.port())};
  Engine local(c);
  auto reqs = varied_requests();
  for (size_t i = 0; i < reqs.size(); ++i) reqs[i].second.lora = static_cast<int32_t>(i % 3);
  const auto want = run_all(local, reqs);
  {
    Engine remote(head);
    CHECK(remote.lora_adapters().size() == 2);
    check_same_completions(run_all(remote, reqs), want, 1e-4);
    CHECK_THROWS_WITH(remote.load_lora("c", (dir.path() / "a").string()), Catch::Contains("fixed at start"));
  }
  // The head and the worker must name the same adapters, in the same order, of the same weights.
  const auto refused = [&](std::vector<EngineConfig::LoraModule> modules, const std::string& words) {
    EngineConfig other = head;
    other.lora_modules = std::move(modules);
    CHECK_THROWS_WITH(Engine(other), Catch::Contains(words));
  };
  refused({{"b", (dir.path() / "b").string()}, {"a", (dir.path() / "a").string()}}, "the worker serves the LoRA adapters [a, b]");
  refused({}, "this engine's --lora-modules names []");
}
