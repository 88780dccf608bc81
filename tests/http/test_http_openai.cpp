// The OpenAI schema: request parsing/validation into SamplingParams and prompt ids, and responses built from engine
// events (whole bodies, SSE chunks, usage, both logprobs formats). Uses the stories260K tokenizer.
#include <catch2/catch.hpp>

#include <chrono>
#include <fstream>
#include <iterator>

#include <boost/json.hpp>

#include "model/template/chat_template.h"
#include "http/openai.h"
#include "http/server_context.h"
#include "model/tokenizer/load_tokenizer.h"
#include "tests/test_data.h"

namespace json = boost::json;
using namespace paged;
using openai::Endpoint;

namespace {

const std::string kModelDir = paged::test::kModel;

struct Fixture {
  std::unique_ptr<Tokenizer> tok = load_tokenizer(kModelDir);
  ChatTemplate chat = *ChatTemplate::load(kModelDir, std::string(PAGED_SOURCE_DIR) + "/conf/chat_templates/llama2.jinja");
  openai::ModelInfo info() const {
    openai::ModelInfo info{tok.get(), 512, 512, "stories260K", &chat};
    info.trust_request_chat_template = true;
    return info;
  }
};

const Fixture& fixture() {
  static Fixture f;
  return f;
}

openai::Request parse(Endpoint e, const std::string& body) { return openai::parse_request(e, body, fixture().info()); }

/// The param an invalid body is refused for.
std::string refused_param(Endpoint e, const std::string& body, const openai::ModelInfo* info = nullptr) {
  try {
    openai::parse_request(e, body, info ? *info : fixture().info());
  } catch (const InvalidRequest& err) {
    return err.param.empty() ? "<body>" : err.param;
  }
  return "<accepted>";
}

RequestEvent event(std::vector<CompletionDelta> deltas, bool done, int prompt_tokens, int completion_tokens) {
  RequestEvent ev;
  ev.deltas = std::move(deltas);
  ev.done = done;
  ev.prompt_tokens = prompt_tokens;
  ev.completion_tokens = completion_tokens;
  return ev;
}

CompletionDelta delta(int index, std::string text, std::vector<TokenId> ids, std::optional<std::string> finish = {}) {
  CompletionDelta d;
  d.index = index;
  d.text = std::move(text);
  d.token_ids = std::move(ids);
  d.finish_reason = std::move(finish);
  return d;
}

/// Feeds `pieces` to prompt 0's choice 0 as one token each, the last ending it ("stop"); returns the frames.
std::string feed_pieces(openai::ResponseBuilder& rb, const std::vector<std::string>& pieces) {
  std::string frames;
  for (size_t i = 0; i < pieces.size(); ++i) {
    const bool last = i + 1 == pieces.size();
    frames += rb.add(0, event({delta(0, pieces[i], {1}, last ? std::optional<std::string>("stop") : std::nullopt)},
                              last, 9, static_cast<int>(i + 1)));
  }
  return frames;
}

/// The JSON objects of "data: {...}" frames (the [DONE] sentinel excluded) and whether it ended with [DONE].
std::vector<json::object> sse_objects(const std::string& frames, bool* saw_done = nullptr) {
  std::vector<json::object> out;
  size_t pos = 0;
  while (pos < frames.size()) {
    const size_t end = frames.find("\n\n", pos);
    REQUIRE(end != std::string::npos);
    const std::string line = frames.substr(pos, end - pos);
    REQUIRE(line.rfind("data: ", 0) == 0);
    const std::string payload = line.substr(6);
    if (payload == "[DONE]") {
      if (saw_done) *saw_done = true;
    } else {
      out.push_back(json::parse(payload).as_object());
    }
    pos = end + 2;
  }
  return out;
}

}  // namespace

TEST_CASE("completions: prompts in every form become token ids", "[openai]") {
  auto r = parse(Endpoint::completions, R"({"model": "stories260K", "prompt": "Once upon a time"})");
  REQUIRE(r.prompts.size() == 1);
  CHECK(r.prompts[0] == std::vector<TokenId>{1, 403, 407, 261, 378});  // golden prompt ids: BOS added
  CHECK(r.prompt_texts[0] == "Once upon a time");
  CHECK(r.params.max_tokens == 16);
  CHECK_FALSE(r.stream);

  r = parse(Endpoint::completions, R"({"prompt": ["Once upon a time", "Max found a box"]})");
  CHECK(r.prompts.size() == 2);
  r = parse(Endpoint::completions, R"({"prompt": [1, 403, 407]})");
  REQUIRE(r.prompts.size() == 1);
  CHECK(r.prompts[0] == std::vector<TokenId>{1, 403, 407});
  CHECK(r.prompt_texts[0] == "Once upon");
  r = parse(Endpoint::completions, R"({"prompt": [[1, 403], [1, 407, 261]]})");
  REQUIRE(r.prompts.size() == 2);
  CHECK(r.prompts[1] == std::vector<TokenId>{1, 407, 261});
}

TEST_CASE("the model is named by its served name or by its folder; another is not found", "[openai]") {
  openai::ModelInfo info = fixture().info();
  info.model_path = kModelDir;
  CHECK(openai::parse_request(Endpoint::completions, R"({"model": "stories260K", "prompt": "x"})", info).prompts.size() == 1);
  const std::string by_path = R"({"model": ")" + kModelDir + R"(", "prompt": "x"})";
  CHECK(openai::parse_request(Endpoint::completions, by_path, info).prompts.size() == 1);
  CHECK_THROWS_AS(openai::parse_request(Endpoint::completions, R"({"model": "gpt-4", "prompt": "x"})", info),
                  openai::ModelNotFound);
  const server::ErrorReply reply = server::error_reply(std::make_exception_ptr(openai::ModelNotFound("no", "model")));
  CHECK(reply.status == 404);
  CHECK(reply.body.find("\"model_not_found\"") != std::string::npos);
}

TEST_CASE("/tokenize gives the golden prompt ids and /detokenize their text", "[openai]") {
  const boost::json::value golden = boost::json::parse(
      [] {
        std::ifstream in(paged::test::kGolden);
        return std::string(std::istreambuf_iterator<char>(in), {});
      }());
  const openai::ModelInfo info = fixture().info();
  for (const auto& c : golden.at("cases").as_array()) {
    const std::string prompt(c.at("prompt").as_string());
    const boost::json::value got = boost::json::parse(
        openai::tokenize_body(R"({"model": "stories260K", "prompt": )" + boost::json::serialize(boost::json::value(prompt)) + "}", info));
    CHECK(got.at("tokens") == c.at("prompt_ids"));
    CHECK(got.at("count").to_number<size_t>() == c.at("prompt_ids").as_array().size());
    CHECK(got.at("max_model_len") == 512);
    const boost::json::value text =
        boost::json::parse(openai::detokenize_body(R"({"tokens": )" + boost::json::serialize(c.at("prompt_ids")) + "}", info));
    CHECK(text.at("prompt") == prompt.c_str());
  }
  const boost::json::value without = boost::json::parse(
      openai::tokenize_body(R"({"prompt": "Once upon a time", "add_special_tokens": false})", info));
  CHECK(without.at("tokens").as_array().size() == 4);
  const boost::json::value chat =
      boost::json::parse(openai::tokenize_body(R"({"messages": [{"role": "user", "content": "hi"}]})", info));
  CHECK(chat.at("tokens") == boost::json::value_from(parse(Endpoint::chat, R"({"messages": [{"role": "user", "content": "hi"}]})").prompts[0]));
  CHECK_THROWS_AS(openai::tokenize_body(R"({"prompt": "x", "bogus": 1})", info), InvalidRequest);
  CHECK_THROWS_WITH(openai::tokenize_body(R"({"prompt": "x", "messages": [{"role": "user", "content": "hi"}]})", info),
                    "/tokenize takes 'prompt' or 'messages', not both");
  CHECK_THROWS_AS(openai::tokenize_body(R"({"model": "gpt-4", "prompt": "x"})", info), openai::ModelNotFound);
  CHECK_THROWS_AS(openai::detokenize_body(R"({"tokens": [9999]})", info), InvalidRequest);
  CHECK_THROWS_AS(openai::detokenize_body(R"({"tokens": "x"})", info), InvalidRequest);
}

