// The Responses API translation (http/responses.h), pure: a Responses body into the chat body that asks the same,
// the refusals naming their field, a chat answer into the response object, and the order of the streamed events.
#include <catch2/catch.hpp>

#include <boost/json.hpp>

#include "actors/engine_types.h"
#include "http/responses.h"

using namespace paged;
using namespace paged::openai;
namespace json = boost::json;

namespace {

json::object chat_of(const std::string& body, json::object* echo_out = nullptr) {
  ResponsesForm form = responses_form(json::parse(body).as_object(), nullptr);
  if (echo_out) *echo_out = form.echo;
  return form.chat;
}

// The field a refusal names ("" when none came), with `store` holding the responses.
std::string refused(const std::string& body, const ResponseStore* store = nullptr) {
  try {
    responses_form(json::parse(body).as_object(), store);
  } catch (const InvalidRequest& e) {
    return e.param;
  }
  return "";
}

// What a store keeps of an answer `text` to the request `body`, stored as `id`.
void answer(ResponseStore& store, const std::string& body, const std::string& id, const std::string& text) {
  const ResponsesForm form = responses_form(json::parse(body).as_object(), &store);
  const json::object chat{{"model", "m"},
                          {"choices", json::array{json::object{{"index", 0}, {"finish_reason", "stop"},
                                                               {"message", json::object{{"role", "assistant"},
                                                                                        {"content", text}}}}}},
                          {"usage", json::parse(R"({"prompt_tokens": 4, "completion_tokens": 3, "total_tokens": 7,
                              "prompt_tokens_details": {"cached_tokens": 0}})")}};
  const json::object& message = chat.at("choices").at(0).at("message").as_object();
  REQUIRE(store.put(id, "", stored_response(form, response_object(chat, form.echo, id, 100), message)));
}

}  // namespace

TEST_CASE("a Responses body becomes the chat body that asks the same", "[http][responses]") {
  json::object echo;
  const json::object chat = chat_of(R"({"model": "m", "input": "Hi", "instructions": "Be kind",
      "max_output_tokens": 7, "temperature": 0.5, "metadata": {"k": "v"}, "store": false})", &echo);
  CHECK(chat == json::parse(R"({"model": "m", "temperature": 0.5, "max_tokens": 7,
      "messages": [{"role": "system", "content": "Be kind"}, {"role": "user", "content": "Hi"}]})").as_object());
  CHECK(echo.at("instructions") == "Be kind");
  CHECK(echo.at("max_output_tokens") == 7);
  CHECK(echo.at("metadata") == json::parse(R"({"k": "v"})"));
  CHECK(echo.at("store") == false);

  const json::object parts = chat_of(R"({"input": [{"role": "developer", "content": "Short."},
      {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "a"}, {"type": "input_text", "text": "b"}]},
      {"role": "assistant", "content": [{"type": "output_text", "text": "c"}]}],
      "text": {"format": {"type": "json_schema", "name": "x", "schema": {"type": "object"}, "strict": true}}})");
  CHECK(parts.at("messages") == json::parse(R"([{"role": "system", "content": "Short."},
      {"role": "user", "content": "a\nb"}, {"role": "assistant", "content": "c"}])"));
  CHECK(parts.at("response_format") == json::parse(R"({"type": "json_schema",
      "json_schema": {"name": "x", "schema": {"type": "object"}, "strict": true}})"));
  CHECK_FALSE(chat_of(R"({"input": "x", "text": {"format": {"type": "text"}}})").contains("response_format"));

  // Function tools, a named tool_choice, and an earlier round of calls and their outputs.
  const json::object tools = chat_of(R"({"input": [{"role": "user", "content": "weather?"},
      {"type": "function_call", "call_id": "c1", "name": "get", "arguments": "{\"city\": \"Oslo\"}"},
      {"type": "function_call", "call_id": "c2", "name": "get", "arguments": "{\"city\": \"Rome\"}"},
      {"type": "function_call_output", "call_id": "c1", "output": "cold"},
      {"type": "function_call_output", "call_id": "c2", "output": "warm"}],
      "tools": [{"type": "function", "name": "get", "description": "d", "parameters": {"type": "object"}}],
      "tool_choice": {"type": "function", "name": "get"}, "parallel_tool_calls": false})");
  CHECK(tools.at("tools") == json::parse(R"([{"type": "function", "function": {"name": "get", "description": "d",
      "parameters": {"type": "object"}}}])"));
  CHECK(tools.at("tool_choice") == json::parse(R"({"type": "function", "function": {"name": "get"}})"));
  CHECK(tools.at("parallel_tool_calls") == false);
  CHECK(tools.at("messages") == json::parse(R"([{"role": "user", "content": "weather?"},
      {"role": "assistant", "content": "", "tool_calls": [
        {"id": "c1", "type": "function", "function": {"name": "get", "arguments": "{\"city\": \"Oslo\"}"}},
        {"id": "c2", "type": "function", "function": {"name": "get", "arguments": "{\"city\": \"Rome\"}"}}]},
      {"role": "tool", "tool_call_id": "c1", "content": "cold"},
      {"role": "tool", "tool_call_id": "c2", "content": "warm"}])"));
}

