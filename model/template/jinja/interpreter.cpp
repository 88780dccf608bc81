#include "model/template/jinja/interpreter.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <utility>

#include "model/template/jinja/budget.h"
#include "model/template/jinja/error.h"
#include "model/template/jinja/filters.h"
#include "model/template/jinja/methods.h"
#include "model/template/jinja/text.h"

namespace paged::jinja {
namespace {

// Thrown by {% break %} and {% continue %}, caught by the loop around them.
struct BreakSignal {};
struct ContinueSignal {};

/// Python-style slice of n elements: the selected indices.
std::vector<size_t> slice_indices(int64_t n, const Value& start_v, const Value& stop_v, const Value& step_v) {
  const int64_t step = step_v.kind == Kind::integer ? step_v.integer : 1;
  if (step == 0) fail("slice step cannot be zero");
  int64_t start, stop;
  if (step > 0) {
    start = start_v.kind == Kind::integer ? start_v.integer : 0;
    stop = stop_v.kind == Kind::integer ? stop_v.integer : n;
    start = start < 0 ? std::max<int64_t>(n + start, 0) : std::min(start, n);
    stop = stop < 0 ? std::max<int64_t>(n + stop, 0) : std::min(stop, n);
  } else {
    start = start_v.kind == Kind::integer ? start_v.integer : n - 1;
    stop = stop_v.kind == Kind::integer ? stop_v.integer : -1;
    start = start < 0 ? std::max<int64_t>(n + start, -1) : std::min(start, n - 1);
    stop = stop < -1 ? std::max<int64_t>(n + stop, -1) : std::min(stop, n - 1);
  }
  std::vector<size_t> idx;
  for (int64_t i = start; step > 0 ? i < stop : i > stop; i += step) idx.push_back(static_cast<size_t>(i));
  return idx;
}

// Runs one render; the macros a template defines hold a pointer to it, so it outlives them (they live in its scopes).
// Every statement, expression and loop iteration is a step of the open RenderBudget; their nesting (macro calls
// within) is bounded by its max_depth, so no template overflows the stack.
class Interpreter {
 public:
  /// Renders `program`; a break or continue outside a loop is an error.
  std::string render(const Program& program, Scope& global) {
    std::string out;
    try {
      exec(program, global, out);
    } catch (const BreakSignal&) {
      fail("break outside a loop");
    } catch (const ContinueSignal&) {
      fail("continue outside a loop");
    }
    return out;
  }

 private:
  /// Runs statements, appending their output to `out` (output made before a break/continue stays, as in Python;
  /// the JavaScript renderer drops it).
  void exec(const std::vector<NodePtr>& statements, Scope& scope, std::string& out) {
    const Nesting nesting(*this);
    for (const auto& s : statements) {
      charge_steps(1);
      switch (s->kind) {
        case NodeKind::comment: break;
        case NodeKind::break_: throw BreakSignal{};
        case NodeKind::continue_: throw ContinueSignal{};
        case NodeKind::set: exec_set(*s, scope); break;
        case NodeKind::macro: define_macro(*s, scope); break;
        case NodeKind::if_: exec(eval(*s->a, scope).truthy() ? s->body : s->alternate, scope, out); break;
        case NodeKind::for_: exec_for(*s, scope, out); break;
        default: {
          const Value v = eval(*s, scope);
          if (v.nullish()) break;
          const std::string text = to_output(v);
          charge_bytes(text.size());
          out += text;
        }
      }
    }
  }

  /// Counts one level of evaluation inside another while it lives; fails past the budget's max_depth.
  class Nesting {
   public:
    explicit Nesting(Interpreter& in) : in_(in) {
      if (++in_.depth_ > in_.max_depth_)
        fail("the template nests expressions, statements or macro calls deeper than " +
             std::to_string(in_.max_depth_) + " levels");
    }
    ~Nesting() { --in_.depth_; }
    Nesting(const Nesting&) = delete;
    Nesting& operator=(const Nesting&) = delete;

   private:
    Interpreter& in_;
  };

