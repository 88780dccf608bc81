#include "tools/bench/multiturn_bench.h"

#include <boost/json.hpp>

#include <chrono>
#include <condition_variable>
#include <iostream>
#include <mutex>
#include <queue>

#include "actors/engine.h"
#include "tools/bench/bench_stats.h"
#include "tools/bench/datasets.h"
#include "tools/cli.h"

namespace paged::bench {

namespace {

namespace json = boost::json;
using Clock = std::chrono::steady_clock;

/// What one run of the dataset measured.
struct MultiturnResult {
  double seconds = 0;
  int requests = 0, failed = 0;
  int64_t output_tokens = 0, prompt_tokens = 0, prompt_tokens_computed = 0;
  int64_t device_hit_tokens = 0, cpu_hit_tokens = 0, disk_hit_tokens = 0, offloaded_blocks = 0, preemptions = 0;
  int64_t pool_tokens = 0, history_tokens = 0;  // the device pool, and every conversation's history at the end
  double ttft_p50_s = 0, ttft_p99_s = 0;
};

MultiturnResult run_dataset(Engine& engine, const MultiturnDataset& data, const MultiturnOptions& o) {
  const int conversations = static_cast<int>(data.messages.size());
  SamplingParams params;
  params.max_tokens = o.output_len;
  params.temperature = 0;
  params.ignore_eos = true;

  // What the sinks update, shared with them: a request's last events may come after a failed submit() ended the run.
  using Due = std::pair<double, int>;  // (seconds from the start, conversation)
  struct Run {
    std::mutex mu;
    std::condition_variable cv;
    std::vector<std::vector<std::vector<TokenId>>> replies;  // [conversation][turn]
    std::priority_queue<Due, std::vector<Due>, std::greater<>> due;
    std::vector<double> ttfts;
    MultiturnResult r;
    int finished = 0;
  };
  const auto run = std::make_shared<Run>();
  run->replies.resize(conversations);
  for (int c = 0; c < conversations; ++c) run->due.push({o.think_time_s * c / conversations, c});
  const Clock::time_point t0 = Clock::now();
  const auto since_start = [t0] { return std::chrono::duration<double>(Clock::now() - t0).count(); };
  const int turns = o.turns;
  const double think_time_s = o.think_time_s;

  std::unique_lock lock(run->mu);
  while (run->finished < conversations) {
    if (run->due.empty()) {
      run->cv.wait(lock);
      continue;
    }
    const auto [at, c] = run->due.top();
    if (since_start() < at) {
      run->cv.wait_until(lock, t0 + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(at)));
      continue;
    }
    run->due.pop();
    const std::vector<TokenId> prompt = turn_prompt(data, c, run->replies[c]);
    run->r.prompt_tokens += static_cast<int64_t>(prompt.size());
    ++run->r.requests;
    auto reply = std::make_shared<std::vector<TokenId>>();
    auto first_token = std::make_shared<bool>(false);
    const Clock::time_point sent = Clock::now();
    lock.unlock();  // the sink takes the lock, maybe before submit returns
    engine.submit(prompt, params, [run, c, reply, first_token, sent, since_start, turns, think_time_s](
                                      const RequestEvent& ev) {
      for (const CompletionDelta& d : ev.deltas) reply->insert(reply->end(), d.token_ids.begin(), d.token_ids.end());
      std::lock_guard guard(run->mu);
      if (!*first_token && !reply->empty()) {
        *first_token = true;
        run->ttfts.push_back(std::chrono::duration<double>(Clock::now() - sent).count());
      }
      if (!ev.done) return;
      if (ev.error) ++run->r.failed;
      run->r.output_tokens += static_cast<int64_t>(reply->size());
      run->replies[c].push_back(std::move(*reply));
      if (static_cast<int>(run->replies[c].size()) == turns) ++run->finished;
      else run->due.push({since_start() + think_time_s, c});
      run->cv.notify_all();
    });
    lock.lock();
  }
  MultiturnResult r = run->r;
  r.seconds = since_start();
  lock.unlock();  // every conversation is done: no sink runs any more
  const std::vector<double>& ttfts = run->ttfts;
  const std::vector<std::vector<std::vector<TokenId>>>& replies = run->replies;
  engine.wait_idle();
  const Metrics& m = engine.metrics();
  r.prompt_tokens_computed = m.prompt_tokens_computed;
  r.cpu_hit_tokens = m.offload_hit_tokens;
  r.disk_hit_tokens = m.disk_hit_tokens;  // loaded into the CPU tier, then counted there again as promoted
  r.device_hit_tokens = m.prefix_cache_hit_tokens - m.offload_hit_tokens;
  r.offloaded_blocks = m.offloaded_blocks;
  r.preemptions = m.preemptions;
  r.pool_tokens = m.kv_blocks_total * engine.config().block_size;
  for (int c = 0; c < conversations; ++c) {
    std::vector<std::vector<TokenId>> all = replies[c];
    all.pop_back();  // the last turn's prompt, plus its reply
    r.history_tokens += static_cast<int64_t>(turn_prompt(data, c, all).size() + replies[c].back().size());
  }
  r.ttft_p50_s = percentile(ttfts, 50);
  r.ttft_p99_s = percentile(ttfts, 99);
  return r;
}

json::object result_json(const MultiturnResult& r) {
  return {{"seconds", r.seconds},
          {"requests", r.requests},
          {"failed", r.failed},
          {"output_tokens", r.output_tokens},
          {"output_tok_per_s", double(r.output_tokens) / r.seconds},
          {"ttft_p50_s", r.ttft_p50_s},
          {"ttft_p99_s", r.ttft_p99_s},
          {"prompt_tokens", r.prompt_tokens},
          {"prompt_tokens_computed", r.prompt_tokens_computed},
          {"device_hit_tokens", r.device_hit_tokens},
          {"cpu_tier_hit_tokens", r.cpu_hit_tokens},
          {"disk_tier_hit_tokens", r.disk_hit_tokens},
          {"kv_offloaded_blocks", r.offloaded_blocks},
          {"preemptions", r.preemptions},
          {"history_tokens", r.history_tokens},
          {"device_pool_tokens", r.pool_tokens}};
}

std::string table(const std::string& title, const MultiturnResult& r) {
  return table_title(" " + title + " ", '-') + table_row("Requests (failed):", std::to_string(r.requests) + " (" +
                                                                                  std::to_string(r.failed) + ")") +
         table_row("Benchmark duration (s):", fixed2(r.seconds)) +
         table_row("Output token throughput (tok/s):", fixed2(double(r.output_tokens) / r.seconds)) +
         table_row("Median TTFT (ms):", fixed2(1000 * r.ttft_p50_s)) +
         table_row("P99 TTFT (ms):", fixed2(1000 * r.ttft_p99_s)) +
         table_row("Prompt tokens:", std::to_string(r.prompt_tokens)) +
         table_row("Prompt tokens computed:", std::to_string(r.prompt_tokens_computed)) +
         table_row("Hit tokens, device:", std::to_string(r.device_hit_tokens)) +
         table_row("Hit tokens, CPU tier:", std::to_string(r.cpu_hit_tokens)) +
         table_row("Hit tokens, disk tier:", std::to_string(r.disk_hit_tokens)) +
         table_row("Blocks offloaded to the CPU tier:", std::to_string(r.offloaded_blocks)) +
         table_row("Preemptions:", std::to_string(r.preemptions)) +
         table_row("Histories / device pool:", fixed2(double(r.history_tokens) / double(r.pool_tokens)));
}

}  // namespace

