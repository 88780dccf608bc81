// The reasoning in a model's answer (vLLM's reasoning outputs): the text a Qwen3 / DeepSeek-R1 style model writes
// in its think block, split from the rest, the answer's content, by the format `--reasoning-parser` names. Pure:
// one incremental scan reads a whole answer and a stream's pieces alike, a tag may fall across pieces.
#pragma once

#include <optional>
#include <string>
#include <string_view>

namespace paged::openai {

/// How an answer marks its reasoning. After the first "</think>" everything is content, further tags included.
enum class ReasoningFormat {
  none,         // no reasoning: the answer is content
  deepseek_r1,  // the answer starts inside the reasoning (the template may have opened <think>): everything up to
                // the first "</think>" is reasoning (the first "<think>" before it dropped); none: all reasoning
  qwen3,        // reasoning only inside "<think>" ... "</think>": text before "<think>" is content, an answer with
                // no "<think>" (enable_thinking false) all content; one cut inside the block keeps it as reasoning
};

/// The tag that ends the reasoning in every format.
inline constexpr std::string_view kReasoningEnd = "</think>";

/// The format a --reasoning-parser name gives (deepseek_r1, qwen3); nullopt for another name.
std::optional<ReasoningFormat> reasoning_parser_named(std::string_view name);

/// An answer, or a piece of one, split into its reasoning and its content (the tags in neither).
struct ReasoningSplit {
  std::string reasoning;
  std::string content;
};

/// Reads an answer piece by piece: the pieces' reasoning and content join to split_reasoning of the whole answer,
/// however it is cut. A tail that may begin a tag is held back until the next piece (or the end) settles it.
class ReasoningStream {
 public:
  explicit ReasoningStream(ReasoningFormat format);
  /// The reasoning and content that the answer's next piece `text` settles; `ended`: the answer ends with it.
  ReasoningSplit add(std::string_view text, bool ended);
  /// Whether the answer read so far is inside its reasoning: not yet past the tag that ends it (qwen3: past the one
  /// that opens it). The tokens of a piece added in that state are reasoning tokens (the closing tag's included).
  bool in_reasoning() const {
    return phase_ == Phase::thinking || (phase_ == Phase::opening && format_ == ReasoningFormat::deepseek_r1);
  }

 private:
  enum class Phase { opening, thinking, answer };  // before any tag, inside the think block, after "</think>"
  ReasoningFormat format_;
  Phase phase_ = Phase::opening;
  std::string held_;  // the tail of the answer so far that may begin a tag
};

/// The reasoning and content of the whole answer `text` (format none: all content).
ReasoningSplit split_reasoning(ReasoningFormat format, std::string_view text);

}  // namespace paged::openai
