// The sampling defaults of a model's generation_config.json, as vLLM takes them (--generation-config auto): the
// request fields a Hugging Face generation config sets that a request may leave out. Pure: JSON in, defaults out.
#pragma once

#include <boost/json.hpp>
#include <filesystem>
#include <string_view>

#include "model/sampling/sampling_params.h"

namespace paged {

/// The defaults an object sets: temperature, top_p, top_k, min_p, repetition_penalty and max_new_tokens (as
/// max_tokens); every other key is left alone (do_sample, eos ids: vLLM's reading). Throws std::invalid_argument
/// naming `where` and the key for a value of the wrong type or outside what a request may ask (temperature [0, 2],
/// top_p (0, 1], top_k -1 or more, min_p [0, 1], repetition_penalty (0, 2], max_new_tokens 1 or more).
SamplingDefaults sampling_defaults_of(const boost::json::object& config, std::string_view where);

/// sampling_defaults_of(DIR/generation_config.json); none when the folder has no such file. Throws
/// std::invalid_argument also for a file that is not a JSON object.
SamplingDefaults read_sampling_defaults(const std::filesystem::path& dir);

/// `base` with every default that `over` sets taken from `over`.
SamplingDefaults overridden(SamplingDefaults base, const SamplingDefaults& over);

/// Calls f(name, value) for each default set, by SamplingParams' names (max_new_tokens as max_tokens), in order.
template <class F>
void for_each_default(const SamplingDefaults& d, F&& f) {
  const auto visit = [&](const char* name, const auto& value) {
    if (value) f(name, *value);
  };
  visit("temperature", d.temperature);
  visit("top_p", d.top_p);
  visit("top_k", d.top_k);
  visit("min_p", d.min_p);
  visit("repetition_penalty", d.repetition_penalty);
  visit("max_tokens", d.max_tokens);
}

/// "temperature 0.6, top_p 0.9": the defaults set, for a log line; empty when none is.
std::string describe(const SamplingDefaults& defaults);

}  // namespace paged
