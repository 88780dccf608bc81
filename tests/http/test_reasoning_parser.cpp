// The reasoning split of answers (http/reasoning_parser.h): whole answers against splits written out by hand, and
// the same answers streamed in every cut into two and three pieces and byte by byte, whose pieces must join to
// the hand-written split (a tag falling across pieces, nested and repeated tags, a '<' that begins no tag).
#include <catch2/catch.hpp>

#include <vector>

#include "http/reasoning_parser.h"

namespace paged::openai {

namespace {

struct Case {
  std::string text;
  std::string reasoning;
  std::string content;
};

// The pieces of `cuts` (ascending offsets into `text`) streamed in order, their splits joined.
ReasoningSplit streamed(ReasoningFormat format, const std::string& text, const std::vector<size_t>& cuts) {
  ReasoningStream stream(format);
  ReasoningSplit joined;
  size_t from = 0;
  for (size_t i = 0; i <= cuts.size(); ++i) {
    const size_t to = i < cuts.size() ? cuts[i] : text.size();
    const ReasoningSplit piece = stream.add(std::string_view(text).substr(from, to - from), i == cuts.size());
    joined.reasoning += piece.reasoning;
    joined.content += piece.content;
    from = to;
  }
  return joined;
}

void check_case(ReasoningFormat format, const Case& c) {
  INFO(c.text);
  const ReasoningSplit whole = split_reasoning(format, c.text);
  CHECK(whole.reasoning == c.reasoning);
  CHECK(whole.content == c.content);
  std::vector<size_t> bytes;
  for (size_t i = 1; i < c.text.size(); ++i) bytes.push_back(i);
  std::vector<std::vector<size_t>> cuttings{{}, bytes};
  for (size_t i = 0; i <= c.text.size(); ++i)
    for (size_t j = i; j <= c.text.size(); ++j) cuttings.push_back({i, j});
  for (const std::vector<size_t>& cuts : cuttings) {
    const ReasoningSplit got = streamed(format, c.text, cuts);
    if (got.reasoning == c.reasoning && got.content == c.content) continue;
    INFO("cut at " << (cuts.empty() ? 0 : cuts.front()) << ", " << (cuts.size() > 1 ? cuts[1] : 0) << " of "
                   << cuts.size() << " cuts");
    CHECK(got.reasoning == c.reasoning);
    CHECK(got.content == c.content);
  }
}

}  // namespace

TEST_CASE("reasoning parser names: vLLM's deepseek_r1 and qwen3, nothing else", "[openai][reasoning]") {
  CHECK(reasoning_parser_named("deepseek_r1") == ReasoningFormat::deepseek_r1);
  CHECK(reasoning_parser_named("qwen3") == ReasoningFormat::qwen3);
  CHECK(!reasoning_parser_named("granite"));
  CHECK(!reasoning_parser_named(""));
}

TEST_CASE("deepseek_r1: reasoning up to the first </think>, an opening tag optional", "[openai][reasoning]") {
  const auto D = ReasoningFormat::deepseek_r1;
  for (const Case& c : std::vector<Case>{
           {"<think>I think so</think>The answer.", "I think so", "The answer."},
           {"I think so</think>The answer.", "I think so", "The answer."},
           {"still thinking, cut short", "still thinking, cut short", ""},
           {"</think>only the answer", "", "only the answer"},
           {"<think>a<think>b</think>c</think>d", "a<think>b", "c</think>d"},
           {"<think>a</think>b<think>c</think>d", "a", "b<think>c</think>d"},
           {"pre<think>a</think>b", "prea", "b"},
           {"a < b <thin k> c</thinker><</think>x<", "a < b <thin k> c</thinker><", "x<"},
           {"ends inside a tag </thi", "ends inside a tag </thi", ""},
           {"", "", ""},
       })
    check_case(D, c);
}

TEST_CASE("qwen3: reasoning only inside <think> ... </think>", "[openai][reasoning]") {
  const auto Q = ReasoningFormat::qwen3;
  for (const Case& c : std::vector<Case>{
           {"<think>I think so</think>The answer.", "I think so", "The answer."},
           {"I think so</think>The answer.", "", "I think so</think>The answer."},
           {"no think block at all", "", "no think block at all"},
           {"<think>\n\n</think>\n\nThe answer.", "\n\n", "\n\nThe answer."},
           {"pre<think>a</think>b", "a", "preb"},
           {"<think>cut short inside", "cut short inside", ""},
           {"<think>a<think>b</think>c</think>d", "a<think>b", "c</think>d"},
           {"<think>a</think>b<think>c</think>d", "a", "b<think>c</think>d"},
           {"x < y <thin<think>a <b> </think </think>z<", "a <b> </think ", "x < y <thinz<"},
           {"ends inside a tag <thi", "", "ends inside a tag <thi"},
       })
    check_case(Q, c);
}

TEST_CASE("format none: the answer is content, tags and all", "[openai][reasoning]") {
  check_case(ReasoningFormat::none, {"<think>a</think>b", "", "<think>a</think>b"});
}

TEST_CASE("a streamed tail that may begin a tag is held back until the next piece settles it", "[openai][reasoning]") {
  ReasoningStream qwen(ReasoningFormat::qwen3);
  ReasoningSplit s = qwen.add("Hi <thi", false);
  CHECK((s.reasoning.empty() && s.content == "Hi "));
  s = qwen.add("nk>abc<", false);
  CHECK((s.reasoning == "abc" && s.content.empty()));
  s = qwen.add("/think>", false);
  CHECK((s.reasoning.empty() && s.content.empty()));
  s = qwen.add("done<", false);
  CHECK((s.reasoning.empty() && s.content == "done<"));  // after </think> no tag is looked for
  ReasoningStream deepseek(ReasoningFormat::deepseek_r1);
  s = deepseek.add("x <", false);
  CHECK((s.reasoning == "x " && s.content.empty()));
  s = deepseek.add("", true);
  CHECK((s.reasoning == "<" && s.content.empty()));
}


TEST_CASE("in_reasoning: whether the pieces read so far leave the answer inside its think block", "[openai][reasoning]") {
  // (piece, in_reasoning after it), for each format; a tag cut across pieces counts once whole.
  const auto states = [](ReasoningFormat format, const std::vector<std::string>& pieces) {
    ReasoningStream stream(format);
    std::vector<bool> out{stream.in_reasoning()};
    for (const std::string& piece : pieces) {
      stream.add(piece, false);
      out.push_back(stream.in_reasoning());
    }
    return out;
  };
  const std::vector<std::string> pieces = {"Hi ", "<thi", "nk>", "so ", "</th", "ink>", "yes", "</think>"};
  CHECK(states(ReasoningFormat::deepseek_r1, pieces) ==
        std::vector<bool>{true, true, true, true, true, true, false, false, false});
  CHECK(states(ReasoningFormat::qwen3, pieces) ==
        std::vector<bool>{false, false, false, true, true, true, false, false, false});
  CHECK(states(ReasoningFormat::none, pieces) == std::vector<bool>(pieces.size() + 1, false));
}

}  // namespace paged::openai