TEST_CASE("/invocations: a body with messages is chat, else one with a prompt is a completion", "[openai]") {
  CHECK(openai::invocation_endpoint(R"({"messages": [{"role": "user", "content": "hi"}]})") == Endpoint::chat);
  CHECK(openai::invocation_endpoint(R"({"prompt": "Once", "max_tokens": 3})") == Endpoint::completions);
  CHECK(openai::invocation_endpoint(R"({"prompt": [1, 403]})") == Endpoint::completions);
  // Chat first, as vLLM's order of request types: the chat parser then refuses the stray prompt, naming it.
  CHECK(openai::invocation_endpoint(R"({"messages": [], "prompt": "x"})") == Endpoint::chat);
  CHECK(refused_param(Endpoint::chat, R"({"messages": [{"role": "user", "content": "hi"}], "prompt": "x"})") ==
        "prompt");
  for (const char* body : {R"({})", R"({"max_tokens": 3})", R"([{"prompt": "x"}])", R"("prompt")", "{\"prompt\"",
                           R"({"prompt": "a", "prompt": "b"})"}) {
    INFO(body);
    CHECK_THROWS_AS(openai::invocation_endpoint(body), InvalidRequest);
  }
  CHECK_THROWS_WITH(openai::invocation_endpoint(R"({"input": "hi"})"),
                    "/invocations takes a chat completion body (with 'messages') or a completion body (with 'prompt')");
}

TEST_CASE("a request holds at most max_prompts prompts and generates at most max_sequences sequences", "[openai]") {
  const auto prompts = [](size_t count) {
    std::string list = "[";
    for (size_t i = 0; i < count; ++i) list += std::string(i ? ", " : "") + "[1, 403]";
    return list + "]";
  };
  const openai::ModelInfo info = fixture().info();  // the defaults: 256 prompts, 1024 sequences
  CHECK(parse(Endpoint::completions, R"({"prompt": )" + prompts(256) + "}").prompts.size() == 256);
  CHECK(refused_param(Endpoint::completions, R"({"prompt": )" + prompts(257) + "}") == "prompt");
  CHECK(parse(Endpoint::completions, R"({"n": 4, "prompt": )" + prompts(256) + "}").prompts.size() == 256);
  CHECK(refused_param(Endpoint::completions, R"({"n": 5, "prompt": )" + prompts(256) + "}") == "n");
  CHECK(refused_param(Endpoint::completions, R"({"n": 2, "best_of": 8, "prompt": )" + prompts(200) + "}") == "best_of");
  openai::ModelInfo tight = info;
  tight.max_prompts = 2;
  CHECK(refused_param(Endpoint::completions, R"({"prompt": )" + prompts(3) + "}", &tight) == "prompt");
}

TEST_CASE("add_special_tokens, truncate_prompt_tokens and response_format text take effect", "[openai]") {
  const auto C = Endpoint::completions;
  const auto K = Endpoint::chat;
  const auto& tok = *fixture().tok;
  const std::vector<TokenId> with_bos = tok.encode("Once upon a time", true);
  const std::vector<TokenId> without = tok.encode("Once upon a time", false);
  REQUIRE(with_bos.size() == without.size() + 1);
  CHECK(parse(C, R"({"prompt": "Once upon a time"})").prompts[0] == with_bos);
  CHECK(parse(C, R"({"prompt": "Once upon a time", "add_special_tokens": false})").prompts[0] == without);
  const openai::Request cut = parse(C, R"({"prompt": "Once upon a time", "truncate_prompt_tokens": 2})");
  CHECK(cut.prompts[0] == std::vector<TokenId>(with_bos.end() - 2, with_bos.end()));
  CHECK(cut.prompt_texts[0] == tok.decode(cut.prompts[0]));
  CHECK(parse(C, R"({"prompt": "Once upon a time", "truncate_prompt_tokens": 99})").prompts[0] == with_bos);
  CHECK(parse(C, R"({"prompt": "x", "response_format": {"type": "text"}})").params.structured == StructuredOutput{});
  // Structured outputs: each way of asking gives its kind, its text and the field errors name.
  using S = StructuredOutput::Kind;
  const std::vector<std::pair<std::string, StructuredOutput>> asked{
      {R"("response_format": {"type": "json_object"})", {S::json_object, "", "response_format"}},
      {R"("response_format": {"type": "json_schema", "json_schema": {"name": "n", "strict": true,
          "schema": {"type": "integer"}}})", {S::json_schema, R"({"type":"integer"})", "response_format"}},
      {R"("structured_outputs": {"regex": "a+"})", {S::regex, "a+", "structured_outputs"}},
      {R"("structured_outputs": {"choice": ["x", "y"]})", {S::choice, R"(["x","y"])", "structured_outputs"}},
      {R"("structured_outputs": {"grammar": "root ::= \"a\""})", {S::grammar, R"(root ::= "a")", "structured_outputs"}},
      {R"("structured_outputs": {"json": "{\"type\": \"null\"}"})", {S::json_schema, R"({"type": "null"})", "structured_outputs"}},
      {R"("guided_json": {"type": "null"})", {S::json_schema, R"({"type":"null"})", "guided_json"}},
      {R"("guided_regex": "b")", {S::regex, "b", "guided_regex"}},
      {R"("guided_choice": ["z"])", {S::choice, R"(["z"])", "guided_choice"}},
      {R"("guided_grammar": "root ::= [a]")", {S::grammar, "root ::= [a]", "guided_grammar"}}};
  for (const auto& [field, expected] : asked) {
    INFO(field);
    CHECK(parse(C, R"({"prompt": "x", )" + field + "}").params.structured == expected);
    CHECK(parse(K, R"({"messages": [{"role": "user", "content": "a"}], )" + field + "}").params.structured == expected);
  }
  // Chat leaves BOS to the template; add_special_tokens adds the tokenizer's as well.
  const std::string chat = R"({"messages": [{"role": "user", "content": "hi"}])";
  const openai::Request plain = parse(K, chat + "}");
  const openai::Request added = parse(K, chat + R"(, "add_special_tokens": true})");
  REQUIRE(added.prompts[0].size() == plain.prompts[0].size() + 1);
  CHECK(added.prompts[0][0] == tok.bos_id());
}

TEST_CASE("completions: every parameter reaches SamplingParams", "[openai]") {
  auto r = parse(Endpoint::completions, R"({
    "prompt": "Hi", "max_tokens": 32, "temperature": 0.5, "top_p": 0.9, "top_k": 40, "min_p": 0.05,
    "n": 2, "best_of": 3, "stop": ["\n", "The end"], "seed": 42, "presence_penalty": 0.5,
    "frequency_penalty": -0.5, "repetition_penalty": 1.1, "logit_bias": {"13": -100, "400": 2.5},
    "logprobs": 3, "echo": false, "user": "u1", "min_tokens": 4, "ignore_eos": true, "stop_token_ids": [7],
    "skip_special_tokens": false})");
  const SamplingParams& p = r.params;
  CHECK(p.max_tokens == 32);
  CHECK(p.temperature == Approx(0.5));
  CHECK(p.top_p == Approx(0.9));
  CHECK(p.top_k == 40);
  CHECK(p.min_p == Approx(0.05));
  CHECK(p.n == 2);
  CHECK(p.best_of == 3);
  CHECK(p.stop == std::vector<std::string>{"\n", "The end"});
  CHECK(p.seed == std::optional<uint64_t>(42));
  CHECK(p.presence_penalty == Approx(0.5));
  CHECK(p.frequency_penalty == Approx(-0.5));
  CHECK(p.repetition_penalty == Approx(1.1));
  CHECK(p.logit_bias == std::map<TokenId, float>{{13, -100.0f}, {400, 2.5f}});
  CHECK(p.logprobs == std::optional<int>(3));
  CHECK(p.min_tokens == 4);
  CHECK(p.ignore_eos);
  CHECK(p.stop_token_ids == std::vector<TokenId>{7});
  CHECK_FALSE(p.skip_special_tokens);
  CHECK_FALSE(r.stream);

  r = parse(Endpoint::completions, R"({"prompt": "Hi", "stream": true, "stream_options": {"include_usage": true},
                                       "stop": "x", "temperature": 0, "echo": true, "n": 3, "seed": null})");
  CHECK(r.stream);
  CHECK(r.include_usage);
  CHECK(r.echo);
  CHECK(r.params.greedy());
  CHECK(r.params.stop == std::vector<std::string>{"x"});
  CHECK(r.params.n == 3);
  CHECK_FALSE(r.params.seed.has_value());
}