TEST_CASE("what the Responses translation does not support is refused, naming the field", "[http][responses]") {
  CHECK(refused(R"({"input": "x", "store": true})") == "store");
  CHECK(refused(R"({"input": "x", "tools": [{"type": "web_search"}]})") == "tools[0].type");
  CHECK(refused(R"({"input": "x", "tools": [{"type": "function", "name": "f", "cache": 1}]})") == "tools[0].cache");
  CHECK(refused(R"({"input": "x", "include": ["reasoning.encrypted_content"]})") == "include");
  CHECK(refused(R"({"input": "x", "previous_response_id": "resp_1"})") == "previous_response_id");
  CHECK(refused(R"({"input": "x", "truncation": "auto"})") == "truncation");
  CHECK(refused(R"({"input": "x", "tool_choice": {"type": "file_search"}})") == "tool_choice");
  CHECK(refused(R"({"input": "x", "max_output_tokens": 0})") == "max_output_tokens");
  CHECK(refused(R"({"input": "x", "metadata": {"k": 1}})") == "metadata");
  CHECK(refused(R"({"input": "x", "text": {"format": {"type": "xml"}}})") == "text.format.type");
  CHECK(refused(R"({"input": "x", "text": {"verbosity": "low"}})") == "text.verbosity");
  CHECK(refused(R"({"max_output_tokens": 3})") == "input");
  CHECK(refused(R"({"input": []})") == "input");
  CHECK(refused(R"({"input": [{"role": "tool", "content": "x"}]})") == "input[0].role");
  CHECK(refused(R"({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "u"}]}]})") ==
        "input[0].content");
  CHECK(refused(R"({"input": [{"type": "function_call", "name": "f"}]})") == "input[0].call_id");
  CHECK(refused(R"({"input": [{"type": "reasoning", "summary": []}]})") == "input[0].type");
  CHECK(refused(R"({"input": [{"role": "user", "content": "x", "name": "bob"}]})") == "input[0].name");
  CHECK(refused(R"({"input": "x", "n": 2})") == "n");  // not a Responses field
}

TEST_CASE("a chat answer becomes the response object; streamed, its events come in OpenAI's order",
          "[http][responses]") {
  json::object echo;
  chat_of(R"({"input": "x", "max_output_tokens": 3})", &echo);
  const json::object chat = json::parse(R"({"model": "m", "choices": [{"index": 0, "finish_reason": "length",
      "message": {"role": "assistant", "content": "Hello", "reasoning_content": "think"}}],
      "usage": {"prompt_tokens": 4, "completion_tokens": 3, "total_tokens": 7,
                "prompt_tokens_details": {"cached_tokens": 2}, "completion_tokens_details": {"reasoning_tokens": 2}}})")
                                .as_object();
  const json::object r = response_object(chat, echo, "resp_abc", 100);
  CHECK(r.at("status") == "incomplete");
  CHECK(r.at("incomplete_details") == json::parse(R"({"reason": "max_output_tokens"})"));
  const json::array& output = r.at("output").as_array();
  REQUIRE(output.size() == 2);
  CHECK(output[0].at("type") == "reasoning");
  CHECK(output[0].at("content").at(0).at("text") == "think");
  CHECK(output[1].at("id") == "msg_abc");
  CHECK(output[1].at("content").at(0).at("text") == "Hello");
  CHECK(r.at("usage") == json::parse(R"({"input_tokens": 4, "input_tokens_details": {"cached_tokens": 2},
      "output_tokens": 3, "output_tokens_details": {"reasoning_tokens": 2}, "total_tokens": 7})"));

  // An answer that only calls a tool: a function_call item, no message.
  const json::object calling = json::parse(R"({"model": "m", "choices": [{"index": 0, "finish_reason": "tool_calls",
      "message": {"role": "assistant", "content": "", "tool_calls": [{"id": "call_1", "type": "function",
        "function": {"name": "get", "arguments": "{}"}}]}}],
      "usage": {"prompt_tokens": 4, "completion_tokens": 3, "total_tokens": 7,
                "prompt_tokens_details": {"cached_tokens": 0}}})").as_object();
  const json::object called = response_object(calling, echo, "resp_abc", 100);
  CHECK(called.at("status") == "completed");
  CHECK(called.at("output") == json::parse(R"([{"type": "function_call", "id": "fc_call_1", "call_id": "call_1",
      "name": "get", "arguments": "{}", "status": "completed"}])"));

  ResponsesEvents events(echo, "resp_abc", "m", 100);
  std::string sse = events.add("th", "");  // one call a statement: the order of the events is the order of calls
  sse += events.add("ink", "");
  sse += events.add("", "Hel");
  sse += events.add("", "lo");
  sse += events.finish(r);
  std::vector<std::string> types;
  int64_t sequence = 0;
  for (size_t at = 0; (at = sse.find("data: ", at)) != std::string::npos; at += 6) {
    const json::object e = json::parse(sse.substr(at + 6, sse.find('\n', at) - at - 6)).as_object();
    types.emplace_back(e.at("type").as_string());
    CHECK(e.at("sequence_number") == sequence++);
  }
  CHECK(types == std::vector<std::string>{
                     "response.created", "response.in_progress", "response.output_item.added",
                     "response.content_part.added", "response.reasoning_text.delta", "response.reasoning_text.delta",
                     "response.reasoning_text.done", "response.content_part.done", "response.output_item.done",
                     "response.output_item.added", "response.content_part.added", "response.output_text.delta",
                     "response.output_text.delta", "response.output_text.done", "response.content_part.done",
                     "response.output_item.done", "response.incomplete"});
}

