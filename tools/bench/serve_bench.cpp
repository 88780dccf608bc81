#include "tools/bench/serve_bench.h"

#include <boost/asio.hpp>
#include <boost/asio/ssl.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <boost/beast/ssl.hpp>
#include <boost/json.hpp>

#include <openssl/ssl.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <ctime>
#include <exception>
#include <fstream>
#include <iostream>
#include <limits>
#include <memory>
#include <optional>

#include <sys/resource.h>

#include "model/json_file.h"
#include "model/tokenizer/load_tokenizer.h"
#include "tools/bench/bench_stats.h"
#include "tools/bench/datasets.h"
#include "tools/bench/progress.h"
#include "tools/bench/serve_protocol.h"
#include "tools/cli.h"

namespace paged::bench {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
namespace json = boost::json;
using tcp = asio::ip::tcp;
using Clock = std::chrono::steady_clock;

std::vector<std::string> expand_multi_value_flags(int argc, char** argv, int first,
                                                  const std::vector<std::string>& multi_value) {
  std::vector<std::string> out;
  std::string flag;  // the multi-value flag whose words are being read, or ""
  for (int i = first; i < argc; ++i) {
    const std::string a = argv[i];
    if (a.rfind("--", 0) == 0) {
      const std::string name = a.substr(2);
      flag = std::find(multi_value.begin(), multi_value.end(), name) != multi_value.end() ? a : "";
      out.push_back(a);
      if (!flag.empty() && i + 1 < argc && std::string_view(argv[i + 1]).rfind("--", 0) != 0) out.push_back(argv[++i]);
      continue;
    }
    if (!flag.empty()) out.push_back(flag);
    out.push_back(a);
  }
  return out;
}

namespace {

/// How long a connection may take, and how long a response may stay silent before the request counts as failed.
constexpr auto kConnectTimeout = std::chrono::seconds(30);
constexpr auto kSilenceTimeout = std::chrono::minutes(10);

/// Where the requests go.
struct Target {
  BaseUrl url;
  std::string endpoint;
  std::string api_key;
  tcp::resolver::results_type endpoints;
  /// https://: the TLS context (the server's certificate checked against --ssl-ca-certs, else the system's CAs,
  /// and its name against the URL's host); null for http://.
  std::shared_ptr<asio::ssl::context> tls;
};

using TlsStream = beast::ssl_stream<beast::tcp_stream>;

// Connects `stream` to the target: over TLS, a handshake too (with the host's name for SNI and the certificate's
// check). Returns why it failed, or "".
asio::awaitable<std::string> open_stream(const Target& target, beast::tcp_stream& stream) {
  beast::error_code ec;
  co_await stream.async_connect(target.endpoints, asio::redirect_error(asio::use_awaitable, ec));
  co_return ec ? "cannot connect to " + target.url.host + ":" + std::to_string(target.url.port) + ": " + ec.message()
               : "";
}
asio::awaitable<std::string> open_stream(const Target& target, TlsStream& stream) {
  if (std::string failed = co_await open_stream(target, beast::get_lowest_layer(stream)); !failed.empty())
    co_return failed;
  if (!SSL_set_tlsext_host_name(stream.native_handle(), target.url.host.c_str()))
    co_return "TLS: cannot name the host " + target.url.host;
  stream.set_verify_callback(asio::ssl::host_name_verification(target.url.host));
  beast::error_code ec;
  co_await stream.async_handshake(asio::ssl::stream_base::client, asio::redirect_error(asio::use_awaitable, ec));
  co_return ec ? "TLS handshake with " + target.url.host + ":" + std::to_string(target.url.port) + ": " + ec.message()
               : "";
}

/// What came back for one request: the status (0: none) and, when the body did not end properly, why (`cut`).
struct Exchange {
  unsigned status = 0;
  std::string cut;
};

/// Sends `method` `path` with `body` and reads the response into `x`, streaming the body's bytes to
/// `on_bytes(bytes)` as they arrive (x.status is set by then). A connection per request.
template <class Stream, class OnBytes>
asio::awaitable<void> exchange_over(Stream& stream, const Target& target, http::verb method, const std::string& path,
                                    const std::string& body, Exchange& x, OnBytes on_bytes) {
  beast::error_code ec;
  auto on_error = asio::redirect_error(asio::use_awaitable, ec);
  beast::get_lowest_layer(stream).expires_after(kConnectTimeout);
  x.cut = co_await open_stream(target, stream);
  if (!x.cut.empty()) co_return;
  http::request<http::string_body> req{method, target.url.prefix + path, 11};
  req.set(http::field::host, target.url.host + ":" + std::to_string(target.url.port));
  req.set(http::field::user_agent, "paged-bench");
  if (!target.api_key.empty()) req.set(http::field::authorization, "Bearer " + target.api_key);
  if (method == http::verb::post) req.set(http::field::content_type, "application/json");
  req.body() = body;
  req.prepare_payload();
  beast::get_lowest_layer(stream).expires_after(kSilenceTimeout);
  co_await http::async_write(stream, req, on_error);
  beast::flat_buffer buffer;
  http::response_parser<http::buffer_body> parser;
  parser.body_limit(std::numeric_limits<uint64_t>::max());
  if (!ec) co_await http::async_read_header(stream, buffer, parser, on_error);
  if (ec) {
    x.cut = "no response: " + ec.message();
    co_return;
  }
  x.status = parser.get().result_int();
  char chunk[16384];
  while (!parser.is_done()) {
    parser.get().body().data = chunk;
    parser.get().body().size = sizeof chunk;
    beast::get_lowest_layer(stream).expires_after(kSilenceTimeout);
    co_await http::async_read_some(stream, buffer, parser, on_error);
    if (ec == http::error::need_buffer) ec = {};
    if (const size_t n = sizeof chunk - parser.get().body().size; n > 0) on_bytes(std::string_view(chunk, n));
    if (ec) {
      x.cut = ec.message();
      break;
    }
  }
  // Over TLS too without a close_notify exchange: the request is over, and a server that does not answer one would
  // hold the connection until a timeout.
  beast::get_lowest_layer(stream).socket().shutdown(tcp::socket::shutdown_both, ec);
}

template <class OnBytes>
asio::awaitable<void> exchange(const Target& target, http::verb method, const std::string& path,
                               const std::string& body, Exchange& x, OnBytes on_bytes) {
  if (target.tls) {
    TlsStream stream(co_await asio::this_coro::executor, *target.tls);
    co_await exchange_over(stream, target, method, path, body, x, on_bytes);
  } else {
    beast::tcp_stream stream(co_await asio::this_coro::executor);
    co_await exchange_over(stream, target, method, path, body, x, on_bytes);
  }
}

/// The message of an error response's body ({"error": {"message": ...}} or vLLM's {"message": ...}), else the body.
std::string error_message(const std::string& body) {
  boost::system::error_code ec;
  const json::value v = json::parse(body, ec);
  if (!ec && v.is_object()) {
    const json::object& o = v.get_object();
    const json::value* error = o.if_contains("error");
    const json::value* message =
        error && error->is_object() ? error->get_object().if_contains("message") : o.if_contains("message");
    if (message && message->is_string()) return std::string(message->get_string());
  }
  return body.substr(0, 300);
}

/// One streamed completion, timed from the moment it is sent; never throws for what the server does.
asio::awaitable<RequestResult> send_completion(const Target& target, const std::string& body, int prompt_len) {
  const auto sent = Clock::now();
  StreamRecorder recorder(prompt_len);
  Exchange x;
  std::string error_body;
  co_await exchange(target, http::verb::post, target.endpoint, body, x, [&](std::string_view bytes) {
    if (x.status == 200) recorder.feed(bytes, std::chrono::duration<double>(Clock::now() - sent).count());
    else error_body.append(bytes);
  });
  if (x.status == 200) co_return recorder.finish(x.cut.empty(), x.cut);
  RequestResult failed;
  failed.prompt_len = prompt_len;
  failed.error = x.status == 0 ? x.cut : "HTTP " + std::to_string(x.status) + ": " + error_message(error_body);
  co_return failed;
}

/// The first model a server lists at GET /v1/models: its id and max_model_len (2048 when it gives none).
struct ServedModel {
  std::string id;
  int max_model_len = 2048;
};

asio::awaitable<ServedModel> first_model(const Target& target) {
  Exchange x;
  std::string body;
  co_await exchange(target, http::verb::get, "/v1/models", "", x, [&](std::string_view bytes) { body.append(bytes); });
  const std::string where = std::string("GET ") + (target.url.tls ? "https://" : "http://") + target.url.host + ":" +
                            std::to_string(target.url.port) + target.url.prefix + "/v1/models";
  if (x.status == 0 || !x.cut.empty()) throw std::runtime_error(where + ": " + x.cut);
  if (x.status != 200)
    throw std::runtime_error(where + " answered " + std::to_string(x.status) + ": " + error_message(body));
  boost::system::error_code ec;
  const json::value v = json::parse(body, ec);
  const json::value* data = !ec && v.is_object() ? v.get_object().if_contains("data") : nullptr;
  if (!data || !data->is_array() || data->get_array().empty() || !data->get_array()[0].is_object())
    throw std::runtime_error(where + " lists no model: " + body.substr(0, 300));
  const json::object& model = data->get_array()[0].get_object();
  ServedModel m;
  if (const json::value* id = model.if_contains("id"); id && id->is_string()) m.id = std::string(id->get_string());
  if (const json::value* len = model.if_contains("max_model_len"); len && len->is_int64())
    m.max_model_len = static_cast<int>(len->get_int64());
  if (m.id.empty()) throw std::runtime_error(where + ": the first model has no id");
  co_return m;
}

/// At most `limit` holders at once; waiters resume in turn as holders leave. One thread only.
class Slots {
 public:
  Slots(asio::any_io_executor ex, int limit) : free_(limit), wake_(ex, Clock::time_point::max()) {}
  asio::awaitable<void> acquire() {
    while (free_ == 0) {
      beast::error_code ec;
      co_await wake_.async_wait(asio::redirect_error(asio::use_awaitable, ec));  // cancel_one() wakes one
    }
    --free_;
  }
  void release() {
    ++free_;
    wake_.cancel_one();
  }

