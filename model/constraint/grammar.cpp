#include "model/constraint/grammar.h"

#include <algorithm>
#include <functional>
#include <unordered_map>

namespace paged::constraint {

ByteSet ByteSet::of(uint8_t b) {
  ByteSet s;
  s.add(b);
  return s;
}

ByteSet ByteSet::range(uint8_t lo, uint8_t hi) {
  ByteSet s;
  s.add_range(lo, hi);
  return s;
}

ByteSet ByteSet::all() { return ByteSet::range(0, 255); }

void ByteSet::add_range(uint8_t lo, uint8_t hi) {
  for (int b = lo; b <= hi; ++b) add(static_cast<uint8_t>(b));
}

void ByteSet::add(const ByteSet& other) {
  for (size_t i = 0; i < bits_.size(); ++i) bits_[i] |= other.bits_[i];
}

ByteSet ByteSet::negated() const {
  ByteSet s;
  for (size_t i = 0; i < bits_.size(); ++i) s.bits_[i] = ~bits_[i];
  return s;
}

Expr bytes(ByteSet set) {
  Expr e;
  e.kind = Expr::Kind::bytes;
  e.set = set;
  return e;
}

Expr literal(std::string_view text) {
  Expr e;
  for (char c : text) e.items.push_back(bytes(ByteSet::of(static_cast<uint8_t>(c))));
  return e;
}

Expr seq(std::vector<Expr> items) {
  if (items.size() == 1) return std::move(items[0]);
  Expr e;
  e.items = std::move(items);
  return e;
}

Expr alt(std::vector<Expr> items) {
  if (items.size() == 1) return std::move(items[0]);
  Expr e;
  e.kind = Expr::Kind::alt;
  e.items = std::move(items);
  return e;
}

Expr repeat(Expr item, int min, int max) {
  if (min < 0 || (max >= 0 && max < min))
    throw GrammarError("a repetition needs 0 <= min <= max (got {" + std::to_string(min) + "," +
                       std::to_string(max) + "})");
  Expr e;
  e.kind = Expr::Kind::repeat;
  e.items.push_back(std::move(item));
  e.min = min;
  e.max = max;
  return e;
}

Expr optional(Expr item) { return repeat(std::move(item), 0, 1); }

Expr ref(std::string name) {
  Expr e;
  e.kind = Expr::Kind::ref;
  e.rule = std::move(name);
  return e;
}

Expr byte_strings_between(std::string_view a, std::string_view b, uint8_t min, uint8_t max) {
  const auto byte = [](char c) { return static_cast<uint8_t>(c); };
  if (a.size() == 1) return bytes(ByteSet::range(byte(a[0]), byte(b[0])));
  if (a[0] == b[0]) return seq({bytes(ByteSet::of(byte(a[0]))), byte_strings_between(a.substr(1), b.substr(1), min, max)});
  const auto all_of = [](std::string_view s, uint8_t v) {
    return std::all_of(s.begin() + 1, s.end(), [v](char x) { return static_cast<uint8_t>(x) == v; });
  };
  const std::string lowest(a.size() - 1, static_cast<char>(min)), highest(a.size() - 1, static_cast<char>(max));
  std::vector<Expr> parts;
  int first_full = byte(a[0]), last_full = byte(b[0]);
  if (!all_of(a, min)) {  // a[0] followed by a's tail .. the highest tail
    parts.push_back(seq({bytes(ByteSet::of(byte(a[0]))), byte_strings_between(a.substr(1), highest, min, max)}));
    ++first_full;
  }
  if (!all_of(b, max)) {  // b[0] followed by the lowest tail .. b's tail
    parts.push_back(seq({bytes(ByteSet::of(byte(b[0]))), byte_strings_between(lowest, b.substr(1), min, max)}));
    --last_full;
  }
  if (first_full <= last_full) {  // any tail after a first byte strictly between
    const int tail = static_cast<int>(a.size()) - 1;
    parts.push_back(seq({bytes(ByteSet::range(static_cast<uint8_t>(first_full), static_cast<uint8_t>(last_full))),
                         repeat(bytes(ByteSet::range(min, max)), tail, tail)}));
  }
  return alt(std::move(parts));
}

class GrammarBuilder {
 public:
  explicit GrammarBuilder(const Rules& rules) {
    for (const auto& [name, expr] : rules) {
      if (!ids_.emplace(name, static_cast<uint32_t>(ids_.size())).second)
        throw GrammarError("rule '" + name + "' is defined twice");
    }
    g_.rule_alts_.resize(rules.size());
    for (const auto& [name, expr] : rules) g_.rule_names_.push_back(name);
    for (const auto& [name, expr] : rules) lower_rule(ids_.at(name), expr);
  }

