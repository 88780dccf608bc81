// The Jinja subset and chat templates against the @huggingface/jinja reference renderer (byte-equal output), plus
// the places where it follows Python's Jinja instead.
#include <catch2/catch.hpp>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>

#include <boost/json.hpp>

#include "model/template/chat_template.h"
#include "model/template/jinja.h"
#include "model/tokenizer/load_tokenizer.h"
#include "tests/test_data.h"
#include "tests/http/node_env.h"
#include "tests/test_data.h"

namespace json = boost::json;
using paged::ChatTemplate;
using paged::jinja::Template;
using paged::jinja::TemplateError;

namespace {

std::string read_all(const std::filesystem::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

json::object vars(std::string_view text) { return json::parse(text).as_object(); }

}  // namespace

TEST_CASE("chat templates and Jinja features render byte-equal to @huggingface/jinja", "[chat]") {
  const auto node_dir = paged::test::install_node_packages();
  const auto out = node_dir / "chat_template_reference.json";
  const std::string cmd = "cd '" + node_dir.string() + "' && node render_chat_templates.mjs '" + out.string() +
                          "' '" + std::string(PAGED_SOURCE_DIR) + "/conf' > render.log 2>&1";
  REQUIRE(std::system(cmd.c_str()) == 0);
  const json::value reference = json::parse(read_all(out));
  const auto& cases = reference.at("cases").as_array();
  REQUIRE(cases.size() > 60);

  int compared = 0;
  for (const auto& c : cases) {
    const auto& obj = c.as_object();
    const std::string name(obj.at("name").as_string());
    INFO("case " << name);
    const auto& variables = obj.at("variables").as_object();
    std::optional<std::string> output;
    std::string error;
    try {
      if (obj.at("model_dir").is_string()) {
        // Through the loader, as the server does it: template and special tokens from the package's files.
        const std::string file = obj.at("template_file").is_string() ? std::string(obj.at("template_file").as_string()) : "";
        const auto tmpl = ChatTemplate::load(std::string(obj.at("model_dir").as_string()), file);
        REQUIRE(tmpl.has_value());
        json::object extra;
        for (const auto& kv : variables) {
          if (kv.key() != "messages" && kv.key() != "add_generation_prompt" && kv.key() != "bos_token" &&
              kv.key() != "eos_token" && kv.key() != "continue_final_message") {
            extra[kv.key()] = kv.value();
          }
        }
        const auto& messages = variables.at("messages").as_array();
        output = variables.contains("continue_final_message")
                     ? tmpl->continue_final_message(messages, extra)
                     : tmpl->apply(messages, variables.at("add_generation_prompt").as_bool(), extra);
      } else {
        output = Template(std::string(obj.at("template").as_string())).render(variables);
      }
    } catch (const TemplateError& e) {
      error = e.what();
    }
    if (const auto* expected = obj.if_contains("output")) {
      INFO("error: " << error);
      REQUIRE(output.has_value());
      CHECK(*output == std::string(expected->as_string()));
    } else {
      INFO("reference error: " << obj.at("error").as_string());
      CHECK_FALSE(output.has_value());
      // raise_exception() messages reach the client: they must match too.
      const std::string expected_error(obj.at("error").as_string());
      if (expected_error.find("Conversation roles") != std::string::npos || name == "feature/raise") {
        CHECK(error == expected_error);
      }
    }
    ++compared;
  }
  CHECK(compared == static_cast<int>(cases.size()));
}

TEST_CASE("Jinja subset follows Python where the JavaScript renderer ignores it", "[chat]") {
  // str.strip(chars) strips only those characters (the JS renderer strips all whitespace).
  CHECK(Template("{{ '\\n  x  \\n'.strip('\\n') }}|{{ 'xxhixx'.lstrip('x') }}|{{ 'hi--'.rstrip('-') }}").render({}) ==
        "  x  |hixx|hi");
  // Output made before a break or continue stays.
  CHECK(Template("{% for x in [1, 2, 3] %}{{ x }}{% if x == 2 %}{% break %}{% endif %}{% endfor %}").render({}) == "12");
  CHECK(Template("{% for x in [1, 2] %}<{% if true %}{{ x }}{% continue %}{% endif %}never{% endfor %}").render({}) ==
        "<1<2");
}

TEST_CASE("Jinja subset reports syntax and runtime errors as TemplateError", "[chat]") {
  CHECK_THROWS_AS(Template("{% if x %}unterminated"), TemplateError);
  CHECK_THROWS_AS(Template("{{ 'unterminated }}"), TemplateError);
  CHECK_THROWS_AS(Template("{% frobnicate %}"), TemplateError);
  CHECK_THROWS_AS(Template("{{ x | }}"), TemplateError);
  CHECK_THROWS_AS(Template("{{ 1 + }}"), TemplateError);
  CHECK_THROWS_AS(Template("{{ x }"), TemplateError);
  CHECK_THROWS_WITH(Template("{{ raise_exception('no: ' ~ n) }}").render(vars(R"({"n": 3})")), "no: 3");
  CHECK_THROWS_AS(Template("{{ 1 / x.y + none }}").render({}), TemplateError);
  CHECK_THROWS_AS(Template("{% for x in 5 %}{% endfor %}").render({}), TemplateError);
  CHECK_THROWS_AS(Template("{% break %}").render({}), TemplateError);
  CHECK_THROWS_AS(Template("{{ 1 // 0 }}").render({}), TemplateError);
  CHECK_THROWS_AS(Template("{% set x.y = 1 %}").render(vars(R"({"x": {"y": 0}})")), TemplateError);
}

TEST_CASE("Jinja template renders the same from several threads", "[chat]") {
  const Template t("{% for m in messages %}{{ m.role }}:{{ m.content | trim }};{% endfor %}");
  const auto v = vars(R"({"messages": [{"role": "user", "content": " a "}, {"role": "assistant", "content": "b"}]})");
  std::vector<std::string> results(8);
  std::vector<std::thread> threads;
  for (size_t i = 0; i < results.size(); ++i) {
    threads.emplace_back([&, i] {
      for (int k = 0; k < 200; ++k) results[i] = t.render(v);
    });
  }
  for (auto& th : threads) th.join();
  for (const auto& r : results) CHECK(r == "user:a;assistant:b;");
}

TEST_CASE("ChatTemplate::load finds no template in a model without one", "[chat]") {
  const std::string stories = paged::test::kModel;
  CHECK_FALSE(ChatTemplate::load(stories).has_value());
  // --chat-template supplies one; BOS/EOS still come from the model's tokenizer_config.json.
  const auto with_file = ChatTemplate::load(stories, std::string(PAGED_SOURCE_DIR) + "/conf/chat_templates/llama2.jinja");
  REQUIRE(with_file.has_value());
  const auto messages = json::parse(R"([{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Yo"}])").as_array();
  CHECK(with_file->apply(messages, true) == "<s>[INST] Hi [/INST] Yo </s>");
  CHECK_THROWS_AS(ChatTemplate::load(stories, "/nonexistent/template.jinja"), std::runtime_error);
}

TEST_CASE("ChatTemplate::with_tokenizer_tokens gives a template the tokenizer's BOS and EOS text", "[chat]") {
  const std::unique_ptr<paged::Tokenizer> tok = paged::load_tokenizer(paged::test::kModel);
  const paged::ChatTemplate t = paged::ChatTemplate::with_tokenizer_tokens("{{ bos_token }}|{{ eos_token }}", *tok);
  CHECK(t.apply(boost::json::array{}, false) == "<s>|</s>");  // stories260K's SentencePiece control pieces
}
