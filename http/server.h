// The HTTP server of `paged serve`: OpenAI-compatible endpoints, SSE streaming, WebSocket token streaming,
// health and Prometheus metrics, on Boost.Beast (listener / http_session / websocket_session, strands, no
// blocking on the engine).
//
//   POST /v1/completions, POST /v1/chat/completions   (stream: SSE ending with "data: [DONE]")
//   GET  /v1/models, GET /health, GET /metrics
//   GET  /v1/stream (WebSocket upgrade): generate / cancel frames, several generations at once
//
// Errors are OpenAI-shaped: 400 invalid parameters, 401 missing/wrong API key, 404, 405, 413 over the body
// limit, 503 engine overloaded or its executor gone (then /health answers 503 too), 500 anything else.
#pragma once

#include "actors/engine.h"
#include "http/server_options.h"
#include "http/server_port.h"

namespace paged {

/// Serves `engine` on `port` (bound before the engine loaded, see server_port.h) until SIGINT or SIGTERM, then shuts
/// down gracefully (options.shutdown_timeout_s). Prints the startup summary and "paged: serving MODEL on
/// http://HOST:PORT". Returns 0 after the shutdown, 1 when the server cannot start (a bad chat template file). Call
/// from one thread; the engine must outlive the call.
int run_server(Engine& engine, const ServerOptions& options, server::ServerPort& port);

}  // namespace paged