  Grammar finish(const std::string& root) {
    auto it = ids_.find(root);
    if (it == ids_.end()) throw GrammarError("the root rule '" + root + "' is not defined");
    g_.root_ = it->second;
    check_left_recursion();
    return std::move(g_);
  }

 private:
  using Element = Grammar::Element;
  using Op = Grammar::Op;

  uint32_t new_rule(const std::string& name) {
    g_.rule_alts_.emplace_back();
    g_.rule_names_.push_back(name);
    return static_cast<uint32_t>(g_.rule_alts_.size() - 1);
  }

  // Appends one alternative (its elements, then end) to the grammar; the elements of one alternative stay together.
  void add_alternative(uint32_t rule, const std::vector<Element>& elements) {
    g_.rule_alts_[rule].push_back(static_cast<uint32_t>(g_.elements_.size()));
    g_.elements_.insert(g_.elements_.end(), elements.begin(), elements.end());
    g_.elements_.push_back({Op::end, 0});
    if (g_.elements_.size() > kMaxGrammarElements)
      throw GrammarError("the grammar is too large (more than " + std::to_string(kMaxGrammarElements) +
                         " elements once repetitions are expanded)");
  }

  void lower_rule(uint32_t rule, const Expr& e) {
    const std::string name = g_.rule_names_[rule];
    auto lower_one = [&](const Expr& a) {
      std::vector<Element> out;
      emit(a, out, name);
      add_alternative(rule, out);
    };
    if (e.kind == Expr::Kind::alt) {
      for (const Expr& a : e.items) lower_one(a);
    } else {
      lower_one(e);
    }
  }

  // The one element standing for `e`: a byte class or rule reference as it is, anything else as a new rule.
  Element unit(const Expr& e, const std::string& owner) {
    std::vector<Element> out;
    if (e.kind == Expr::Kind::bytes || e.kind == Expr::Kind::ref) {
      emit(e, out, owner);
      return out[0];
    }
    const uint32_t aux = new_rule(owner + "_" + std::to_string(g_.rule_alts_.size()));
    lower_rule(aux, e);
    return {Op::ref, aux};
  }

  void emit(const Expr& e, std::vector<Element>& out, const std::string& owner) {
    switch (e.kind) {
      case Expr::Kind::bytes:
        if (e.set.empty()) throw GrammarError("an empty character class matches nothing (in rule '" + owner + "')");
        g_.sets_.push_back(e.set);
        out.push_back({Op::bytes, static_cast<uint32_t>(g_.sets_.size() - 1)});
        return;
      case Expr::Kind::seq:
        for (const Expr& item : e.items) emit(item, out, owner);
        return;
      case Expr::Kind::alt:
        out.push_back(unit(e, owner));
        return;
      case Expr::Kind::ref: {
        auto it = ids_.find(e.rule);
        if (it == ids_.end()) throw GrammarError("rule '" + e.rule + "' is used but not defined");
        out.push_back({Op::ref, it->second});
        return;
      }
      case Expr::Kind::repeat: {
        if (e.max == 0) return;
        const Element one = unit(e.items[0], owner);
        for (int i = 0; i < e.min; ++i) {
          out.push_back(one);
          if (out.size() > kMaxGrammarElements) throw GrammarError("the grammar is too large (a repetition)");
        }
        if (e.max < 0) {
          // star ::= one star | ""
          const uint32_t star = new_rule(owner + "_star" + std::to_string(g_.rule_alts_.size()));
          add_alternative(star, {one, {Op::ref, star}});
          add_alternative(star, {});
          out.push_back({Op::ref, star});
        } else if (e.max > e.min) {
          // opt_1 ::= one | "";  opt_k ::= one opt_(k-1) | ""
          uint32_t prev = 0;
          for (int k = 1; k <= e.max - e.min; ++k) {
            const uint32_t opt = new_rule(owner + "_opt" + std::to_string(g_.rule_alts_.size()));
            if (k == 1) {
              add_alternative(opt, {one});
            } else {
              add_alternative(opt, {one, {Op::ref, prev}});
            }
            add_alternative(opt, {});
            prev = opt;
          }
          out.push_back({Op::ref, prev});
        }
        return;
      }
    }
  }

