#include "model/json_file.h"

#include <fstream>
#include <iterator>

namespace paged {

std::optional<std::string> read_file(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return std::nullopt;
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

boost::json::object read_json_object(const std::filesystem::path& path, std::string& error) {
  error.clear();
  const std::optional<std::string> text = read_file(path);
  if (!text) {
    error = path.string() + ": cannot open";
    return {};
  }
  boost::system::error_code ec;
  boost::json::value value = boost::json::parse(*text, ec);
  if (ec) {
    error = path.string() + ": malformed JSON (" + ec.message() + ")";
    return {};
  }
  if (!value.is_object()) {
    error = path.string() + ": not a JSON object";
    return {};
  }
  return std::move(value.as_object());
}

}  // namespace paged
