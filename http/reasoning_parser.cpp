#include "http/reasoning_parser.h"

#include <algorithm>
#include <vector>

namespace paged::openai {

namespace {

constexpr std::string_view kOpen = "<think>";
constexpr std::string_view kClose = kReasoningEnd;

// The length of the longest tail of `text` that is a proper prefix of one of `tags` (it may begin a tag).
size_t tag_prefix_tail(std::string_view text, const std::vector<std::string_view>& tags) {
  size_t longest = 0;
  for (std::string_view tag : tags)
    for (size_t n = std::min(text.size(), tag.size() - 1); n > longest; --n)
      if (text.ends_with(tag.substr(0, n))) {
        longest = n;
        break;
      }
  return longest;
}

}  // namespace

std::optional<ReasoningFormat> reasoning_parser_named(std::string_view name) {
  if (name == "deepseek_r1") return ReasoningFormat::deepseek_r1;
  if (name == "qwen3") return ReasoningFormat::qwen3;
  return std::nullopt;
}

ReasoningStream::ReasoningStream(ReasoningFormat format)
    : format_(format), phase_(format == ReasoningFormat::none ? Phase::answer : Phase::opening) {}

ReasoningSplit ReasoningStream::add(std::string_view text, bool ended) {
  ReasoningSplit out;
  std::string pending = std::move(held_);
  held_.clear();
  pending += text;
  std::string_view rest = pending;
  while (!rest.empty()) {
    if (phase_ == Phase::answer) {
      out.content += rest;
      break;
    }
    // Where this phase's text goes, and the tags that end it.
    std::string& sink = phase_ == Phase::opening && format_ == ReasoningFormat::qwen3 ? out.content : out.reasoning;
    std::vector<std::string_view> tags{kClose};
    if (phase_ == Phase::opening && format_ == ReasoningFormat::qwen3) tags = {kOpen};
    if (phase_ == Phase::opening && format_ == ReasoningFormat::deepseek_r1) tags = {kOpen, kClose};
    size_t at = std::string_view::npos;
    std::string_view found;
    for (std::string_view tag : tags)
      if (const size_t p = rest.find(tag); p < at) {
        at = p;
        found = tag;
      }
    if (at == std::string_view::npos) {
      const size_t hold = ended ? 0 : tag_prefix_tail(rest, tags);
      sink += rest.substr(0, rest.size() - hold);
      held_ = std::string(rest.substr(rest.size() - hold));
      break;
    }
    sink += rest.substr(0, at);
    rest.remove_prefix(at + found.size());
    phase_ = found == kClose ? Phase::answer : Phase::thinking;  // opening -> thinking, thinking -> answer
  }
  return out;
}

ReasoningSplit split_reasoning(ReasoningFormat format, std::string_view text) {
  return ReasoningStream(format).add(text, true);
}

}  // namespace paged::openai
