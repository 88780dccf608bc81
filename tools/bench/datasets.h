// The requests of a benchmark run (`paged bench` and `paged bench serve` alike), as vLLM's benchmarks sample them:
// random (token ids of fixed or uniformly ranged lengths), sharegpt-like (seeded lognormal lengths) and sharegpt (a
// ShareGPT-format JSON file); and the multiturn conversations of `paged bench --dataset-name multiturn`.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include <boost/json/value.hpp>

#include "model/types.h"

namespace paged::cli {
class Args;
}

namespace paged::bench {

/// One request: its prompt as token ids (random, sharegpt-like) or as text (sharegpt, where `prompt_ids` holds its
/// tokens too), the prompt's length in tokens and the number of tokens to generate.
struct BenchRequest {
  std::vector<TokenId> prompt_ids;
  std::string prompt_text;  // empty unless the dataset is text
  int prompt_len = 0;
  int output_len = 0;
};

/// The dataset flags shared by both benchmarks.
struct DatasetOptions {
  std::string name = "random";  // random | sharegpt-like | sharegpt
  std::string path;             // the ShareGPT JSON file (sharegpt)
  int num_prompts = 1000;
  int random_input_len = 1024, random_output_len = 128;
  double random_range_ratio = 0;  // lengths uniform in [len * (1 - r), len * (1 + r)], 0 <= r < 1
  int random_prefix_len = 0;      // random: the same this many tokens before every prompt (vLLM's)
  uint64_t seed = 0;
};
/// Reads --dataset-name, --dataset-path (alone it means sharegpt), --num-prompts, --random-input-len,
/// --random-output-len, --random-range-ratio, --random-prefix-len and --seed on top of `defaults`; UsageError for a
/// bad or contradictory value (sharegpt without a path, a path with another dataset, a prefix off the random one).
DatasetOptions dataset_options(cli::Args& args, const DatasetOptions& defaults);

/// vLLM's random dataset: `n` prompts of token ids drawn uniformly from [0, vocab_size), input and output lengths
/// drawn uniformly from [floor(len * (1 - ratio)), ceil(len * (1 + ratio))] (at least 1), seeded; each prompt starts
/// with the same `prefix_len` random ids (a shared system prompt or few-shot examples), not counted in input_len.
std::vector<BenchRequest> random_requests(int n, int input_len, int output_len, double range_ratio, int vocab_size,
                                          uint64_t seed, int prefix_len = 0);

/// ShareGPT-like lengths without the data: lognormal (sigma 1) with means 161 in / 338 out as in the PagedAttention
/// paper, the prompt clamped to [4, min(1024, total / 2)] and the output to [1, total - prompt] where total is
/// min(2048, max_model_len); random token ids from [0, vocab_size); seeded.
std::vector<BenchRequest> sharegpt_like_requests(int n, int max_model_len, int vocab_size, uint64_t seed);

/// The (prompt, reply) pairs of a ShareGPT-format dataset ([{"conversations": [{"from", "value"}, ...]}, ...]): the
/// first two turns of every conversation that has at least two; std::runtime_error for another shape.
std::vector<std::pair<std::string, std::string>> sharegpt_pairs(const boost::json::value& dataset);
/// sharegpt_pairs of the JSON file at `path`; std::runtime_error when it cannot be read or parsed.
std::vector<std::pair<std::string, std::string>> read_sharegpt_file(const std::string& path);

/// vLLM's ShareGPT sampling: the pairs shuffled (seeded), each prompt and reply counted with `encode` (the model's
/// tokenizer, special tokens added), those with a prompt or reply under 4 tokens, a prompt over 1024 or prompt +
/// reply over min(2048, max_model_len) dropped, the first `n` kept; fewer usable pairs than `n` are repeated
/// (seeded draws) up to `n`, as vLLM oversamples. std::runtime_error when no pair is usable.
std::vector<BenchRequest> sharegpt_requests(const std::vector<std::pair<std::string, std::string>>& pairs, int n,
                                            const std::function<std::vector<TokenId>(const std::string&)>& encode,
                                            int max_model_len, uint64_t seed);

/// The requests `options` name: random and sharegpt-like prompts of ids from [0, vocab_size), sharegpt from the
/// file, counted with `encode` (needed only there); lengths bounded by `max_model_len` where the dataset says so.
std::vector<BenchRequest> dataset_requests(const DatasetOptions& options, int vocab_size, int max_model_len,
                                           const std::function<std::vector<TokenId>(const std::string&)>& encode);

/// The shape of the multiturn dataset: `conversations` conversations of `turns` turns behind one system prompt; each
/// turn sends the conversation's whole history (system prompt, earlier messages and replies) and a new message.
struct MultiturnOptions {
  int conversations = 32, turns = 8;
  int system_prompt_len = 1024, message_len = 128, output_len = 128;  // tokens
  double think_time_s = 0.5;  // between a reply and the conversation's next message
  uint64_t seed = 0;
};
/// Reads --num-conversations, --num-turns, --system-prompt-len, --message-len, --output-len, --think-time (seconds)
/// and --seed; UsageError for a value out of range.
MultiturnOptions multiturn_options(cli::Args& args);

/// The token ids of a multiturn run: the system prompt and every conversation's messages, uniform ids from
/// [0, vocab_size), seeded; the replies are the engine's.
struct MultiturnDataset {
  std::vector<TokenId> system_prompt;
  std::vector<std::vector<std::vector<TokenId>>> messages;  // [conversation][turn]
};
MultiturnDataset multiturn_dataset(const MultiturnOptions& options, int vocab_size);

/// The prompt of turn `replies.size()` of `conversation`: the system prompt, then each earlier turn's message and
/// reply, then this turn's message.
std::vector<TokenId> turn_prompt(const MultiturnDataset& dataset, int conversation,
                                 const std::vector<std::vector<TokenId>>& replies);

}  // namespace paged::bench
