// The wire side of `paged bench serve`, free of sockets: the base URL, the request body, the server-sent events of a
// streamed /v1/completions and how vLLM's benchmark turns them into one request's timings.
#pragma once

#include <boost/json/value.hpp>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "tools/bench/bench_stats.h"
#include "tools/bench/datasets.h"

namespace paged::bench {

/// "http://HOST[:PORT][/PREFIX]": PORT 80 when absent, PREFIX without a trailing '/' ("" for none).
struct BaseUrl {
  bool tls = false;  // https://
  std::string host;
  uint16_t port = 80;  // 443 for https:// without a port
  std::string prefix;
};
/// Parses --base-url, http:// or https://; std::invalid_argument naming what is wrong (another scheme, no host, a
/// bad port).
BaseUrl parse_base_url(const std::string& url);

/// The JSON body of one streamed completion: the prompt as token ids, or as text when the request has one;
/// greedy, max_tokens the request's output length, usage in the last chunk, ignore_eos when asked; with
/// `json_schema`, a response_format asking that schema (structured outputs).
std::string completion_body(const std::string& model, const BenchRequest& request, bool ignore_eos,
                            const boost::json::value* json_schema = nullptr);

/// Splits a text/event-stream into events: lines end in "\n" or "\r\n", a blank line ends an event, ':' lines are
/// comments, the "data" lines of one event are joined with '\n'; other fields are ignored.
class SseParser {
 public:
  /// The data of every event that `bytes` completes, in order.
  std::vector<std::string> feed(std::string_view bytes);

 private:
  std::string pending_;  // bytes of an unfinished line
  std::string data_;     // the data lines of the current event
  bool has_data_ = false;
};

/// One request's timings from its streamed body, as vLLM's request function takes them: TTFT at the first chunk
/// with a choice, each later such chunk adds a gap to ITL, the latency is the last one's time; the usage chunk
/// gives the output tokens. It succeeds only with a choice, the usage, "[DONE]", no error event and a body that
/// ended properly.
class StreamRecorder {
 public:
  explicit StreamRecorder(int prompt_len);
  /// Body bytes that arrived `t` seconds after the request was sent.
  void feed(std::string_view bytes, double t);
  /// The result once the body ended; `complete` false: it was cut (`why` says how).
  RequestResult finish(bool complete, const std::string& why);

 private:
  void take(const std::string& data, double t);

  SseParser sse_;
  RequestResult result_;
  bool first_choice_seen_ = false, usage_seen_ = false, done_seen_ = false;
  double last_choice_t_ = 0;
};

}  // namespace paged::bench
