#include "model/constraint/number_ranges.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <optional>
#include <string>

namespace paged::constraint {

Expr digits(int min, int max) { return repeat(bytes(ByteSet::range('0', '9')), min, max); }

namespace {

int digit_count(uint64_t v) { return v < 10 ? 1 : 1 + digit_count(v / 10); }

// Decimal numerals without leading zeros of the numbers in [lo, hi].
Expr naturals_between(uint64_t lo, uint64_t hi) {
  std::vector<Expr> parts;
  uint64_t low_of_length = 0, high_of_length = 9;
  for (int len = 1; len <= digit_count(hi); ++len) {
    const uint64_t a = std::max(lo, low_of_length), b = std::min(hi, high_of_length);
    if (a <= b) parts.push_back(byte_strings_between(std::to_string(a), std::to_string(b), '0', '9'));
    low_of_length = high_of_length + 1;
    high_of_length = high_of_length * 10 + 9;
  }
  return alt(std::move(parts));
}

}  // namespace

Expr integers_between(int64_t lo, int64_t hi) {
  std::vector<Expr> parts;
  if (lo < 0) {
    const uint64_t from = hi < 0 ? static_cast<uint64_t>(-hi) : 1, to = static_cast<uint64_t>(-lo);
    parts.push_back(seq({literal("-"), naturals_between(from, to)}));
  }
  if (hi >= 0) parts.push_back(naturals_between(static_cast<uint64_t>(std::max<int64_t>(lo, 0)), static_cast<uint64_t>(hi)));
  return alt(std::move(parts));
}

namespace {

// A decimal with 16 fraction digits: sign, integer part, fraction digits.
struct Decimal {
  bool negative = false;
  uint64_t whole = 0;
  std::string fraction = std::string(16, '0');
  bool is_zero() const { return whole == 0 && fraction == std::string(16, '0'); }
};

// |a| < |b|, |a| == |b|.
int compare_magnitude(const Decimal& a, const Decimal& b) {
  if (a.whole != b.whole) return a.whole < b.whole ? -1 : 1;
  return a.fraction.compare(b.fraction) < 0 ? -1 : a.fraction == b.fraction ? 0 : 1;
}

bool less(const Decimal& a, const Decimal& b) {
  const bool an = a.negative && !a.is_zero(), bn = b.negative && !b.is_zero();
  if (an != bn) return an;
  const int c = compare_magnitude(a, b);
  return an ? c > 0 : c < 0;
}

// The magnitude one unit of the 16th fraction digit larger.
void step_up(Decimal& d) {
  for (size_t i = d.fraction.size(); i-- > 0;) {
    if (d.fraction[i] != '9') {
      ++d.fraction[i];
      return;
    }
    d.fraction[i] = '0';
  }
  ++d.whole;
}

// x (|x| < 10^16) as a Decimal rounded to 16 fraction digits towards +inf (`up`) or -inf: the shortest decimal that
// reads back as x, so that a text at or beyond it reads back as a double at or beyond x (rounding is monotonic).
Decimal decimal_of(double x, bool up) {
  char buf[512];
  const auto r = std::to_chars(buf, buf + sizeof buf, std::fabs(x), std::chars_format::fixed);
  const std::string text(buf, r.ptr);
  const size_t dot = text.find('.');
  Decimal d;
  d.negative = x < 0;
  d.whole = std::stoull(text.substr(0, dot));
  if (dot == std::string::npos) return d;
  const std::string digits = text.substr(dot + 1);
  d.fraction = (digits + std::string(16, '0')).substr(0, 16);
  const bool cut = digits.size() > 16 && digits.find_first_not_of('0', 16) != std::string::npos;
  if (cut && up != d.negative) step_up(d);  // away from zero: up for positives, down for negatives
  return d;
}

// Fraction digit strings (1 to 16 digits, read as padded with zeros) from position `pos` on, at or above `lo` while
// `tight_lo` and at or below `hi` while `tight_hi` (lo <= hi where both are tight); nullopt when there is none.
std::optional<Expr> fraction_digits(const std::string& lo, const std::string& hi, size_t pos, bool tight_lo,
                                    bool tight_hi) {
  std::vector<Expr> parts;
  const bool may_end = pos > 0 && (!tight_lo || lo.find_first_not_of('0', pos) == std::string::npos);
  if (may_end) parts.push_back(seq({}));
  if (pos < 16) {
    const char from = tight_lo ? lo[pos] : '0', to = tight_hi ? hi[pos] : '9';
    const int rest = static_cast<int>(16 - pos - 1);
    for (char d = from; d <= to; ++d) {
      const bool tl = tight_lo && d == lo[pos], th = tight_hi && d == hi[pos];
      if (!tl && !th) continue;
      if (std::optional<Expr> after = fraction_digits(lo, hi, pos + 1, tl, th))
        parts.push_back(seq({literal(std::string(1, d)), std::move(*after)}));
    }
    // The digits strictly inside: any digits after them.
    const char inner_from = tight_lo ? static_cast<char>(lo[pos] + 1) : '0';
    const char inner_to = tight_hi ? static_cast<char>(hi[pos] - 1) : '9';
    if (inner_from <= inner_to) parts.push_back(seq({bytes(ByteSet::range(inner_from, inner_to)), digits(0, rest)}));
  }
  if (parts.empty()) return std::nullopt;
  return alt(std::move(parts));
}

// Unsigned decimal numerals (no exponent) whose value lies in [a, b] (a <= b, magnitudes).
Expr unsigned_between(const Decimal& a, const Decimal& b) {
  const std::string zeros(16, '0'), nines(16, '9');
  // The numerals with integer part `whole` and a fraction in [lo, hi] (padded); "whole" alone when lo is zero.
  const auto with_fraction = [&](Expr whole, const std::string& lo, const std::string& hi) {
    std::vector<Expr> parts;
    if (lo == zeros) parts.push_back(whole);
    if (std::optional<Expr> f = fraction_digits(lo, hi, 0, true, true))
      parts.push_back(seq({whole, literal("."), std::move(*f)}));
    return alt(std::move(parts));
  };
  std::vector<Expr> parts;
  if (a.whole == b.whole) {
    parts.push_back(with_fraction(naturals_between(a.whole, a.whole), a.fraction, b.fraction));
  } else {
    parts.push_back(with_fraction(naturals_between(a.whole, a.whole), a.fraction, nines));
    if (a.whole + 1 <= b.whole - 1)
      parts.push_back(seq({naturals_between(a.whole + 1, b.whole - 1), optional(seq({literal("."), digits(1, 16)}))}));
    parts.push_back(with_fraction(naturals_between(b.whole, b.whole), zeros, b.fraction));
  }
  return alt(std::move(parts));
}

}  // namespace

Expr decimals_between(double lo, double hi) {
  // Beyond what is written (16 integer digits), a bound binds nothing.
  constexpr double kLimit = 9'999'999'999'999'999.0;
  const Decimal low = decimal_of(std::clamp(lo, -kLimit, kLimit), true);
  const Decimal high = decimal_of(std::clamp(hi, -kLimit, kLimit), false);
  if (less(high, low)) throw GrammarError("JSON schema: the number bounds admit no value that can be written");
  std::vector<Expr> parts;
  if (!high.negative || high.is_zero()) {
    Decimal from = low;
    if (low.negative) from = Decimal{};
    Decimal to = high;
    to.negative = false;
    parts.push_back(unsigned_between(from, to));
  }
  if (low.negative && !low.is_zero()) {
    Decimal from = high.negative ? high : Decimal{}, to = low;
    from.negative = to.negative = false;
    if (from.is_zero()) step_up(from);  // zero is written unsigned
    if (!less(to, from)) parts.push_back(seq({literal("-"), unsigned_between(from, to)}));
  }
  return alt(std::move(parts));
}

}  // namespace paged::constraint