 private:
  int free_;
  asio::steady_timer wake_;  // never expires: only woken
};

/// One benchmark run: the requests, when each is sent, and what each measured.
struct Run {
  const Target& target;
  const std::vector<std::string>& bodies;
  const std::vector<BenchRequest>& requests;
  const std::vector<double>& arrivals;
  std::optional<Slots> slots;  // --max-concurrency
  ProgressBar* progress;       // null: none shown
  std::vector<RequestResult> results;
  int finished = 0;
  Clock::time_point start, end;
};

asio::awaitable<void> run_one(Run& run, size_t i) {
  if (run.slots) co_await run.slots->acquire();
  try {
    run.results[i] = co_await send_completion(run.target, run.bodies[i], run.requests[i].prompt_len);
  } catch (const std::exception& e) {  // the client's own failure (out of memory, descriptors): the request failed
    run.results[i].prompt_len = run.requests[i].prompt_len;
    run.results[i].error = e.what();
  }
  if (run.slots) run.slots->release();
  ++run.finished;
  if (run.progress) run.progress->update(run.finished);
  if (run.finished == static_cast<int>(run.requests.size())) run.end = Clock::now();
}

asio::awaitable<void> dispatch(Run& run) {
  asio::steady_timer timer(co_await asio::this_coro::executor);
  run.start = Clock::now();
  for (size_t i = 0; i < run.requests.size(); ++i) {
    timer.expires_at(run.start + std::chrono::duration_cast<Clock::duration>(
                                     std::chrono::duration<double>(run.arrivals[i])));
    co_await timer.async_wait(asio::use_awaitable);
    asio::co_spawn(timer.get_executor(), run_one(run, i), asio::detached);
  }
}

/// Runs `task` on `ioc` to the end; rethrows what it threw.
template <class T>
T run_to_end(asio::io_context& ioc, asio::awaitable<T> task) {
  std::exception_ptr error;
  std::optional<T> value;
  asio::co_spawn(ioc, std::move(task), [&](std::exception_ptr e, T v) {
    error = e;
    if (!e) value = std::move(v);
  });
  ioc.restart();
  ioc.run();
  if (error) std::rethrow_exception(error);
  return std::move(*value);
}

/// A comma-separated list.
std::vector<std::string> split_commas(const std::string& list) {
  std::vector<std::string> items;
  for (size_t begin = 0; begin <= list.size();) {
    const size_t comma = std::min(list.find(',', begin), list.size());
    items.push_back(list.substr(begin, comma - begin));
    begin = comma + 1;
  }
  return items;
}

/// As many file descriptors as the hard limit allows: a burst opens a connection per request.
void raise_descriptor_limit() {
  rlimit limit{};
  if (getrlimit(RLIMIT_NOFILE, &limit) == 0 && limit.rlim_cur < limit.rlim_max) {
    limit.rlim_cur = limit.rlim_max;
    setrlimit(RLIMIT_NOFILE, &limit);
  }
}

json::array to_json(const std::vector<double>& values) {
  json::array a;
  for (double v : values) a.push_back(v);
  return a;
}

/// The flags of `paged bench serve`, checked.
struct ServeBenchFlags {
  std::string base_url;
  Target target;                 // without its resolved endpoints
  std::optional<std::string> model;
  std::string tokenizer_dir;
  DatasetOptions data;
  double rate = std::numeric_limits<double>::infinity(), burstiness = 1;
  std::optional<int> max_concurrency;
  Slo slo;
  std::vector<std::string> metrics;  // of ttft, tpot, itl, e2el
  std::vector<double> percentiles;
  bool ignore_eos = false, show_progress = true;
  std::string result_file;
  std::optional<json::value> json_schema;  // --json-schema FILE: every request asks it (structured outputs)
};

/// Reads and checks the flags; UsageError for a bad one.
ServeBenchFlags read_flags(cli::Args& args) {
  ServeBenchFlags f;
  const std::optional<std::string> base_url = args.get("base-url");
  f.target.endpoint = args.get("endpoint").value_or("/v1/completions");
  f.model = args.get("model");
  f.tokenizer_dir = args.get("tokenizer").value_or("");
  if (auto key = args.get("api-key")) {
    f.target.api_key = *key;
  } else {
    for (const char* name : {"OPENAI_API_KEY", "PAGED_API_KEY"})
      if (const char* env = std::getenv(name); env && *env && f.target.api_key.empty()) f.target.api_key = env;
  }
  f.data = dataset_options(args, DatasetOptions{});  // vLLM's defaults: 1000 prompts, 1024 in, 128 out
  f.rate = args.get_double("request-rate", f.rate);
  f.burstiness = args.get_double("burstiness", f.burstiness);
  if (args.has("max-concurrency")) f.max_concurrency = args.get_int("max-concurrency", 0);
  try {
    std::vector<std::string> items;
    for (const std::string& value : args.get_all("goodput"))
      for (std::string& item : split_commas(value))
        if (!item.empty()) items.push_back(std::move(item));
    f.slo = parse_slo(items);
  } catch (const std::invalid_argument& e) {
    throw cli::UsageError(std::string("--goodput ") + e.what());
  }
  f.metrics = split_commas(args.get("percentile-metrics").value_or("ttft,tpot,itl"));
  for (const std::string& p : split_commas(args.get("metric-percentiles").value_or("99"))) {
    char* end = nullptr;
    const double v = std::strtod(p.c_str(), &end);
    if (p.empty() || *end || !(v >= 0 && v <= 100))
      throw cli::UsageError("--metric-percentiles takes numbers in [0, 100] separated by commas, got '" + p + "'");
    f.percentiles.push_back(v);
  }
  f.ignore_eos = args.get_bool("ignore-eos", false);
  if (const std::optional<std::string> path = args.get("json-schema")) {
    const std::optional<std::string> text = read_file(*path);
    if (!text) throw cli::UsageError("--json-schema " + *path + ": cannot open");
    boost::system::error_code ec;
    f.json_schema = json::parse(*text, ec);
    if (ec) throw cli::UsageError("--json-schema " + *path + ": malformed JSON (" + ec.message() + ")");
    if (f.ignore_eos) throw cli::UsageError("--json-schema ends each answer with its JSON: --ignore-eos cannot go with it");
  }
  f.show_progress = !args.get_bool("disable-tqdm", false);
  f.result_file = args.get("result-file").value_or("");
  const std::optional<std::string> ca_certs = args.get("ssl-ca-certs");
  args.reject_unknown();

  if (!base_url) throw cli::UsageError("bench serve needs --base-url URL (e.g. http://127.0.0.1:8000)");
  f.base_url = *base_url;
  try {
    f.target.url = parse_base_url(f.base_url);
  } catch (const std::invalid_argument& e) {
    throw cli::UsageError(e.what());
  }
  if (f.target.url.tls) {
    // TLS 1.2 or newer; the server's certificate chain checked against the CAs of --ssl-ca-certs (a server with a
    // certificate of its own CA: `paged gen-certs`'s ca.pem), else the system's.
    f.target.tls = std::make_shared<asio::ssl::context>(asio::ssl::context::tls_client);
    f.target.tls->set_options(asio::ssl::context::no_sslv2 | asio::ssl::context::no_sslv3 |
                              asio::ssl::context::no_tlsv1 | asio::ssl::context::no_tlsv1_1);
    f.target.tls->set_verify_mode(asio::ssl::verify_peer);
    beast::error_code ec;
    if (ca_certs)
      f.target.tls->load_verify_file(*ca_certs, ec);
    else
      f.target.tls->set_default_verify_paths(ec);
    if (ec) throw cli::UsageError("--ssl-ca-certs " + ca_certs.value_or("(the system's)") + ": " + ec.message());
  } else if (ca_certs) {
    throw cli::UsageError("--ssl-ca-certs checks an https:// server's certificate; --base-url is http://");
  }
  const auto ends_with = [](const std::string& s, const std::string& tail) {
    return s.size() >= tail.size() && s.compare(s.size() - tail.size(), tail.size(), tail) == 0;
  };
  const std::string& endpoint = f.target.endpoint;
  if (endpoint.empty() || endpoint[0] != '/' || !ends_with(endpoint, "/completions") ||
      ends_with(endpoint, "/chat/completions"))
    throw cli::UsageError("--endpoint must be a completions path such as /v1/completions (chat is not supported)");
  if (!(f.rate > 0)) throw cli::UsageError("--request-rate must be positive requests/s, or inf");
  if (!(f.burstiness > 0) || std::isinf(f.burstiness)) throw cli::UsageError("--burstiness must be a positive number");
  if (f.max_concurrency && *f.max_concurrency < 1) throw cli::UsageError("--max-concurrency must be positive");
  for (const std::string& m : f.metrics)
    if (m != "ttft" && m != "tpot" && m != "itl" && m != "e2el")
      throw cli::UsageError("--percentile-metrics takes ttft, tpot, itl and e2el separated by commas, got '" + m + "'");
  if (f.data.name == "sharegpt" && f.tokenizer_dir.empty())
    throw cli::UsageError("--dataset-name sharegpt counts the tokens of prompts and replies with the model's "
                          "tokenizer: give --tokenizer DIR (the model folder)");
  if (!f.result_file.empty() && !std::ofstream(f.result_file, std::ios::app))
    throw cli::UsageError("cannot write --result-file " + f.result_file);
  return f;
}

/// vLLM's result JSON: the run's flags, its metrics (the summaries of f.metrics in milliseconds; request_goodput
/// null without --goodput) and the per-request lists.
json::object result_json(const ServeBenchFlags& f, const std::string& model_id, const ServingMetrics& m,
                         const std::vector<RequestResult>& results) {
  json::object o;
  char date[32];
  const std::time_t now = std::time(nullptr);
  std::strftime(date, sizeof date, "%Y%m%d-%H%M%S", std::localtime(&now));
  o["date"] = date;
  o["backend"] = "openai";
  o["base_url"] = f.base_url;
  o["endpoint"] = f.target.endpoint;
  o["model_id"] = model_id;
  o["tokenizer_id"] = f.tokenizer_dir.empty() ? json::value(nullptr) : json::value(f.tokenizer_dir);
  o["dataset_name"] = f.data.name;
  o["num_prompts"] = results.size();
  o["request_rate"] = std::isinf(f.rate) ? json::value("inf") : json::value(f.rate);
  o["burstiness"] = f.burstiness;
  o["max_concurrency"] = f.max_concurrency ? json::value(*f.max_concurrency) : json::value(nullptr);
  o["duration"] = m.duration_s;
  o["completed"] = m.completed;
  o["failed"] = m.failed;
  o["total_input_tokens"] = m.total_input;
  o["total_output_tokens"] = m.total_output;
  o["request_throughput"] = m.request_throughput;
  o["request_goodput"] = f.slo.any() ? json::value(m.request_goodput) : json::value(nullptr);
  o["output_throughput"] = m.output_throughput;
  o["total_token_throughput"] = m.total_token_throughput;
  json::array input_lens, output_lens, ttfts, itls, texts, errors;
  for (const RequestResult& r : results) {
    input_lens.push_back(r.prompt_len);
    output_lens.push_back(r.success ? r.output_tokens : 0);
    ttfts.push_back(r.success ? r.ttft : 0.0);
    itls.push_back(to_json(r.itl));
    texts.push_back(json::string(r.generated_text));
    errors.push_back(json::string(r.error));
  }
  o["input_lens"] = std::move(input_lens);
  o["output_lens"] = std::move(output_lens);
  o["ttfts"] = std::move(ttfts);
  o["itls"] = std::move(itls);
  o["generated_texts"] = std::move(texts);
  o["errors"] = std::move(errors);
  const std::pair<const char*, const Summary*> summaries[] = {
      {"ttft", &m.ttft_ms}, {"tpot", &m.tpot_ms}, {"itl", &m.itl_ms}, {"e2el", &m.e2el_ms}};
  for (const auto& [key, s] : summaries) {
    if (std::find(f.metrics.begin(), f.metrics.end(), key) == f.metrics.end()) continue;
    const std::string k = key;
    o["mean_" + k + "_ms"] = s->mean;
    o["median_" + k + "_ms"] = s->median;
    o["std_" + k + "_ms"] = s->std;
    for (const auto& [p, value] : s->percentiles) o["p" + percentile_name(p) + "_" + k + "_ms"] = value;
  }
  return o;
}

}  // namespace

int run_bench_serve_command(int argc, char** argv, int first) {
  std::vector<std::string> words = expand_multi_value_flags(argc, argv, first, {"goodput"});
  std::vector<char*> word_ptrs;
  for (std::string& w : words) word_ptrs.push_back(w.data());
  cli::Args args(static_cast<int>(word_ptrs.size()), word_ptrs.data(), 0, {"ignore-eos", "disable-tqdm"});
  ServeBenchFlags f = read_flags(args);

  raise_descriptor_limit();
  asio::io_context ioc;
  {
    tcp::resolver resolver(ioc);
    beast::error_code ec;
    f.target.endpoints = resolver.resolve(f.target.url.host, std::to_string(f.target.url.port), ec);
    if (ec) throw std::runtime_error("cannot resolve " + f.target.url.host + ": " + ec.message());
  }
  const ServedModel served = run_to_end(ioc, first_model(f.target));
  const std::string model_id = f.model.value_or(served.id);
  std::unique_ptr<Tokenizer> tokenizer = f.tokenizer_dir.empty() ? nullptr : load_tokenizer(f.tokenizer_dir);
  // Random prompts draw from the tokenizer's vocabulary; without one, from the first 256 ids, which every
  // vocabulary has.
  const int vocab = tokenizer ? tokenizer->vocab_size() : 256;
  const std::vector<BenchRequest> requests =
      dataset_requests(f.data, vocab, served.max_model_len,
                       [&](const std::string& text) { return tokenizer->encode(text, true); });
  std::vector<std::string> bodies;
  for (const BenchRequest& r : requests)
    bodies.push_back(completion_body(model_id, r, f.ignore_eos, f.json_schema ? &*f.json_schema : nullptr));
  const int n = static_cast<int>(requests.size());
  const std::vector<double> arrivals = arrival_times(n, f.rate, f.burstiness, f.data.seed);

  std::cout << "paged bench serve: " << n << " requests (" << f.data.name << ") to " << f.base_url
            << f.target.endpoint << ", model " << model_id << "\nTraffic request rate: "
            << (std::isinf(f.rate) ? std::string("inf") : fixed2(f.rate)) << "\nBurstiness factor: " << f.burstiness
            << (f.burstiness == 1.0 ? " (Poisson process)" : " (gamma distribution)")
            << "\nMaximum request concurrency: " << (f.max_concurrency ? std::to_string(*f.max_concurrency) : "None")
            << std::endl;
  ProgressBar progress = stderr_progress("bench serve", n);
  if (f.show_progress) progress.update(0);
  Run run{f.target, bodies, requests, arrivals, std::nullopt, f.show_progress ? &progress : nullptr, {}, 0, {}, {}};
  run.results.resize(requests.size());
  if (f.max_concurrency) run.slots.emplace(ioc.get_executor(), *f.max_concurrency);
  asio::co_spawn(ioc, dispatch(run), asio::detached);
  ioc.restart();
  ioc.run();
  const double duration = std::chrono::duration<double>(run.end - run.start).count();

  const ServingMetrics m = serving_metrics(run.results, duration, f.slo, f.percentiles);
  ServingTableOptions table;
  table.max_concurrency = f.max_concurrency;
  if (!std::isinf(f.rate)) table.request_rate = f.rate;
  table.goodput = f.slo.any();
  table.metrics = f.metrics;
  std::cout << serving_table(m, table) << std::flush;
  const auto failed =
      std::find_if(run.results.begin(), run.results.end(), [](const RequestResult& r) { return !r.success; });
  if (failed != run.results.end())
    std::cerr << "paged bench serve: " << (m.completed == 0 ? "every request" : std::to_string(m.failed) + " requests")
              << " failed; the first: " << failed->error << "\n";
  if (!f.result_file.empty()) {
    std::ofstream out(f.result_file);
    out << json::serialize(result_json(f, model_id, m, run.results)) << "\n";
    if (!out) throw std::runtime_error("cannot write --result-file " + f.result_file);
  }
  return 0;
}

}  // namespace paged::bench
