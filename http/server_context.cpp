#include "http/server_context.h"

#include "http/dashboard.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <iostream>
#include <sstream>

#include <boost/asio/post.hpp>
#include <boost/json.hpp>
#include <openssl/rand.h>

namespace paged::server {

EventGate::Ticket::~Ticket() {
  const std::shared_ptr<EventGate> gate = gate_.lock();
  if (!gate) return;
  // Destroyed under the lock: close() cannot come between, so the sink goes while its io_context still lives.
  std::lock_guard lock(gate->mu_);
  gate->sinks_.erase(key_);
}

void EventGate::close() {
  std::unordered_map<uint64_t, std::shared_ptr<void>> sinks;  // destroyed on this thread, the lock let go
  std::lock_guard lock(mu_);
  open_ = false;
  sinks.swap(sinks_);
}

void HttpCounters::count(unsigned status) {
  size_t i = 0;
  while (i + 1 < kCodes.size() && kCodes[i] != status) ++i;
  counts_[i].fetch_add(1, std::memory_order_relaxed);
}

std::string HttpCounters::prometheus() const {
  std::string out =
      "# HELP paged_http_responses_total HTTP responses by status code (101: WebSocket upgrades).\n"
      "# TYPE paged_http_responses_total counter\n";
  for (size_t i = 0; i < kCodes.size(); ++i) {
    const std::string code = kCodes[i] ? std::to_string(kCodes[i]) : "other";
    out += "paged_http_responses_total{code=\"" + code + "\"} " + std::to_string(counts_[i].load()) + "\n";
  }
  return out;
}

namespace {

std::string folder_name(const std::string& dir) {
  std::filesystem::path p(dir);
  if (!p.has_filename()) p = p.parent_path();
  return p.filename().string();
}

}  // namespace

ServerContext::ServerContext(Engine& eng, ServerOptions opts, std::shared_ptr<boost::asio::ssl::context> tls_context)
    : engine(eng),
      options(std::move(opts)),
      model_name(options.served_model_names.empty() ? folder_name(eng.config().model_dir)
                                                    : options.served_model_names.front()),
      max_model_len(eng.config().max_model_len.value_or(eng.model_config().max_position_embeddings)),
      responses(options.max_stored_responses),
      tls(std::move(tls_context)),
      runtime_lora_updating([] {
        const char* v = std::getenv("VLLM_ALLOW_RUNTIME_LORA_UPDATING");
        const std::string s = v ? v : "";
        return s == "1" || s == "true" || s == "True" || s == "TRUE";
      }()),
      chat_template_(ChatTemplate::load(eng.config().model_dir, options.chat_template_file)) {
  model_info_.tokenizer = &eng.tokenizer();
  model_info_.vocab_size = eng.model_config().vocab_size;
  model_info_.max_model_len = max_model_len;
  model_info_.served_model_name = model_name;
  if (options.served_model_names.size() > 1)
    model_info_.other_names.assign(options.served_model_names.begin() + 1, options.served_model_names.end());
  model_info_.model_path = eng.config().model_dir;
  for (const LoraInfo& l : eng.lora_adapters())
    if (serves_as_model(l.name))
      throw std::invalid_argument("--lora-modules: '" + l.name + "' is the served model's own name");
  model_info_.lora_adapters = [&eng] { return eng.lora_adapters(); };
  model_info_.max_prompts = options.max_prompts_per_request;
  model_info_.max_sequences = options.max_sequences_per_request;
  model_info_.trust_request_chat_template = options.trust_request_chat_template;
  model_info_.tool_call_parser = auto_tool_call_format(options);
  // Mistral's chat templates take back only call ids of 9 letters and digits (vLLM gives its Mistral models such).
  const std::string& type = eng.model_config().model_type;
  model_info_.mistral_tool_ids =
      options.tool_call_parser == "mistral" || type == "mistral" || type == "mixtral";
  model_info_.reasoning_parser = reasoning_format(options);
  model_info_.structured_in_reasoning = options.structured_outputs_in_reasoning;
  model_info_.sampling_defaults = sampling_defaults(options, eng.config().model_dir);
  model_info_.return_tokens_as_token_ids = options.return_tokens_as_token_ids;
  model_info_.chat_template = chat_template_ ? &*chat_template_ : nullptr;
}

bool ServerContext::serves_as_model(const std::string& name) const {
  return name == model_name || name == model_info_.model_path ||
         std::find(model_info_.other_names.begin(), model_info_.other_names.end(), name) != model_info_.other_names.end();
}

std::string ServerContext::update_lora(bool load, std::string_view body) {
  const openai::LoraUpdate u = openai::lora_update_body(body, load);
  if (!load) {
    if (!engine.unload_lora(u.name))
      throw openai::ModelNotFound("The lora adapter '" + u.name + "' cannot be found.", "lora_name");
    return "Success: LoRA adapter '" + u.name + "' removed successfully.";
  }
  if (serves_as_model(u.name)) throw InvalidRequest("'" + u.name + "' is the served model's own name", "lora_name");
  try {
    engine.load_lora(u.name, u.path);
  } catch (const ModelError& e) {
    throw InvalidRequest(e.what(), "lora_path");
  }
  return "Success: LoRA adapter '" + u.name + "' added successfully.";
}

std::shared_ptr<void> ServerContext::owe_client() {
  class Owed {
   public:
    explicit Owed(std::atomic<int>& count) : count_(count) { count_.fetch_add(1); }
    Owed(const Owed&) = delete;
    Owed& operator=(const Owed&) = delete;
    ~Owed() { count_.fetch_sub(1); }

   private:
    std::atomic<int>& count_;
  };
  return std::make_shared<Owed>(owed_);
}

std::string ServerContext::next_id(const char* prefix) {
  // 96 random bits from OpenSSL's generator: an id (a stored response's is its only handle) tells nothing of others.
  unsigned char bytes[12];
  if (RAND_bytes(bytes, sizeof bytes) != 1) throw std::runtime_error("no random bytes for a response id");
  static constexpr char kHex[] = "0123456789abcdef";
  std::string id = std::string(prefix) + "-";
  for (unsigned char b : bytes) {
    id += kHex[b >> 4];
    id += kHex[b & 15];
  }
  return id;
}

std::string ServerContext::allowed_origin(std::string_view origin) const {
  if (origin.empty()) return "";
  for (const std::string& allowed : options.allowed_origins) {
    if (allowed == "*") return "*";
    if (allowed == origin) return std::string(origin);
  }
  return "";
}

namespace {

// given == expected, in time that depends on their lengths only.
bool same_secret(std::string_view given, std::string_view expected) {
  if (given.size() != expected.size()) return false;
  unsigned diff = 0;
  for (size_t i = 0; i < expected.size(); ++i) diff |= static_cast<unsigned char>(given[i] ^ expected[i]);
  return diff == 0;
}

}  // namespace

std::optional<size_t> ServerContext::key_of(std::string_view given) const {
  // Every key is compared whatever matched: the time does not tell which key, or how far a guess got.
  std::optional<size_t> found;
  for (size_t i = 0; i < options.api_keys.size(); ++i)
    if (same_secret(given, options.api_keys[i]) && !found) found = i;
  return found;
}

bool ServerContext::authorized(std::string_view authorization_header) const {
  if (options.api_keys.empty()) return true;
  return authorization_header.starts_with("Bearer ") &&
         key_of(authorization_header.substr(std::string_view("Bearer ").size())).has_value();
}

std::string ServerContext::key_owner(std::string_view authorization_header) const {
  if (options.api_keys.empty() || !authorization_header.starts_with("Bearer ")) return "";
  const std::optional<size_t> key = key_of(authorization_header.substr(std::string_view("Bearer ").size()));
  return key ? "key " + std::to_string(*key) : "";
}

bool ServerContext::dashboard_authorized(std::string_view authorization_header, std::string_view target,
                                         std::string_view cookie_header) const {
  return authorized(authorization_header) || (!options.api_keys.empty() && key_of(query_param(target, "key"))) ||
         (!options.api_keys.empty() && key_of(cookie_value(cookie_header, kDashboardKeyCookie)));
}

void log_request_start(const std::string& id, const openai::Request& request) {
  const SamplingParams& p = request.params;
  std::ostringstream line;
  line << "paged: request " << id << ": " << request.prompts.size() << " prompt(s) of";
  for (const auto& prompt : request.prompts) line << ' ' << prompt.size();
  line << " tokens, max_tokens " << p.max_tokens << ", n " << p.n << ", temperature " << p.temperature
       << (request.stream ? ", streamed" : "") << '\n';
  std::cout << line.str() << std::flush;
}

void log_request_end(const std::string& id, size_t prompt_index, const RequestEvent& last) {
  std::ostringstream line;
  line << "paged: request " << id << " prompt " << prompt_index << ": " << last.prompt_tokens << " prompt and "
       << last.completion_tokens << " completion tokens";
  if (last.error) {
    line << ", failed: " << *last.error;
  } else {
    line << ", finished:";
    for (const CompletionDelta& d : last.deltas)
      if (d.finish_reason) line << ' ' << *d.finish_reason;
  }
  std::cout << line.str() << '\n' << std::flush;
}

std::vector<RequestId> submit_prompts(ServerContext& ctx, const openai::Request& request,
                                      boost::asio::any_io_executor executor, EventHandler on_event) {
  for (const auto& prompt : request.prompts) ctx.engine.validate(request.params, prompt.size());
  auto handler = std::make_shared<EventHandler>(std::move(on_event));
  std::vector<RequestId> ids;
  try {
    for (size_t i = 0; i < request.prompts.size(); ++i) {
      ids.push_back(ctx.engine.submit(
          request.prompts[i], request.params,
          ctx.gate->guard<RequestEvent>([executor, handler, i](RequestEvent event) {
            boost::asio::post(executor, [handler, i, ev = std::move(event)]() mutable { (*handler)(i, std::move(ev)); });
          })));
    }
  } catch (...) {
    for (RequestId id : ids) ctx.engine.abort(id);
    throw;
  }
  return ids;
}

ErrorReply error_reply(std::exception_ptr error) {
  try {
    std::rethrow_exception(error);
  } catch (const openai::ModelNotFound& e) {
    return {404, openai::error_body(e.what(), "invalid_request_error", e.param, "model_not_found")};
  } catch (const openai::ResponseNotFound& e) {
    return {404, openai::error_body(e.what(), "invalid_request_error", e.param, "not_found")};
  } catch (const InvalidRequest& e) {
    return {400, openai::error_body(e.what(), "invalid_request_error", e.param)};
  } catch (const EngineOverloaded& e) {
    return {503, openai::error_body(e.what(), "server_error", "", "server_overloaded")};
  } catch (const EngineUnavailable& e) {
    return {503, openai::error_body(e.what(), "server_error", "", "engine_unavailable")};
  } catch (const std::exception& e) {
    return {500, openai::error_body(std::string("internal error: ") + e.what(), "server_error", "", "internal_error")};
  } catch (...) {
    return {500, openai::error_body("internal error", "server_error", "", "internal_error")};
  }
}

ErrorReply error_reply(unsigned status, const std::string& message) {
  switch (status) {
    case 401: return {401, openai::error_body(message, "invalid_request_error", "", "invalid_api_key")};
    case 404: return {404, openai::error_body(message, "invalid_request_error", "", "not_found")};
    case 405: return {405, openai::error_body(message, "invalid_request_error", "", "method_not_allowed")};
    case 413: return {413, openai::error_body(message, "invalid_request_error", "", "request_too_large")};
    default: return {status, openai::error_body(message, "invalid_request_error")};
  }
}

HealthReply health_reply(const EngineHealth& health) {
  const bool ready = health.state == EngineState::ready;
  boost::json::array replicas;
  for (const ReplicaInfo& r : health.replicas) {
    boost::json::object o{{"kind", r.address.empty() ? "local" : "remote"}};
    if (!r.address.empty()) o["address"] = r.address;
    o["state"] = r.serving ? "ready" : "lost";
    if (!r.serving) o["reason"] = r.reason;
    replicas.push_back(std::move(o));
  }
  boost::json::object body{{"status", ready ? "ok" : "unavailable"}};
  if (!ready) body["reason"] = health.reason;
  body["replicas"] = std::move(replicas);
  return {ready ? 200u : 503u, boost::json::serialize(body)};
}

}  // namespace paged::server
