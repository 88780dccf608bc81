// The transport between an engine and its workers: CAF's network layer, through CAF's OpenSSL module with mutual
// TLS when a deployment's folder (actors/tls_certs.h, --tls-dir) is given, else plain TCP, which a worker accepts on
// loopback only. With TLS both sides present the deployment's node certificate and refuse a peer whose certificate
// its CA did not sign; an unauthenticated peer's bytes never get past the TLS handshake.
#pragma once

#include <caf/fwd.hpp>

#include <array>
#include <chrono>
#include <cstdint>
#include <memory>
#include <string>

#include "actors/tls_certs.h"

namespace paged {

/// A deployment's files held open while an actor system uses them. CAF's OpenSSL module rereads the files on every
/// connection and ends the process when it cannot load them; through these descriptors (/proc/self/fd/N) it reads
/// what was checked at the start, whatever later happens to the folder (a key replaced before its certificate, a
/// folder removed).
class HeldTlsFiles {
 public:
  /// Opens the three files; ModelError naming one it cannot open.
  explicit HeldTlsFiles(const DeploymentFiles& files);
  ~HeldTlsFiles();
  HeldTlsFiles(const HeldTlsFiles&) = delete;
  HeldTlsFiles& operator=(const HeldTlsFiles&) = delete;
  /// The /proc/self/fd paths of the open files.
  const DeploymentFiles& paths() const { return paths_; }

 private:
  std::array<int, 3> fds_{-1, -1, -1};
  DeploymentFiles paths_;
};

/// How often each end of a connection tells the other it is there.
constexpr std::chrono::seconds kHeartbeatInterval{1};
/// How long a connection may stay silent before its peer counts as lost (checked at each heartbeat, so a silent
/// peer is lost within kSilentPeerTimeout + kHeartbeatInterval).
constexpr std::chrono::seconds kSilentPeerTimeout{4};

/// Loads CAF's middleman into cfg, with the heartbeats above, and, when tls_dir is not empty, CAF's OpenSSL module
/// with the deployment's CA, node certificate and key, checked first: ModelError "--tls-dir DIR: ..." names a
/// missing or unusable file. The caller keeps what it returns (null without TLS) until the actor system made from cfg
/// is gone.
std::unique_ptr<HeldTlsFiles> load_transport(caf::actor_system_config& cfg, const std::string& tls_dir);

/// Publishes the executor on host:port (0: any free port) over the transport load_transport set up; the bound port.
caf::expected<uint16_t> publish_executor(const caf::actor& executor, const std::string& host, uint16_t port);

/// The worker's executor at host:port over the transport load_transport set up, or ModelError with the reason (the
/// caller names the worker), saying what TLS (or its absence on one side) has to do with it when the connection ended
/// in the handshake.
caf::actor connect_executor(caf::actor_system& system, const std::string& host, uint16_t port);

/// Whether `host` is a loopback address: localhost, 127.0.0.0/8 or ::1.
bool is_loopback_host(const std::string& host);

/// Why a worker must not listen on `host` without TLS; empty when it may (TLS is on, or host is loopback).
std::string plain_listen_refusal(const std::string& host, const std::string& tls_dir);

}  // namespace paged
