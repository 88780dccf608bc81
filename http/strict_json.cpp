#include "http/strict_json.h"

#include <set>
#include <vector>

#include <boost/json/basic_parser_impl.hpp>
#include <boost/json/parse.hpp>

namespace paged::openai {

namespace {

// A basic_parser handler that only keeps the keys of the objects open, and stops at the first key given twice.
struct DuplicateKeyFinder {
  static constexpr size_t max_object_size = size_t(-1);
  static constexpr size_t max_array_size = size_t(-1);
  static constexpr size_t max_key_size = size_t(-1);
  static constexpr size_t max_string_size = size_t(-1);

  std::vector<std::set<std::string, std::less<>>> open;  // per open object, the keys it gave
  std::string key;                                        // the key being read
  std::optional<std::string> duplicate;

  using ec_t = boost::system::error_code;
  bool on_document_begin(ec_t&) { return true; }
  bool on_document_end(ec_t&) { return true; }
  bool on_object_begin(ec_t&) {
    open.emplace_back();
    return true;
  }
  bool on_object_end(size_t, ec_t&) {
    open.pop_back();
    return true;
  }
  bool on_array_begin(ec_t&) { return true; }
  bool on_array_end(size_t, ec_t&) { return true; }
  bool on_key_part(boost::json::string_view s, size_t, ec_t&) {
    key.append(s.data(), s.size());
    return true;
  }
  bool on_key(boost::json::string_view s, size_t, ec_t& ec) {
    key.append(s.data(), s.size());
    const bool fresh = open.back().insert(key).second;
    if (!fresh) {
      duplicate = key;
      ec = boost::json::error::extra_data;  // any error: it stops the parse, `duplicate` says why
    }
    key.clear();
    return fresh;
  }
  bool on_string_part(boost::json::string_view, size_t, ec_t&) { return true; }
  bool on_string(boost::json::string_view, size_t, ec_t&) { return true; }
  bool on_number_part(boost::json::string_view, ec_t&) { return true; }
  bool on_int64(int64_t, boost::json::string_view, ec_t&) { return true; }
  bool on_uint64(uint64_t, boost::json::string_view, ec_t&) { return true; }
  bool on_double(double, boost::json::string_view, ec_t&) { return true; }
  bool on_bool(bool, ec_t&) { return true; }
  bool on_null(ec_t&) { return true; }
  bool on_comment_part(boost::json::string_view, ec_t&) { return true; }
  bool on_comment(boost::json::string_view, ec_t&) { return true; }
};

}  // namespace

std::string StrictJsonError::message() const {
  return duplicate ? "the key '" + *duplicate + "' is given twice" : ec.message();
}

std::optional<boost::json::value> parse_strict(std::string_view text, StrictJsonError& error) {
  error = {};
  boost::json::value v = boost::json::parse(text, error.ec);
  if (error.ec) return std::nullopt;
  // Valid JSON: a second pass over it finds a key given twice (the parse above kept only its last value).
  boost::json::basic_parser<DuplicateKeyFinder> finder(boost::json::parse_options{});
  boost::system::error_code ec;
  finder.write_some(false, text.data(), text.size(), ec);
  if (finder.handler().duplicate) {
    error.duplicate = finder.handler().duplicate;
    return std::nullopt;
  }
  return v;
}

}  // namespace paged::openai