TEST_CASE("stored responses: kept, pushed out oldest first, found by id, deleted", "[http][responses]") {
  ResponseStore store(2);
  REQUIRE(store.enabled());
  CHECK(store.put("a", "k", {}));
  CHECK_FALSE(store.put("a", "k", {}));  // an id is stored once
  CHECK_FALSE(store.put("a", "other", {}));
  CHECK(store.put("b", "k", {}));
  CHECK(store.put("c", "k", {}));  // full: "a" goes
  CHECK(store.find("a", "k") == nullptr);
  CHECK(store.find("b", "k") != nullptr);
  CHECK(store.size() == 2);
  // Another owner (API key) finds nothing of k's, and cannot delete it.
  CHECK(store.find("b", "other") == nullptr);
  CHECK(store.reserve("b", "other") == nullptr);  // its id is not another request's to hold
  CHECK_FALSE(store.erase("b", "other"));
  CHECK_THROWS_AS(store.get("b", "other", ""), ResponseNotFound);
  CHECK(store.erase("b", "k"));
  CHECK_FALSE(store.erase("b", "k"));
  CHECK(store.put("d", "k", {}));  // the deleted one's place is free: "c" stays
  CHECK(store.find("c", "k") != nullptr);
  CHECK(store.size() == 2);
  CHECK_THROWS_AS(store.get("b", "k", "previous_response_id"), ResponseNotFound);
  ResponseStore off(0);
  CHECK_FALSE(off.enabled());
  CHECK_FALSE(off.put("a", "", {}));
  CHECK(off.reserve("a", "") == nullptr);
}

TEST_CASE("a response's id is held while it is generated: no other request takes it, and it is free if never stored",
          "[http][responses]") {
  ResponseStore store(4);
  std::shared_ptr<void> first = store.reserve("r", "k");
  REQUIRE(first);
  CHECK(store.reserve("r", "k") == nullptr);  // a second request naming the same id, while the first runs
  CHECK(store.reserve("r", "other") == nullptr);
  CHECK(store.find("r", "k") == nullptr);     // nothing to read until it is stored
  CHECK_FALSE(store.put("r", "other", {}));  // another owner cannot store under it
  CHECK(store.put("r", "k", {}));
  CHECK(store.find("r", "k") != nullptr);
  CHECK(store.reserve("r", "k") == nullptr);  // stored: taken as such
  // Deleted while its request still holds the handle, then held by a later request: the first handle's end does
  // not let go of the later hold.
  CHECK(store.erase("r", "k"));
  std::shared_ptr<void> later = store.reserve("r", "k");
  REQUIRE(later);
  first.reset();
  CHECK(store.reserve("r", "k") == nullptr);
  // A request that stores nothing (an error, a client gone) lets go of its id.
  later.reset();
  CHECK(store.reserve("r", "k") != nullptr);
}

