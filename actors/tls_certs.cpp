#include "actors/tls_certs.h"

#include <openssl/bn.h>
#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/rand.h>
#include <openssl/x509.h>
#include <openssl/x509v3.h>

#include <arpa/inet.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cctype>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <memory>
#include <utility>

namespace paged {

namespace {

namespace fs = std::filesystem;

struct OpenSslFree {
  void operator()(EVP_PKEY* p) const { EVP_PKEY_free(p); }
  void operator()(X509* p) const { X509_free(p); }
  void operator()(X509_NAME* p) const { X509_NAME_free(p); }
  void operator()(X509_EXTENSION* p) const { X509_EXTENSION_free(p); }
  void operator()(X509_STORE* p) const { X509_STORE_free(p); }
  void operator()(X509_STORE_CTX* p) const { X509_STORE_CTX_free(p); }
  void operator()(BIGNUM* p) const { BN_free(p); }
  void operator()(BIO* p) const { BIO_free_all(p); }
};
template <class T>
using Owned = std::unique_ptr<T, OpenSslFree>;

// OpenSSL's oldest queued error as text (the queue is cleared), or `fallback` when none is queued.
std::string openssl_error(const std::string& fallback) {
  const unsigned long code = ERR_get_error();
  ERR_clear_error();
  if (code == 0) return fallback;
  char text[256];
  ERR_error_string_n(code, text, sizeof(text));
  return text;
}

// `what` failed inside OpenSSL: a TlsError with OpenSSL's reason.
[[noreturn]] void fail(const std::string& what) { throw TlsError(what + ": " + openssl_error("failed")); }

Owned<EVP_PKEY> p256_key() {
  Owned<EVP_PKEY> key(EVP_PKEY_Q_keygen(nullptr, nullptr, "EC", "P-256"));
  if (!key) fail("cannot make an EC P-256 key");
  return key;
}

// 16 random bytes, the top bit clear: a positive serial number that no other certificate of ours shares.
void set_random_serial(X509* cert) {
  unsigned char bytes[16];
  if (RAND_bytes(bytes, sizeof(bytes)) != 1) fail("cannot draw a serial number");
  bytes[0] &= 0x7f;
  Owned<BIGNUM> serial(BN_bin2bn(bytes, sizeof(bytes), nullptr));
  if (!serial || !BN_to_ASN1_INTEGER(serial.get(), X509_get_serialNumber(cert))) fail("cannot set a serial number");
}

Owned<X509_NAME> name_of(const std::string& common_name) {
  Owned<X509_NAME> name(X509_NAME_new());
  const auto add = [&](const char* field, const std::string& value) {
    if (!name || !X509_NAME_add_entry_by_txt(name.get(), field, MBSTRING_UTF8,
                                             reinterpret_cast<const unsigned char*>(value.c_str()), -1, -1, 0))
      fail("cannot build the name " + common_name);
  };
  add("O", "paged");
  add("CN", common_name);
  return name;
}

// A certificate for `key` named `common_name` with the extensions (OpenSSL's configuration syntax, added in order),
// signed by issuer_key; issuer null: self-signed.
Owned<X509> make_certificate(EVP_PKEY* key, const std::string& common_name, X509* issuer, EVP_PKEY* issuer_key,
                             int days, const std::vector<std::pair<int, std::string>>& extensions) {
  Owned<X509> cert(X509_new());
  if (!cert || !X509_set_version(cert.get(), X509_VERSION_3)) fail("cannot make a certificate");
  set_random_serial(cert.get());
  // Valid from five minutes ago, so that a host whose clock runs a little behind accepts it at once.
  if (!X509_gmtime_adj(X509_getm_notBefore(cert.get()), -300) ||
      !X509_time_adj_ex(X509_getm_notAfter(cert.get()), days, 0, nullptr))
    fail("cannot set the validity of " + common_name);
  const Owned<X509_NAME> subject = name_of(common_name);
  if (!X509_set_subject_name(cert.get(), subject.get()) ||
      !X509_set_issuer_name(cert.get(), issuer ? X509_get_subject_name(issuer) : subject.get()) ||
      !X509_set_pubkey(cert.get(), key))
    fail("cannot name " + common_name);
  X509V3_CTX ctx;
  X509V3_set_ctx_nodb(&ctx);
  X509V3_set_ctx(&ctx, issuer ? issuer : cert.get(), cert.get(), nullptr, nullptr, 0);
  for (const auto& [nid, value] : extensions) {
    Owned<X509_EXTENSION> ext(X509V3_EXT_conf_nid(nullptr, &ctx, nid, value.c_str()));
    if (!ext || !X509_add_ext(cert.get(), ext.get(), -1)) fail("cannot add " + value + " to " + common_name);
  }
  if (!X509_sign(cert.get(), issuer_key, EVP_sha256())) fail("cannot sign " + common_name);
  return cert;
}

std::string random_hex(int bytes) {
  std::vector<unsigned char> raw(bytes);
  if (RAND_bytes(raw.data(), bytes) != 1) fail("cannot draw random bytes");
  static const char digits[] = "0123456789abcdef";
  std::string hex;
  for (unsigned char b : raw) hex += {digits[b >> 4], digits[b & 15]};
  return hex;
}

// The PEM text `write` puts into a memory BIO.
template <class Write>
std::string pem_text(Write write, const std::string& what) {
  Owned<BIO> bio(BIO_new(BIO_s_mem()));
  if (!bio || write(bio.get()) != 1) fail("cannot encode " + what);
  char* data = nullptr;
  const long size = BIO_get_mem_data(bio.get(), &data);
  return std::string(data, static_cast<size_t>(size));
}

// Writes text to path through a temporary file renamed into place, created with `mode` (0600 for a key, so that it
// is never readable by others, not even for a moment).
void write_file(const fs::path& path, const std::string& text, mode_t mode) {
  const fs::path tmp = path.string() + ".tmp";
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, mode);
  if (fd < 0) throw TlsError("cannot write " + tmp.string() + ": " + std::strerror(errno));
  bool ok = ::fchmod(fd, mode) == 0;
  for (size_t done = 0; ok && done < text.size();) {
    const ssize_t n = ::write(fd, text.data() + done, text.size() - done);
    ok = n > 0;
    if (ok) done += static_cast<size_t>(n);
  }
  ok = ::fsync(fd) == 0 && ok;
  const int error = errno;
  ::close(fd);
  std::error_code ec;
  if (ok) fs::rename(tmp, path, ec);
  if (!ok || ec) {
    fs::remove(tmp, ec);
    throw TlsError("cannot write " + path.string() + ": " + std::strerror(ok ? ec.value() : error));
  }
}

// The file's PEM object `read` parses, or a TlsError naming the file and `kind`.
template <class T, class Read>
Owned<T> read_pem(const std::string& path, Read read, const std::string& kind) {
  if (!fs::exists(path)) throw TlsError("no " + path + " (paged gen-certs DIR writes ca.pem, node.pem, node-key.pem)");
  Owned<BIO> bio(BIO_new_file(path.c_str(), "r"));
  if (!bio) throw TlsError("cannot read " + path + ": " + openssl_error("unreadable"));
  Owned<T> object(read(bio.get()));
  if (!object) throw TlsError(path + " is not " + kind + ": " + openssl_error("no PEM object"));
  return object;
}

// A passphrase callback that has none: an encrypted key fails to load instead of prompting on the terminal.
int no_passphrase(char*, int, int, void*) { return 0; }

}  // namespace

