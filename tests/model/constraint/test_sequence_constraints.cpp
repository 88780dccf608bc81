// A worker's constraints (SequenceConstraints) on the stories260K tokenizer: along random walks, the mask each
// sample gets equals the one the engine's own constraint (built and advanced as the engine and scheduler do) gives
// for the same tokens, whatever prompt, also with the newest token still pending (two steps in flight); finished
// sequences are dropped; ids the grammar refuses are refused; a sequence without a structured output gets no mask.
#include <catch2/catch.hpp>

#include <random>

#include "model/constraint/matcher.h"
#include "model/constraint/sequence_constraints.h"
#include "model/constraint/structured_output.h"
#include "model/tokenizer/load_tokenizer.h"
#include "tests/test_data.h"

namespace paged::constraint {

TEST_CASE("a worker's sequence constraints give the engine's masks, step after step", "[constraint]") {
  const std::shared_ptr<const Tokenizer> tok = load_tokenizer(test::kModel);
  const auto trie = std::make_shared<const TokenTrie>(*tok);
  SequenceConstraints worker(trie, tok);
  ConstraintCache engine(trie);  // the engine's side, shared by nothing of the worker's
  SamplingParams regex, free;
  regex.structured = {StructuredOutput::Kind::regex, "(Once|The) [a-z ]{20,60}\\.", "guided_regex"};
  const std::vector<TokenId> stop_ids = tok->eos_ids();
  // Sequence 1's prompt writes no text (its first token writes its leading form), sequence 2's does; 3 is free.
  const std::vector<TokenId> empty_prompt{tok->bos_id()}, prompt = tok->encode("Lily said", true);
  std::vector<TokenId> out1, out2, out3;
  const auto batch_of = [&](std::vector<SeqId> finished) {
    StepBatch b;
    b.finished = std::move(finished);
    const auto chunk = [&](SeqId seq, const SamplingParams& p, const std::vector<TokenId>& pr,
                           const std::vector<TokenId>& out) {
      SeqChunk c;
      c.seq = seq;
      c.samples.push_back(SampleSpec{.params = &p, .prompt = &pr, .output = &out, .stop_ids = &stop_ids});
      b.seqs.push_back(std::move(c));
    };
    chunk(1, regex, empty_prompt, out1);
    chunk(2, regex, prompt, out2);
    chunk(3, free, prompt, out3);
    return b;
  };
  std::shared_ptr<TokenConstraint> head1 = engine.make(regex.structured, stop_ids, "");
  std::shared_ptr<TokenConstraint> head2 = engine.make(regex.structured, stop_ids, tok->decode(prompt, true));
  std::mt19937 rng(3);
  const auto mask_of = [&](const TokenMaskSource& source) {
    std::vector<uint32_t> mask(mask_words(tok->vocab_size()));
    source.fill_mask({}, mask);
    return mask;
  };
  // A random allowed token that writes text; -1 when only a stop id is left (the regex is complete).
  const auto pick = [&](const std::vector<uint32_t>& mask) {
    std::vector<TokenId> allowed;
    for (TokenId id = 0; id < tok->vocab_size(); ++id)
      if (mask_allows(mask, id) && std::find(stop_ids.begin(), stop_ids.end(), id) == stop_ids.end())
        allowed.push_back(id);
    return allowed.empty() ? TokenId{-1} : allowed[std::uniform_int_distribution<size_t>(0, allowed.size() - 1)(rng)];
  };
  std::string text1;
  for (int step = 0; step < 12; ++step) {
    INFO("step " << step);
    StepBatch b = batch_of({});
    worker.attach(b);
    REQUIRE(b.seqs[0].samples[0].mask_source);
    REQUIRE(b.seqs[1].samples[0].mask_source);
    CHECK(b.seqs[2].samples[0].mask_source == nullptr);
    const std::vector<uint32_t> m1 = mask_of(*b.seqs[0].samples[0].mask_source);
    const std::vector<uint32_t> m2 = mask_of(*b.seqs[1].samples[0].mask_source);
    REQUIRE(m1 == mask_of(*head1));
    REQUIRE(m2 == mask_of(*head2));
    const TokenId t1 = pick(m1), t2 = pick(m2);
    if (t1 < 0 || t2 < 0) break;
    // The next step's masks while t1 and t2 are still in flight: those the engine's constraints give after them.
    std::vector<uint32_t> after1(m1.size()), after2(m2.size());
    b.seqs[0].samples[0].mask_source->fill_mask(std::span<const TokenId>(&t1, 1), after1);
    b.seqs[1].samples[0].mask_source->fill_mask(std::span<const TokenId>(&t2, 1), after2);
    CHECK(mask_of(*b.seqs[0].samples[0].mask_source) == m1);  // the source itself stays where it was
    out1.push_back(t1);
    out2.push_back(t2);
    out3.push_back(t1);
    REQUIRE(head1->accept(t1));
    REQUIRE(head2->accept(t2));
    REQUIRE(after1 == mask_of(*head1));
    REQUIRE(after2 == mask_of(*head2));
    text1 += tok->token_bytes(t1, step == 0);
  }
  CHECK(worker.size() == 2);
  // What sequence 1 wrote is a beginning of the regex's language, read by a matcher of its own.
  GrammarMatcher shadow(compile_structured_output(regex.structured));
  CHECK(shadow.accept(text1));

  StepBatch ended = batch_of({1});
  ended.seqs.erase(ended.seqs.begin());  // sequence 1 ended: it samples no more
  worker.attach(ended);
  CHECK(worker.size() == 1);
  // An output id its grammar refuses (the engine's mask would have stopped it).
  out2.push_back(tok->encode("7", false).back());
  StepBatch refused = batch_of({1});
  refused.seqs.erase(refused.seqs.begin());
  CHECK_THROWS_WITH(worker.attach(refused), Catch::Contains("sequence 2") && Catch::Contains("guided_regex"));
  worker.reset();
  CHECK(worker.size() == 0);
  SamplingParams bad;
  bad.structured = {StructuredOutput::Kind::regex, "a(?=b)", "guided_regex"};
  CHECK_THROWS_AS(engine.make(bad.structured, stop_ids, ""), GrammarError);
}

}  // namespace paged::constraint