TEST_CASE("chat: messages are rendered by the template and tokenized without adding BOS again", "[openai]") {
  const auto r = parse(Endpoint::chat, R"({"model": "stories260K", "messages": [
      {"role": "system", "content": "Be brief."}, {"role": "user", "content": [{"type": "text", "text": "Hi"}]}],
      "logprobs": true, "top_logprobs": 2, "max_completion_tokens": 20})");
  REQUIRE(r.prompts.size() == 1);
  CHECK(r.prompt_texts[0] == "<s>[INST] <<SYS>>\nBe brief.\n<</SYS>>\n\nHi [/INST]");
  CHECK(r.prompts[0] == fixture().tok->encode(r.prompt_texts[0], false));
  CHECK(r.params.logprobs == std::optional<int>(2));
  CHECK(r.params.max_tokens == 20);

  // Without max_tokens a chat request may use the rest of the context.
  const auto d = parse(Endpoint::chat, R"({"messages": [{"role": "user", "content": "Hi"}]})");
  CHECK(d.params.max_tokens == 512 - static_cast<int>(d.prompts[0].size()));
  CHECK_FALSE(d.params.logprobs.has_value());
  // chat_template_kwargs reach the template; assistant content may be null.
  CHECK_NOTHROW(parse(Endpoint::chat, R"({"messages": [{"role": "user", "content": "a"},
      {"role": "assistant", "content": null}, {"role": "user", "content": "b"}], "chat_template_kwargs": {"x": 1}})"));
}

TEST_CASE("prompt_logprobs, continue_final_message, a request's chat_template and spaces_between_special_tokens",
          "[openai]") {
  const auto C = Endpoint::completions;
  const auto K = Endpoint::chat;
  CHECK(parse(C, R"({"prompt": "Hi", "prompt_logprobs": 3})").params.prompt_logprobs == std::optional<int>(3));
  CHECK(parse(C, R"({"prompt": "Hi", "prompt_logprobs": 0})").params.prompt_logprobs == std::optional<int>(0));
  CHECK(parse(K, R"({"messages": [{"role": "user", "content": "Hi"}], "prompt_logprobs": 20})")
            .params.prompt_logprobs == std::optional<int>(20));
  CHECK_FALSE(parse(C, R"({"prompt": "Hi"})").params.prompt_logprobs.has_value());

  // continue_final_message: Llama 2's template writes " Once upon </s>" for the assistant turn; the prompt stops
  // right after its text (with the space the template writes after it when the message ends in one).
  const std::string turns = R"({"messages": [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": )";
  const std::string go_on = R"(], "continue_final_message": true, "add_generation_prompt": false})";
  CHECK(parse(K, turns + R"("Once upon"})" + go_on).prompt_texts[0] == "<s>[INST] Hi [/INST] Once upon");
  CHECK(parse(K, turns + R"("Once upon "})" + go_on).prompt_texts[0] == "<s>[INST] Hi [/INST] Once upon ");
  CHECK(parse(K, turns + R"("  Once upon"})" + go_on).prompt_texts[0] == "<s>[INST] Hi [/INST] Once upon");
  CHECK(parse(K, turns + R"("Once upon"}]})").prompt_texts[0] == "<s>[INST] Hi [/INST] Once upon </s>");
  const auto cut = parse(K, turns + R"("Once upon"})" + go_on);
  CHECK(cut.prompts[0] == fixture().tok->encode("<s>[INST] Hi [/INST] Once upon", false));

  // A request's own template, with the model's special tokens and chat_template_kwargs; also for a model that has
  // no template (the tokenizer's BOS then).
  const std::string own = R"({"messages": [{"role": "user", "content": "Hi"}], "chat_template_kwargs": {"who": "bot"},
      "chat_template": )" + json::serialize(json::value("{{ bos_token }}{% for m in messages %}<{{ m.role }}>"
                                                         "{{ m.content }}{% endfor %}"
                                                         "{% if add_generation_prompt %}<{{ who }}>{% endif %}"));
  CHECK(parse(K, own + "}").prompt_texts[0] == "<s><user>Hi<bot>");
  CHECK(parse(K, own + R"(, "add_generation_prompt": false})").prompt_texts[0] == "<s><user>Hi");
  auto no_template = fixture().info();
  no_template.chat_template = nullptr;
  CHECK(openai::parse_request(K, own + "}", no_template).prompt_texts[0] == "<s><user>Hi<bot>");
  // The server's template is untouched by a request's.
  CHECK(parse(K, R"({"messages": [{"role": "user", "content": "Hi"}]})").prompt_texts[0] == "<s>[INST] Hi [/INST]");

  // spaces_between_special_tokens: false (how special tokens are written), or true where none are written.
  CHECK_FALSE(parse(C, R"({"prompt": "x", "spaces_between_special_tokens": false, "skip_special_tokens": false})")
                  .params.skip_special_tokens);
  CHECK(parse(C, R"({"prompt": "x", "spaces_between_special_tokens": true})").params.skip_special_tokens);
}

TEST_CASE("a hostile chat_template is refused with the reason, quickly", "[openai]") {
  const auto start = std::chrono::steady_clock::now();
  for (const char* tmpl : {"{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}",
                           "{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}",
                           "{{ range(1000000000000) }}"}) {
    INFO(tmpl);
    json::object body{{"messages", json::array{json::object{{"role", "user"}, {"content", "Hi"}}}},
                      {"chat_template", tmpl}};
    try {
      openai::parse_request(Endpoint::chat, body, fixture().info());
      FAIL("accepted");
    } catch (const InvalidRequest& e) {
      CHECK(e.param == "chat_template");
      CHECK(std::string(e.what()).find("the chat template rejected the messages: the template") != std::string::npos);
    }
  }
  CHECK(std::chrono::steady_clock::now() - start < std::chrono::seconds(10));
}

TEST_CASE("prompt_logprobs in vLLM's form: per completions choice, at the top of a chat response", "[openai]") {
  const Tokenizer& tok = *fixture().tok;
  // Prompt [1, 403, 407]: token 403 scored rank 2 (432 was likelier), 407 rank 1.
  const std::vector<PromptLogprob> scored = {{403, -1.25f, 2, {{432, -0.5f}, {403, -1.25f}}},
                                             {407, -0.125f, 1, {{407, -0.125f}, {13, -3.0f}}}};
  const auto check_list = [&](const json::value& list) {
    const auto& a = list.as_array();
    REQUIRE(a.size() == 3);
    CHECK(a[0].is_null());
    const auto& first = a[1].as_object();
    CHECK(first.size() == 2);
    CHECK(first.begin()->key() == "403");  // the prompt's token first
    CHECK(first.at("403").at("logprob").as_double() == Approx(-1.25));
    CHECK(first.at("403").at("rank") == 2);
    CHECK(first.at("403").at("decoded_token") == json::value(openai::token_text(tok, 403)));
    CHECK(first.at("432").at("rank") == 1);
    CHECK(first.at("432").at("logprob").as_double() == Approx(-0.5));
    const auto& second = a[2].as_object();
    CHECK(second.size() == 2);
    CHECK(second.at("407").at("rank") == 1);
    CHECK(second.at("13").at("rank") == 2);
  };
  RequestEvent ev = event({delta(0, "a", {400}, "length"), delta(1, "b", {401}, "length")}, true, 3, 2);
  ev.prompt_logprobs = scored;
  const auto creq = parse(Endpoint::completions, R"({"prompt": [1, 403, 407], "n": 2, "prompt_logprobs": 1})");
  openai::ResponseBuilder crb(creq, tok, "m", "cmpl-4", 1);
  crb.add(0, ev);
  const auto cbody = json::parse(crb.body());
  for (int i = 0; i < 2; ++i) check_list(cbody.at("choices").at(i).at("prompt_logprobs"));
  CHECK_FALSE(cbody.as_object().contains("prompt_logprobs"));

  RequestEvent kev = event({delta(0, "a", {400}, "length")}, true, 3, 1);
  kev.prompt_logprobs = scored;
  const auto kreq = parse(Endpoint::chat, R"({"messages": [{"role": "user", "content": "Hi"}], "prompt_logprobs": 1})");
  openai::ResponseBuilder krb(kreq, tok, "m", "chatcmpl-4", 1);
  krb.add(0, kev);
  const auto kbody = json::parse(krb.body());
  check_list(kbody.at("prompt_logprobs"));
  CHECK_FALSE(kbody.at("choices").at(0).as_object().contains("prompt_logprobs"));

  // Not asked: no field. A one-token prompt: [null].
  openai::ResponseBuilder plain(parse(Endpoint::completions, R"({"prompt": [1, 403]})"), tok, "m", "cmpl-5", 1);
  plain.add(0, event({delta(0, "a", {400}, "length")}, true, 2, 1));
  CHECK_FALSE(json::parse(plain.body()).at("choices").at(0).as_object().contains("prompt_logprobs"));
  openai::ResponseBuilder one(parse(Endpoint::completions, R"({"prompt": [1], "prompt_logprobs": 2})"), tok, "m",
                              "cmpl-6", 1);
  one.add(0, event({delta(0, "a", {400}, "length")}, true, 1, 1));
  CHECK(json::parse(one.body()).at("choices").at(0).at("prompt_logprobs") == json::array{nullptr});
}

