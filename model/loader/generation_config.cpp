#include "model/loader/generation_config.h"

#include <limits>
#include <sstream>
#include <stdexcept>
#include <string>

#include "model/json_file.h"

namespace paged {

namespace json = boost::json;

namespace {

// The number at `key` within [lo, hi] (`open_lo`: lo itself excluded), or nullopt when absent or null.
std::optional<double> number_in(const json::object& o, const char* key, double lo, double hi, bool open_lo,
                                std::string_view where) {
  const json::value* v = o.if_contains(key);
  if (!v || v->is_null()) return std::nullopt;
  const auto fail = [&](const std::string& why) {
    throw std::invalid_argument(std::string(where) + ": " + key + " " + why);
  };
  if (!v->is_number()) fail("must be a number");
  const double x = v->to_number<double>();
  if (!(open_lo ? x > lo : x >= lo) || !(x <= hi)) {
    std::ostringstream range;
    range << (open_lo ? "(" : "[") << lo << ", " << hi << "]";
    std::ostringstream value;
    value << x;
    fail(value.str() + " is outside " + range.str());
  }
  return x;
}

// The integer at `key`, at least `lo` (and an int32), or nullopt when absent or null.
std::optional<int> integer_in(const json::object& o, const char* key, int lo, std::string_view where) {
  const json::value* v = o.if_contains(key);
  if (!v || v->is_null()) return std::nullopt;
  const double x = v->is_number() ? v->to_number<double>() : 0.5;
  if (!(x >= lo && x <= std::numeric_limits<int32_t>::max()) || x != static_cast<double>(static_cast<int64_t>(x))) {
    std::ostringstream got;
    if (v->is_number()) got << x;
    else got << json::serialize(*v);
    throw std::invalid_argument(std::string(where) + ": " + key + " must be an integer of at least " +
                                std::to_string(lo) + ", got " + got.str());
  }
  return static_cast<int>(x);
}

}  // namespace

SamplingDefaults sampling_defaults_of(const json::object& config, std::string_view where) {
  SamplingDefaults d;
  const auto as_float = [](std::optional<double> x) {
    return x ? std::optional<float>(static_cast<float>(*x)) : std::nullopt;
  };
  d.temperature = as_float(number_in(config, "temperature", 0.0, 2.0, false, where));
  d.top_p = as_float(number_in(config, "top_p", 0.0, 1.0, true, where));
  d.top_k = integer_in(config, "top_k", -1, where);
  d.min_p = as_float(number_in(config, "min_p", 0.0, 1.0, false, where));
  d.repetition_penalty = as_float(number_in(config, "repetition_penalty", 0.0, 2.0, true, where));
  d.max_tokens = integer_in(config, "max_new_tokens", 1, where);
  return d;
}

SamplingDefaults read_sampling_defaults(const std::filesystem::path& dir) {
  const std::filesystem::path file = dir / "generation_config.json";
  if (!std::filesystem::exists(file)) return {};
  return sampling_defaults_of(read_json_object<std::invalid_argument>(file), file.string());
}

SamplingDefaults overridden(SamplingDefaults base, const SamplingDefaults& over) {
  const auto take = [](auto& to, const auto& from) {
    if (from) to = from;
  };
  take(base.temperature, over.temperature);
  take(base.top_p, over.top_p);
  take(base.top_k, over.top_k);
  take(base.min_p, over.min_p);
  take(base.repetition_penalty, over.repetition_penalty);
  take(base.max_tokens, over.max_tokens);
  return base;
}

std::string describe(const SamplingDefaults& d) {
  std::ostringstream out;
  for_each_default(d, [&](const char* name, auto value) {
    if (out.tellp() > 0) out << ", ";
    out << name << " " << value;
  });
  return out.str();
}

}  // namespace paged