  // Left recursion makes the matcher's stacks grow without consuming input: refused. Edges go from a rule to the
  // rules it can start with (after nullable elements); an edge is a tail when the reference is its alternative's
  // last element (the matcher drops the finished frame, so a cycle of tail edges does not grow the stack).
  void check_left_recursion() {
    const size_t n = g_.rule_alts_.size();
    const auto& el = g_.elements_;
    std::vector<bool> nullable(n, false);
    for (bool changed = true; changed;) {
      changed = false;
      for (size_t r = 0; r < n; ++r) {
        if (nullable[r]) continue;
        for (uint32_t start : g_.rule_alts_[r]) {
          uint32_t i = start;
          while (el[i].op == Op::ref && nullable[el[i].arg]) ++i;
          if (el[i].op == Op::end) {
            nullable[r] = changed = true;
            break;
          }
        }
      }
    }
    struct Edge {
      uint32_t to;
      bool tail;
    };
    std::vector<std::vector<Edge>> edges(n);
    for (size_t r = 0; r < n; ++r)
      for (uint32_t start : g_.rule_alts_[r])
        for (uint32_t i = start; el[i].op == Op::ref; ++i) {
          edges[r].push_back({el[i].arg, el[i + 1].op == Op::end});
          if (!nullable[el[i].arg]) break;
        }
    // Tarjan's strongly connected components, iteratively (chains of repetition rules are deep).
    std::vector<int> index(n, -1), low(n, 0), component(n, -1);
    std::vector<bool> on_stack(n, false);
    std::vector<uint32_t> stack;
    int counter = 0, components = 0;
    for (uint32_t s = 0; s < n; ++s) {
      if (index[s] >= 0) continue;
      std::vector<std::pair<uint32_t, size_t>> work{{s, 0}};
      index[s] = low[s] = counter++;
      stack.push_back(s);
      on_stack[s] = true;
      while (!work.empty()) {
        auto& [v, next] = work.back();
        if (next < edges[v].size()) {
          const uint32_t w = edges[v][next++].to;
          if (index[w] < 0) {
            index[w] = low[w] = counter++;
            stack.push_back(w);
            on_stack[w] = true;
            work.emplace_back(w, 0);
          } else if (on_stack[w]) {
            low[v] = std::min(low[v], index[w]);
          }
          continue;
        }
        if (low[v] == index[v]) {
          uint32_t w;
          do {
            w = stack.back();
            stack.pop_back();
            on_stack[w] = false;
            component[w] = components;
          } while (w != v);
          ++components;
        }
        const uint32_t done = v;
        work.pop_back();
        if (!work.empty()) low[work.back().first] = std::min(low[work.back().first], low[done]);
      }
    }
    for (size_t r = 0; r < n; ++r)
      for (const Edge& e : edges[r])
        if (!e.tail && component[e.to] == component[r])
          throw GrammarError("rule '" + g_.rule_names_[r] + "' is left-recursive (it can reach itself again "
                             "before matching a byte); write the recursion on the right");
  }

  Grammar g_;
  std::unordered_map<std::string, uint32_t> ids_;
};

Grammar build_grammar(const Rules& rules, const std::string& root) {
  GrammarBuilder builder(rules);
  return builder.finish(root);
}

namespace {

void prefix_refs(Expr& e, const std::string& prefix) {
  if (e.kind == Expr::Kind::ref) e.rule = prefix + e.rule;
  for (Expr& item : e.items) prefix_refs(item, prefix);
}

}  // namespace

Rules with_prefix(Rules rules, const std::string& prefix) {
  for (auto& [name, expr] : rules) {
    name = prefix + name;
    prefix_refs(expr, prefix);
  }
  return rules;
}

}  // namespace paged::constraint
