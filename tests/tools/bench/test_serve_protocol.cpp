// `paged bench serve` without sockets: the base URL, the request body, server-sent events, the timings of one
// stream, the --goodput argument form, and the progress line.
#include <catch2/catch.hpp>

#include <boost/json.hpp>

#include <sstream>

#include "tools/bench/progress.h"
#include "tools/bench/serve_bench.h"
#include "tools/bench/serve_protocol.h"

using namespace paged::bench;
namespace json = boost::json;

TEST_CASE("parse_base_url: host, port, prefix", "[bench]") {
  const BaseUrl a = parse_base_url("http://127.0.0.1:8000");
  CHECK((a.host == "127.0.0.1" && a.port == 8000 && a.prefix.empty()));
  const BaseUrl b = parse_base_url("http://localhost");
  CHECK((b.host == "localhost" && b.port == 80));
  CHECK(parse_base_url("http://h:81/api/").prefix == "/api");
  const BaseUrl c = parse_base_url("http://[::1]:9000/x");
  CHECK((c.host == "::1" && c.port == 9000 && c.prefix == "/x"));
  CHECK_FALSE(c.tls);
  const BaseUrl d = parse_base_url("https://api.example:8443/v");
  CHECK((d.tls && d.host == "api.example" && d.port == 8443 && d.prefix == "/v"));
  const BaseUrl e = parse_base_url("https://api.example");
  CHECK((e.tls && e.port == 443));
  for (const char* bad : {"ftp://h:1", "127.0.0.1:8000", "http://", "https://", "http://:80", "http://h:0",
                          "http://h:99999", "http://h:8a", "http://h:", "http://[::1", "httpx://h"})
    CHECK_THROWS_AS(parse_base_url(bad), std::invalid_argument);
}

TEST_CASE("completion_body: ids or text, greedy, streamed with usage", "[bench]") {
  BenchRequest ids;
  ids.prompt_ids = {5, 6, 7};
  ids.prompt_len = 3;
  ids.output_len = 9;
  const json::object a = json::parse(completion_body("m", ids, false)).as_object();
  CHECK(a.at("model") == "m");
  CHECK(a.at("prompt") == json::array{5, 6, 7});
  CHECK(a.at("max_tokens") == 9);
  CHECK(a.at("temperature").to_number<double>() == 0);
  CHECK(a.at("stream") == true);
  CHECK(a.at("stream_options") == json::object{{"include_usage", true}});
  CHECK_FALSE(a.contains("ignore_eos"));
  BenchRequest text = ids;
  text.prompt_text = "Once upon";
  const json::object b = json::parse(completion_body("m", text, true)).as_object();
  CHECK(b.at("prompt") == "Once upon");
  CHECK(b.at("ignore_eos") == true);
  CHECK_FALSE(b.contains("response_format"));
  const json::value schema = json::parse(R"({"type": "object"})");
  const json::object c = json::parse(completion_body("m", ids, false, &schema)).as_object();
  CHECK(c.at("response_format") ==
        json::object{{"type", "json_schema"}, {"json_schema", json::object{{"name", "bench"}, {"schema", schema}}}});
}

TEST_CASE("SseParser: events across any split, CRLF, comments, multi-line data", "[bench]") {
  const std::string stream =
      ": keep-alive\r\ndata: {\"a\":1}\r\n\r\nevent: x\ndata: one\ndata: two\n\nid: 3\n\ndata:[DONE]\n\n";
  const std::vector<std::string> want{"{\"a\":1}", "one\ntwo", "[DONE]"};
  for (size_t step : {1, 2, 5, 1000}) {
    SseParser parser;
    std::vector<std::string> got;
    for (size_t i = 0; i < stream.size(); i += step)
      for (std::string& e : parser.feed(std::string_view(stream).substr(i, step))) got.push_back(std::move(e));
    CHECK(got == want);
  }
  SseParser unfinished;
  CHECK(unfinished.feed("data: x\n").empty());  // no blank line yet
  CHECK(unfinished.feed("\n") == std::vector<std::string>{"x"});
}

namespace {

std::string chunk(const std::string& text) {
  return "data: {\"object\":\"text_completion\",\"choices\":[{\"index\":0,\"text\":\"" + text +
         "\",\"finish_reason\":null}],\"usage\":null}\n\n";
}
const std::string kUsage =
    "data: {\"choices\":[],\"usage\":{\"prompt_tokens\":4,\"completion_tokens\":3,\"total_tokens\":7}}\n\n";
const std::string kDone = "data: [DONE]\n\n";

}  // namespace

