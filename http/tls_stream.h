// HTTPS for `paged serve` (vLLM's --ssl-keyfile, --ssl-certfile, --ssl-ca-certs, --ssl-cert-reqs): the server's TLS
// context from its options, and the two streams a connection runs on, plain TCP or TLS over it. The sessions
// (http_session.h, websocket_session.h, dashboard_session.h) are templates over the stream, made for these two.
#pragma once

#include <memory>
#include <type_traits>

#include <boost/asio/ssl/context.hpp>
#include <boost/beast/core/tcp_stream.hpp>
#include <boost/beast/ssl/ssl_stream.hpp>

#include "http/server_options.h"

namespace paged::server {

using PlainStream = boost::beast::tcp_stream;
using TlsStream = boost::beast::ssl_stream<boost::beast::tcp_stream>;

template <class Stream>
inline constexpr bool kIsTls = std::is_same_v<Stream, TlsStream>;

/// The TLS context of options.ssl_*: null without ssl_certfile / ssl_keyfile (plain HTTP). TLS 1.2 and up; with
/// ssl_ca_certs and ssl_cert_reqs 1 (optional) or 2 (required) clients present certificates signed by those CAs (a
/// certificate that does not verify fails the handshake; 2: none fails it too). Throws std::invalid_argument naming
/// the option and the file for a missing or unreadable file, a key that does not match the certificate, or options
/// that do not go together (a key without a certificate, CA certificates or cert_reqs without TLS, cert_reqs > 0
/// without CA certificates).
std::shared_ptr<boost::asio::ssl::context> server_tls_context(const ServerOptions& options);

}  // namespace paged::server
