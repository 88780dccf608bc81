// How the Jinja internals raise their one error: every syntax and runtime error is a TemplateError.
#pragma once

#include <cmath>
#include <cstdint>
#include <string>

#include "model/template/jinja/template_error.h"

namespace paged::jinja {

/// Throws TemplateError(message).
[[noreturn]] inline void fail(const std::string& message) { throw TemplateError(message); }

/// `d` truncated to an integer; TemplateError when it is NaN or outside int64 (a cast would be undefined).
inline int64_t int_of(double d) {
  if (!(d >= -9223372036854775808.0 && d < 9223372036854775808.0)) fail("the number does not fit in an integer");
  return static_cast<int64_t>(d);
}

/// x + y, x - y, x * y, x // y (floored) or x % y (the sign of x, as the JavaScript renderer's) of integers, `op`
/// one of + - * / % ('/' the floored division); TemplateError on overflow (a template's integers are 64 bits) and
/// on a division by zero. Unchecked, INT64_MIN // -1 and % -1 trap on x86 (SIGFPE), ending the server.
inline int64_t int_arith(char op, int64_t x, int64_t y) {
  int64_t r = 0;
  bool overflow = false;
  switch (op) {
    case '+': overflow = __builtin_add_overflow(x, y, &r); break;
    case '-': overflow = __builtin_sub_overflow(x, y, &r); break;
    case '*': overflow = __builtin_mul_overflow(x, y, &r); break;
    default:
      if (y == 0) fail("integer division or modulo by zero");
      if (y == -1) {  // x // -1 = -x, x % -1 = 0
        overflow = op == '/' && __builtin_sub_overflow(int64_t{0}, x, &r);
        break;
      }
      r = op == '%' ? x % y : x / y - ((x % y != 0) && ((x < 0) != (y < 0)) ? 1 : 0);
  }
  if (overflow) fail("integer overflow");
  return r;
}

}  // namespace paged::jinja