int run_multiturn_bench(cli::Args& args, const EngineConfig& config) {
  const MultiturnOptions o = multiturn_options(args);
  const bool as_json = args.get_bool("json", false);
  args.reject_unknown();

  MultiturnDataset data;
  MultiturnResult with_tier;
  {
    Engine engine(config);
    const int64_t longest = o.system_prompt_len + int64_t{o.turns} * (o.message_len + o.output_len);
    if (longest > engine.max_model_len())
      throw cli::UsageError("the last turn's history holds " + std::to_string(longest) + " tokens, more than the " +
                            std::to_string(engine.max_model_len()) +
                            " of the model's context: fewer --num-turns or shorter lengths");
    data = multiturn_dataset(o, engine.model_config().vocab_size);
    with_tier = run_dataset(engine, data, o);
  }
  const bool compare = config.kv_offloading_gib > 0;
  MultiturnResult without_tier;
  if (compare) {
    EngineConfig off = config;
    off.kv_offloading_gib = 0;
    off.kv_disk_dir.clear();  // the disk tier sits below the CPU tier
    off.kv_disk_gib = 0;
    Engine engine(off);
    without_tier = run_dataset(engine, data, o);
  }
  const double ttft_ratio = with_tier.ttft_p50_s > 0 ? without_tier.ttft_p50_s / with_tier.ttft_p50_s : 0;
  const double throughput_ratio =
      without_tier.output_tokens > 0 ? (double(with_tier.output_tokens) / with_tier.seconds) /
                                           (double(without_tier.output_tokens) / without_tier.seconds)
                                     : 0;
  if (as_json) {
    json::object out{{"dataset", "multiturn"},
                     {"conversations", o.conversations},
                     {"turns", o.turns},
                     {"system_prompt_len", o.system_prompt_len},
                     {"message_len", o.message_len},
                     {"output_len", o.output_len},
                     {"think_time_s", o.think_time_s},
                     {compare ? "cpu_tier" : "run", result_json(with_tier)}};
    if (compare) {
      out["no_cpu_tier"] = result_json(without_tier);
      out["ttft_p50_ratio"] = ttft_ratio;
      out["output_tok_per_s_ratio"] = throughput_ratio;
    }
    std::cout << json::serialize(out) << std::endl;
    return 0;
  }
  std::cout << table_title(" Multiturn Benchmark Result ", '=')
            << table_row("Conversations x turns:", std::to_string(o.conversations) + " x " + std::to_string(o.turns))
            << table_row("System prompt / message / reply:", std::to_string(o.system_prompt_len) + " / " +
                                                                 std::to_string(o.message_len) + " / " +
                                                                 std::to_string(o.output_len))
            << table(compare ? "With the CPU tier" : "Run", with_tier);
  if (compare)
    std::cout << table("Without the CPU tier", without_tier)
              << table_row("Median TTFT, without / with:", fixed2(ttft_ratio))
              << table_row("Output tok/s, with / without:", fixed2(throughput_ratio));
  std::cout << std::string(50, '=') << std::endl;
  return 0;
}

}  // namespace paged::bench