DeploymentFiles deployment_files(const std::string& dir) {
  const fs::path base = fs::absolute(dir);
  return {(base / "ca.pem").string(), (base / "node.pem").string(), (base / "node-key.pem").string()};
}

std::optional<std::string> subject_alt_name(const std::string& host) {
  unsigned char address[16];
  if (inet_pton(AF_INET, host.c_str(), address) == 1 || inet_pton(AF_INET6, host.c_str(), address) == 1)
    return "IP:" + host;
  if (host.empty() || host.size() > 253 || host.front() == '.' || host.front() == '-' || host.back() == '.')
    return std::nullopt;
  for (char ch : host)
    if (!std::isalnum(static_cast<unsigned char>(ch)) && ch != '-' && ch != '.') return std::nullopt;
  return "DNS:" + host;
}

DeploymentFiles write_deployment(const std::string& dir, const CertOptions& options) {
  if (options.days < 1) throw TlsError("certificates must be valid for at least one day");
  std::string names = "DNS:localhost,IP:127.0.0.1,IP:::1";
  for (const std::string& host : options.hosts) {
    const auto name = subject_alt_name(host);
    if (!name) throw TlsError("'" + host + "' is neither an IP address nor a DNS name");
    names += "," + *name;
  }
  const DeploymentFiles files = deployment_files(dir);
  if (!options.force)
    for (const std::string& path : {files.ca, files.cert, files.key})
      if (fs::exists(path)) throw TlsError(path + " exists: pass --force to replace this folder's deployment");
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) throw TlsError("cannot create " + dir + ": " + ec.message());

  const Owned<EVP_PKEY> ca_key = p256_key(), node_key = p256_key();
  // A name of its own for each deployment's CA, so that the refusals of another deployment's peer can say which.
  const Owned<X509> ca = make_certificate(
      ca_key.get(), "paged deployment CA " + random_hex(8), nullptr, ca_key.get(), options.days,
      {{NID_basic_constraints, "critical,CA:TRUE,pathlen:0"}, {NID_key_usage, "critical,keyCertSign,cRLSign"},
       {NID_subject_key_identifier, "hash"}, {NID_authority_key_identifier, "keyid:always"}});
  const Owned<X509> node = make_certificate(
      node_key.get(), "paged node", ca.get(), ca_key.get(), options.days,
      {{NID_basic_constraints, "critical,CA:FALSE"}, {NID_key_usage, "critical,digitalSignature"},
       {NID_ext_key_usage, "serverAuth,clientAuth"}, {NID_subject_key_identifier, "hash"},
       {NID_authority_key_identifier, "keyid:always"}, {NID_subject_alt_name, names}});

  const std::string key_pem = pem_text(
      [&](BIO* b) { return PEM_write_bio_PrivateKey(b, node_key.get(), nullptr, nullptr, 0, nullptr, nullptr); },
      "the node key");
  write_file(files.key, key_pem, 0600);
  write_file(files.cert, pem_text([&](BIO* b) { return PEM_write_bio_X509(b, node.get()); }, "node.pem"), 0644);
  write_file(files.ca, pem_text([&](BIO* b) { return PEM_write_bio_X509(b, ca.get()); }, "ca.pem"), 0644);
  return files;
}

