#include "model/constraint/sequence_constraints.h"

#include <stdexcept>
#include <string>

#include "model/constraint/structured_output.h"

namespace paged::constraint {

std::shared_ptr<TokenConstraint> ConstraintCache::make(const StructuredOutput& output,
                                                       const std::vector<TokenId>& stop_ids,
                                                       std::string_view prompt_text) {
  std::shared_ptr<ConstraintAutomaton> automaton;
  {
    std::lock_guard lock(mu_);
    std::erase_if(automata_, [](const auto& entry) { return entry.second.expired(); });
    auto key = std::make_pair(output, stop_ids);
    const auto it = automata_.find(key);
    if (it != automata_.end()) automaton = it->second.lock();
    if (!automaton) {
      automaton = std::make_shared<ConstraintAutomaton>(compile_structured_output(output), trie_, stop_ids);
      automata_[std::move(key)] = automaton;
    }
  }
  const bool started = output.after.empty() || prompt_text.find(output.after) != std::string_view::npos;
  return std::make_shared<TokenConstraint>(std::move(automaton), prompt_text.empty(), started ? "" : output.after);
}

void SequenceConstraints::attach(StepBatch& batch) {
  for (SeqId id : batch.finished) held_.erase(id);
  for (SeqChunk& chunk : batch.seqs) {
    if (chunk.samples.empty()) continue;
    const SampleSpec& first = chunk.samples.front();
    if (!first.params || first.params->structured.kind == StructuredOutput::Kind::none) continue;
    auto it = held_.find(chunk.seq);
    if (it == held_.end()) {
      const std::vector<TokenId> none;
      const std::vector<TokenId>& prompt = first.prompt ? *first.prompt : none;
      const std::string text = tokenizer_->decode(prompt, first.params->skip_special_tokens);
      it = held_.emplace(chunk.seq, Held{cache_.make(first.params->structured, first.stop_ids ? *first.stop_ids : none,
                                                     text)})
               .first;
    }
    Held& held = it->second;
    const std::vector<TokenId>* output = first.output;
    for (; output && held.accepted < output->size(); ++held.accepted)
      if (!held.constraint->accept((*output)[held.accepted]))
        throw std::invalid_argument("sequence " + std::to_string(chunk.seq) + ": output id " +
                                    std::to_string((*output)[held.accepted]) + " is not allowed by its " +
                                    first.params->structured.field);
    for (SampleSpec& spec : chunk.samples) spec.mask_source = held.constraint.get();
  }
}

}  // namespace paged::constraint
