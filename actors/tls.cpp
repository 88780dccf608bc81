#include "actors/tls.h"

#include <caf/io/all.hpp>
#include <caf/openssl/all.hpp>

#include <arpa/inet.h>
#include <dlfcn.h>
#include <fcntl.h>
#include <openssl/err.h>
#include <openssl/ssl.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <type_traits>

#include "actors/tls_certs.h"
#include "model/loader/config.h"

// CAF 0.17's OpenSSL layer judges each SSL_read / SSL_write / handshake by SSL_get_error without emptying the
// thread's error queue first, which OpenSSL requires ("the current thread's error queue must be empty before the
// TLS/SSL I/O operation is attempted, or SSL_get_error() will not work reliably"). Every connection of a process is
// served by the one multiplexer thread, so the error a dying peer leaves there reads as a failure of whichever healthy
// connection is served next, and CAF closes that one too: killing one worker dropped the head's other workers. These
// definitions take the place of libssl's for the whole process (the executable's symbols come first in the dynamic
// linker's lookup; libcaf_openssl's calls bind to them), empty the queue and call libssl's own.
namespace {

template <class Fn>
Fn* libssl_function(const char* name) {
  static_assert(std::is_function_v<Fn>);
  void* found = dlsym(RTLD_NEXT, name);
  if (!found) std::abort();  // libssl is linked: its functions are there
  return reinterpret_cast<Fn*>(found);
}

}  // namespace

extern "C" {
int SSL_read(SSL* ssl, void* buf, int num) {
  static auto* const next = libssl_function<int(SSL*, void*, int)>("SSL_read");
  ERR_clear_error();
  return next(ssl, buf, num);
}
int SSL_write(SSL* ssl, const void* buf, int num) {
  static auto* const next = libssl_function<int(SSL*, const void*, int)>("SSL_write");
  ERR_clear_error();
  return next(ssl, buf, num);
}
int SSL_accept(SSL* ssl) {
  static auto* const next = libssl_function<int(SSL*)>("SSL_accept");
  ERR_clear_error();
  return next(ssl);
}
int SSL_connect(SSL* ssl) {
  static auto* const next = libssl_function<int(SSL*)>("SSL_connect");
  ERR_clear_error();
  return next(ssl);
}
}

namespace paged {

HeldTlsFiles::HeldTlsFiles(const DeploymentFiles& files) {
  std::array<std::string*, 3> held = {&paths_.ca, &paths_.cert, &paths_.key};
  const std::array<const std::string*, 3> given = {&files.ca, &files.cert, &files.key};
  for (size_t i = 0; i < fds_.size(); ++i) {
    fds_[i] = ::open(given[i]->c_str(), O_RDONLY | O_CLOEXEC);
    if (fds_[i] < 0) {
      const std::string why = std::strerror(errno);
      for (size_t j = 0; j < i; ++j) ::close(fds_[j]);
      throw ModelError("cannot open " + *given[i] + ": " + why);
    }
    *held[i] = "/proc/self/fd/" + std::to_string(fds_[i]);
  }
}

HeldTlsFiles::~HeldTlsFiles() {
  for (int fd : fds_) ::close(fd);
}

std::unique_ptr<HeldTlsFiles> load_transport(caf::actor_system_config& cfg, const std::string& tls_dir) {
  cfg.load<caf::io::middleman>();
  // Both ends send a BASP heartbeat every kHeartbeatInterval; a connection silent for kSilentPeerTimeout is closed,
  // which takes down the peer's actors here (the proxy fails its pending steps, the worker frees its engine slot).
  cfg.set("middleman.heartbeat-interval", caf::timespan{kHeartbeatInterval});
  cfg.set("middleman.connection-timeout", caf::timespan{kSilentPeerTimeout});
  if (tls_dir.empty()) return nullptr;
  const DeploymentFiles files = deployment_files(tls_dir);
  try {
    check_deployment(files);
  } catch (const TlsError& e) {
    throw ModelError("--tls-dir " + tls_dir + ": " + e.what());
  }
  auto held = std::make_unique<HeldTlsFiles>(files);
  // All three set: CAF's OpenSSL module then requires and verifies the peer's certificate. With none set it would
  // fall back to anonymous ciphers, which authenticate nobody.
  cfg.openssl_certificate = held->paths().cert;
  cfg.openssl_key = held->paths().key;
  cfg.openssl_cafile = held->paths().ca;
  cfg.load<caf::openssl::manager>();
  return held;
}

caf::expected<uint16_t> publish_executor(const caf::actor& executor, const std::string& host, uint16_t port) {
  caf::actor_system& system = executor.home_system();
  if (system.has_openssl_manager()) return caf::openssl::publish(executor, port, host.c_str(), true);
  return system.middleman().publish(executor, port, host.c_str(), true);
}

caf::actor connect_executor(caf::actor_system& system, const std::string& host, uint16_t port) {
  const bool tls = system.has_openssl_manager();
  caf::expected<caf::actor> worker =
      tls ? caf::openssl::remote_actor(system, host, port) : system.middleman().remote_actor(host, port);
  if (worker) return *worker;
  std::string why = system.render(worker.error());
  if (worker.error() == caf::sec::disconnect_during_handshake)
    why = (tls ? "the TLS handshake failed: the worker's certificate is not signed by this deployment's CA, or the "
                 "worker refused this engine's (both need --tls-dir with the files of one `paged gen-certs`), or "
                 "the worker runs without --tls-dir"
               : "the worker closed the connection in the handshake: a worker started with --tls-dir takes TLS "
                 "connections only; pass --tls-dir with the same deployment's files") +
          std::string(" (") + why + ")";
  throw ModelError(why);
}

bool is_loopback_host(const std::string& host) {
  if (host == "localhost") return true;
  in_addr v4;
  if (inet_pton(AF_INET, host.c_str(), &v4) == 1) return (ntohl(v4.s_addr) >> 24) == 127;
  in6_addr v6;
  return inet_pton(AF_INET6, host.c_str(), &v6) == 1 && IN6_IS_ADDR_LOOPBACK(&v6);
}

std::string plain_listen_refusal(const std::string& host, const std::string& tls_dir) {
  if (!tls_dir.empty() || is_loopback_host(host)) return "";
  return "--host " + host + ": a worker listens off loopback only with mutual TLS, since anyone reaching its port " +
         "could drive its executor; pass --tls-dir DIR with the files of `paged gen-certs DIR`, or listen on " +
         "127.0.0.1";
}

}  // namespace paged
