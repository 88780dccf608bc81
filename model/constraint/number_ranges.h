// Numerals of numeric intervals as grammar expressions: the integers, or the plain decimals, whose value lies within
// bounds (JSON Schema's minimum / maximum). Decimals are written without exponent, with at most 16 integer and 16
// fraction digits.
#pragma once

#include <cstdint>

#include "model/constraint/grammar.h"

namespace paged::constraint {

/// Decimal digits, between `min` and `max` of them (max -1: unbounded).
Expr digits(int min, int max);

/// Integer numerals (no leading zeros, never "-0") of the values in [lo, hi]; lo <= hi, both within +-(10^16 - 1).
Expr integers_between(int64_t lo, int64_t hi);

/// Plain decimal numerals ([-]digits[.digits], no leading zeros, zero unsigned) that read back, as a double, within
/// [lo, hi] (infinite or beyond 10^16: no bound on that side). Throws GrammarError when no such numeral exists.
Expr decimals_between(double lo, double hi);

}  // namespace paged::constraint