TEST_CASE("echo with logprobs: the prompt's tokens scored first (vLLM's), and max_tokens 0 answers the prompt alone",
          "[openai]") {
  const Tokenizer& tok = *fixture().tok;
  // Prompt [1, 403, 407]: token 403 scored rank 2 (432 was likelier), 407 rank 1.
  const std::vector<PromptLogprob> scored = {{403, -1.25f, 2, {{432, -0.5f}}}, {407, -0.125f, 1, {{407, -0.125f}}}};
  auto req = parse(Endpoint::completions, R"({"prompt": [1, 403, 407], "echo": true, "logprobs": 1, "max_tokens": 1})");
  CHECK(req.params.prompt_logprobs == 1);  // the engine scores the prompt with as many alternatives
  CHECK_FALSE(req.show_prompt_logprobs);
  CHECK_FALSE(req.echo_only);
  const std::string prompt_text = req.prompt_texts[0];
  CompletionDelta d = delta(0, tok.decode(std::vector<TokenId>{383}), {383}, "length");
  d.logprobs = {SampledToken{383, -0.75f, {{383, -0.75f}}}};
  RequestEvent ev = event({d}, true, 3, 1);
  ev.prompt_logprobs = scored;
  const auto check_echoed = [&](const json::object& lp, size_t generated) {
    const auto& tokens = lp.at("tokens").as_array();
    REQUIRE(tokens.size() == 3 + generated);
    CHECK(tokens[1] == json::value(openai::token_text(tok, 403)));
    const auto& values = lp.at("token_logprobs").as_array();
    CHECK(values[0].is_null());
    CHECK(values[1].as_double() == Approx(-1.25));
    CHECK(values[2].as_double() == Approx(-0.125));
    const auto& top = lp.at("top_logprobs").as_array();
    CHECK(top[0].is_null());
    CHECK(top[1].as_object().size() == 2);  // the prompt's token and the likeliest
    CHECK(top[1].at(openai::token_text(tok, 432)).as_double() == Approx(-0.5));
    CHECK(top[2].as_object().size() == 1);
    const auto& offsets = lp.at("text_offset").as_array();
    CHECK(offsets[0] == 0);
    CHECK(offsets[2] == static_cast<int64_t>(tok.token_bytes(1, false).size() + tok.token_bytes(403, false).size()));
    if (generated) {
      CHECK(tokens[3] == json::value(openai::token_text(tok, 383)));
      CHECK(values[3].as_double() == Approx(-0.75));
      CHECK(offsets[3] == static_cast<int64_t>(prompt_text.size()));  // after the echoed text, as before
    }
  };
  openai::ResponseBuilder rb(req, tok, "m", "cmpl-7", 1);
  rb.add(0, ev);
  const auto body = json::parse(rb.body());
  const auto& choice = body.at("choices").at(0).as_object();
  CHECK(choice.at("text") == json::value(prompt_text + d.text));
  check_echoed(choice.at("logprobs").as_object(), 1);
  CHECK_FALSE(choice.contains("prompt_logprobs"));  // not asked by that name

  // Streamed: the first chunk of the choice carries the prompt's logprobs before its token's.
  auto sreq = parse(Endpoint::completions, R"({"prompt": [1, 403, 407], "echo": true, "logprobs": 1, "stream": true})");
  openai::ResponseBuilder srb(sreq, tok, "m", "cmpl-8", 1);
  const auto chunks = sse_objects(srb.add(0, ev));
  REQUIRE(chunks.size() == 1);
  check_echoed(chunks[0].at("choices").at(0).at("logprobs").as_object(), 1);

  // max_tokens 0: the prompt is the answer; one token is generated (the engine's least) and dropped.
  auto oreq =
      parse(Endpoint::completions, R"({"prompt": [1, 403, 407], "echo": true, "logprobs": 1, "max_tokens": 0})");
  CHECK(oreq.echo_only);
  CHECK(oreq.params.max_tokens == 1);
  for (const bool stream : {false, true}) {
    oreq.stream = stream;
    openai::ResponseBuilder orb(oreq, tok, "m", "cmpl-9", 1);
    const std::string frames = orb.add(0, ev);
    const json::object only = stream ? sse_objects(frames).at(0).at("choices").at(0).as_object()
                                     : json::parse(orb.body()).at("choices").at(0).as_object();
    CHECK(only.at("text") == json::value(prompt_text));
    CHECK(only.at("finish_reason") == "length");
    check_echoed(only.at("logprobs").as_object(), 0);
    CHECK(orb.completion_tokens() == 0);
  }
}

TEST_CASE("the model's sampling defaults fill what a request leaves out; max_new_tokens caps max_tokens", "[openai]") {
  openai::ModelInfo info = fixture().info();
  info.sampling_defaults = {.temperature = 0.6f, .top_p = 0.9f, .top_k = 20, .min_p = 0.05f,
                            .repetition_penalty = 1.1f, .max_tokens = 8};
  const auto left_out = openai::parse_request(Endpoint::completions, R"({"prompt": "x", "max_tokens": 64})", info);
  CHECK(left_out.params.temperature == 0.6f);
  CHECK(left_out.params.top_p == 0.9f);
  CHECK(left_out.params.top_k == 20);
  CHECK(left_out.params.min_p == 0.05f);
  CHECK(left_out.params.repetition_penalty == 1.1f);
  CHECK(left_out.params.max_tokens == 8);
  const auto asked = openai::parse_request(Endpoint::chat, R"({"messages": [{"role": "user", "content": "a"}],
      "temperature": 1.0, "top_p": 1, "top_k": -1, "min_p": 0, "repetition_penalty": 1, "max_tokens": 4})", info);
  CHECK(asked.params.temperature == 1.0f);
  CHECK(asked.params.top_p == 1.0f);
  CHECK(asked.params.top_k == -1);
  CHECK(asked.params.min_p == 0.0f);
  CHECK(asked.params.repetition_penalty == 1.0f);
  CHECK(asked.params.max_tokens == 4);
  // Without defaults: the API's.
  const auto plain = parse(Endpoint::completions, R"({"prompt": "x"})");
  CHECK(plain.params.temperature == 1.0f);
  CHECK(plain.params.max_tokens == 16);
}

TEST_CASE("cache_salt: one salt, one hash; another salt or none, another", "[openai]") {
  const auto salt = [](const char* body) { return parse(Endpoint::completions, body).params.cache_salt; };
  CHECK(salt(R"({"prompt": "x"})") == 0);
  const uint64_t a = salt(R"({"prompt": "x", "cache_salt": "tenant-a"})");
  CHECK(a != 0);
  CHECK(salt(R"({"prompt": "y", "cache_salt": "tenant-a"})") == a);
  CHECK(salt(R"({"prompt": "x", "cache_salt": "tenant-b"})") != a);
  CHECK(salt(R"({"prompt": "x", "cache_salt": "tenant-a "})") != a);
  CHECK(parse(Endpoint::chat, R"({"messages": [{"role": "user", "content": "a"}], "cache_salt": "tenant-a"})")
            .params.cache_salt == a);
  CHECK(refused_param(Endpoint::completions, R"({"prompt": "x", "cache_salt": ""})") == "cache_salt");
  CHECK(refused_param(Endpoint::completions, R"({"prompt": "x", "cache_salt": 5})") == "cache_salt");
}