TEST_CASE("store and previous_response_id: a conversation continues, without the earlier instructions",
          "[http][responses]") {
  ResponseStore store(8);
  // Where responses are kept, store is true unless the request says false (OpenAI's default).
  CHECK(responses_form(json::parse(R"({"input": "x"})").as_object(), &store).store);
  CHECK(responses_form(json::parse(R"({"input": "x"})").as_object(), &store).echo.at("store") == true);
  CHECK_FALSE(responses_form(json::parse(R"({"input": "x", "store": false})").as_object(), &store).store);
  CHECK_FALSE(responses_form(json::parse(R"({"input": "x"})").as_object(), nullptr).store);

  answer(store, R"({"input": "Hi", "instructions": "Be kind"})", "resp_1", "Hello");
  answer(store, R"({"input": [{"role": "user", "content": "And?"}], "previous_response_id": "resp_1"})", "resp_2",
         "More");
  const ResponsesForm third = responses_form(
      json::parse(R"({"input": "Last", "previous_response_id": "resp_2", "instructions": "Be brief"})").as_object(),
      &store);
  CHECK(third.chat.at("messages") == json::parse(R"([{"role": "system", "content": "Be brief"},
      {"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello"},
      {"role": "user", "content": "And?"}, {"role": "assistant", "content": "More"},
      {"role": "user", "content": "Last"}])"));
  CHECK(third.echo.at("previous_response_id") == "resp_2");
  const auto second = store.find("resp_2", "");
  REQUIRE(second);
  CHECK(second->response.at("id") == "resp_2");
  CHECK(second->input_items == json::parse(R"([{"type": "message", "role": "user",
      "content": [{"type": "input_text", "text": "And?"}], "id": "msg_2_in0"}])"));

  CHECK(refused(R"({"input": "x", "previous_response_id": "resp_9"})", &store) == "previous_response_id");
  CHECK_THROWS_AS(responses_form(json::parse(R"({"input": "x", "previous_response_id": "resp_9"})").as_object(),
                                 &store),
                  ResponseNotFound);
  CHECK(refused(R"({"input": "x", "previous_response_id": 7})", &store) == "previous_response_id");
  // Another API key's request does not see resp_2.
  CHECK_THROWS_AS(
      responses_form(json::parse(R"({"input": "x", "previous_response_id": "resp_2"})").as_object(), &store, "key 1"),
      ResponseNotFound);
  ResponseStore off(0);
  CHECK(refused(R"({"input": "x", "store": true})", &off) == "store");
  CHECK(refused(R"({"input": "x", "previous_response_id": "resp_1"})", &off) == "previous_response_id");
}

TEST_CASE("a stored response's input items page by limit, order and after", "[http][responses]") {
  ResponseStore store(4);
  answer(store, R"({"input": [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"},
      {"type": "function_call", "call_id": "c1", "name": "f", "arguments": "{}"},
      {"type": "function_call_output", "call_id": "c1", "output": "ok"}]})", "resp_x", "done");
  const StoredResponse& stored = *store.find("resp_x", "");
  const auto ids = [](const json::object& page) {
    std::vector<std::string> out;
    for (const json::value& item : page.at("data").as_array()) out.emplace_back(item.at("id").as_string());
    return out;
  };
  const json::object all = input_items_page(stored, {});
  CHECK(ids(all) == std::vector<std::string>{"fco_x_in3", "fc_x_in2", "msg_x_in1", "msg_x_in0"});  // newest first
  CHECK(all.at("object") == "list");
  CHECK(all.at("has_more") == false);
  CHECK(all.at("first_id") == "fco_x_in3");
  CHECK(all.at("data").at(1).at("name") == "f");
  CHECK(all.at("data").at(2).at("content") == json::parse(R"([{"type": "output_text", "text": "b"}])"));
  const json::object page = input_items_page(stored, {{"order", "asc"}, {"limit", "2"}, {"after", "msg_x_in0"}});
  CHECK(ids(page) == std::vector<std::string>{"msg_x_in1", "fc_x_in2"});
  CHECK(page.at("has_more") == true);
  CHECK(page.at("last_id") == "fc_x_in2");
  const auto bad = [&](std::vector<std::pair<std::string, std::string>> params) {
    try {
      input_items_page(stored, params);
    } catch (const InvalidRequest& e) {
      return e.param;
    }
    return std::string();
  };
  CHECK(bad({{"limit", "0"}}) == "limit");
  CHECK(bad({{"limit", "101"}}) == "limit");
  CHECK(bad({{"limit", "2x"}}) == "limit");
  CHECK(bad({{"order", "up"}}) == "order");
  CHECK(bad({{"after", "msg_nope"}}) == "after");
  CHECK(bad({{"include", "x"}}) == "include");
}
