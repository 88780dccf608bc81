#include "tools/bench/datasets.h"

#include <boost/json.hpp>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <random>
#include <sstream>
#include <stdexcept>

#include "tools/cli.h"

namespace paged::bench {

namespace json = boost::json;

DatasetOptions dataset_options(cli::Args& args, const DatasetOptions& defaults) {
  DatasetOptions o = defaults;
  const std::optional<std::string> name = args.get("dataset-name");
  o.path = args.get("dataset-path").value_or("");
  o.name = name.value_or(o.path.empty() ? defaults.name : "sharegpt");
  o.num_prompts = args.get_int("num-prompts", o.num_prompts);
  o.random_input_len = args.get_int("random-input-len", o.random_input_len);
  o.random_output_len = args.get_int("random-output-len", o.random_output_len);
  o.random_range_ratio = args.get_double("random-range-ratio", o.random_range_ratio);
  o.random_prefix_len = args.get_int("random-prefix-len", o.random_prefix_len);
  if (args.has("seed")) {
    const int seed = args.get_int("seed", 0);
    if (seed < 0) throw cli::UsageError("--seed must be 0 or more");
    o.seed = static_cast<uint64_t>(seed);
  }
  if (o.name != "random" && o.name != "sharegpt-like" && o.name != "sharegpt")
    throw cli::UsageError("--dataset-name must be random, sharegpt-like or sharegpt, got '" + o.name + "'");
  if (o.name == "sharegpt" && o.path.empty())
    throw cli::UsageError("--dataset-name sharegpt reads a ShareGPT JSON file: give --dataset-path FILE");
  if (o.name != "sharegpt" && !o.path.empty())
    throw cli::UsageError("--dataset-path is the ShareGPT file of --dataset-name sharegpt, not of " + o.name);
  if (o.num_prompts < 1) throw cli::UsageError("--num-prompts must be positive");
  if (o.random_input_len < 1 || o.random_output_len < 1)
    throw cli::UsageError("--random-input-len and --random-output-len must be positive");
  if (!(o.random_range_ratio >= 0 && o.random_range_ratio < 1))
    throw cli::UsageError("--random-range-ratio must be in [0, 1)");
  if (o.random_prefix_len < 0) throw cli::UsageError("--random-prefix-len must be 0 or more");
  if (o.random_prefix_len > 0 && o.name != "random")
    throw cli::UsageError("--random-prefix-len is of --dataset-name random, not of " + o.name);
  return o;
}

std::vector<BenchRequest> random_requests(int n, int input_len, int output_len, double range_ratio, int vocab_size,
                                          uint64_t seed, int prefix_len) {
  const auto range = [&](int len) {
    const int low = std::max(1, static_cast<int>(std::floor(len * (1 - range_ratio))));
    const int high = std::max(low, static_cast<int>(std::ceil(len * (1 + range_ratio))));
    return std::uniform_int_distribution<int>(low, high);
  };
  std::mt19937_64 rng(seed);
  std::uniform_int_distribution<int> in_len = range(input_len), out_len = range(output_len);
  std::uniform_int_distribution<TokenId> token(0, vocab_size - 1);
  std::vector<TokenId> prefix(std::max(prefix_len, 0));
  for (TokenId& t : prefix) t = token(rng);
  std::vector<BenchRequest> requests(std::max(n, 0));
  for (BenchRequest& r : requests) {
    const int own = in_len(rng);
    r.output_len = out_len(rng);
    r.prompt_ids = prefix;
    for (int i = 0; i < own; ++i) r.prompt_ids.push_back(token(rng));
    r.prompt_len = static_cast<int>(r.prompt_ids.size());
  }
  return requests;
}

std::vector<BenchRequest> sharegpt_like_requests(int n, int max_model_len, int vocab_size, uint64_t seed) {
  std::mt19937_64 rng(seed);
  // Lognormal with sigma 1 has mean exp(mu + 1/2): mu = log(mean) - 1/2.
  std::lognormal_distribution<double> in_dist(std::log(161.0) - 0.5, 1.0), out_dist(std::log(338.0) - 0.5, 1.0);
  std::uniform_int_distribution<TokenId> token(0, vocab_size - 1);
  const int total = std::min(2048, max_model_len);
  std::vector<BenchRequest> requests(std::max(n, 0));
  for (BenchRequest& r : requests) {
    r.prompt_len = std::clamp(static_cast<int>(std::lround(in_dist(rng))), 4, std::max(4, std::min(1024, total / 2)));
    r.output_len = std::clamp(static_cast<int>(std::lround(out_dist(rng))), 1, std::max(1, total - r.prompt_len));
    r.prompt_ids.resize(r.prompt_len);
    for (TokenId& t : r.prompt_ids) t = token(rng);
  }
  return requests;
}

std::vector<std::pair<std::string, std::string>> sharegpt_pairs(const json::value& dataset) {
  if (!dataset.is_array()) throw std::runtime_error("a ShareGPT dataset is a JSON list of conversations");
  std::vector<std::pair<std::string, std::string>> pairs;
  for (const json::value& entry : dataset.get_array()) {
    const json::value* turns = entry.is_object() ? entry.get_object().if_contains("conversations") : nullptr;
    if (!turns || !turns->is_array())
      throw std::runtime_error("a ShareGPT entry is {\"conversations\": [{\"from\": ..., \"value\": ...}, ...]}");
    const json::array& list = turns->get_array();
    if (list.size() < 2) continue;
    std::string texts[2];
    for (int i = 0; i < 2; ++i) {
      const json::value* value = list[i].is_object() ? list[i].get_object().if_contains("value") : nullptr;
      if (!value || !value->is_string()) throw std::runtime_error("a ShareGPT turn's \"value\" is a string");
      texts[i] = std::string(value->get_string());
    }
    pairs.emplace_back(std::move(texts[0]), std::move(texts[1]));
  }
  return pairs;
}

std::vector<std::pair<std::string, std::string>> read_sharegpt_file(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw std::runtime_error("cannot read the dataset " + path);
  std::stringstream text;
  text << in.rdbuf();
  boost::system::error_code ec;
  const json::value dataset = json::parse(text.str(), ec);
  if (ec) throw std::runtime_error(path + ": not valid JSON (" + ec.message() + ")");
  try {
    return sharegpt_pairs(dataset);
  } catch (const std::runtime_error& e) {
    throw std::runtime_error(path + ": " + e.what());
  }
}

std::vector<BenchRequest> sharegpt_requests(const std::vector<std::pair<std::string, std::string>>& pairs, int n,
                                            const std::function<std::vector<TokenId>(const std::string&)>& encode,
                                            int max_model_len, uint64_t seed) {
  std::vector<size_t> order(pairs.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::mt19937_64 rng(seed);
  std::shuffle(order.begin(), order.end(), rng);
  const int max_total = std::min(2048, max_model_len);
  std::vector<BenchRequest> requests;
  for (size_t i = 0; i < order.size() && static_cast<int>(requests.size()) < n; ++i) {
    const auto& [prompt, reply] = pairs[order[i]];
    BenchRequest r;
    r.prompt_ids = encode(prompt);
    r.prompt_text = prompt;
    r.prompt_len = static_cast<int>(r.prompt_ids.size());
    r.output_len = static_cast<int>(encode(reply).size());
    if (r.prompt_len < 4 || r.output_len < 4 || r.prompt_len > 1024 || r.prompt_len + r.output_len > max_total)
      continue;
    requests.push_back(std::move(r));
  }
  if (requests.empty())
    throw std::runtime_error("no ShareGPT conversation fits (prompt and reply of 4 tokens or more, prompt up to 1024, "
                             "both up to " + std::to_string(max_total) + ")");
  std::uniform_int_distribution<size_t> pick(0, requests.size() - 1);  // among the usable ones
  while (static_cast<int>(requests.size()) < n) requests.push_back(requests[pick(rng)]);
  return requests;
}

std::vector<BenchRequest> dataset_requests(const DatasetOptions& options, int vocab_size, int max_model_len,
                                           const std::function<std::vector<TokenId>(const std::string&)>& encode) {
  if (options.name == "random")
    return random_requests(options.num_prompts, options.random_input_len, options.random_output_len,
                           options.random_range_ratio, vocab_size, options.seed, options.random_prefix_len);
  if (options.name == "sharegpt-like")
    return sharegpt_like_requests(options.num_prompts, max_model_len, vocab_size, options.seed);
  return sharegpt_requests(read_sharegpt_file(options.path), options.num_prompts, encode, max_model_len, options.seed);
}

MultiturnOptions multiturn_options(cli::Args& args) {
  MultiturnOptions o;
  o.conversations = args.get_int("num-conversations", o.conversations);
  o.turns = args.get_int("num-turns", o.turns);
  o.system_prompt_len = args.get_int("system-prompt-len", o.system_prompt_len);
  o.message_len = args.get_int("message-len", o.message_len);
  o.output_len = args.get_int("output-len", o.output_len);
  o.think_time_s = args.get_double("think-time", o.think_time_s);
  const int seed = args.get_int("seed", 0);
  if (seed < 0) throw cli::UsageError("--seed must be 0 or more");
  o.seed = static_cast<uint64_t>(seed);
  if (o.conversations < 1 || o.turns < 1) throw cli::UsageError("--num-conversations and --num-turns must be positive");
  if (o.system_prompt_len < 0) throw cli::UsageError("--system-prompt-len must be 0 or more");
  if (o.message_len < 1 || o.output_len < 1) throw cli::UsageError("--message-len and --output-len must be positive");
  if (!(o.think_time_s >= 0 && o.think_time_s <= 3600)) throw cli::UsageError("--think-time must be in [0, 3600] s");
  return o;
}

MultiturnDataset multiturn_dataset(const MultiturnOptions& options, int vocab_size) {
  std::mt19937_64 rng(options.seed);
  std::uniform_int_distribution<TokenId> token(0, vocab_size - 1);
  const auto draw = [&](int n) {
    std::vector<TokenId> ids(n);
    for (TokenId& id : ids) id = token(rng);
    return ids;
  };
  MultiturnDataset d;
  d.system_prompt = draw(options.system_prompt_len);
  d.messages.resize(options.conversations);
  for (auto& conversation : d.messages)
    for (int t = 0; t < options.turns; ++t) conversation.push_back(draw(options.message_len));
  return d;
}

std::vector<TokenId> turn_prompt(const MultiturnDataset& dataset, int conversation,
                                 const std::vector<std::vector<TokenId>>& replies) {
  const auto& messages = dataset.messages.at(conversation);
  if (replies.size() >= messages.size()) throw std::out_of_range("turn_prompt: the conversation has no more turns");
  std::vector<TokenId> prompt = dataset.system_prompt;
  for (size_t t = 0; t < replies.size(); ++t) {
    prompt.insert(prompt.end(), messages[t].begin(), messages[t].end());
    prompt.insert(prompt.end(), replies[t].begin(), replies[t].end());
  }
  const auto& message = messages[replies.size()];
  prompt.insert(prompt.end(), message.begin(), message.end());
  return prompt;
}

}  // namespace paged::bench
