// Mutual TLS between an engine and its workers: the certificates `paged gen-certs` writes (actors/tls_certs.h), the
// checks on a deployment's folder, the loopback rule for plain TCP, and an engine and a worker on loopback that
// talk through CAF's OpenSSL module, refusing the peers of another deployment or without TLS, and keeping the
// files it started with.
#include <catch2/catch.hpp>

#include <openssl/pem.h>
#include <openssl/x509v3.h>

#include <sys/stat.h>

#include <filesystem>
#include <fstream>

#include "actors/engine.h"
#include "actors/tls.h"
#include "actors/tls_certs.h"
#include "actors/worker.h"
#include "model/loader/config.h"
#include "tests/test_data.h"

using namespace paged;
using namespace paged::test;

namespace {

namespace fs = std::filesystem;

// A fresh folder of deployments, removed with the object.
struct CertsDir {
  TempDir tmp{"paged_tls_"};
  std::string sub(const std::string& name) const { return (tmp.path() / name).string(); }
};

std::string contents(const std::string& path) {
  std::ifstream in(path);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

// The message of the TlsError that check_deployment throws for `files`, or "" when it accepts them.
std::string refusal(const DeploymentFiles& files) {
  try {
    check_deployment(files);
    return "";
  } catch (const TlsError& e) {
    return e.what();
  }
}

EngineConfig cpu_config() { return {.model_dir = kModel, .device = "cpu", .max_num_seqs = 8}; }

// The ModelError message of an engine `c` that does not start, or "" when it starts.
std::string engine_refusal(const EngineConfig& c) {
  try {
    Engine engine(c);
    return "";
  } catch (const ModelError& e) {
    return e.what();
  }
}

}  // namespace

TEST_CASE("gen-certs writes a CA and a node certificate it signs, for loopback and the given hosts", "[tls]") {
  CertsDir dir;
  const DeploymentFiles files =
      write_deployment(dir.sub("certs"), {.hosts = {"gpu-1.example", "10.0.0.5"}, .days = 30});
  CHECK(files.ca == dir.sub("certs/ca.pem"));
  CHECK(files.cert == dir.sub("certs/node.pem"));
  CHECK(files.key == dir.sub("certs/node-key.pem"));
  struct stat st {};
  REQUIRE(stat(files.key.c_str(), &st) == 0);
  CHECK((st.st_mode & 0777) == 0600);
  CHECK(refusal(files).empty());

  BIO* bio = BIO_new_file(files.cert.c_str(), "r");
  REQUIRE(bio);
  X509* cert = PEM_read_bio_X509(bio, nullptr, nullptr, nullptr);
  BIO_free(bio);
  REQUIRE(cert);
  for (const char* name : {"localhost", "gpu-1.example"}) CHECK(X509_check_host(cert, name, 0, 0, nullptr) == 1);
  for (const char* ip : {"127.0.0.1", "::1", "10.0.0.5"}) CHECK(X509_check_ip_asc(cert, ip, 0) == 1);
  CHECK(X509_check_host(cert, "elsewhere.example", 0, 0, nullptr) == 0);
  CHECK(X509_check_purpose(cert, X509_PURPOSE_SSL_SERVER, 0) == 1);
  CHECK(X509_check_purpose(cert, X509_PURPOSE_SSL_CLIENT, 0) == 1);
  EVP_PKEY* key = X509_get0_pubkey(cert);
  CHECK(EVP_PKEY_is_a(key, "EC"));
  char curve[64] = {};
  CHECK(EVP_PKEY_get_utf8_string_param(key, "group", curve, sizeof(curve), nullptr) == 1);
  CHECK(std::string(curve) == "prime256v1");
  const int days_left = [&] {
    int days = 0, seconds = 0;
    ASN1_TIME_diff(&days, &seconds, nullptr, X509_get0_notAfter(cert));
    return days;
  }();
  CHECK((days_left == 29 || days_left == 30));
  X509_free(cert);
}

TEST_CASE("gen-certs keeps an earlier deployment unless forced, and refuses unusable host names", "[tls]") {
  CertsDir dir;
  const DeploymentFiles first = write_deployment(dir.sub("certs"), {});
  const std::string ca = contents(first.ca);
  try {
    write_deployment(dir.sub("certs"), {});
    FAIL("an existing deployment was overwritten");
  } catch (const TlsError& e) {
    CHECK(std::string(e.what()).find("--force") != std::string::npos);
  }
  CHECK(contents(first.ca) == ca);
  write_deployment(dir.sub("certs"), {.force = true});
  CHECK(contents(first.ca) != ca);
  CHECK(refusal(first).empty());
  CHECK_THROWS_AS(write_deployment(dir.sub("other"), {.hosts = {"a,b"}}), TlsError);
  CHECK(!fs::exists(dir.sub("other/ca.pem")));

  CHECK(subject_alt_name("10.1.2.3") == "IP:10.1.2.3");
  CHECK(subject_alt_name("fe80::1") == "IP:fe80::1");
  CHECK(subject_alt_name("gpu-1.example") == "DNS:gpu-1.example");
  for (const char* bad : {"", "a,b", "-x", "x.", "a b", "IP:1.2.3.4"}) CHECK(!subject_alt_name(bad));
}

TEST_CASE("a deployment's folder is refused naming the file that is missing or does not fit", "[tls]") {
  CertsDir dir;
  const DeploymentFiles mine = write_deployment(dir.sub("mine"), {});
  const DeploymentFiles theirs = write_deployment(dir.sub("theirs"), {});
  fs::create_directory(dir.sub("mixed"));
  const DeploymentFiles mixed = deployment_files(dir.sub("mixed"));
  fs::copy_file(mine.ca, mixed.ca);
  fs::copy_file(mine.cert, mixed.cert);
  CHECK(refusal(mixed).find("no " + mixed.key) != std::string::npos);
  fs::copy_file(theirs.key, mixed.key);
  CHECK(refusal(mixed).find(mixed.key + " is not the key of " + mixed.cert) != std::string::npos);
  fs::copy_file(theirs.cert, mixed.cert, fs::copy_options::overwrite_existing);
  CHECK(refusal(mixed).find(mixed.cert + " does not verify against " + mixed.ca) != std::string::npos);
  std::ofstream(mixed.ca) << "not a certificate\n";
  CHECK(refusal(mixed).find(mixed.ca + " is not a PEM certificate") != std::string::npos);

  EngineConfig c = cpu_config();
  c.workers = {"127.0.0.1:1"};
  c.tls_dir = dir.sub("mixed");
  CHECK(engine_refusal(c).find("--tls-dir " + c.tls_dir + ": " + mixed.ca) != std::string::npos);
  c.workers.clear();
  CHECK(engine_refusal(c).find("--tls-dir secures the connections to workers") != std::string::npos);
}

TEST_CASE("without TLS a worker listens on loopback only", "[tls]") {
  for (const char* host : {"127.0.0.1", "127.4.5.6", "::1", "localhost"}) {
    CHECK(is_loopback_host(host));
    CHECK(plain_listen_refusal(host, "").empty());
  }
  for (const char* host : {"0.0.0.0", "10.0.0.5", "::", "gpu-1.example", "", "128.0.0.1"}) {
    CHECK(!is_loopback_host(host));
    CHECK(plain_listen_refusal(host, "").find("mutual TLS") != std::string::npos);
    CHECK(plain_listen_refusal(host, "certs").empty());
  }
  try {
    Worker worker(cpu_config(), "0.0.0.0", 0);
    FAIL("a plain worker listened on every interface");
  } catch (const ModelError& e) {
    CHECK(std::string(e.what()).find("--tls-dir") != std::string::npos);
  }
}

TEST_CASE("an engine and a worker of one deployment generate the golden outputs; other peers are refused",
          "[tls][remote]") {
  CertsDir dir;
  write_deployment(dir.sub("ours"), {});
  write_deployment(dir.sub("theirs"), {});
  fs::copy(dir.sub("ours"), dir.sub("worker's"));
  EngineConfig worker_config = cpu_config();
  worker_config.tls_dir = dir.sub("worker's");
  Worker worker(worker_config, "127.0.0.1", 0);
  // The worker keeps the files it checked at its start (CAF rereads them on every connection, and would end the
  // process if they were gone).
  fs::remove_all(dir.sub("worker's"));
  EngineConfig c = cpu_config();
  c.workers = {"127.0.0.1:" + std::to_string(worker.port())};

  c.tls_dir = dir.sub("theirs");
  CHECK(engine_refusal(c).find("the TLS handshake failed") != std::string::npos);
  c.tls_dir.clear();
  CHECK(engine_refusal(c).find("--tls-dir") != std::string::npos);

  c.tls_dir = dir.sub("ours");
  Engine engine(c);
  std::vector<std::vector<TokenId>> prompts, expected;
  const boost::json::value golden = read_json(kGolden);
  for (const auto& tc : golden.at("cases").as_array()) {
    prompts.push_back(ids_of(tc.at("prompt_ids")));
    expected.push_back(ids_of(tc.at("greedy_ids")));
  }
  SamplingParams greedy;
  greedy.temperature = 0.0f;
  greedy.max_tokens = 64;
  const auto outputs = engine.generate(prompts, greedy);
  REQUIRE(outputs.size() == expected.size());
  for (size_t i = 0; i < outputs.size(); ++i) CHECK(outputs[i].outputs[0].token_ids == expected[i]);
}
