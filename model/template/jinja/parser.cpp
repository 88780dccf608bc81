#include "model/template/jinja/parser.h"

#include <initializer_list>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>

#include "model/template/jinja/error.h"

namespace paged::jinja {

Node::~Node() {
  std::vector<NodePtr> pending;
  const auto take_children = [&pending](Node& n) {
    for (NodePtr* child : {&n.a, &n.b, &n.c})
      if (*child) pending.push_back(std::move(*child));
    for (std::vector<NodePtr>* list : {&n.list, &n.body, &n.alternate})
      for (NodePtr& child : *list)
        if (child) pending.push_back(std::move(child));
    for (auto& [key, value] : n.pairs) {
      if (key) pending.push_back(std::move(key));
      if (value) pending.push_back(std::move(value));
    }
  };
  take_children(*this);
  while (!pending.empty()) {
    NodePtr n = std::move(pending.back());
    pending.pop_back();
    take_children(*n);
  }  // each node is destroyed childless
}

namespace {

// Most parse rules one inside another (the parser recurses for parentheses, nested blocks, `not`, signs and calls):
// deeper templates are refused rather than overflow the stack.
constexpr int kMaxParseDepth = 256;

NodePtr make(NodeKind kind) {
  auto n = std::make_unique<Node>();
  n->kind = kind;
  return n;
}

// Recursive descent over the tokens, one method a grammar rule, lowest precedence first (parse_expression down to
// parse_primary).
class Parser {
 public:
  explicit Parser(std::vector<Token> tokens) : tokens_(std::move(tokens)) {}

  Program parse_program() {
    std::vector<NodePtr> body;
    while (cur_ < tokens_.size()) body.push_back(parse_any());
    return body;
  }

 private:
  const Token& peek(size_t ahead = 0) const {
    if (cur_ + ahead >= tokens_.size()) fail("Unexpected end of template");
    return tokens_[cur_ + ahead];
  }
  bool is(Tok t) const { return cur_ < tokens_.size() && tokens_[cur_].type == t; }
  bool is_ident(std::string_view name, size_t ahead = 0) const {
    return cur_ + ahead < tokens_.size() && tokens_[cur_ + ahead].type == Tok::ident && tokens_[cur_ + ahead].value == name;
  }
  bool is_statement(std::initializer_list<std::string_view> names) const {
    if (!(is(Tok::open_stmt) && cur_ + 1 < tokens_.size() && tokens_[cur_ + 1].type == Tok::ident)) return false;
    for (auto n : names) {
      if (tokens_[cur_ + 1].value == n) return true;
    }
    return false;
  }
  const Token& expect(Tok t, const char* what) {
    const Token& tok = peek();
    if (tok.type != t) fail(std::string("Parser Error: expected ") + what + ", got '" + tok.value + "'");
    ++cur_;
    return tok;
  }
  void expect_ident(std::string_view name) {
    if (!is_ident(name)) fail("Expected " + std::string(name));
    ++cur_;
  }
  void expect_end(std::string_view name) {
    expect(Tok::open_stmt, "{%");
    expect_ident(name);
    expect(Tok::close_stmt, "%}");
  }

  NodePtr parse_any() {
    const Nesting nesting(*this);
    const Token& t = peek();
    switch (t.type) {
      case Tok::comment: ++cur_; return make(NodeKind::comment);
      case Tok::text: {
        auto n = make(NodeKind::literal);
        n->value = Value::of(t.value);
        ++cur_;
        return n;
      }
      case Tok::open_stmt: return parse_statement();
      case Tok::open_expr: {
        ++cur_;
        auto e = parse_expression();
        expect(Tok::close_expr, "}}");
        return e;
      }
      default: fail("Unexpected token '" + t.value + "'");
    }
  }

  std::vector<NodePtr> parse_until(std::initializer_list<std::string_view> ends) {
    std::vector<NodePtr> body;
    while (!is_statement(ends)) body.push_back(parse_any());
    return body;
  }