TEST_CASE("bad requests are refused with the parameter named", "[openai]") {
  const auto C = Endpoint::completions;
  const auto K = Endpoint::chat;
  const std::vector<std::tuple<Endpoint, std::string, std::string>> cases = {
      {C, R"({"prompt": "x")", "<body>"},
      {C, "[1, 2]", "<body>"},
      {C, "\"just a string\"", "<body>"},
      {C, "{\"prompt\": \"\xff\xfe\"}", "<body>"},  // invalid UTF-8
      {C, R"({})", "prompt"},
      {C, R"({"prompt": 5})", "prompt"},
      {C, R"({"prompt": []})", "prompt"},
      {C, R"({"prompt": [[]]})", "prompt"},
      {C, R"({"prompt": [1, 512]})", "prompt"},
      {C, R"({"prompt": [1, -1]})", "prompt"},
      {C, R"({"prompt": [1, 2.5]})", "prompt"},
      {C, R"({"prompt": [{"a": 1}]})", "prompt"},
      {C, R"({"prompt": "x", "model": "gpt-4"})", "model"},
      {C, R"({"prompt": "x", "model": 3})", "model"},
      {C, R"({"prompt": "x", "max_tokens": 0})", "max_tokens"},
      {C, R"({"prompt": "x", "max_tokens": "10"})", "max_tokens"},
      {C, R"({"prompt": "x", "max_tokens": 600})", "max_tokens"},
      {C, R"({"prompt": "x", "max_tokens": 1.5})", "max_tokens"},
      {C, R"({"prompt": "x", "temperature": -0.1})", "temperature"},
      {C, R"({"prompt": "x", "temperature": 2.5})", "temperature"},
      {C, R"({"prompt": "x", "temperature": "hot"})", "temperature"},
      {C, R"({"prompt": "x", "top_p": 0})", "top_p"},
      {C, R"({"prompt": "x", "top_p": 1.5})", "top_p"},
      {C, R"({"prompt": "x", "top_k": -2})", "top_k"},
      {C, R"({"prompt": "x", "min_p": 1.5})", "min_p"},
      {C, R"({"prompt": "x", "n": 0})", "n"},
      {C, R"({"prompt": "x", "n": 1000})", "n"},
      {C, R"({"prompt": "x", "n": true})", "n"},
      {C, R"({"prompt": "x", "n": 3, "best_of": 2})", "best_of"},
      {C, R"({"prompt": "x", "best_of": 3, "stream": true})", "best_of"},
      {C, R"({"prompt": "x", "stop": 5})", "stop"},
      {C, R"({"prompt": "x", "stop": [""]})", "stop"},
      {C, R"({"prompt": "x", "stop": ["a", 1]})", "stop"},
      {C, R"({"prompt": "x", "seed": "abc"})", "seed"},
      {C, R"({"prompt": "x", "presence_penalty": 3})", "presence_penalty"},
      {C, R"({"prompt": "x", "frequency_penalty": -2.5})", "frequency_penalty"},
      {C, R"({"prompt": "x", "repetition_penalty": 0})", "repetition_penalty"},
      {C, R"({"prompt": "x", "logit_bias": {"999": 1}})", "logit_bias"},
      {C, R"({"prompt": "x", "logit_bias": {"abc": 1}})", "logit_bias"},
      {C, R"({"prompt": "x", "logit_bias": {"5": 101}})", "logit_bias"},
      {C, R"({"prompt": "x", "logit_bias": {"5": "a"}})", "logit_bias"},
      {C, R"({"prompt": "x", "logit_bias": [1]})", "logit_bias"},
      {C, R"({"prompt": "x", "logit_bias": {" 5": 1}})", "logit_bias"},  // std::stoll's leniency: " 5", "+5",
      {C, R"({"prompt": "x", "logit_bias": {"+5": 1}})", "logit_bias"},  // "05" would all be token 5
      {C, R"({"prompt": "x", "logit_bias": {"05": 1}})", "logit_bias"},
      {C, R"({"prompt": "x", "logit_bias": {"5 ": 1}})", "logit_bias"},
      {C, R"({"prompt": "x", "logit_bias": {"-0": 1}})", "logit_bias"},
      {C, R"({"prompt": "x", "max_tokens": 2, "max_tokens": 100000})", "max_tokens"},  // a key given twice
      {C, R"({"prompt": "x", "logit_bias": {"5": 1, "5": -100}})", "5"},
      {K, R"({"messages": [{"role": "user", "content": "a", "role": "system"}]})", "role"},
      {C, R"({"prompt": "x", "logprobs": 21})", "logprobs"},
      {C, R"({"prompt": "x", "logprobs": true})", "logprobs"},
      {C, R"({"prompt": "x", "echo": "yes"})", "echo"},
      {C, R"({"prompt": "x", "max_tokens": 0})", "max_tokens"},  // 0 only with echo
      {C, R"({"prompt": "x", "stream": "true"})", "stream"},
      {C, R"({"prompt": "x", "stream_options": {"include_usage": true}})", "stream_options"},
      {C, R"({"prompt": "x", "stream": true, "stream_options": {"include_usage": 1}})", "include_usage"},
      {C, R"({"prompt": "x", "user": 7})", "user"},
      {C, R"({"prompt": "x", "suffix": "y"})", "suffix"},
      {C, R"({"prompt": "x", "stop_token_ids": [9999]})", "stop_token_ids"},
      {C, R"({"prompt": "x", "max_tokens": 4, "min_tokens": 5})", "min_tokens"},
      {K, R"({})", "messages"},
      {K, R"({"messages": []})", "messages"},
      {K, R"({"messages": "hi"})", "messages"},
      {K, R"({"messages": [{"content": "hi"}]})", "messages"},
      {K, R"({"messages": [{"role": "wizard", "content": "hi"}]})", "messages"},
      {K, R"({"messages": [{"role": "user"}]})", "messages"},
      {K, R"({"messages": [{"role": "user", "content": 3}]})", "messages"},
      {K, R"({"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]})", "messages"},
      {K, R"({"messages": [{"role": "user", "content": "a"}, {"role": "user", "content": "b"}]})", "messages"},
      {K, R"({"messages": [{"role": "user", "content": "a"}], "logprobs": 2})", "logprobs"},
      {K, R"({"messages": [{"role": "user", "content": "a"}], "top_logprobs": 2})", "top_logprobs"},
      {K, R"({"messages": [{"role": "user", "content": "a"}], "logprobs": true, "top_logprobs": 50})", "top_logprobs"},
      {K, R"({"messages": [{"role": "user", "content": "a"}], "max_completion_tokens": 0})", "max_completion_tokens"},
      {K, R"({"messages": [{"role": "user", "content": "a"}], "tools": {}})", "tools"},
      // Fields this server does not act on are refused, never ignored.
      {K, R"({"messages": [{"role": "user", "content": "a"}], "tool_choice": "auto"})", "tool_choice"},
      {K, R"({"messages": [{"role": "user", "content": "a"}], "tools": []})", "tools"},
      {K, R"({"messages": [{"role": "user", "content": "a"}], "response_format": {"type": "xml"}})",
       "response_format"},
      {C, R"({"prompt": "x", "response_format": {"type": "json_schema", "json_schema": {}}})", "response_format"},
      {C, R"({"prompt": "x", "response_format": {"type": "json_object", "schema": {}}})", "response_format.schema"},
      {C, R"({"prompt": "x", "guided_json": 3})", "guided_json"},
      {C, R"({"prompt": "x", "guided_choice": []})", "guided_choice"},
      {C, R"({"prompt": "x", "guided_regex": "a", "guided_choice": ["a"]})", "guided_choice"},
      {C, R"({"prompt": "x", "structured_outputs": {"json": {}, "structural_tag": "{}"}})", "structured_outputs"},
      {C, R"({"prompt": "x", "structured_outputs": {"regex": "a", "whitespace_pattern": " "}})",
       "structured_outputs.whitespace_pattern"},
      {C, R"({"prompt": "x", "structured_outputs": {"json": {}, "disable_fallback": "yes"}})",
       "structured_outputs.disable_fallback"},
      {C, R"({"prompt": "x", "prompt_logprobs": 21})", "prompt_logprobs"},
      {C, R"({"prompt": "x", "prompt_logprobs": -1})", "prompt_logprobs"},
      {C, R"({"prompt": "x", "prompt_logprobs": 1, "stream": true})", "prompt_logprobs"},
      {K, R"({"messages": [{"role": "user", "content": "a"}], "prompt_logprobs": 0, "stream": true})",
       "prompt_logprobs"},
      {C, R"({"prompt": "x", "skip_special_tokens": false, "spaces_between_special_tokens": true})",
       "spaces_between_special_tokens"},
      {C, R"({"prompt": "x", "spaces_between_special_tokens": "no"})", "spaces_between_special_tokens"},
      {C, R"({"prompt": "x", "include_stop_str_in_output": 1})", "include_stop_str_in_output"},
      {K, R"({"messages": [{"role": "user", "content": "a"}], "continue_final_message": true})",
       "continue_final_message"},
      {K, R"({"messages": [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}],
              "continue_final_message": true, "add_generation_prompt": true})", "continue_final_message"},
      {K, R"({"messages": [{"role": "user", "content": "a"}], "continue_final_message": true,
              "add_generation_prompt": false})", "continue_final_message"},
      {K, R"({"messages": [{"role": "user", "content": "a"}, {"role": "assistant", "content": " "}],
              "continue_final_message": true, "add_generation_prompt": false})", "continue_final_message"},
      {K, R"({"messages": [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}],
              "chat_template": "{{ messages[0].content }}", "continue_final_message": true,
              "add_generation_prompt": false})", "continue_final_message"},
      {K, R"({"messages": [{"role": "user", "content": "a"}], "chat_template": "{% if %}"})", "chat_template"},
      {K, R"({"messages": [{"role": "user", "content": "a"}], "chat_template": 3})", "chat_template"},
      {K, R"({"messages": [{"role": "user", "content": "a"}], "chat_template": "{{ raise_exception('no') }}"})",
       "chat_template"},
      {K, R"({"messages": [{"role": "user", "content": "a"}], "echo": true})", "echo"},
      {C, R"({"prompt": "x", "stream": true, "stream_options": {"continuous_usage_stats": 1}})",
       "continuous_usage_stats"},
      {C, R"({"prompt": "x", "stream": true, "stream_options": {"no_such_option": true}})",
       "stream_options.no_such_option"},
      {C, R"({"prompt": "x", "no_such_field": 1})", "no_such_field"},
      {C, R"({"prompt": "x", "truncate_prompt_tokens": 0})", "truncate_prompt_tokens"},
      {C, R"({"prompt": "x", "add_special_tokens": "yes"})", "add_special_tokens"},
      {K, R"({"messages": [{"role": "user", "content": "a"}], "chat_template_kwargs": []})", "chat_template_kwargs"},
  };
  for (const auto& [endpoint, body, param] : cases) {
    INFO(body);
    CHECK(refused_param(endpoint, body) == param);
  }
  // Prompt + max_tokens over the context, and a prompt that fills it.
  std::string long_prompt = "[1";
  for (int i = 0; i < 511; ++i) long_prompt += ", 400";
  long_prompt += "]";
  CHECK(refused_param(C, R"({"prompt": )" + long_prompt + "}") == "prompt");
  // A model without a chat template refuses chat requests.
  auto no_template = fixture().info();
  no_template.chat_template = nullptr;
  CHECK(refused_param(K, R"({"messages": [{"role": "user", "content": "a"}]})", &no_template) == "messages");
}

