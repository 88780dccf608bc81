#include "model/kv/kv_disk_file.h"

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <string>

#include "model/hash_mix.h"

namespace paged {

namespace {

constexpr char kMagic[8] = {'P', 'G', 'K', 'V', '0', '0', '0', '1'};
constexpr size_t kHeaderBytes = sizeof(kMagic) + 8 + 4 + 8 + 8 + 4 + 8 + 8;

std::string hex16(uint64_t v) {
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(v));
  return buf;
}

uint64_t checksum(std::span<const std::byte> bytes) {
  uint64_t h = hash_mix(0, bytes.size());
  size_t i = 0;
  for (; i + 8 <= bytes.size(); i += 8) {
    uint64_t word;
    std::memcpy(&word, bytes.data() + i, 8);
    h = hash_mix(h, word);
  }
  for (; i < bytes.size(); ++i) h = hash_mix(h, static_cast<uint64_t>(bytes[i]));
  return h;
}

template <class T>
void put(std::vector<char>& out, T v) {
  const size_t at = out.size();
  out.resize(at + sizeof(T));
  std::memcpy(out.data() + at, &v, sizeof(T));
}

template <class T>
T get(const char*& p) {
  T v;
  std::memcpy(&v, p, sizeof(T));
  p += sizeof(T);
  return v;
}

}  // namespace

KvDiskStore::KvDiskStore(std::filesystem::path dir, uint64_t identity, int rank)
    : dir_(std::move(dir)), identity_(identity), rank_(rank) {}

std::filesystem::path KvDiskStore::path_of(uint64_t key) const {
  std::string name = hex16(identity_) + "-" + hex16(key);
  if (rank_ != 0) name += "-r" + std::to_string(rank_);
  return dir_ / (name + ".kv");
}

bool KvDiskStore::save(uint64_t key, uint64_t salt, std::span<const TokenId> tokens,
                       std::span<const std::byte> kv) const {
  std::vector<char> header;
  header.insert(header.end(), kMagic, kMagic + sizeof(kMagic));
  put<uint64_t>(header, identity_);
  put<uint32_t>(header, static_cast<uint32_t>(rank_));
  put<uint64_t>(header, key);
  put<uint64_t>(header, salt);
  put<uint32_t>(header, static_cast<uint32_t>(tokens.size()));
  put<uint64_t>(header, kv.size());
  put<uint64_t>(header, checksum(kv));
  for (TokenId t : tokens) put<int32_t>(header, t);
  const std::filesystem::path path = path_of(key), temp = path.string() + ".tmp";
  {
    std::ofstream out(temp, std::ios::binary | std::ios::trunc);
    out.write(header.data(), static_cast<std::streamsize>(header.size()));
    out.write(reinterpret_cast<const char*>(kv.data()), static_cast<std::streamsize>(kv.size()));
    if (!out.flush()) {
      out.close();
      std::error_code ec;
      std::filesystem::remove(temp, ec);
      return false;
    }
  }
  std::error_code ec;
  std::filesystem::rename(temp, path, ec);
  if (ec) std::filesystem::remove(temp, ec);
  return !ec;
}

bool KvDiskStore::load(uint64_t key, uint64_t salt, std::span<const TokenId> tokens, std::span<std::byte> kv) const {
  std::ifstream in(path_of(key), std::ios::binary | std::ios::ate);
  if (!in) return false;
  const std::streamoff size = in.tellg();
  const size_t expected = kHeaderBytes + tokens.size() * sizeof(int32_t) + kv.size();
  if (size < 0 || static_cast<size_t>(size) != expected) return false;  // truncated or too long
  std::vector<char> header(expected - kv.size());
  in.seekg(0);
  if (!in.read(header.data(), static_cast<std::streamsize>(header.size()))) return false;
  if (std::memcmp(header.data(), kMagic, sizeof(kMagic)) != 0) return false;
  const char* p = header.data() + sizeof(kMagic);
  if (get<uint64_t>(p) != identity_ || get<uint32_t>(p) != static_cast<uint32_t>(rank_) || get<uint64_t>(p) != key ||
      get<uint64_t>(p) != salt || get<uint32_t>(p) != tokens.size() || get<uint64_t>(p) != kv.size())
    return false;
  const uint64_t sum = get<uint64_t>(p);
  for (TokenId t : tokens)
    if (get<int32_t>(p) != t) return false;  // verified token by token
  std::vector<std::byte> payload(kv.size());
  if (!in.read(reinterpret_cast<char*>(payload.data()), static_cast<std::streamsize>(payload.size()))) return false;
  if (checksum(payload) != sum) return false;
  std::copy(payload.begin(), payload.end(), kv.begin());
  return true;
}

void KvDiskStore::remove(uint64_t key) const {
  std::error_code ec;
  std::filesystem::remove(path_of(key), ec);
}

std::vector<uint64_t> KvDiskStore::list_keys(const std::filesystem::path& dir, uint64_t identity) {
  std::vector<std::pair<std::filesystem::file_time_type, uint64_t>> found;
  std::error_code ec;
  const std::string prefix = hex16(identity) + "-";
  for (const auto& entry : std::filesystem::directory_iterator(dir, ec)) {
    const std::string name = entry.path().filename().string();
    // <identity>-<key>.kv: rank 0's files name the blocks (the other ranks' files go with them).
    if (name.size() != prefix.size() + 16 + 3 || name.rfind(prefix, 0) != 0 || !name.ends_with(".kv")) continue;
    const std::string key = name.substr(prefix.size(), 16);
    if (key.find_first_not_of("0123456789abcdef") != std::string::npos) continue;
    found.emplace_back(entry.last_write_time(ec), std::stoull(key, nullptr, 16));
  }
  std::sort(found.begin(), found.end());
  std::vector<uint64_t> keys;
  for (const auto& [time, key] : found) keys.push_back(key);
  return keys;
}

}  // namespace paged
