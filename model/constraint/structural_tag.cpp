#include "model/constraint/structural_tag.h"

#include <boost/json.hpp>

#include <array>
#include <map>

#include "model/constraint/json_schema.h"

namespace paged::constraint {

namespace {

namespace json = boost::json;

/// The triggers' trie with Aho-Corasick moves: node 0 is the empty prefix; next[n][b] the node of the longest trigger
/// prefix that ends the text of n followed by b; ends[n] the triggers (indices) that end there, its own and those of
/// its suffixes.
struct TriggerAutomaton {
  std::vector<std::array<int, 256>> next;
  std::vector<std::vector<size_t>> ends;

  explicit TriggerAutomaton(const std::vector<std::string>& triggers) {
    std::vector<std::array<int, 256>> child;
    std::vector<int> fail;
    const auto add_node = [&] {
      std::array<int, 256> none;
      none.fill(-1);
      child.push_back(none);
      ends.emplace_back();
      fail.push_back(0);
      return static_cast<int>(child.size()) - 1;
    };
    add_node();
    for (size_t t = 0; t < triggers.size(); ++t) {
      int n = 0;
      for (unsigned char b : triggers[t]) {
        if (child[n][b] < 0) {
          const int made = add_node();
          child[n][b] = made;
        }
        n = child[n][b];
      }
      ends[n].push_back(t);
    }
    // Breadth first: a node's failure link is shorter than it, so its moves are known when the node's are made.
    next.assign(child.size(), {});
    std::vector<int> queue{0};
    for (size_t q = 0; q < queue.size(); ++q) {
      const int n = queue[q];
      if (n != 0)
        for (size_t t : ends[fail[n]]) ends[n].push_back(t);
      for (int b = 0; b < 256; ++b) {
        const int c = child[n][b];
        if (c >= 0) {
          fail[c] = n == 0 ? 0 : next[fail[n]][b];
          next[n][b] = c;
          queue.push_back(c);
        } else {
          next[n][b] = n == 0 ? 0 : next[fail[n]][b];
        }
      }
    }
  }
};

std::string text_rule(int node) { return "text" + std::to_string(node); }

}  // namespace

Grammar compile_structural_tag(const std::vector<TagStructure>& structures, const std::vector<std::string>& triggers) {
  if (structures.empty()) throw GrammarError("a structural tag needs at least one structure");
  if (triggers.empty()) throw GrammarError("a structural tag needs at least one trigger");
  for (const std::string& t : triggers)
    if (t.empty()) throw GrammarError("a structural tag's trigger is empty");
  Rules rules;
  // Each structure: the rest of its begin after each trigger it starts with, its JSON, its end, then free text.
  std::vector<std::vector<Expr>> after_trigger(triggers.size());
  for (size_t i = 0; i < structures.size(); ++i) {
    const TagStructure& s = structures[i];
    const std::string prefix = "s" + std::to_string(i) + "_";
    try {
      for (auto& rule : with_prefix(json_schema_rules(s.schema), prefix)) rules.push_back(std::move(rule));
    } catch (const GrammarError& e) {
      throw GrammarError("structures[" + std::to_string(i) + "].schema: " + e.what());
    }
    bool opened = false;
    for (size_t t = 0; t < triggers.size(); ++t) {
      if (s.begin.rfind(triggers[t], 0) != 0) continue;
      opened = true;
      after_trigger[t].push_back(seq({literal(std::string_view(s.begin).substr(triggers[t].size())),
                                      ref(prefix + "root"), literal(s.end), ref(text_rule(0))}));
    }
    if (!opened)
      throw GrammarError("structures[" + std::to_string(i) + "].begin '" + s.begin + "' starts with no trigger");
  }
  // Free text at each node of the triggers' automaton: it may end, or take a byte to the node that byte leads to;
  // a byte that completes triggers opens one of their structures instead.
  const TriggerAutomaton automaton(triggers);
  for (size_t n = 0; n < automaton.next.size(); ++n) {
    std::map<int, ByteSet> to;  // target node -> the bytes that lead there
    for (int b = 0; b < 256; ++b) to[automaton.next[n][b]].add(static_cast<uint8_t>(b));
    std::vector<Expr> choices{seq({})};
    for (const auto& [target, set] : to) {
      if (automaton.ends[target].empty()) {
        choices.push_back(seq({bytes(set), ref(text_rule(target))}));
        continue;
      }
      std::vector<Expr> opens;
      for (size_t t : automaton.ends[target])
        for (const Expr& e : after_trigger[t]) opens.push_back(e);
      if (opens.empty()) continue;  // a trigger no structure starts with: never written
      choices.push_back(seq({bytes(set), alt(std::move(opens))}));
    }
    rules.emplace_back(text_rule(static_cast<int>(n)), alt(std::move(choices)));
  }
  rules.emplace_back("root", ref(text_rule(0)));
  return build_grammar(rules, "root");
}

Grammar compile_structural_tag(const json::value& response_format) {
  if (!response_format.is_object()) throw GrammarError("a structural tag is a JSON object");
  const json::object& o = response_format.get_object();
  for (const auto& [key, _] : o)
    if (key != "type" && key != "structures" && key != "triggers")
      throw GrammarError("a structural tag's '" + std::string(key) +
                         "' is not supported (type, structures and triggers are)");
  const json::value* structures = o.if_contains("structures");
  const json::value* triggers = o.if_contains("triggers");
  if (!structures || !structures->is_array())
    throw GrammarError("a structural tag needs 'structures', a list of {begin, schema, end}");
  if (!triggers || !triggers->is_array()) throw GrammarError("a structural tag needs 'triggers', a list of strings");
  std::vector<TagStructure> parsed;
  for (size_t i = 0; i < structures->get_array().size(); ++i) {
    const json::value& s = structures->get_array()[i];
    const std::string at = "structures[" + std::to_string(i) + "]";
    if (!s.is_object()) throw GrammarError(at + " is not an object");
    for (const auto& [key, _] : s.get_object())
      if (key != "begin" && key != "schema" && key != "end")
        throw GrammarError(at + "." + std::string(key) + " is not supported (begin, schema and end are)");
    const json::value* begin = s.get_object().if_contains("begin");
    const json::value* schema = s.get_object().if_contains("schema");
    const json::value* end = s.get_object().if_contains("end");
    if (!begin || !begin->is_string()) throw GrammarError(at + ".begin must be a string");
    if (!end || !end->is_string()) throw GrammarError(at + ".end must be a string");
    if (!schema || !(schema->is_object() || schema->is_bool())) throw GrammarError(at + ".schema must be a JSON schema");
    parsed.push_back({std::string(begin->get_string()), *schema, std::string(end->get_string())});
  }
  std::vector<std::string> words;
  for (const json::value& t : triggers->get_array()) {
    if (!t.is_string()) throw GrammarError("a structural tag's triggers must be strings");
    words.emplace_back(t.get_string());
  }
  return compile_structural_tag(parsed, words);
}

}  // namespace paged::constraint
