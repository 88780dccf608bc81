#include "tools/bench/serve_protocol.h"

#include <boost/json.hpp>

#include <stdexcept>

namespace paged::bench {

namespace json = boost::json;

BaseUrl parse_base_url(const std::string& url) {
  BaseUrl b;
  b.tls = url.rfind("https://", 0) == 0;
  if (!b.tls && url.rfind("http://", 0) != 0)
    throw std::invalid_argument("--base-url '" + url + "': only http(s)://HOST[:PORT][/PREFIX] is supported");
  if (b.tls) b.port = 443;
  const std::string rest = url.substr(url.find("://") + 3);
  const size_t slash = rest.find('/');
  std::string authority = rest.substr(0, slash);
  b.prefix = slash == std::string::npos ? "" : rest.substr(slash);
  while (!b.prefix.empty() && b.prefix.back() == '/') b.prefix.pop_back();
  size_t host_end = authority.size();
  if (!authority.empty() && authority[0] == '[') {  // [::1]:8000
    const size_t close = authority.find(']');
    if (close == std::string::npos) throw std::invalid_argument("--base-url '" + url + "': unclosed '['");
    b.host = authority.substr(1, close - 1);
    host_end = close + 1;
  } else {
    host_end = std::min(authority.find(':'), authority.size());
    b.host = authority.substr(0, host_end);
  }
  if (b.host.empty()) throw std::invalid_argument("--base-url '" + url + "' names no host");
  if (host_end < authority.size()) {
    const std::string port = authority.substr(host_end + 1);
    if (authority[host_end] != ':' || port.empty() || port.size() > 5 ||
        port.find_first_not_of("0123456789") != std::string::npos || std::stoi(port) < 1 || std::stoi(port) > 65535)
      throw std::invalid_argument("--base-url '" + url + "': the port must be a number in [1, 65535]");
    b.port = static_cast<uint16_t>(std::stoi(port));
  }
  return b;
}

std::string completion_body(const std::string& model, const BenchRequest& request, bool ignore_eos,
                            const json::value* json_schema) {
  json::object body;
  body["model"] = model;
  if (request.prompt_text.empty()) {
    json::array ids;
    for (TokenId t : request.prompt_ids) ids.push_back(t);
    body["prompt"] = std::move(ids);
  } else {
    body["prompt"] = request.prompt_text;
  }
  body["temperature"] = 0.0;
  body["max_tokens"] = request.output_len;
  body["stream"] = true;
  body["stream_options"] = json::object{{"include_usage", true}};
  if (ignore_eos) body["ignore_eos"] = true;
  if (json_schema)
    body["response_format"] = json::object{{"type", "json_schema"},
                                           {"json_schema", json::object{{"name", "bench"}, {"schema", *json_schema}}}};
  return json::serialize(body);
}

std::vector<std::string> SseParser::feed(std::string_view bytes) {
  std::vector<std::string> events;
  pending_.append(bytes);
  size_t begin = 0;
  for (size_t end; (end = pending_.find('\n', begin)) != std::string::npos; begin = end + 1) {
    std::string_view line(pending_.data() + begin, end - begin);
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    if (line.empty()) {  // the event ends
      if (has_data_) events.push_back(std::move(data_));
      data_.clear();
      has_data_ = false;
      continue;
    }
    if (line.front() == ':') continue;
    const size_t colon = line.find(':');
    if (line.substr(0, colon) != "data") continue;
    std::string_view value = colon == std::string_view::npos ? std::string_view() : line.substr(colon + 1);
    if (!value.empty() && value.front() == ' ') value.remove_prefix(1);
    if (has_data_) data_ += '\n';
    data_.append(value);
    has_data_ = true;
  }
  pending_.erase(0, begin);
  return events;
}

StreamRecorder::StreamRecorder(int prompt_len) { result_.prompt_len = prompt_len; }

void StreamRecorder::feed(std::string_view bytes, double t) {
  for (const std::string& data : sse_.feed(bytes)) take(data, t);
}

void StreamRecorder::take(const std::string& data, double t) {
  if (data == "[DONE]") {
    done_seen_ = true;
    return;
  }
  boost::system::error_code ec;
  const json::value v = json::parse(data, ec);
  if (ec || !v.is_object()) {
    if (result_.error.empty()) result_.error = "an event is not a JSON object: " + data.substr(0, 200);
    return;
  }
  const json::object& o = v.get_object();
  const json::value* error = o.if_contains("error");
  const json::value* object = o.if_contains("object");
  if (error || (object && object->is_string() && object->get_string() == "error")) {
    const json::value* message = error && error->is_object() ? error->get_object().if_contains("message")
                                 : error                     ? error
                                                             : o.if_contains("message");
    if (result_.error.empty())
      result_.error = "error event: " + (message && message->is_string() ? std::string(message->get_string())
                                                                           : json::serialize(v));
    return;
  }
  const json::value* choices = o.if_contains("choices");
  if (choices && choices->is_array() && !choices->get_array().empty()) {
    if (!first_choice_seen_) {
      first_choice_seen_ = true;
      result_.ttft = t;
    } else {
      result_.itl.push_back(t - last_choice_t_);
    }
    last_choice_t_ = t;
    const json::value& choice = choices->get_array()[0];
    const json::value* text = choice.is_object() ? choice.get_object().if_contains("text") : nullptr;
    if (text && text->is_string()) result_.generated_text.append(text->get_string());
    return;
  }
  const json::value* usage = o.if_contains("usage");
  if (usage && usage->is_object()) {
    const json::value* tokens = usage->get_object().if_contains("completion_tokens");
    if (tokens && tokens->is_int64()) {
      result_.output_tokens = static_cast<int>(tokens->get_int64());
      usage_seen_ = true;
    }
  }
}

RequestResult StreamRecorder::finish(bool complete, const std::string& why) {
  RequestResult r = std::move(result_);
  r.latency = last_choice_t_;
  if (r.error.empty()) {
    if (!complete) r.error = "the stream was cut: " + why;
    else if (!first_choice_seen_) r.error = "no chunk with a choice arrived";
    else if (!usage_seen_) r.error = "no usage chunk arrived (stream_options.include_usage)";
    else if (!done_seen_) r.error = "the stream ended without [DONE]";
  }
  r.success = r.error.empty();
  return r;
}

}  // namespace paged::bench