TEST_CASE("completions response: n=2 over two prompts, usage summed", "[openai]") {
  const auto req = parse(Endpoint::completions, R"({"prompt": ["Once upon a time", "Max found a box"], "n": 2})");
  openai::ResponseBuilder rb(req, *fixture().tok, "stories260K", "cmpl-1", 1700000000);
  CHECK(rb.add(0, event({delta(0, "Hello", {10}), delta(1, "Hi", {11})}, false, 5, 2)).empty());
  CHECK_FALSE(rb.finished());
  RequestEvent second = event({delta(0, "a", {12}, "length"), delta(1, "b", {13}, "stop")}, true, 6, 2);
  second.cached_tokens = 4;  // its prefix-cache hit
  rb.add(1, second);
  rb.add(0, event({delta(0, " there", {14}, "stop"), delta(1, "!", {15}, "length")}, true, 5, 4));
  REQUIRE(rb.finished());
  const auto body = json::parse(rb.body()).as_object();
  CHECK(body.at("object") == "text_completion");
  CHECK(body.at("id") == "cmpl-1");
  CHECK(body.at("model") == "stories260K");
  const auto& choices = body.at("choices").as_array();
  REQUIRE(choices.size() == 4);
  CHECK(choices[0].at("text") == "Hello there");
  CHECK(choices[0].at("finish_reason") == "stop");
  CHECK(choices[1].at("text") == "Hi!");
  CHECK(choices[2].at("index") == 2);
  CHECK(choices[2].at("text") == "a");
  CHECK(choices[3].at("finish_reason") == "stop");
  CHECK(choices[0].at("logprobs").is_null());
  const auto& usage = body.at("usage").as_object();
  CHECK(usage.at("prompt_tokens") == 11);
  CHECK(usage.at("completion_tokens") == 6);
  CHECK(usage.at("total_tokens") == 17);
  CHECK(usage.at("prompt_tokens_details").at("cached_tokens") == 4);
}

TEST_CASE("chat stream: role first, deltas concatenate to the text, usage chunk, [DONE]", "[openai]") {
  const auto req = parse(Endpoint::chat, R"({"messages": [{"role": "user", "content": "Hi"}], "stream": true,
                                             "stream_options": {"include_usage": true}})");
  openai::ResponseBuilder rb(req, *fixture().tok, "stories260K", "chatcmpl-1", 1);
  std::string frames;
  frames += rb.add(0, event({delta(0, "Once", {403})}, false, 9, 1));
  frames += rb.add(0, event({delta(0, "", {})}, false, 9, 1));  // nothing new: no chunk
  frames += rb.add(0, event({delta(0, " upon", {407})}, false, 9, 2));
  frames += rb.add(0, event({delta(0, "", {}, "length")}, true, 9, 2));
  REQUIRE(rb.finished());
  frames += rb.stream_end();
  bool done = false;
  const auto chunks = sse_objects(frames, &done);
  CHECK(done);
  REQUIRE(chunks.size() == 4);
  std::string text;
  for (size_t i = 0; i + 1 < chunks.size(); ++i) {
    CHECK(chunks[i].at("object") == "chat.completion.chunk");
    CHECK(chunks[i].at("usage").is_null());
    const auto& choice = chunks[i].at("choices").as_array().at(0).as_object();
    const auto& d = choice.at("delta").as_object();
    if (i == 0) CHECK(d.at("role") == "assistant");
    if (const auto* c = d.if_contains("content")) text += std::string(c->as_string());
    CHECK(choice.at("finish_reason") == (i == 2 ? json::value("length") : json::value(nullptr)));
  }
  CHECK(text == "Once upon");
  CHECK(chunks[3].at("choices").as_array().empty());
  CHECK(chunks[3].at("usage").at("completion_tokens") == 2);
  CHECK(chunks[3].at("usage").at("prompt_tokens") == 9);
}

TEST_CASE("completions stream with echo prepends the prompt once", "[openai]") {
  const auto req = parse(Endpoint::completions, R"({"prompt": "Once upon a time", "stream": true, "echo": true})");
  openai::ResponseBuilder rb(req, *fixture().tok, "m", "cmpl-2", 1);
  std::string frames = rb.add(0, event({delta(0, ",", {432})}, false, 5, 1));
  frames += rb.add(0, event({delta(0, " there", {383}, "length")}, true, 5, 2));
  frames += rb.stream_end();
  bool done = false;
  const auto chunks = sse_objects(frames, &done);
  REQUIRE(chunks.size() == 2);
  CHECK(done);
  CHECK(chunks[0].at("choices").at(0).at("text") == "Once upon a time,");
  CHECK(chunks[1].at("choices").at(0).at("text") == " there");
  CHECK_FALSE(chunks[0].contains("usage"));
}