  /// The value of expression `n` in `scope`.
  Value eval(const Node& n, Scope& scope) {
    const Nesting nesting(*this);
    charge_steps(1);
    switch (n.kind) {
      case NodeKind::literal: return n.value;
      case NodeKind::identifier: return scope.lookup(n.text);
      case NodeKind::array: case NodeKind::tuple: {
        Array items;
        for (const auto& x : n.list) items.push_back(eval(*x, scope));
        return Value::of(std::move(items));
      }
      case NodeKind::object: {
        Object o;
        for (const auto& [k, v] : n.pairs) {
          Value key = eval(*k, scope);
          if (key.kind != Kind::string) fail(std::string("Object keys must be strings: got ") + type_name(key.kind));
          o.set(key.str, eval(*v, scope));
        }
        return Value::of(std::move(o));
      }
      case NodeKind::member: return eval_member(n, scope);
      case NodeKind::call: {
        Args args = eval_args(n.list, scope);
        const Value fn = eval(*n.a, scope);
        if (fn.kind != Kind::function) fail(std::string("Cannot call something that is not a function: got ") + type_name(fn.kind));
        return (*fn.function)(args, scope);
      }
      case NodeKind::filter: return eval_filter(eval(*n.a, scope), *n.b, scope);
      case NodeKind::test: return Value::of(run_test(n.text, eval(*n.a, scope)) != n.flag);
      case NodeKind::unary: return eval_unary(n, scope);
      case NodeKind::binary: return eval_binary(n, scope);
      case NodeKind::ternary: return eval(*n.a, scope).truthy() ? eval(*n.b, scope) : eval(*n.c, scope);
      case NodeKind::select: return eval(*n.b, scope).truthy() ? eval(*n.a, scope) : Value{};
      default: fail("Unexpected expression");
    }
  }

  /// A call's arguments, positional ones first, then keywords (one given twice is an error).
  Args eval_args(const std::vector<NodePtr>& list, Scope& scope) {
    Args args;
    for (const auto& a : list) {
      if (a->kind != NodeKind::kwarg) args.positional.push_back(eval(*a, scope));
    }
    for (const auto& a : list) {
      if (a->kind != NodeKind::kwarg) continue;
      if (args.keyword.find(a->text)) fail("Got multiple values for keyword argument '" + a->text + "'");
      args.keyword.set(a->text, eval(*a->a, scope));
    }
    return args;
  }

  /// {% set %} of a variable, a tuple of them or a namespace attribute; a block set assigns the block's output.
  void exec_set(const Node& n, Scope& scope) {
    Value rhs;
    if (n.b) {
      rhs = eval(*n.b, scope);
    } else {
      std::string body;
      exec(n.body, scope, body);
      rhs = Value::of(std::move(body));
    }
    const Node& target = *n.a;
    if (target.kind == NodeKind::identifier) {
      scope.vars.set(target.text, std::move(rhs));
    } else if (target.kind == NodeKind::tuple) {
      if (rhs.kind != Kind::array) fail(std::string("Cannot unpack non-iterable type in set: ") + type_name(rhs.kind));
      if (rhs.array->size() != target.list.size()) fail("Wrong number of items to unpack in set");
      for (size_t i = 0; i < target.list.size(); ++i) {
        if (target.list[i]->kind != NodeKind::identifier) fail("Cannot unpack to non-identifier in set");
        scope.vars.set(target.list[i]->text, (*rhs.array)[i]);
      }
    } else if (target.kind == NodeKind::member && !target.flag) {
      const Value object = eval(*target.a, scope);
      if (object.kind != Kind::ns) fail("cannot assign attribute on non-namespace object");
      if (target.b->kind != NodeKind::identifier) fail("Cannot assign to member with non-identifier property");
      object.object->set(target.b->text, std::move(rhs));
    } else {
      fail("Invalid left-hand side of an assignment");
    }
  }