  NodePtr parse_statement() {
    expect(Tok::open_stmt, "{%");
    const Token& t = peek();
    if (t.type != Tok::ident) fail("Unknown statement '" + t.value + "'");
    const std::string name = t.value;
    ++cur_;
    if (name == "set") return parse_set();
    if (name == "if") {
      auto n = parse_if();
      expect_end("endif");
      return n;
    }
    if (name == "for") {
      auto n = parse_for();
      expect_end("endfor");
      return n;
    }
    if (name == "macro") {
      auto n = make(NodeKind::macro);
      const Token& id = expect(Tok::ident, "a macro name");
      n->text = id.value;
      n->list = parse_args();
      expect(Tok::close_stmt, "%}");
      n->body = parse_until({"endmacro"});
      expect_end("endmacro");
      return n;
    }
    if (name == "break" || name == "continue") {
      expect(Tok::close_stmt, "%}");
      return make(name == "break" ? NodeKind::break_ : NodeKind::continue_);
    }
    fail("Unknown statement type: " + name);
  }

  NodePtr parse_set() {
    auto n = make(NodeKind::set);
    n->a = parse_sequence(false);
    if (is(Tok::equals)) {
      ++cur_;
      n->b = parse_sequence(false);
    } else {
      expect(Tok::close_stmt, "%}");
      n->body = parse_until({"endset"});
      expect(Tok::open_stmt, "{%");
      expect_ident("endset");
    }
    expect(Tok::close_stmt, "%}");
    return n;
  }

  NodePtr parse_if() {
    auto n = make(NodeKind::if_);
    n->a = parse_expression();
    expect(Tok::close_stmt, "%}");
    n->body = parse_until({"elif", "else", "endif"});
    if (is_statement({"elif"})) {
      cur_ += 2;
      n->alternate.push_back(parse_if());
    } else if (is_statement({"else"})) {
      cur_ += 2;
      expect(Tok::close_stmt, "%}");
      n->alternate = parse_until({"endif"});
    }
    return n;
  }

  NodePtr parse_for() {
    auto n = make(NodeKind::for_);
    n->a = parse_sequence(true);
    if (n->a->kind != NodeKind::identifier && n->a->kind != NodeKind::tuple) {
      fail("Expected identifier/tuple for the loop variable");
    }
    expect_ident("in");
    n->b = parse_expression();
    expect(Tok::close_stmt, "%}");
    n->body = parse_until({"endfor", "else"});
    if (is_statement({"else"})) {
      cur_ += 2;
      expect(Tok::close_stmt, "%}");
      n->alternate = parse_until({"endfor"});
    }
    return n;
  }

  NodePtr parse_sequence(bool primary) {
    auto first = primary ? parse_primary() : parse_expression();
    if (!is(Tok::comma)) return first;
    auto tuple = make(NodeKind::tuple);
    tuple->list.push_back(std::move(first));
    while (is(Tok::comma)) {
      ++cur_;
      tuple->list.push_back(primary ? parse_primary() : parse_expression());
    }
    return tuple;
  }

  NodePtr parse_expression() {
    const Nesting nesting(*this);
    auto a = parse_or();
    if (!is_ident("if")) return a;
    ++cur_;
    auto test = parse_or();
    if (is_ident("else")) {
      ++cur_;
      auto n = make(NodeKind::ternary);
      n->a = std::move(test);
      n->b = std::move(a);
      n->c = parse_expression();
      return n;
    }
    auto n = make(NodeKind::select);
    n->a = std::move(a);
    n->b = std::move(test);
    return n;
  }

  NodePtr binary(std::string op, NodePtr left, NodePtr right) {
    auto n = make(NodeKind::binary);
    n->text = std::move(op);
    n->a = std::move(left);
    n->b = std::move(right);
    return n;
  }

  /// `operand (op operand)*`, grouped to the left, for as long as `is_operator()` holds for the current token
  /// (whose text is the operator).
  template <class IsOperator>
  NodePtr parse_left_associative(NodePtr (Parser::*operand)(), IsOperator is_operator) {
    auto left = (this->*operand)();
    while (is_operator()) {
      std::string op = tokens_[cur_++].value;
      left = binary(std::move(op), std::move(left), (this->*operand)());
    }
    return left;
  }

