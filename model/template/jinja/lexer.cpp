#include "model/template/jinja/lexer.h"

#include <charconv>
#include <optional>
#include <utility>

#include "model/template/jinja/error.h"
#include "model/template/jinja/text.h"
#include "model/unicode/utf8.h"

namespace paged::jinja {
namespace {

bool is_digit(char c) { return c >= '0' && c <= '9'; }

/// Whether a (JavaScript, multiline) line starts at `i`.
bool at_line_start(std::string_view s, size_t i) {
  if (i == 0) return true;
  const char p = s[i - 1];
  if (p == '\n' || p == '\r') return true;
  // U+2028 / U+2029 end lines for JavaScript's ^ too.
  return i >= 3 && s[i - 3] == '\xE2' && s[i - 2] == '\x80' && (s[i - 1] == '\xA8' || s[i - 1] == '\xA9');
}

/// The renderer's preprocessing: one trailing newline dropped, lstrip_blocks, trim_blocks, {% generation %} tags
/// removed.
std::string preprocess(std::string_view in) {
  std::string src(in);
  if (!src.empty() && src.back() == '\n') src.pop_back();
  // lstrip_blocks: spaces and tabs at the start of a line before "{%", "{#" or "{-" go.
  std::string out;
  out.reserve(src.size());
  for (size_t i = 0; i < src.size();) {
    if (at_line_start(src, i)) {
      size_t j = i;
      while (j < src.size() && (src[j] == ' ' || src[j] == '\t')) ++j;
      if (j > i && j + 1 < src.size() && src[j] == '{' &&
          (src[j + 1] == '%' || src[j + 1] == '#' || src[j + 1] == '-')) {
        i = j;
      }
    }
    out.push_back(src[i++]);
  }
  // trim_blocks: the newline right after "%}", "#}" or "-}" goes.
  src.clear();
  for (size_t i = 0; i < out.size(); ++i) {
    src.push_back(out[i]);
    if (out[i] == '}' && i > 0 && (out[i - 1] == '%' || out[i - 1] == '#' || out[i - 1] == '-') &&
        i + 1 < out.size() && out[i + 1] == '\n') {
      ++i;
    }
  }
  // {% generation %} / {% endgeneration %} markers vanish, with their whitespace control.
  out.clear();
  size_t i = 0;
  while (i < src.size()) {
    const size_t open = src.find("{%", i);
    if (open == std::string::npos) {
      out.append(src, i, std::string::npos);
      break;
    }
    size_t p = open + 2;
    const bool strip_before = p < src.size() && src[p] == '-';
    if (strip_before) ++p;
    while (p < src.size() && utf8::is_ascii_space(src[p])) ++p;
    if (src.compare(p, 3, "end") == 0) p += 3;
    bool is_generation = src.compare(p, 10, "generation") == 0;
    bool strip_after = false;
    if (is_generation) {
      p += 10;
      while (p < src.size() && utf8::is_ascii_space(src[p])) ++p;
      strip_after = p < src.size() && src[p] == '-';
      if (strip_after) ++p;
      is_generation = src.compare(p, 2, "%}") == 0;
    }
    if (!is_generation) {
      out.append(src, i, open + 2 - i);
      i = open + 2;
      continue;
    }
    size_t before = open;
    while (before > i && utf8::is_ascii_space(src[before - 1])) --before;
    out.append(src, i, (strip_before ? before : open) - i);
    p += 2;
    size_t after = p;
    while (after < src.size() && utf8::is_ascii_space(src[after])) ++after;
    if (!strip_after) out.append(src, p, after - p);
    i = after;
  }
  return out;
}

}  // namespace

std::vector<Token> tokenize(std::string_view source) {
  const std::string src = preprocess(source);
  std::vector<Token> tokens;
  size_t pos = 0;
  int curly_depth = 0;
  auto last_type = [&]() -> std::optional<Tok> {
    if (tokens.empty()) return std::nullopt;
    return tokens.back().type;
  };
  auto strip_trailing_whitespace = [&] {
    if (!tokens.empty() && tokens.back().type == Tok::text) {
      tokens.back().value = trim(tokens.back().value, Trim::end);
      if (tokens.back().value.empty()) tokens.pop_back();
    }
  };
  auto skip_leading_whitespace = [&] {
    while (pos < src.size()) {
      const utf8::Char ch = utf8::next(std::string_view(src).substr(pos));
      if (!ch.complete || !is_js_space(ch.code_point)) break;
      pos += ch.length;
    }
  };
  // A string literal's characters up to (not including) `quote`, escapes resolved.
  auto read_string = [&](char quote) {
    std::string s;
    while (pos < src.size() && src[pos] != quote) {
      if (src[pos] == '\\') {
        if (++pos >= src.size()) fail("Unexpected end of input");
        const char e = src[pos++];
        if (e == 'x' || e == 'u') {
          const size_t n = e == 'x' ? 2 : 4;
          const std::string hex = src.substr(pos, n);
          unsigned cp = 0;
          auto res = std::from_chars(hex.data(), hex.data() + hex.size(), cp, 16);
          if (hex.size() != n || res.ptr != hex.data() + hex.size()) fail("Invalid hexadecimal escape sequence");
          utf8::append(s, cp);
          pos += n;
          continue;
        }
        if (e == '\'' || e == '"' || e == '\\') {
          s += e;
        } else if (e == 'v') {  // JavaScript's vertical tab, which JSON lacks
          s += '\v';
        } else if (const char control = control_of_escape(e)) {
          s += control;
        } else {
          fail(std::string("Unexpected escaped character: ") + e);
        }
        continue;
      }
      s += src[pos++];
    }
    if (pos >= src.size()) fail("Unexpected end of input");
    return s;
  };
  static const std::pair<std::string_view, Tok> kSymbols[] = {
      {"{%", Tok::open_stmt}, {"%}", Tok::close_stmt}, {"{{", Tok::open_expr}, {"}}", Tok::close_expr},
      {"(", Tok::lparen}, {")", Tok::rparen}, {"{", Tok::lbrace}, {"}", Tok::rbrace}, {"[", Tok::lbracket},
      {"]", Tok::rbracket}, {",", Tok::comma}, {".", Tok::dot}, {":", Tok::colon}, {"|", Tok::pipe},
      {"<=", Tok::comparison}, {">=", Tok::comparison}, {"==", Tok::comparison}, {"!=", Tok::comparison},
      {"<", Tok::comparison}, {">", Tok::comparison}, {"+", Tok::additive}, {"-", Tok::additive},
      {"~", Tok::additive}, {"**", Tok::power}, {"*", Tok::multiplicative}, {"//", Tok::multiplicative},
      {"/", Tok::multiplicative}, {"%", Tok::multiplicative}, {"=", Tok::equals}};

  while (pos < src.size()) {
    const auto lt = last_type();
    if (!lt || *lt == Tok::close_stmt || *lt == Tok::close_expr || *lt == Tok::comment) {
      size_t end = pos;
      while (end < src.size() &&
             !(src[end] == '{' && end + 1 < src.size() && (src[end + 1] == '%' || src[end + 1] == '{' || src[end + 1] == '#'))) {
        ++end;
      }
      if (end > pos) {
        tokens.push_back({Tok::text, src.substr(pos, end - pos)});
        pos = end;
        continue;
      }
    }
    if (src.compare(pos, 2, "{#") == 0) {
      pos += 2;
      const bool strip_before = pos < src.size() && src[pos] == '-';
      if (strip_before) ++pos;
      const size_t close = src.find("#}", pos);
      if (close == std::string::npos) fail("Missing end of comment tag");
      std::string comment = src.substr(pos, close - pos);
      const bool strip_after = !comment.empty() && comment.back() == '-';
      if (strip_after) comment.pop_back();
      if (strip_before) strip_trailing_whitespace();
      tokens.push_back({Tok::comment, std::move(comment)});
      pos = close + 2;
      if (strip_after) skip_leading_whitespace();
      continue;
    }
    if (src.compare(pos, 3, "{%-") == 0 || src.compare(pos, 3, "{{-") == 0) {
      strip_trailing_whitespace();
      const bool stmt = src[pos + 1] == '%';
      tokens.push_back({stmt ? Tok::open_stmt : Tok::open_expr, stmt ? "{%" : "{{"});
      if (!stmt) curly_depth = 0;
      pos += 3;
      continue;
    }
    while (pos < src.size() && utf8::is_ascii_space(src[pos])) ++pos;
    if (pos >= src.size()) break;
    if (src.compare(pos, 3, "-%}") == 0 || src.compare(pos, 3, "-}}") == 0) {
      const bool stmt = src[pos + 1] == '%';
      tokens.push_back({stmt ? Tok::close_stmt : Tok::close_expr, stmt ? "%}" : "}}"});
      pos += 3;
      skip_leading_whitespace();
      continue;
    }
    const char c = src[pos];
    if (c == '-' || c == '+') {
      if (!lt || *lt == Tok::text) fail(std::string("Unexpected character: ") + c);
      if (*lt != Tok::ident && *lt != Tok::number && *lt != Tok::string && *lt != Tok::rparen && *lt != Tok::rbracket) {
        ++pos;
        std::string num;
        while (pos < src.size() && is_digit(src[pos])) num += src[pos++];
        if (!num.empty() && pos + 1 < src.size() && src[pos] == '.' && is_digit(src[pos + 1])) {
          num += src[pos++];
          while (pos < src.size() && is_digit(src[pos])) num += src[pos++];
        }
        tokens.push_back({num.empty() ? Tok::unary : Tok::number, std::string(1, c) + num});
        continue;
      }
    }
    bool matched = false;
    for (const auto& [seq, type] : kSymbols) {
      if (seq == "}}" && curly_depth > 0) continue;
      if (src.compare(pos, seq.size(), seq) == 0) {
        tokens.push_back({type, std::string(seq)});
        if (type == Tok::open_expr) curly_depth = 0;
        if (type == Tok::lbrace) ++curly_depth;
        if (type == Tok::rbrace) --curly_depth;
        pos += seq.size();
        matched = true;
        break;
      }
    }
    if (matched) continue;
    if (c == '\'' || c == '"') {
      ++pos;
      tokens.push_back({Tok::string, read_string(c)});
      ++pos;
      continue;
    }
    if (is_digit(c)) {
      std::string num;
      while (pos < src.size() && is_digit(src[pos])) num += src[pos++];
      if (!(lt && *lt == Tok::dot) && pos + 1 < src.size() && src[pos] == '.' && is_digit(src[pos + 1])) {
        num += src[pos++];
        while (pos < src.size() && is_digit(src[pos])) num += src[pos++];
      }
      tokens.push_back({Tok::number, std::move(num)});
      continue;
    }
    if (is_word_char(c)) {
      std::string word;
      while (pos < src.size() && is_word_char(src[pos])) word += src[pos++];
      tokens.push_back({Tok::ident, std::move(word)});
      continue;
    }
    fail(std::string("Unexpected character: ") + c);
  }
  return tokens;
}

}  // namespace paged::jinja
