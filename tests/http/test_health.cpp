// GET /health: the engine's state and replicas as JSON (200 while one serves, the others "lost" with a reason; 503
// with none).
#include <catch2/catch.hpp>

#include <boost/json.hpp>

#include "actors/engine.h"
#include "http/server_context.h"
#include "tests/test_data.h"

using namespace paged;

TEST_CASE("a local engine is ready: /health answers 200 with its replica", "[http][health]") {
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
        boost::json::parse(R"({"status":"ok","replicas":[{"kind":"local","state":"ready"}]})"));
}

TEST_CASE("a failed engine: /health answers 503 with the reason and its replicas lost", "[http][health]") {
  const EngineHealth health{EngineState::failed, "every replica is lost; the last: gone",
                            {ReplicaInfo{"127.0.0.1:5000", false, "gone"}, ReplicaInfo{"127.0.0.1:5001", false, "x"}}};
  const server::HealthReply reply = server::health_reply(health);
  CHECK(reply.status == 503);
  CHECK(boost::json::parse(reply.body) ==
        boost::json::parse(R"({"status":"unavailable","reason":"every replica is lost; the last: gone","replicas":[)"
                           R"({"kind":"remote","address":"127.0.0.1:5000","state":"lost","reason":"gone"},)"
                           R"({"kind":"remote","address":"127.0.0.1:5001","state":"lost","reason":"x"}]})"));
}

TEST_CASE("one replica lost of two: /health answers 200 and lists it lost", "[http][health]") {
  const EngineHealth health{EngineState::ready, "",
                            {ReplicaInfo{"127.0.0.1:5000", true, ""}, ReplicaInfo{"127.0.0.1:5001", false, "gone"}}};
  const server::HealthReply reply = server::health_reply(health);
  CHECK(reply.status == 200);
  CHECK(boost::json::parse(reply.body) ==
        boost::json::parse(R"({"status":"ok","replicas":[{"kind":"remote","address":"127.0.0.1:5000","state":"ready"},)"
                           R"({"kind":"remote","address":"127.0.0.1:5001","state":"lost","reason":"gone"}]})"));
}

TEST_CASE("EngineUnavailable maps to 503 with the reason", "[http][health]") {
  const server::ErrorReply reply =
      server::error_reply(std::make_exception_ptr(EngineUnavailable("the engine's executor is gone: lost")));
  CHECK(reply.status == 503);
  CHECK(reply.body.find("the engine's executor is gone: lost") != std::string::npos);
  CHECK(reply.body.find("engine_unavailable") != std::string::npos);
}
