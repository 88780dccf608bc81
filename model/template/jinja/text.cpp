#include "model/template/jinja/text.h"

#include <charconv>
#include <cmath>
#include <utility>

#include "model/unicode/utf8.h"

namespace paged::jinja {
namespace {

// The backslash escapes of control characters that JavaScript and JSON strings share: (letter, character).
constexpr std::pair<char, char> kControlEscapes[] = {{'b', '\b'}, {'f', '\f'}, {'n', '\n'}, {'r', '\r'}, {'t', '\t'}};

}  // namespace

std::u32string code_points(std::string_view s) {
  std::u32string out;
  out.reserve(s.size());
  for (size_t i = 0; i < s.size();) {
    const utf8::Char c = utf8::next(s.substr(i));
    if (c.complete) {
      out.push_back(c.code_point);
    } else {
      for (size_t k = 0; k < c.length; ++k) out.push_back(kRawByte + static_cast<unsigned char>(s[i + k]));
    }
    i += c.length;
  }
  return out;
}

void append_code_point(std::string& out, char32_t c) {
  if (c >= kRawByte) {
    out.push_back(static_cast<char>(c - kRawByte));
  } else {
    utf8::append(out, c);
  }
}

std::string from_code_points(std::u32string_view cps) {
  std::string out;
  out.reserve(cps.size());
  for (char32_t c : cps) append_code_point(out, c);
  return out;
}

bool is_js_space(char32_t c) {
  switch (c) {
    case 0x09: case 0x0A: case 0x0B: case 0x0C: case 0x0D: case 0x20: case 0xA0: case 0x1680: case 0x2028:
    case 0x2029: case 0x202F: case 0x205F: case 0x3000: case 0xFEFF:
      return true;
    default:
      return c >= 0x2000 && c <= 0x200A;
  }
}

bool is_word_char(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_';
}

char control_of_escape(char letter) {
  for (const auto& [escape, control] : kControlEscapes) {
    if (escape == letter) return control;
  }
  return '\0';
}

char escape_of_control(char32_t c) {
  for (const auto& [escape, control] : kControlEscapes) {
    if (static_cast<char32_t>(control) == c) return escape;
  }
  return '\0';
}

std::string trim(std::string_view s, Trim where, const std::u32string* set) {
  const std::u32string cps = code_points(s);
  auto strip = [&](char32_t c) { return set ? set->find(c) != std::u32string::npos : is_js_space(c); };
  size_t begin = 0, end = cps.size();
  if (where != Trim::end) {
    while (begin < end && strip(cps[begin])) ++begin;
  }
  if (where != Trim::start) {
    while (end > begin && strip(cps[end - 1])) --end;
  }
  return from_code_points(std::u32string_view(cps).substr(begin, end - begin));
}

int64_t js_length(std::string_view s) {
  int64_t n = 0;
  for (char32_t c : code_points(s)) n += (c >= 0x10000 && c < kRawByte) ? 2 : 1;
  return n;
}

std::string js_number(double x) {
  if (std::isnan(x)) return "NaN";
  if (std::isinf(x)) return x < 0 ? "-Infinity" : "Infinity";
  if (x == 0) return "0";
  char buf[64];
  auto res = std::to_chars(buf, buf + sizeof buf, x, std::chars_format::scientific);
  std::string sci(buf, res.ptr);
  std::string sign;
  if (sci[0] == '-') {
    sign = "-";
    sci.erase(0, 1);
  }
  const size_t e_pos = sci.find('e');
  const int exponent = std::stoi(sci.substr(e_pos + 1));
  std::string digits;
  for (char c : sci.substr(0, e_pos)) {
    if (c != '.') digits.push_back(c);
  }
  const int k = static_cast<int>(digits.size());
  const int n = exponent + 1;
  std::string out;
  if (k <= n && n <= 21) {
    out = digits + std::string(n - k, '0');
  } else if (0 < n && n <= 21) {
    out = digits.substr(0, n) + "." + digits.substr(n);
  } else if (-6 < n && n <= 0) {
    out = "0." + std::string(-n, '0') + digits;
  } else {
    out = digits.substr(0, 1);
    if (k > 1) out += "." + digits.substr(1);
    out += (n - 1 >= 0 ? "e+" : "e-") + std::to_string(std::abs(n - 1));
  }
  return sign + out;
}

double js_to_number(std::string_view s) {
  const std::string t = trim(s, Trim::both);
  if (t.empty()) return 0.0;
  double d = 0;
  auto res = std::from_chars(t.data(), t.data() + t.size(), d);
  if (res.ec != std::errc() || res.ptr != t.data() + t.size()) return std::nan("");
  return d;
}

}  // namespace paged::jinja
