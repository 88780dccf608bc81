#include "model/constraint/matcher.h"

#include <string>

namespace paged::constraint {

GrammarMatcher::GrammarMatcher(std::shared_ptr<const Grammar> grammar) : grammar_(std::move(grammar)) {
  nodes_.push_back({0, kEmpty});
  seen_.push_back(0);
  ++generation_;
  visited_ = 0;
  for (uint32_t start : grammar_->alternatives(grammar_->root())) {
    if (grammar_->elements()[start].op == Grammar::Op::end) {
      frontier_.accepts = true;
    } else if (!expand(intern(start, kEmpty), frontier_)) {
      throw GrammarError("the grammar is too ambiguous: its start is on more than " +
                         std::to_string(kMaxFrontierStacks) + " stacks at once");
    }
  }
  // No text at all (root ::= root, a JSON schema {"$ref": "#"}): every token would be masked, and the sampler
  // would write one outside the grammar.
  if (frontier_.dead()) throw GrammarError("the grammar matches no text (its start reaches no byte and cannot end)");
}

uint32_t GrammarMatcher::intern(uint32_t pos, uint32_t parent) {
  const uint64_t key = (uint64_t{pos} << 32) | parent;
  auto [it, inserted] = index_.emplace(key, static_cast<uint32_t>(nodes_.size()));
  if (inserted) {
    nodes_.push_back({pos, parent});
    seen_.push_back(0);
  }
  return it->second;
}

uint32_t GrammarMatcher::after(uint32_t pos, uint32_t parent) {
  return grammar_->elements()[pos + 1].op == Grammar::Op::end ? parent : intern(pos + 1, parent);
}

bool GrammarMatcher::expand(uint32_t stack, Frontier& out) {
  const auto& el = grammar_->elements();
  work_.assign(1, stack);
  while (!work_.empty()) {
    const uint32_t s = work_.back();
    work_.pop_back();
    if (s == kEmpty) {
      out.accepts = true;
      continue;
    }
    if (seen_[s] == generation_) continue;
    seen_[s] = generation_;
    if (++visited_ > kMaxExpansionFrames) return false;
    const Node node = nodes_[s];
    const Grammar::Element e = el[node.pos];
    if (e.op == Grammar::Op::bytes) {
      out.stacks.push_back(s);
      if (out.stacks.size() > kMaxFrontierStacks) return false;
      continue;
    }
    // A rule reference: each alternative of the rule, returning to what follows the reference.
    const uint32_t cont = after(node.pos, node.parent);
    for (uint32_t start : grammar_->alternatives(e.arg))
      work_.push_back(el[start].op == Grammar::Op::end ? cont : intern(start, cont));
  }
  return true;
}

GrammarMatcher::Frontier GrammarMatcher::next(const Frontier& from, uint8_t byte) {
  const auto& el = grammar_->elements();
  const auto& sets = grammar_->sets();
  Frontier out;
  ++generation_;
  visited_ = 0;
  const size_t start = mark();
  for (uint32_t s : from.stacks) {
    const Node node = nodes_[s];
    if (sets[el[node.pos].arg].contains(byte) && !expand(after(node.pos, node.parent), out)) {
      rollback(start);
      return {};
    }
  }
  return out;
}

bool GrammarMatcher::accept(std::string_view bytes) {
  const size_t start = mark();
  Frontier f = frontier_;
  for (char c : bytes) {
    f = next(f, static_cast<uint8_t>(c));
    if (f.dead()) {
      rollback(start);
      return false;
    }
  }
  frontier_ = std::move(f);
  return true;
}

void GrammarMatcher::rollback(size_t mark) {
  for (size_t i = mark; i < nodes_.size(); ++i) index_.erase((uint64_t{nodes_[i].pos} << 32) | nodes_[i].parent);
  nodes_.resize(mark);
  seen_.resize(mark);
}

}  // namespace paged::constraint
