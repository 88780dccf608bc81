#include "http/tls_stream.h"

#include <fstream>
#include <stdexcept>
#include <string>

namespace paged::server {

namespace ssl = boost::asio::ssl;

namespace {

void require_file(const std::string& flag, const std::string& path) {
  if (!std::ifstream(path)) throw std::invalid_argument(flag + ": cannot read " + path);
}

}  // namespace

std::shared_ptr<ssl::context> server_tls_context(const ServerOptions& o) {
  const bool tls = !o.ssl_certfile.empty() || !o.ssl_keyfile.empty();
  if (!tls) {
    if (!o.ssl_ca_certs.empty() || o.ssl_cert_reqs != 0)
      throw std::invalid_argument("--ssl-ca-certs and --ssl-cert-reqs need --ssl-certfile and --ssl-keyfile (HTTPS)");
    return nullptr;
  }
  if (o.ssl_certfile.empty() || o.ssl_keyfile.empty())
    throw std::invalid_argument("--ssl-certfile and --ssl-keyfile go together");
  if (o.ssl_cert_reqs < 0 || o.ssl_cert_reqs > 2)
    throw std::invalid_argument("--ssl-cert-reqs must be 0 (none), 1 (optional) or 2 (required)");
  if (o.ssl_cert_reqs > 0 && o.ssl_ca_certs.empty())
    throw std::invalid_argument("--ssl-cert-reqs " + std::to_string(o.ssl_cert_reqs) +
                                " needs --ssl-ca-certs (the CAs client certificates are checked against)");
  require_file("--ssl-certfile", o.ssl_certfile);
  require_file("--ssl-keyfile", o.ssl_keyfile);
  if (!o.ssl_ca_certs.empty()) require_file("--ssl-ca-certs", o.ssl_ca_certs);
  auto ctx = std::make_shared<ssl::context>(ssl::context::tls_server);
  ctx->set_options(ssl::context::default_workarounds | ssl::context::no_sslv2 | ssl::context::no_sslv3 |
                   ssl::context::no_tlsv1 | ssl::context::no_tlsv1_1 | ssl::context::single_dh_use);
  const auto load = [&](const std::string& flag, const std::string& path, auto&& fn) {
    boost::system::error_code ec;
    fn(ec);
    if (ec) throw std::invalid_argument(flag + ": " + path + ": " + ec.message());
  };
  load("--ssl-certfile", o.ssl_certfile, [&](auto& ec) { ctx->use_certificate_chain_file(o.ssl_certfile, ec); });
  load("--ssl-keyfile", o.ssl_keyfile, [&](auto& ec) { ctx->use_private_key_file(o.ssl_keyfile, ssl::context::pem, ec); });
  if (!o.ssl_ca_certs.empty()) {
    load("--ssl-ca-certs", o.ssl_ca_certs, [&](auto& ec) { ctx->load_verify_file(o.ssl_ca_certs, ec); });
    ctx->set_verify_mode(o.ssl_cert_reqs == 2   ? ssl::verify_peer | ssl::verify_fail_if_no_peer_cert
                         : o.ssl_cert_reqs == 1 ? ssl::verify_peer
                                                : ssl::verify_none);
  }
  return ctx;
}

}  // namespace paged::server
