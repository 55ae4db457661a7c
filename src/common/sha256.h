// SHA-256 (OpenSSL's), for the daemon's snapshots and the client tokens it keeps hashed.
#pragma once

#include <string>
#include <string_view>

namespace salus {

inline constexpr size_t kSha256Bytes = 32;

// The 32-byte digest of `data`.
std::string Sha256(std::string_view data);

// A digest computed over pieces fed one after another.
class Sha256Stream {
 public:
  Sha256Stream();
  ~Sha256Stream();
  Sha256Stream(const Sha256Stream&) = delete;
  Sha256Stream& operator=(const Sha256Stream&) = delete;
  void Update(const void* data, size_t bytes);
  std::string Finish();  // the 32-byte digest; the stream is spent

 private:
  void* ctx_;  // EVP_MD_CTX
};

}  // namespace salus