TEST_CASE("StreamRecorder: TTFT, ITL and latency from the chunk times, tokens from the usage chunk", "[bench]") {
  StreamRecorder r(4);
  r.feed(chunk(" a"), 0.5);
  r.feed(chunk(" b") + chunk(" c"), 0.75);  // two chunks in one read: the same arrival time
  r.feed(chunk(""), 1.0);                   // a chunk with a choice counts even without text, as in vLLM
  r.feed(kUsage, 1.25);
  r.feed(kDone, 1.5);
  const RequestResult got = r.finish(true, "");
  CHECK(got.success);
  CHECK(got.error.empty());
  CHECK(got.prompt_len == 4);
  CHECK(got.ttft == 0.5);
  CHECK(got.itl == std::vector<double>{0.25, 0.0, 0.25});
  CHECK(got.latency == 1.0);  // the last chunk with a choice, not the usage or [DONE]
  CHECK(got.output_tokens == 3);
  CHECK(got.generated_text == " a b c");
}

TEST_CASE("StreamRecorder: a cut stream, an error event, no usage, no choice or no [DONE] fail", "[bench]") {
  const auto result = [](const std::string& body, bool complete) {
    StreamRecorder r(1);
    r.feed(body, 0.1);
    return r.finish(complete, "end of stream");
  };
  const RequestResult cut = result(chunk("x"), false);
  CHECK_FALSE(cut.success);
  CHECK(cut.error == "the stream was cut: end of stream");
  const RequestResult error = result(chunk("x") +
      "data: {\"error\":{\"message\":\"the server is shutting down\",\"type\":\"server_error\"}}\n\n" + kDone, true);
  CHECK_FALSE(error.success);
  CHECK(error.error == "error event: the server is shutting down");
  CHECK_FALSE(result(chunk("x") + kDone, true).success);
  CHECK_FALSE(result(kUsage + kDone, true).success);
  CHECK_FALSE(result(chunk("x") + kUsage, true).success);
  CHECK(result(chunk("x") + kUsage + kDone, true).success);
  CHECK(result("data: {\"object\":\"error\",\"message\":\"bad\"}\n\n" + kDone, true).error == "error event: bad");
}

TEST_CASE("expand_multi_value_flags gives every word after --goodput its own flag", "[bench]") {
  std::vector<std::string> words{"paged", "bench", "serve", "--goodput", "ttft:5", "tpot:2", "--seed", "1",
                                 "--goodput=e2el:9", "--goodput", "--ignore-eos"};
  std::vector<char*> argv;
  for (std::string& w : words) argv.push_back(w.data());
  CHECK(expand_multi_value_flags(static_cast<int>(argv.size()), argv.data(), 3, {"goodput"}) ==
        std::vector<std::string>{"--goodput", "ttft:5", "--goodput", "tpot:2", "--seed", "1", "--goodput=e2el:9",
                                 "--goodput", "--ignore-eos"});
}

TEST_CASE("ProgressBar: plain lines at a bounded rate, the first and last always; a bar on a terminal", "[bench]") {
  std::ostringstream every;
  ProgressBar all(every, false, "run", 3, std::chrono::milliseconds(0));
  for (int done : {0, 1, 1, 2, 3}) all.update(done);
  CHECK(every.str() == "run: 0/3\nrun: 1/3\nrun: 2/3\nrun: 3/3\n");
  std::ostringstream sparse;
  ProgressBar few(sparse, false, "run", 3, std::chrono::hours(1));
  for (int done : {0, 1, 2, 3}) few.update(done);
  CHECK(sparse.str() == "run: 0/3\nrun: 3/3\n");
  std::ostringstream terminal;
  ProgressBar bar(terminal, true, "run", 4, std::chrono::milliseconds(0));
  bar.update(2);
  CHECK(terminal.str().rfind("\rrun 50% [###############               ] 2/4 ", 0) == 0);
  bar.update(4);
  const std::string end = terminal.str().substr(terminal.str().rfind('\r'));
  CHECK(end.rfind("\rrun 100% [##############################] 4/4 ", 0) == 0);
  CHECK(end.back() == '\n');
}