  NodePtr parse_or() { return parse_left_associative(&Parser::parse_and, [this] { return is_ident("or"); }); }
  NodePtr parse_and() { return parse_left_associative(&Parser::parse_not, [this] { return is_ident("and"); }); }
  NodePtr parse_not() {
    if (!is_ident("not")) return parse_comparison();
    const Nesting nesting(*this);
    ++cur_;
    auto n = make(NodeKind::unary);
    n->text = "not";
    n->a = parse_not();
    return n;
  }
  NodePtr parse_comparison() {
    auto left = parse_additive();
    while (true) {
      std::string op;
      if (is_ident("not") && is_ident("in", 1)) {
        op = "not in";
        cur_ += 2;
      } else if (is_ident("in") || is(Tok::comparison)) {
        op = tokens_[cur_++].value;
      } else {
        return left;
      }
      left = binary(op, std::move(left), parse_additive());
    }
  }
  NodePtr parse_additive() {
    return parse_left_associative(&Parser::parse_multiplicative, [this] { return is(Tok::additive); });
  }
  NodePtr parse_multiplicative() {
    return parse_left_associative(&Parser::parse_power, [this] { return is(Tok::multiplicative); });
  }
  NodePtr parse_power() { return parse_left_associative(&Parser::parse_test, [this] { return is(Tok::power); }); }
  NodePtr parse_test() {
    auto operand = parse_filter();
    while (is_ident("is")) {
      ++cur_;
      auto n = make(NodeKind::test);
      n->flag = is_ident("not");
      if (n->flag) ++cur_;
      n->text = expect(Tok::ident, "a test name").value;
      n->a = std::move(operand);
      operand = std::move(n);
    }
    return operand;
  }
  NodePtr parse_filter() {
    auto operand = parse_unary_sign();
    while (is(Tok::pipe)) {
      ++cur_;
      auto filter = make(NodeKind::identifier);
      filter->text = expect(Tok::ident, "a filter name").value;
      if (is(Tok::lparen)) filter = parse_call(std::move(filter));
      auto n = make(NodeKind::filter);
      n->a = std::move(operand);
      n->b = std::move(filter);
      operand = std::move(n);
    }
    return operand;
  }
  NodePtr parse_unary_sign() {
    if (cur_ < tokens_.size() && (is(Tok::unary) || is(Tok::additive)) &&
        (tokens_[cur_].value == "-" || tokens_[cur_].value == "+")) {
      const Nesting nesting(*this);
      auto n = make(NodeKind::unary);
      n->text = tokens_[cur_++].value;
      n->a = parse_unary_sign();
      return n;
    }
    auto member = parse_member(parse_primary());
    return is(Tok::lparen) ? parse_call(std::move(member)) : std::move(member);
  }
  NodePtr parse_call(NodePtr callee) {
    const Nesting nesting(*this);
    auto n = make(NodeKind::call);
    n->a = std::move(callee);
    n->list = parse_args();
    auto expr = parse_member(std::move(n));
    return is(Tok::lparen) ? parse_call(std::move(expr)) : std::move(expr);
  }
  std::vector<NodePtr> parse_args() {
    expect(Tok::lparen, "(");
    std::vector<NodePtr> args;
    bool saw_keyword = false;
    while (!is(Tok::rparen)) {
      auto arg = parse_expression();
      if (is(Tok::equals)) {
        ++cur_;
        if (arg->kind != NodeKind::identifier) fail("Expected identifier for keyword argument");
        auto kw = make(NodeKind::kwarg);
        kw->text = arg->text;
        kw->a = parse_expression();
        arg = std::move(kw);
        saw_keyword = true;
      } else if (saw_keyword) {
        fail("Positional arguments must come before keyword arguments");
      }
      args.push_back(std::move(arg));
      if (is(Tok::comma)) ++cur_;
    }
    ++cur_;
    return args;
  }
  NodePtr parse_member(NodePtr object) {
    while (is(Tok::dot) || is(Tok::lbracket)) {
      const bool computed = is(Tok::lbracket);
      ++cur_;
      auto n = make(NodeKind::member);
      n->flag = computed;
      n->a = std::move(object);
      if (computed) {
        n->b = parse_subscript();
        expect(Tok::rbracket, "]");
      } else {
        n->b = parse_primary();
        if (n->b->kind != NodeKind::identifier &&
            !(n->b->kind == NodeKind::literal && n->b->value.kind == Kind::integer)) {
          fail("Expected identifier or integer following dot operator");
        }
      }
      object = std::move(n);
    }
    return object;
  }
  NodePtr parse_subscript() {
    std::vector<NodePtr> parts;
    bool is_slice = false;
    while (!is(Tok::rbracket)) {
      if (is(Tok::colon)) {
        parts.push_back(nullptr);
        ++cur_;
        is_slice = true;
      } else {
        parts.push_back(parse_expression());
        if (is(Tok::colon)) {
          ++cur_;
          is_slice = true;
        }
      }
    }
    if (parts.empty()) fail("Expected at least one argument for member/slice expression");
    if (!is_slice) return std::move(parts[0]);
    if (parts.size() > 3) fail("Expected 0-3 arguments for slice expression");
    auto n = make(NodeKind::slice);
    parts.resize(3);
    n->a = std::move(parts[0]);
    n->b = std::move(parts[1]);
    n->c = std::move(parts[2]);
    return n;
  }
  NodePtr parse_primary() {
    const Token& t = peek();
    ++cur_;
    switch (t.type) {
      case Tok::number: {
        auto n = make(NodeKind::literal);
        try {  // std::stoll / std::stod throw std::out_of_range past their type: a TemplateError here
          if (t.value.find('.') != std::string::npos) {
            n->value = Value::of_float(std::stod(t.value));
          } else {
            n->value = Value::of_int(std::stoll(t.value));
          }
        } catch (const std::out_of_range&) {
          fail("the number " + t.value.substr(0, 40) + " is out of range");
        }
        return n;
      }
      case Tok::string: {
        std::string s = t.value;
        while (is(Tok::string)) s += tokens_[cur_++].value;
        auto n = make(NodeKind::literal);
        n->value = Value::of(std::move(s));
        return n;
      }
      case Tok::ident: {
        auto n = make(NodeKind::identifier);
        n->text = t.value;
        return n;
      }
      case Tok::lparen: {
        auto e = parse_sequence(false);
        expect(Tok::rparen, ")");
        return e;
      }
      case Tok::lbracket: {
        auto n = make(NodeKind::array);
        while (!is(Tok::rbracket)) {
          n->list.push_back(parse_expression());
          if (is(Tok::comma)) ++cur_;
        }
        ++cur_;
        return n;
      }
      case Tok::lbrace: {
        auto n = make(NodeKind::object);
        while (!is(Tok::rbrace)) {
          auto key = parse_expression();
          expect(Tok::colon, ":");
          n->pairs.emplace_back(std::move(key), parse_expression());
          if (is(Tok::comma)) ++cur_;
        }
        ++cur_;
        return n;
      }
      default: fail("Unexpected token '" + t.value + "'");
    }
  }

  /// One level of parse rules inside another while it lives; fails past kMaxParseDepth.
  class Nesting {
   public:
    explicit Nesting(Parser& p) : p_(p) {
      if (++p_.depth_ > kMaxParseDepth)
        fail("the template nests deeper than " + std::to_string(kMaxParseDepth) + " levels");
    }
    ~Nesting() { --p_.depth_; }
    Nesting(const Nesting&) = delete;
    Nesting& operator=(const Nesting&) = delete;

   private:
    Parser& p_;
  };

  std::vector<Token> tokens_;
  size_t cur_ = 0;
  int depth_ = 0;
};

}  // namespace

Program parse(std::vector<Token> tokens) { return Parser(std::move(tokens)).parse_program(); }

}  // namespace paged::jinja