  /// {% for %} in a scope of its own, with `loop` and the optional `if` filter; `else` runs when no item passed.
  void exec_for(const Node& n, Scope& outer, std::string& out) {
    Scope scope(&outer);
    const Node* filter = nullptr;
    Value iterable;
    if (n.b->kind == NodeKind::select) {
      iterable = eval(*n.b->a, scope);
      filter = n.b->b.get();
    } else {
      iterable = eval(*n.b, scope);
    }
    if (iterable.kind == Kind::object) {
      Array keys;
      for (const auto& [k, v] : iterable.object->entries) keys.push_back(Value::of(k));
      iterable = Value::of(std::move(keys));
    }
    // An undefined variable iterates as nothing (Python Jinja's Undefined; templates loop over `tools` unset).
    if (iterable.kind == Kind::undefined) iterable = Value::of(Array{});
    if (iterable.kind != Kind::array) {
      fail(std::string("Expected iterable or object type in for loop: got ") + type_name(iterable.kind));
    }
    const Node& target = *n.a;
    auto bind = [&](Scope& s, const Value& item) {
      if (target.kind == NodeKind::identifier) {
        s.vars.set(target.text, item);
        return;
      }
      if (item.kind != Kind::array) fail(std::string("Cannot unpack non-iterable type: ") + type_name(item.kind));
      if (item.array->size() != target.list.size()) fail("Wrong number of items to unpack");
      for (size_t j = 0; j < target.list.size(); ++j) {
        if (target.list[j]->kind != NodeKind::identifier) fail("Cannot unpack non-identifier type");
        s.vars.set(target.list[j]->text, (*item.array)[j]);
      }
    };
    std::vector<Value> items;
    for (const Value& item : *iterable.array) {
      if (filter) {
        Scope test_scope(&scope);
        bind(test_scope, item);
        if (!eval(*filter, test_scope).truthy()) continue;
      }
      items.push_back(item);
    }
    const auto count = static_cast<int64_t>(items.size());
    // One `loop` dict for the statement, updated in place each iteration (made once: charged once).
    const Value loop_value = Value::of(Object{});
    scope.vars.set("loop", loop_value);
    for (int64_t i = 0; i < count; ++i) {
      charge_steps(1);
      Object& loop = *loop_value.object;
      loop.set("index", Value::of_int(i + 1));
      loop.set("index0", Value::of_int(i));
      loop.set("revindex", Value::of_int(count - i));
      loop.set("revindex0", Value::of_int(count - i - 1));
      loop.set("first", Value::of(i == 0));
      loop.set("last", Value::of(i == count - 1));
      loop.set("length", Value::of_int(count));
      loop.set("previtem", i > 0 ? items[i - 1] : Value{});
      loop.set("nextitem", i < count - 1 ? items[i + 1] : Value{});
      bind(scope, items[i]);
      try {
        exec(n.body, scope, out);
      } catch (const ContinueSignal&) {
        continue;
      } catch (const BreakSignal&) {
        break;
      }
    }
    if (count == 0) exec(n.alternate, scope, out);
  }

  /// {% macro %}: binds its name in `scope` to a function that renders its body in a scope below the caller's.
  void define_macro(const Node& n, Scope& scope) {
    const Node* macro = &n;
    scope.vars.set(n.text, Value::of(Function([this, macro](Args& args, Scope& caller) {
      Scope local(&caller);
      std::vector<std::pair<std::string, const Node*>> defaults;
      for (size_t i = 0; i < macro->list.size(); ++i) {
        const Node& param = *macro->list[i];
        const std::string& name = param.text;
        const Value* v = i < args.positional.size() ? &args.positional[i] : args.keyword.find(name);
        if (v) {
          local.vars.set(name, *v);
        } else {
          local.vars.set(name, Value{});
          if (param.kind == NodeKind::kwarg) defaults.emplace_back(name, param.a.get());
        }
      }
      for (const auto& [k, v] : args.keyword.entries) {
        bool known = false;
        for (const auto& p : macro->list) known = known || p->text == k;
        if (!known) fail("macro '" + macro->text + "' takes no keyword argument '" + k + "'");
      }
      if (args.positional.size() > macro->list.size()) {
        fail("macro '" + macro->text + "' takes not more than " + std::to_string(macro->list.size()) + " argument(s)");
      }
      for (const auto& [name, expr] : defaults) local.vars.set(name, eval(*expr, local));
      std::string out;
      exec(macro->body, local, out);
      return Value::of(std::move(out));
    })));
  }