void check_deployment(const DeploymentFiles& files) {
  const auto read_cert = [](BIO* b) { return PEM_read_bio_X509(b, nullptr, nullptr, nullptr); };
  const Owned<X509> ca = read_pem<X509>(files.ca, read_cert, "a PEM certificate");
  const Owned<X509> cert = read_pem<X509>(files.cert, read_cert, "a PEM certificate");
  const Owned<EVP_PKEY> key = read_pem<EVP_PKEY>(
      files.key, [](BIO* b) { return PEM_read_bio_PrivateKey(b, nullptr, no_passphrase, nullptr); },
      "an unencrypted PEM private key");
  if (X509_check_private_key(cert.get(), key.get()) != 1) {
    ERR_clear_error();
    throw TlsError(files.key + " is not the key of " + files.cert);
  }
  Owned<X509_STORE> store(X509_STORE_new());
  Owned<X509_STORE_CTX> ctx(X509_STORE_CTX_new());
  if (!store || !ctx || X509_STORE_add_cert(store.get(), ca.get()) != 1 ||
      X509_STORE_CTX_init(ctx.get(), store.get(), cert.get(), nullptr) != 1)
    fail("cannot check " + files.cert);
  if (X509_verify_cert(ctx.get()) != 1) {
    const std::string why = X509_verify_cert_error_string(X509_STORE_CTX_get_error(ctx.get()));
    ERR_clear_error();
    throw TlsError(files.cert + " does not verify against " + files.ca + ": " + why);
  }
}

}  // namespace paged
