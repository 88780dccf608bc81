// GET /health: the local engine's state and executors as JSON (200, "ready"), and a failed engine's (503, "lost").
#include <catch2/catch.hpp>

#include <boost/json.hpp>

#include "actors/engine.h"
#include "http/server_context.h"
#include "tests/test_data.h"

using namespace paged;

TEST_CASE("a local engine is ready: /health answers 200 with its executor", "[http][health]") {
  EngineConfig config;
  config.model_dir = test::kModel;
  config.device = "cpu";
  Engine engine(config);
  const EngineHealth health = engine.health();
  CHECK(health.state == EngineState::ready);
  CHECK(health.reason.empty());
  CHECK(engine.metrics().engine_ready == 1);
  CHECK(engine.metrics().prometheus().find("\npaged_engine_ready 1\n") != std::string::npos);
  const server::HealthReply reply = server::health_reply(health);
  CHECK(reply.status == 200);
  CHECK(boost::json::parse(reply.body) ==
        boost::json::parse(R"({"status":"ok","executors":[{"kind":"local","state":"ready"}]})"));
}

TEST_CASE("a failed engine: /health answers 503 with the reason and its executors lost", "[http][health]") {
  const EngineHealth health{EngineState::failed, "the engine's executor is gone: lost",
                            {ExecutorInfo{true, "127.0.0.1:5000"}}};
  const server::HealthReply reply = server::health_reply(health);
  CHECK(reply.status == 503);
  CHECK(boost::json::parse(reply.body) ==
        boost::json::parse(R"({"status":"unavailable","reason":"the engine's executor is gone: lost",)"
                           R"("executors":[{"kind":"remote","address":"127.0.0.1:5000","state":"lost"}]})"));
}

TEST_CASE("EngineUnavailable maps to 503 with the reason", "[http][health]") {
  const server::ErrorReply reply =
      server::error_reply(std::make_exception_ptr(EngineUnavailable("the engine's executor is gone: lost")));
  CHECK(reply.status == 503);
  CHECK(reply.body.find("the engine's executor is gone: lost") != std::string::npos);
  CHECK(reply.body.find("engine_unavailable") != std::string::npos);
}
