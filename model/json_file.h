// Reading a JSON document from a file: the one reader of config.json, tokenizer.json, tokenizer_config.json,
// safetensors indexes, chat templates and server options.
#pragma once

#include <boost/json.hpp>
#include <filesystem>
#include <optional>
#include <string>

namespace paged {

/// The bytes of `path`, or nullopt when it cannot be opened.
std::optional<std::string> read_file(const std::filesystem::path& path);

/// The JSON object in `path`. On failure returns an empty object and sets `error` to a message that names the path:
/// "PATH: cannot open", "PATH: malformed JSON (WHY)" or "PATH: not a JSON object"; `error` is cleared on success.
boost::json::object read_json_object(const std::filesystem::path& path, std::string& error);

/// read_json_object, throwing Error (constructible from a std::string) with that message.
template <class Error>
boost::json::object read_json_object(const std::filesystem::path& path) {
  std::string error;
  boost::json::object object = read_json_object(path, error);
  if (!error.empty()) throw Error(error);
  return object;
}

}  // namespace paged
