// Where sequences' constraints come from: the automata of the structured outputs in use (ConstraintCache, the
// engine's and a worker's), and a worker's constraints of the sequences a remote engine has it sample
// (SequenceConstraints: the head's scheduler keeps its own; a step's SampleSpecs cannot carry them across the wire).
#pragma once

#include <map>
#include <memory>
#include <mutex>
#include <span>
#include <string_view>
#include <utility>
#include <vector>

#include "model/constraint/token_mask.h"
#include "model/sampling/sampling_params.h"
#include "model/step.h"
#include "model/tokenizer/tokenizer.h"

namespace paged::constraint {

/// The automaton of each (structured output, stop ids) in use, shared by the sequences that use it (transitions and
/// masks computed once for all), kept while one of them holds it. Thread-safe.
class ConstraintCache {
 public:
  /// `trie`: the vocabulary of the tokenizer the constraints' tokens come from.
  explicit ConstraintCache(std::shared_ptr<const TokenTrie> trie) : trie_(std::move(trie)) {}
  /// A new sequence's constraint for `output` with `stop_ids` after `prompt_text` (its prompt's decode): when that
  /// is empty its first token writes its leading form; when it holds output.after the grammar starts at once.
  /// Throws GrammarError for an output that does not compile.
  std::shared_ptr<TokenConstraint> make(const StructuredOutput& output, const std::vector<TokenId>& stop_ids,
                                        std::string_view prompt_text);

 private:
  std::shared_ptr<const TokenTrie> trie_;
  std::map<std::pair<StructuredOutput, std::vector<TokenId>>, std::weak_ptr<ConstraintAutomaton>> automata_;
  std::mutex mu_;  // guards automata_
};

/// A worker's constraints of the sequences it samples: each sequence whose parameters ask a structured output gets
/// one when it first samples, advanced over its output ids as they come (they only grow while its id lives), and is
/// the mask source of its samples. Not thread-safe: the worker's executor alone uses it, between steps.
class SequenceConstraints {
 public:
  /// `trie`: `tokenizer`'s vocabulary; the tokenizer decodes prompts (whether the first token writes its leading
  /// form).
  SequenceConstraints(std::shared_ptr<const TokenTrie> trie, std::shared_ptr<const Tokenizer> tokenizer)
      : cache_(std::move(trie)), tokenizer_(std::move(tokenizer)) {}
  /// Drops the constraints of `batch.finished`, then sets the mask source of each sample in `batch` that asks a
  /// structured output (pointing into this, valid until the next attach() or reset()). Throws GrammarError for an
  /// output that does not compile and std::invalid_argument for an output id its grammar refuses (the engine's
  /// constraint would have masked it): then the constraints already attached stay as they are.
  void attach(StepBatch& batch);
  /// Forgets every sequence (a new engine is served).
  void reset() { held_.clear(); }
  /// Sequences held.
  size_t size() const { return held_.size(); }

 private:
  struct Held {
    std::shared_ptr<TokenConstraint> constraint;
    size_t accepted = 0;  // output ids it has taken
  };
  ConstraintCache cache_;
  std::shared_ptr<const Tokenizer> tokenizer_;
  std::map<SeqId, Held> held_;
};

}  // namespace paged::constraint
