#include "http/tool_call_parser.h"

#include <cctype>

#include <boost/json.hpp>

#include "model/unicode/utf8.h"

namespace paged::openai {

namespace json = boost::json;

namespace {

constexpr std::string_view kPythonTag = "<|python_tag|>";
constexpr std::string_view kCallOpen = "<tool_call>";
constexpr std::string_view kCallClose = "</tool_call>";
constexpr std::string_view kToolCalls = "[TOOL_CALLS]";  // Mistral's
constexpr std::string_view kArgs = "[ARGS]";
constexpr std::string_view kCallId = "[CALL_ID]";
constexpr std::string_view kPythonStart = "<|python_start|>";  // Llama 4's, around pythonic calls
constexpr std::string_view kPythonEnd = "<|python_end|>";
constexpr int kMaxLiteralDepth = 32;  // nesting of a pythonic argument's lists and dicts
constexpr size_t npos = std::string_view::npos;

bool is_space(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }

size_t skip_spaces(std::string_view text, size_t pos) {
  while (pos < text.size() && is_space(text[pos])) ++pos;
  return pos;
}

// Whether text[pos..] is a proper beginning of `word` (the text ends inside it).
bool begins(std::string_view text, size_t pos, std::string_view word) {
  const std::string_view rest = text.substr(pos);
  return rest.size() < word.size() && word.starts_with(rest);
}

// One past the JSON value at text[pos] (no leading space), npos when the text ends inside it (a number or a literal
// at the end of an answer not `ended` may go on); `bad` when a byte cannot belong to it. It follows the structure
// (strings and their escapes, nesting); whether the value is valid JSON is json::parse's to say.
size_t value_end(std::string_view text, size_t pos, bool ended, bool& bad) {
  const char first = text[pos];
  if (first != '"' && first != '{' && first != '[') {
    if (first != '-' && !(first >= '0' && first <= '9') && first != 't' && first != 'f' && first != 'n') {
      bad = true;
      return npos;
    }
    size_t end = pos;
    while (end < text.size() && (std::isalnum(static_cast<unsigned char>(text[end])) || text[end] == '+' ||
                                 text[end] == '-' || text[end] == '.'))
      ++end;
    return end < text.size() || ended ? end : npos;
  }
  std::string closers;  // the brackets open, innermost last
  bool in_string = false, escaped = false;
  for (size_t i = pos; i < text.size(); ++i) {
    const char c = text[i];
    if (in_string) {
      if (escaped) escaped = false;
      else if (c == '\\') escaped = true;
      else if (c == '"') in_string = false;
    } else if (c == '"') {
      in_string = true;
    } else if (c == '{' || c == '[') {
      closers.push_back(c == '{' ? '}' : ']');
    } else if (c == '}' || c == ']') {
      if (closers.empty() || closers.back() != c) {
        bad = true;
        return npos;
      }
      closers.pop_back();
    }
    if (!in_string && closers.empty()) return i + 1;
  }
  return npos;
}

// A call's object at text[pos] == '{' as far as the text goes.
struct CallScan {
  enum class State { complete, partial, bad };
  ToolCallText call;
  State state = State::partial;
  size_t end = npos;           // one past the object, when complete
  bool has_arguments = false;  // its arguments key came
};

CallScan scan_call(std::string_view text, size_t pos, bool ended) {
  CallScan s;
  const auto bad = [&] {
    s.state = CallScan::State::bad;
    return s;
  };
  size_t at = pos + 1;
  for (bool first = true;; first = false) {
    at = skip_spaces(text, at);
    if (at == text.size()) return s;
    if (text[at] == '}' && first) break;
    if (text[at] != '"') return bad();
    bool malformed = false;
    const size_t key_end = value_end(text, at, ended, malformed);
    if (malformed) return bad();
    if (key_end == npos) return s;
    boost::system::error_code ec;
    const json::value key = json::parse(text.substr(at, key_end - at), ec);
    if (ec) return bad();
    at = skip_spaces(text, key_end);
    if (at == text.size()) return s;
    if (text[at] != ':') return bad();
    at = skip_spaces(text, at + 1);
    if (at == text.size()) return s;
    const size_t end = value_end(text, at, ended, malformed);
    if (malformed) return bad();
    if (key.as_string() == "name") {
      if (end != npos) {
        const json::value name = json::parse(text.substr(at, end - at), ec);
        if (ec || !name.is_string()) return bad();
        s.call.name = std::string(name.get_string());
      }
    } else if (key.as_string() == "parameters" || key.as_string() == "arguments") {
      s.call.arguments = std::string(text.substr(at, end == npos ? npos : end - at));
      s.has_arguments = true;
    }
    if (end == npos) return s;
    at = skip_spaces(text, end);
    if (at == text.size()) return s;
    if (text[at] == '}') break;
    if (text[at] != ',') return bad();
    ++at;
  }
  s.state = CallScan::State::complete;
  s.call.complete = true;
  s.end = at + 1;
  return s;
}

// Whether a complete call's object is a valid call: JSON, with a string name and arguments.
bool valid_call(std::string_view object, const CallScan& s) {
  boost::system::error_code ec;
  const json::value v = json::parse(object, ec);
  return !ec && v.is_object() && !s.call.name.empty() && s.has_arguments;
}

// The call at text[pos] (no leading space) added to `out` as far as it is written: one past its object when that is
// complete and a valid call; else npos, and `valid` false unless the call is only cut short in a stream's prefix.
size_t take_call(std::string_view text, size_t pos, bool ended, ToolCallScan& out, bool& valid) {
  if (text[pos] != '{') {
    valid = false;
    return npos;
  }
  const CallScan s = scan_call(text, pos, ended);
  if (s.state != CallScan::State::bad) out.calls.push_back(s.call);
  if (s.state == CallScan::State::complete && valid_call(text.substr(pos, s.end - pos), s)) return s.end;
  valid = valid && !ended && s.state == CallScan::State::partial;
  return npos;
}

// The calls from text[pos] on, one object after another with `separator` (and spaces) between them, `close` after
// the last (0: none, the text's end). `valid` stays true when they end well (ended: the text's end is reached too).
// Returns where the scan stopped.
size_t scan_calls(std::string_view text, size_t pos, char separator, char close, bool ended, ToolCallScan& out,
                  bool& valid) {
  while (true) {
    pos = skip_spaces(text, pos);
    if (pos == text.size()) {
      valid = valid && !ended;  // nothing, where a call or the close should come
      return pos;
    }
    const size_t end = take_call(text, pos, ended, out, valid);
    if (end == npos) return text.size();
    pos = skip_spaces(text, end);
    if (pos == text.size()) {
      valid = valid && close == 0;
      return pos;
    }
    if (close != 0 && text[pos] == close) return pos + 1;
    if (text[pos] != separator) {
      valid = false;
      return pos;
    }
    ++pos;
  }
}

// Where the calls of a format that opens them with `tag` begin (npos: no tag; then `out` gets the content, in a
// stream all but a tail that may begin the tag, and `valid` goes false); else `out` gets the content before it.
size_t find_opening(std::string_view text, std::string_view tag, bool ended, ToolCallScan& out, bool& valid) {
  const size_t open = text.find(tag);
  if (open != npos) {
    out.content = std::string(text.substr(0, open));
    return open;
  }
  valid = false;
  if (ended) return npos;
  size_t keep = text.size();
  for (size_t k = std::min(text.size(), tag.size() - 1); k > 0; --k)
    if (tag.starts_with(text.substr(text.size() - k))) {
      keep = text.size() - k;
      break;
    }
  out.content = std::string(text.substr(0, keep));
  return npos;
}

// Hermes: content, then <tool_call>CALL</tool_call> blocks (text between and after them dropped).
ToolCallScan scan_hermes(std::string_view text, bool ended, bool& valid) {
  ToolCallScan out;
  size_t open = find_opening(text, kCallOpen, ended, out, valid);
  if (open == npos) return out;
  while (open != npos) {
    size_t pos = skip_spaces(text, open + kCallOpen.size());
    if (pos == text.size()) {
      valid = valid && !ended;
      return out;
    }
    const size_t end = take_call(text, pos, ended, out, valid);
    if (end == npos) return out;
    pos = skip_spaces(text, end);
    if (text.substr(pos).starts_with(kCallClose)) {
      open = text.find(kCallOpen, pos + kCallClose.size());
    } else if (pos == text.size() || (!ended && begins(text, pos, kCallClose))) {
      return out;  // the last call left open, or its close on the way
    } else {
      valid = false;
      return out;
    }
  }
  return out;
}

// Mistral, v11+: NAME[ARGS]ARGUMENTS from text[pos] on (NAME[CALL_ID]ID[ARGS] too), each further call after its own
// [TOOL_CALLS]; text after the last dropped. A call is added once its name is complete ([ARGS] reached).
void scan_mistral_named(std::string_view text, size_t pos, bool ended, ToolCallScan& out, bool& valid) {
  const auto cut = [&] { valid = valid && !ended; };  // the text ends where more must come
  while (true) {
    size_t at = pos;
    while (at < text.size() && (std::isalnum(static_cast<unsigned char>(text[at])) || text[at] == '_' ||
                                text[at] == '-' || text[at] == '.'))
      ++at;
    if (at == text.size()) return cut();
    const std::string name(text.substr(pos, at - pos));
    if (name.empty() || text[at] != '[') {
      valid = false;
      return;
    }
    if (text.substr(at).starts_with(kCallId)) {
      at = text.find(kArgs, at + kCallId.size());
      if (at == npos) return cut();
    }
    if (!text.substr(at).starts_with(kArgs)) {
      if (!(begins(text, at, kArgs) || begins(text, at, kCallId))) valid = false;
      else cut();
      return;
    }
    at = skip_spaces(text, at + kArgs.size());
    ToolCallText call{name, "", false};
    if (at == text.size()) {
      out.calls.push_back(call);
      return cut();
    }
    bool bad = text[at] != '{';
    const size_t end = bad ? npos : value_end(text, at, ended, bad);
    if (bad) {
      valid = false;
      return;
    }
    call.arguments = std::string(text.substr(at, end == npos ? npos : end - at));
    if (end == npos) {
      out.calls.push_back(call);
      return cut();
    }
    boost::system::error_code ec;
    if (!json::parse(call.arguments, ec).is_object() || ec) {
      valid = false;
      return;
    }
    call.complete = true;
    out.calls.push_back(std::move(call));
    const size_t next = skip_spaces(text, end);
    if (text.substr(next).starts_with(kToolCalls)) {
      pos = skip_spaces(text, next + kToolCalls.size());
      continue;
    }
    return;  // the rest (or a [TOOL_CALLS] on its way: a next call would come after it) is not read
  }
}

// Mistral: content, then [TOOL_CALLS] and the calls: a JSON list (v3 tokenizers) or NAME[ARGS]ARGUMENTS.
ToolCallScan scan_mistral(std::string_view text, bool ended, bool& valid) {
  ToolCallScan out;
  const size_t open = find_opening(text, kToolCalls, ended, out, valid);
  if (open == npos) return out;
  const size_t pos = skip_spaces(text, open + kToolCalls.size());
  if (pos == text.size()) {
    valid = valid && !ended;
  } else if (text[pos] == '[') {
    scan_calls(text, pos + 1, ',', ']', ended, out, valid);
  } else {
    scan_mistral_named(text, pos, ended, out, valid);
  }
  return out;
}

// ---- pythonic: Python literals as JSON ------------------------------------------------------------------------

// Reading a Python literal at text[pos]: `end` one past it and `json` its JSON text when it is complete; `cut` when
// the text ends inside it (a stream's prefix); else `bad`.
struct Literal {
  size_t end = npos;
  std::string json;
  bool cut = false, bad = false;
};

bool is_name_start(char c) { return std::isalpha(static_cast<unsigned char>(c)) || c == '_'; }
bool is_name_char(char c) { return std::isalnum(static_cast<unsigned char>(c)) || c == '_'; }

Literal python_literal(std::string_view text, size_t pos, bool ended, int depth);

// A quoted string ('...' or "..."): its escapes decoded (\\, \', \", \n, \t, \r, \b, \f, \0, \xHH, \uHHHH,
// \UHHHHHHHH; an unknown escape keeps its backslash, as Python's), as a JSON string.
Literal python_string(std::string_view text, size_t pos) {
  Literal r;
  const char quote = text[pos];
  std::string value;
  const auto hex = [&](size_t at, int digits, char32_t& cp) {
    if (at + digits > text.size()) return 0;  // cut
    cp = 0;
    for (int i = 0; i < digits; ++i) {
      const char c = text[at + i];
      const int d = std::isdigit(static_cast<unsigned char>(c)) ? c - '0'
                    : (c >= 'a' && c <= 'f')                    ? c - 'a' + 10
                    : (c >= 'A' && c <= 'F')                    ? c - 'A' + 10
                                                                 : -1;
      if (d < 0) return -1;
      cp = cp * 16 + static_cast<char32_t>(d);
    }
    return 1;
  };
  for (size_t i = pos + 1; i < text.size(); ++i) {
    const char c = text[i];
    if (c == quote) {
      r.end = i + 1;
      r.json = boost::json::serialize(json::string(value));
      if (!utf8::is_valid(value)) r.bad = true;
      return r;
    }
    if (c == '\n') break;  // a single-quoted string does not span lines
    if (c != '\\') {
      value += c;
      continue;
    }
    if (++i == text.size()) break;
    const char e = text[i];
    const int digits = e == 'x' ? 2 : e == 'u' ? 4 : e == 'U' ? 8 : 0;
    if (digits > 0) {
      char32_t cp = 0;
      const int got = hex(i + 1, digits, cp);
      if (got == 0) break;
      if (got < 0 || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) {
        r.bad = true;
        return r;
      }
      utf8::append(value, cp);
      i += digits;
      continue;
    }
    switch (e) {
      case '\\': value += '\\'; break;
      case '\'': value += '\''; break;
      case '"': value += '"'; break;
      case 'n': value += '\n'; break;
      case 't': value += '\t'; break;
      case 'r': value += '\r'; break;
      case 'b': value += '\b'; break;
      case 'f': value += '\f'; break;
      case '0': value += '\0'; break;
      default: value += '\\'; value += e;
    }
  }
  if (r.end == npos && !r.bad) r.cut = true;
  return r;
}

// Items of a list, tuple ([..] / (..), as a JSON array) or dict ({k: v}, as a JSON object; keys strings or numbers,
// numbers as their text) from text[pos] (its opening bracket), a trailing comma allowed.
Literal python_container(std::string_view text, size_t pos, bool ended, int depth) {
  Literal r;
  const char open = text[pos];
  const char close = open == '[' ? ']' : open == '(' ? ')' : '}';
  const bool dict = open == '{';
  std::string out(1, dict ? '{' : '[');
  size_t at = pos + 1;
  for (bool first = true;; first = false) {
    at = skip_spaces(text, at);
    if (at == text.size()) break;
    if (text[at] == close) {
      r.end = at + 1;
      r.json = out + (dict ? '}' : ']');
      return r;
    }
    if (!first) {
      if (text[at] != ',') return r.bad = true, r;
      at = skip_spaces(text, at + 1);
      if (at == text.size()) break;
      if (text[at] == close) continue;  // a trailing comma: closed next round
      out += ", ";
    }
    Literal item = python_literal(text, at, ended, depth + 1);
    if (item.bad || item.cut) return item;
    if (dict) {
      std::string key = item.json;
      if (key.empty() || key[0] != '"') {  // a number key, written as its text
        if (key == "true" || key == "false" || key == "null" || key[0] == '[' || key[0] == '{') return r.bad = true, r;
        key = boost::json::serialize(json::string(key));
      }
      at = skip_spaces(text, item.end);
      if (at == text.size()) break;
      if (text[at] != ':') return r.bad = true, r;
      at = skip_spaces(text, at + 1);
      if (at == text.size()) break;
      item = python_literal(text, at, ended, depth + 1);
      if (item.bad || item.cut) return item;
      out += key + ": ";
    }
    out += item.json;
    at = item.end;
  }
  r.cut = true;
  return r;
}

Literal python_literal(std::string_view text, size_t pos, bool ended, int depth) {
  Literal r;
  if (depth > kMaxLiteralDepth) return r.bad = true, r;
  const char c = text[pos];
  if (c == '\'' || c == '"') {
    r = python_string(text, pos);
    r.bad = r.bad || (r.cut && ended);
    return r;
  }
  if (c == '[' || c == '(' || c == '{') {
    r = python_container(text, pos, ended, depth);
    r.bad = r.bad || (r.cut && ended);
    return r;
  }
  size_t end = pos;
  while (end < text.size() && (std::isalnum(static_cast<unsigned char>(text[end])) || text[end] == '_' ||
                               text[end] == '.' || text[end] == '+' || text[end] == '-'))
    ++end;
  if (end == text.size() && !ended) return r.cut = true, r;  // a word or number may go on
  const std::string_view word = text.substr(pos, end - pos);
  r.end = end;
  if (word == "True" || word == "False" || word == "None") {
    r.json = word == "True" ? "true" : word == "False" ? "false" : "null";
    return r;
  }
  // A number: JSON's own text where it is JSON, else the value Python reads (1., .5, +2, 1_000 are not JSON).
  std::string digits;
  for (char d : word)
    if (d != '_') digits += d;
  if (digits.empty() || !(std::isdigit(static_cast<unsigned char>(digits[0])) || digits[0] == '-' ||
                          digits[0] == '+' || digits[0] == '.'))
    return r.bad = true, r;
  boost::system::error_code ec;
  const json::value v = json::parse(digits, ec);
  if (!ec && v.is_number()) {
    r.json = digits;
    return r;
  }
  char* stop = nullptr;
  const double d = std::strtod(digits.c_str(), &stop);
  if (stop != digits.c_str() + digits.size() || !std::isfinite(d)) return r.bad = true, r;
  r.json = boost::json::serialize(json::value(d));
  return r;
}

// Pythonic: [NAME(KEY=VALUE, ...), ...] and nothing else (spaces, <|python_start|> / <|python_end|> around it).
ToolCallScan scan_pythonic(std::string_view text, bool ended, bool& valid) {
  ToolCallScan out;
  const auto cut = [&] {
    valid = valid && !ended;
    return out;
  };
  const auto bad = [&] {
    valid = false;
    return out;
  };
  size_t pos = skip_spaces(text, 0);
  if (text.substr(pos).starts_with(kPythonStart)) pos = skip_spaces(text, pos + kPythonStart.size());
  if (!ended && (pos == text.size() || begins(text, pos, kPythonStart))) return bad();  // undecided: held back
  if (pos == text.size() || text[pos] != '[') {
    if (!ended) out.content = std::string(text);  // no call: content throughout
    return bad();
  }
  pos = skip_spaces(text, pos + 1);
  for (bool first = true;; first = false) {
    if (pos == text.size()) return cut();
    if (text[pos] == ']' && !first) break;
    if (!is_name_start(text[pos])) return bad();
    size_t at = pos;
    while (at < text.size() && (is_name_char(text[at]) || text[at] == '.')) ++at;
    if (at == text.size()) return cut();
    if (text[at] != '(') return bad();
    ToolCallText call{std::string(text.substr(pos, at - pos)), "{", false};
    at = skip_spaces(text, at + 1);
    for (bool first_arg = true;; first_arg = false) {
      if (at == text.size()) return out.calls.push_back(call), cut();
      if (text[at] == ')') break;
      if (!first_arg) {
        if (text[at] != ',') return bad();
        at = skip_spaces(text, at + 1);
        if (at == text.size()) return out.calls.push_back(call), cut();
        if (text[at] == ')') break;
      }
      const size_t key = at;
      if (!is_name_start(text[at])) return bad();  // keyword arguments only
      while (at < text.size() && is_name_char(text[at])) ++at;
      const std::string name(text.substr(key, at - key));
      at = skip_spaces(text, at);
      if (at == text.size()) return out.calls.push_back(call), cut();
      if (text[at] != '=') return bad();
      at = skip_spaces(text, at + 1);
      if (at == text.size()) return out.calls.push_back(call), cut();
      const Literal value = python_literal(text, at, ended, 0);
      if (value.bad) return bad();
      if (value.cut) return out.calls.push_back(call), cut();
      call.arguments += (call.arguments.size() > 1 ? ", " : "") + boost::json::serialize(json::string(name)) + ": " +
                        value.json;
      at = skip_spaces(text, value.end);
    }
    call.arguments += '}';
    call.complete = true;
    out.calls.push_back(std::move(call));
    pos = skip_spaces(text, at + 1);
    if (pos == text.size()) return cut();
    if (text[pos] == ']') break;
    if (text[pos] != ',') return bad();
    pos = skip_spaces(text, pos + 1);
  }
  // After the list: nothing but spaces and a closing <|python_end|>.
  pos = skip_spaces(text, pos + 1);
  if (text.substr(pos).starts_with(kPythonEnd)) pos = skip_spaces(text, pos + kPythonEnd.size());
  else if (!ended && begins(text, pos, kPythonEnd)) return out;
  if (pos != text.size()) return bad();
  return out;
}

// Llama 3 JSON: [<|python_tag|>]CALL; CALL... with nothing before.
ToolCallScan scan_llama3(std::string_view text, bool ended, bool& valid) {
  ToolCallScan out;
  size_t pos = skip_spaces(text, 0);
  if (text.substr(pos).starts_with(kPythonTag)) pos = skip_spaces(text, pos + kPythonTag.size());
  if (!ended && (pos == text.size() || begins(text, pos, kPythonTag))) {
    valid = false;  // undecided: held back
    return out;
  }
  if (pos == text.size() || text[pos] != '{') {
    valid = false;
    if (!ended) out.content = std::string(text);  // no call: content throughout
    return out;
  }
  scan_calls(text, pos, ';', 0, ended, out, valid);
  return out;
}

}  // namespace

std::optional<ToolCallFormat> tool_call_parser_named(std::string_view name) {
  if (name == "llama3_json") return ToolCallFormat::llama3_json;
  if (name == "hermes") return ToolCallFormat::hermes;
  if (name == "mistral") return ToolCallFormat::mistral;
  if (name == "pythonic") return ToolCallFormat::pythonic;
  return std::nullopt;
}

ToolCallScan scan_tool_calls(ToolCallFormat format, std::string_view text, bool ended, std::string_view function) {
  ToolCallScan out;
  bool valid = true;
  switch (format) {
    case ToolCallFormat::none:
      valid = false;
      break;
    case ToolCallFormat::arguments: {
      boost::system::error_code ec;
      if (ended) json::parse(text, ec);
      out.calls.push_back(ToolCallText{std::string(function), std::string(text), ended && !ec});
      valid = !ended || !ec;
      break;
    }
    case ToolCallFormat::json_list: {
      const size_t pos = skip_spaces(text, 0);
      if (pos == text.size() && !ended) return out;
      if (pos == text.size() || text[pos] != '[') {
        valid = false;
        break;
      }
      const size_t end = scan_calls(text, pos + 1, ',', ']', ended, out, valid);
      if (ended && skip_spaces(text, end) != text.size()) valid = false;
      break;
    }
    case ToolCallFormat::llama3_json:
      out = scan_llama3(text, ended, valid);
      break;
    case ToolCallFormat::hermes:
      out = scan_hermes(text, ended, valid);
      break;
    case ToolCallFormat::mistral:
      out = scan_mistral(text, ended, valid);
      break;
    case ToolCallFormat::pythonic:
      out = scan_pythonic(text, ended, valid);
      break;
  }
  if (ended && !valid) return ToolCallScan{std::string(text), {}};
  return out;
}

}  // namespace paged::openai