  /// a.b, a[b] and a[start:stop:step] of dicts, namespaces, arrays and strings (their methods included).
  Value eval_member(const Node& n, Scope& scope) {
    const Value object = eval(*n.a, scope);
    if (n.flag && n.b->kind == NodeKind::slice) {
      const Node& s = *n.b;
      const Value start = s.a ? eval(*s.a, scope) : Value{};
      const Value stop = s.b ? eval(*s.b, scope) : Value{};
      const Value step = s.c ? eval(*s.c, scope) : Value{};
      for (const Value* v : {&start, &stop, &step}) {
        if (v->kind != Kind::integer && v->kind != Kind::undefined) fail("Slice indices must be integers or undefined");
      }
      if (object.kind == Kind::array) {
        Array out;
        for (size_t i : slice_indices(static_cast<int64_t>(object.array->size()), start, stop, step)) out.push_back((*object.array)[i]);
        return Value::of(std::move(out));
      }
      if (object.kind == Kind::string) {
        const std::u32string cps = code_points(object.str);
        std::u32string out;
        for (size_t i : slice_indices(static_cast<int64_t>(cps.size()), start, stop, step)) out.push_back(cps[i]);
        return Value::of(from_code_points(out));
      }
      fail("Slice object must be an array or string");
    }
    const Value property = n.flag ? eval(*n.b, scope) : n.b->kind == NodeKind::literal ? n.b->value : Value::of(n.b->text);
    if (object.is_mapping()) {
      if (property.kind != Kind::string) fail(std::string("Cannot access property with non-string: got ") + type_name(property.kind));
      if (const Value* v = object.object->find(property.str)) return *v;
      return object.kind == Kind::object ? dict_method(object.object, property.str) : Value{};
    }
    if (object.kind == Kind::array || object.kind == Kind::string) {
      if (property.kind == Kind::integer) {
        if (object.kind == Kind::array) {
          const auto size = static_cast<int64_t>(object.array->size());
          const int64_t i = property.integer < 0 ? size + property.integer : property.integer;
          return i >= 0 && i < size ? (*object.array)[i] : Value{};
        }
        const std::u32string cps = code_points(object.str);
        const auto size = static_cast<int64_t>(cps.size());
        const int64_t i = property.integer < 0 ? size + property.integer : property.integer;
        return i >= 0 && i < size ? Value::of(from_code_points(cps.substr(i, 1))) : Value{};
      }
      if (property.kind != Kind::string) fail("Cannot access property with non-string/non-number");
      if (object.kind == Kind::array) return property.str == "length" ? Value::of_int(static_cast<int64_t>(object.array->size())) : Value{};
      return string_method(object.str, property.str);
    }
    if (property.kind != Kind::string) fail(std::string("Cannot access property with non-string: got ") + type_name(property.kind));
    return {};
  }

  /// not, unary minus and plus.
  Value eval_unary(const Node& n, Scope& scope) {
    const Value v = eval(*n.a, scope);
    if (n.text == "not") return Value::of(!v.truthy());
    const int sign = n.text == "-" ? -1 : 1;
    if (v.kind == Kind::floating) return Value::of_float(sign * v.number);
    if (v.kind == Kind::integer) return Value::of_int(int_arith('*', sign, v.integer));
    if (v.kind == Kind::boolean) return Value::of_int(sign * static_cast<int64_t>(v.boolean));
    fail("Unknown operator \"" + n.text + "\" for " + type_name(v.kind));
  }

