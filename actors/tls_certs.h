// The certificates of one deployment (an engine and its workers) for mutual TLS: a CA certificate, and one node
// certificate and key that CA signed, shared by every host. Pure OpenSSL, no CAF: `paged gen-certs` writes them,
// actors/tls.h hands them to CAF's OpenSSL module. The CA's private key is never written: nobody can sign a further
// certificate this deployment trusts, and a new host name means a new deployment (gen-certs --force).
#pragma once

#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

namespace paged {

/// A deployment's files that are missing, unreadable or do not fit together, or that cannot be written.
struct TlsError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

/// The three files of a deployment, by absolute path.
struct DeploymentFiles {
  std::string ca;    // ca.pem: the CA certificate every host trusts
  std::string cert;  // node.pem: the node certificate, signed by the CA
  std::string key;   // node-key.pem: the node certificate's private key (mode 0600)
};

/// What write_deployment makes.
struct CertOptions {
  std::vector<std::string> hosts;  // subjectAltNames besides localhost, 127.0.0.1 and ::1: IP addresses or DNS names
  int days = 825;                  // validity of the CA and the node certificate, from now
  bool force = false;              // replace the files of an earlier deployment in the same folder
};

/// ca.pem, node.pem and node-key.pem in `dir`, made absolute (a later change of working directory does not matter).
DeploymentFiles deployment_files(const std::string& dir);

/// The subjectAltName entry for `host` ("IP:10.0.0.5", "DNS:gpu-1.example"), or nullopt when it is neither an IP
/// address nor a DNS name (letters, digits, '-' and '.').
std::optional<std::string> subject_alt_name(const std::string& host);

/// Writes a new deployment into `dir` (created if missing): a self-signed CA and a node certificate it signs for
/// both TLS server and client use, EC P-256 keys, SHA-256 signatures. Throws TlsError when one of the files exists
/// and !options.force, when a file cannot be written, or for a host subject_alt_name refuses.
DeploymentFiles write_deployment(const std::string& dir, const CertOptions& options);

/// Checks what CAF's OpenSSL module will load on every connection: each file exists and parses, the key is the
/// node certificate's and unencrypted, and the CA signed the node certificate, which is valid now. Throws TlsError
/// naming the file and what is wrong with it.
void check_deployment(const DeploymentFiles& files);

}  // namespace paged
