// Request bodies and WebSocket frames as JSON, strictly: Boost.JSON keeps only the last of an object's keys given
// twice ({"max_tokens": 2, "max_tokens": 100000}), so a proxy or a validator that reads the first would pass what
// the server then does otherwise, and one of the two values would be ignored; such a text is refused here.
#pragma once

#include <optional>
#include <string>
#include <string_view>

#include <boost/json/value.hpp>
#include <boost/system/error_code.hpp>

namespace paged::openai {

/// What parse_strict found wrong: Boost.JSON's error (syntax, depth, UTF-8), or the first key an object gives twice.
struct StrictJsonError {
  boost::system::error_code ec;          // set when the text is not valid JSON
  std::optional<std::string> duplicate;  // else: the key given twice
  /// One line for an error message ("syntax error", "the key 'n' is given twice").
  std::string message() const;
};

/// Parses `text` as boost::json::parse does (default options: depth 32, no comments, valid UTF-8) and refuses an
/// object that holds a key twice, at any depth. Returns the value, or nullopt with `error` set.
std::optional<boost::json::value> parse_strict(std::string_view text, StrictJsonError& error);

}  // namespace paged::openai