  /// The binary operators with the renderer's JavaScript-like semantics (and, or short-circuit).
  Value eval_binary(const Node& n, Scope& scope) {
    const std::string& op = n.text;
    Value left = eval(*n.a, scope);
    if (op == "and") return left.truthy() ? eval(*n.b, scope) : left;
    if (op == "or") return left.truthy() ? left : eval(*n.b, scope);
    Value right = eval(*n.b, scope);
    if (op == "==") return Value::of(loose_equal(left, right));
    if (op == "!=") return Value::of(!loose_equal(left, right));
    if (left.kind == Kind::undefined || right.kind == Kind::undefined) {
      if (right.kind == Kind::undefined && (op == "in" || op == "not in")) return Value::of(op == "not in");
      fail("Cannot perform operation " + op + " on undefined values");
    }
    if (left.kind == Kind::none || right.kind == Kind::none) fail("Cannot perform operation on null values");
    if (op == "~") return Value::of(js_string(left) + js_string(right));
    const auto numeric = [](const Value& v) { return v.is_number() || v.kind == Kind::boolean; };
    if (op == "**" && numeric(left) && numeric(right)) {
      const double a = left.as_double(), b = right.as_double();
      if (a == 0 && b < 0) fail("0.0 cannot be raised to a negative power");
      const double r = std::pow(a, b);
      if (!std::isfinite(r)) fail("Exponentiation result is not a finite real number");
      if (left.kind == Kind::floating || right.kind == Kind::floating || b < 0) return Value::of_float(r);
      return Value::of_int(int_of(r));
    }
    if (left.is_number() && right.is_number()) {
      const bool is_float = left.kind == Kind::floating || right.kind == Kind::floating;
      const double a = left.as_double(), b = right.as_double();
      if (op == "+" || op == "-" || op == "*") {
        if (!is_float) {
          return Value::of_int(int_arith(op[0], left.integer, right.integer));
        }
        return Value::of_float(op == "+" ? a + b : op == "-" ? a - b : a * b);
      }
      if (op == "/") return Value::of_float(a / b);
      if (op == "//" || op == "%") {
        if (!is_float) {
          return Value::of_int(int_arith(op == "%" ? '%' : '/', left.integer, right.integer));
        }
        return Value::of_float(op == "%" ? std::fmod(a, b) : std::floor(a / b));
      }
      if (op == "<") return Value::of(a < b);
      if (op == ">") return Value::of(a > b);
      if (op == "<=") return Value::of(a <= b);
      if (op == ">=") return Value::of(a >= b);
    } else if (left.kind == Kind::array && right.kind == Kind::array) {
      if (op == "+") {
        Array joined = *left.array;
        joined.insert(joined.end(), right.array->begin(), right.array->end());
        return Value::of(std::move(joined));
      }
    } else if (right.kind == Kind::array) {
      charge_steps(static_cast<int64_t>(right.array->size()));
      bool member = false;
      for (const Value& x : *right.array) member = member || strict_equal(x, left);
      if (op == "in") return Value::of(member);
      if (op == "not in") return Value::of(!member);
    }
    if ((left.kind == Kind::string || right.kind == Kind::string) && op == "+") {
      return Value::of(js_string(left) + js_string(right));
    }
    if (left.kind == Kind::string && right.kind == Kind::string) {
      if (op == "in") return Value::of(right.str.find(left.str) != std::string::npos);
      if (op == "not in") return Value::of(right.str.find(left.str) == std::string::npos);
    }
    if (left.kind == Kind::string && right.kind == Kind::object) {
      const bool has = right.object->find(left.str) != nullptr;
      if (op == "in") return Value::of(has);
      if (op == "not in") return Value::of(!has);
    }
    fail("Unknown operator \"" + op + "\" between " + type_name(left.kind) + " and " + type_name(right.kind));
  }

  /// `v | filter`, where `filter` is the filter's identifier or a call of it.
  Value eval_filter(const Value& v, const Node& filter, Scope& scope) {
    const bool called = filter.kind == NodeKind::call;
    if (called && filter.a->kind != NodeKind::identifier) fail("Unknown filter");
    const std::string& name = called ? filter.a->text : filter.text;
    Args args = called ? eval_args(filter.list, scope) : Args{};
    return apply_filter(name, v, args, scope);
  }

  int depth_ = 0;
  const int max_depth_ = max_value_depth();
};

}  // namespace

std::string render(const Program& program, Scope& global) { return Interpreter().render(program, global); }

}  // namespace paged::jinja