TEST_CASE("return_tokens_as_token_ids: logprobs name tokens token_id:ID, by the request or the server's default",
          "[openai]") {
  const Tokenizer& tok = *fixture().tok;
  CompletionDelta d = delta(0, tok.decode(std::vector<TokenId>{432}), {432}, "length");
  d.logprobs = {SampledToken{432, -0.25f, {{432, -0.25f}, {383, -2.0f}}}};
  const auto completions = [&](const openai::Request& req) {
    openai::ResponseBuilder rb(req, tok, "m", "cmpl-11", 1);
    rb.add(0, event({d}, true, 5, 1));
    return json::parse(rb.body()).at("choices").at(0).at("logprobs").as_object();
  };
  const auto ids = completions(parse(Endpoint::completions, R"({"prompt": "Once upon a time", "logprobs": 1,
                                                               "return_tokens_as_token_ids": true})"));
  CHECK(ids.at("tokens").at(0) == "token_id:432");
  CHECK(ids.at("top_logprobs").at(0).as_object().contains("token_id:383"));
  CHECK(ids.at("text_offset").at(0) == 0);
  const auto text = completions(parse(Endpoint::completions, R"({"prompt": "Once upon a time", "logprobs": 1})"));
  CHECK(text.at("tokens").at(0) == json::value(openai::token_text(tok, 432)));

  openai::ModelInfo info = fixture().info();
  info.return_tokens_as_token_ids = true;  // the server's --return-tokens-as-token-ids
  const auto chat = openai::parse_request(Endpoint::chat, R"({"messages": [{"role": "user", "content": "a"}],
                                                              "logprobs": true, "top_logprobs": 1})", info);
  CHECK(chat.tokens_as_ids);
  openai::ResponseBuilder krb(chat, tok, "m", "chatcmpl-11", 1);
  krb.add(0, event({d}, true, 9, 1));
  const auto content = json::parse(krb.body()).at("choices").at(0).at("logprobs").at("content").as_array();
  CHECK(content.at(0).at("token") == "token_id:432");
  CHECK(content.at(0).at("bytes").as_array().size() == std::string("token_id:432").size());
  CHECK(content.at(0).at("top_logprobs").at(0).at("token") == "token_id:432");
  const auto off = openai::parse_request(Endpoint::chat, R"({"messages": [{"role": "user", "content": "a"}],
                                                             "return_tokens_as_token_ids": false})", info);
  CHECK_FALSE(off.tokens_as_ids);  // the request wins
}

TEST_CASE("stream_options.continuous_usage_stats: every chunk carries the usage so far", "[openai]") {
  const auto req = parse(Endpoint::completions, R"({"prompt": "Once upon a time", "stream": true,
                                                    "stream_options": {"continuous_usage_stats": true}})");
  CHECK(req.continuous_usage);
  CHECK_FALSE(req.include_usage);
  openai::ResponseBuilder rb(req, *fixture().tok, "m", "cmpl-10", 1);
  std::string frames = rb.add(0, event({delta(0, ",", {432})}, false, 5, 1));
  frames += rb.add(0, event({delta(0, " there", {383}, "length")}, true, 5, 2));
  frames += rb.stream_end();
  const auto chunks = sse_objects(frames);
  REQUIRE(chunks.size() == 2);  // no usage chunk of its own (include_usage is off)
  for (int i = 0; i < 2; ++i) {
    CHECK(chunks[i].at("usage").at("completion_tokens") == i + 1);
    CHECK(chunks[i].at("usage").at("prompt_tokens") == 5);
  }
}

TEST_CASE("logprobs in the completions and the chat formats", "[openai]") {
  const Tokenizer& tok = *fixture().tok;
  SampledToken a{432, -0.25f, {{432, -0.25f}, {383, -2.0f}}};
  SampledToken b{383, -1.5f, {{383, -1.5f}, {432, -3.0f}}};
  CompletionDelta d = delta(0, tok.decode(std::vector<TokenId>{432, 383}), {432, 383}, "length");
  d.logprobs = {a, b};

  const auto creq = parse(Endpoint::completions, R"({"prompt": "Once upon a time", "logprobs": 2, "max_tokens": 2})");
  openai::ResponseBuilder crb(creq, tok, "m", "cmpl-3", 1);
  crb.add(0, event({d}, true, 5, 2));
  const auto clp = json::parse(crb.body()).at("choices").at(0).at("logprobs").as_object();
  const auto& tokens = clp.at("tokens").as_array();
  REQUIRE(tokens.size() == 2);
  CHECK(tokens[0] == json::value(openai::token_text(tok, 432)));
  CHECK(clp.at("token_logprobs").at(1).as_double() == Approx(-1.5));
  CHECK(clp.at("top_logprobs").at(0).at(openai::token_text(tok, 383)).as_double() == Approx(-2.0));
  CHECK(clp.at("text_offset").at(0) == 0);
  CHECK(clp.at("text_offset").at(1) == static_cast<int64_t>(tok.token_bytes(432, false).size()));

  const auto kreq = parse(Endpoint::chat, R"({"messages": [{"role": "user", "content": "Hi"}], "logprobs": true,
                                              "top_logprobs": 2})");
  openai::ResponseBuilder krb(kreq, tok, "m", "chatcmpl-3", 1);
  krb.add(0, event({d}, true, 9, 2));
  const auto kbody = json::parse(krb.body());
  const auto& content = kbody.at("choices").at(0).at("logprobs").at("content").as_array();
  REQUIRE(content.size() == 2);
  CHECK(content[0].at("token") == json::value(openai::token_text(tok, 432)));
  CHECK(content[0].at("logprob").as_double() == Approx(-0.25));
  const std::string raw = tok.token_bytes(432, false);
  REQUIRE(content[0].at("bytes").as_array().size() == raw.size());
  CHECK(content[0].at("bytes").at(0) == static_cast<unsigned char>(raw[0]));
  CHECK(content[1].at("top_logprobs").as_array().size() == 2);
  CHECK(content[1].at("top_logprobs").at(1).at("logprob").as_double() == Approx(-3.0));
  CHECK(kbody.at("choices").at(0).at("message").at("role") == "assistant");
  CHECK(kbody.at("object") == "chat.completion");
}

TEST_CASE("error and model bodies have the OpenAI shape", "[openai]") {
  const auto e = json::parse(openai::error_body("bad n", "invalid_request_error", "n")).as_object();
  const auto& err = e.at("error").as_object();
  CHECK(err.at("message") == "bad n");
  CHECK(err.at("type") == "invalid_request_error");
  CHECK(err.at("param") == "n");
  CHECK(err.at("code").is_null());
  openai::ModelInfo info = fixture().info();
  info.model_path = "models/stories260K";
  const auto m = json::parse(openai::models_body(info, 512, 5)).as_object();
  CHECK(m.at("object") == "list");
  CHECK(m.at("data").as_array().size() == 1);
  CHECK(m.at("data").at(0).at("id") == "stories260K");
  CHECK(m.at("data").at(0).at("object") == "model");
  CHECK(m.at("data").at(0).at("root") == "models/stories260K");
  // Several served names (vLLM's --served-model-name a b): a card each; a request may name any.
  info.other_names = {"tiny", "tiny-v2"};
  const auto several = json::parse(openai::models_body(info, 512, 5)).as_object();
  REQUIRE(several.at("data").as_array().size() == 3);
  CHECK(several.at("data").at(2).at("id") == "tiny-v2");
  CHECK(refused_param(Endpoint::completions, R"({"model": "tiny", "prompt": "a"})", &info) == "<accepted>");
  CHECK(refused_param(Endpoint::completions, R"({"model": "models/stories260K", "prompt": "a"})", &info) == "<accepted>");
  CHECK(refused_param(Endpoint::completions, R"({"model": "other", "prompt": "a"})", &info) == "model");
  // GET /v1/models/{id}: the listed card of that name, any of them; another name is a 404 naming the model.
  const auto one = json::parse(openai::model_body(info, 512, 5, "tiny-v2")).as_object();
  CHECK(one == several.at("data").at(2).as_object());
  CHECK(json::parse(openai::model_body(info, 512, 5, "stories260K")).at("root") == "models/stories260K");
  CHECK_THROWS_AS(openai::model_body(info, 512, 5, "other"), openai::ModelNotFound);
  CHECK_THROWS_AS(openai::model_body(info, 512, 5, "models/stories260K"), openai::ModelNotFound);  // not a card
}

TEST_CASE("a request's own chat_template needs a server that trusts them", "[openai]") {
  openai::ModelInfo strict = fixture().info();
  strict.trust_request_chat_template = false;
  const std::string body = R"({"messages": [{"role": "user", "content": "a"}], "chat_template": "{{ messages[0].content }}"})";
  CHECK(refused_param(Endpoint::chat, body, &strict) == "chat_template");
  CHECK(refused_param(Endpoint::chat, body) == "<accepted>");
  CHECK(parse(Endpoint::chat, body).prompt_texts.at(0) == "a");
}

