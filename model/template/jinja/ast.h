// The syntax tree: one Node type for statements and expressions.
#pragma once

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "model/template/jinja/value.h"

namespace paged::jinja {

enum class NodeKind {
  // statements
  set, if_, for_, macro, break_, continue_, comment,
  // expressions
  literal, identifier, array, tuple, object, member, slice, call, kwarg, filter, test, unary, binary, ternary, select
};

struct Node;
using NodePtr = std::unique_ptr<Node>;

/// One node of the tree; which fields mean what depends on `kind`:
///   literal: value | identifier: text | array, tuple: list | object: pairs | kwarg: text = a
///   member: a[b] (flag: computed; else b is an identifier or an integer literal) | slice: a:b:c (each may be null)
///   call: a(list) | filter: a | b (b an identifier or a call) | test: a is [not: flag] text
///   unary: text a | binary: a text b | ternary: b if a else c | select: a if b
///   set: a = b, or a = body when b is null | if: a, body, alternate | for: a in b, body, alternate (else)
///   macro: text(list) body | comment: nothing
struct Node {
  NodeKind kind;
  Value value;
  std::string text;
  bool flag = false;
  NodePtr a, b, c;
  std::vector<NodePtr> list, body, alternate;
  std::vector<std::pair<NodePtr, NodePtr>> pairs;

  Node() = default;
  /// Frees the subtree one node at a time, not recursively: a long chain of operators (`a + a + ... + a`, as deep
  /// as the template is long) must not overflow the stack.
  ~Node();
  Node(const Node&) = delete;
  Node& operator=(const Node&) = delete;
};

/// A template's top-level statements and output expressions, in order.
using Program = std::vector<NodePtr>;

}  // namespace paged::jinja