TEST_CASE("tools reach the chat template's tools variable; a forced call is a structured output", "[openai][tools]") {
  const auto K = Endpoint::chat;
  const std::string tools = R"([{"type": "function", "function": {"name": "get_weather",
      "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}])";
  // A template that writes the tools' names.
  const std::string body = R"({"messages": [{"role": "user", "content": "hi"}], "tools": )" + tools +
                           R"(, "chat_template": "{% for t in tools %}[{{ t.function.name }}]{% endfor %}{{ messages[0].content }}")";
  const openai::Request none = parse(K, body + R"(, "tool_choice": "none"})");
  CHECK(none.prompt_texts[0] == "[get_weather]hi");
  CHECK(none.params.structured == StructuredOutput{});
  const openai::Request named = parse(K, body + R"(, "tool_choice": {"type": "function", "function": {"name": "get_weather"}}})");
  CHECK(named.params.structured.kind == StructuredOutput::Kind::json_schema);
  CHECK(named.params.structured.field == "tool_choice");
  CHECK(parse(K, body + R"(, "tool_choice": "required", "stream": true})").params.structured.field == "tool_choice");
  CHECK(refused_param(K, body + R"(, "tool_choice": "required", "guided_regex": "a"})") == "tool_choice");
  // "auto" needs a server with a tool-call parser; hermes keeps special tokens (<tool_call>) unless told otherwise.
  CHECK(refused_param(K, body + R"(, "tool_choice": "auto"})") == "tool_choice");
  openai::ModelInfo with_parser = fixture().info();
  with_parser.tool_call_parser = openai::ToolCallFormat::hermes;
  const openai::Request automatic = openai::parse_request(K, body + R"(, "guided_regex": "a"})", with_parser);
  CHECK(automatic.tools.mode == openai::ToolRequest::Mode::automatic);
  CHECK(automatic.params.structured.field == "guided_regex");  // "auto" goes with a structured output
  CHECK_FALSE(automatic.params.skip_special_tokens);
  CHECK(openai::parse_request(K, body + R"(, "skip_special_tokens": true})", with_parser).params.skip_special_tokens);
}

TEST_CASE("chat with tool_choice auto: content, then tool_calls, whole and streamed", "[openai][tools]") {
  const std::string tools = R"([{"type": "function", "function": {"name": "get_weather",
      "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}])";
  openai::ModelInfo info = fixture().info();
  info.tool_call_parser = openai::ToolCallFormat::hermes;
  const std::string body = R"({"messages": [{"role": "user", "content": "hi"}], "tools": )" + tools;
  const std::vector<std::string> pieces = {"Let me see.<to", "ol_call>{\"name\": \"get_", "weather\", \"arguments\": {\"ci",
                                           "ty\": \"Oslo\"}}</tool_call>"};
  const auto feed = [&](openai::ResponseBuilder& rb) { return feed_pieces(rb, pieces); };
  openai::ResponseBuilder whole(openai::parse_request(Endpoint::chat, body + "}", info), *fixture().tok, "m", "c-1", 1);
  feed(whole);
  const json::value message = json::parse(whole.body()).at("choices").at(0).at("message");
  CHECK(message.at("content") == "Let me see.");
  CHECK(message.at("tool_calls") == json::parse(R"([{"id": "call_c-1_0_0", "type": "function",
      "function": {"name": "get_weather", "arguments": "{\"city\": \"Oslo\"}"}}])"));
  CHECK(json::parse(whole.body()).at("choices").at(0).at("finish_reason") == "tool_calls");

  openai::ResponseBuilder stream(openai::parse_request(Endpoint::chat, body + R"(, "stream": true})", info),
                                 *fixture().tok, "m", "c-1", 1);
  const auto chunks = sse_objects(feed(stream));
  REQUIRE(chunks.size() == 3);  // the second piece adds nothing to send: no chunk
  const auto delta_of = [&](size_t i) { return chunks[i].at("choices").at(0).at("delta").as_object(); };
  CHECK(delta_of(0) == json::parse(R"({"role": "assistant", "content": "Let me see."})").as_object());
  CHECK(delta_of(1) == json::parse(R"({"tool_calls": [{"id": "call_c-1_0_0", "type": "function", "index": 0,
      "function": {"name": "get_weather", "arguments": "{\"ci"}}]})").as_object());
  CHECK(delta_of(2).at("tool_calls").at(0).at("function").at("arguments") == "ty\": \"Oslo\"}");
  CHECK(chunks[1].at("choices").at(0).at("finish_reason").is_null());
  CHECK(chunks[2].at("choices").at(0).at("finish_reason") == "tool_calls");
}

TEST_CASE("chat with a reasoning parser: reasoning_content and reasoning, then content and its tool calls",
          "[openai][reasoning]") {
  const std::string tools = R"([{"type": "function", "function": {"name": "get_weather",
      "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}])";
  openai::ModelInfo info = fixture().info();
  info.tool_call_parser = openai::ToolCallFormat::hermes;
  info.reasoning_parser = openai::ReasoningFormat::qwen3;
  const std::string body = R"({"messages": [{"role": "user", "content": "hi"}], "tools": )" + tools;
  // A call written inside the think block is reasoning, not a call; the tags fall across pieces.
  const std::vector<std::string> pieces = {"<thi", "nk>Maybe <tool_call>x</tool_call>, maybe not.</th",
                                           "ink>Oslo:<tool_call>{\"name\": \"get_weather\", ",
                                           "\"arguments\": {\"city\": \"Oslo\"}}</tool_call>"};
  const auto feed = [&](openai::ResponseBuilder& rb) { return feed_pieces(rb, pieces); };
  const std::string reasoning = "Maybe <tool_call>x</tool_call>, maybe not.";
  openai::ResponseBuilder whole(openai::parse_request(Endpoint::chat, body + "}", info), *fixture().tok, "m", "c-1", 1);
  feed(whole);
  const json::value message = json::parse(whole.body()).at("choices").at(0).at("message");
  CHECK(message.at("reasoning_content") == json::value(reasoning));
  CHECK(message.at("reasoning") == json::value(reasoning));
  CHECK(message.at("content") == "Oslo:");
  CHECK(message.at("tool_calls").at(0).at("function").at("arguments") == "{\"city\": \"Oslo\"}");

  openai::ResponseBuilder stream(openai::parse_request(Endpoint::chat, body + R"(, "stream": true})", info),
                                 *fixture().tok, "m", "c-1", 1);
  const auto chunks = sse_objects(feed(stream));
  REQUIRE(chunks.size() == 4);
  const auto delta_of = [&](size_t i) { return chunks[i].at("choices").at(0).at("delta").as_object(); };
  CHECK(delta_of(0) == json::parse(R"({"role": "assistant"})").as_object());  // "<thi" may begin a tag: held back
  CHECK(delta_of(1) == json::object{{"reasoning", reasoning}, {"reasoning_content", reasoning}});
  CHECK(delta_of(2).at("content") == "Oslo:");
  CHECK(delta_of(2).at("tool_calls").at(0).at("function").at("name") == "get_weather");
  CHECK(chunks[3].at("choices").at(0).at("finish_reason") == "tool_calls");

  // deepseek_r1 with no </think>: all reasoning, content null; the parser never touches completions.
  info.tool_call_parser = openai::ToolCallFormat::none;
  info.reasoning_parser = openai::ReasoningFormat::deepseek_r1;
  openai::ResponseBuilder cut(openai::parse_request(Endpoint::chat, R"({"messages": [{"role": "user", "content": "hi"}]})", info),
                              *fixture().tok, "m", "c-2", 1);
  cut.add(0, event({delta(0, "<think>thinking on", {1}, "length")}, true, 9, 1));
  const json::value cut_message = json::parse(cut.body()).at("choices").at(0).at("message");
  CHECK(cut_message.at("reasoning_content") == "thinking on");
  CHECK(cut_message.at("content").is_null());
  openai::ResponseBuilder completion(openai::parse_request(Endpoint::completions, R"({"prompt": "hi"})", info),
                                     *fixture().tok, "m", "c-3", 1);
  completion.add(0, event({delta(0, "<think>a</think>b", {1}, "stop")}, true, 9, 1));
  CHECK(json::parse(completion.body()).at("choices").at(0).at("text") == "<think>a</think>b");
  // Without a parser the tags stay in the content and no reasoning field is sent.
  openai::ResponseBuilder plain(parse(Endpoint::chat, R"({"messages": [{"role": "user", "content": "hi"}]})"),
                                *fixture().tok, "m", "c-4", 1);
  plain.add(0, event({delta(0, "<think>a</think>b", {1}, "stop")}, true, 9, 1));
  const json::object plain_message = json::parse(plain.body()).at("choices").at(0).at("message").as_object();
  CHECK(plain_message.at("content") == "<think>a</think>b");
  CHECK_FALSE(plain_message.contains("reasoning_content"));
}
