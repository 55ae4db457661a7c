#include "common/sha256.h"

#include <openssl/evp.h>

#include "common/check.h"

namespace salus {
namespace {

// OpenSSL's digest calls fail only when the library itself is broken (no memory for a
// context): nothing to answer a request with, so the daemon stops, saying why.
void Require(bool ok, const char* what) {
  if (!ok) internal::DcheckFailed("OpenSSL", what, __FILE__, __LINE__);
}

}  // namespace

Sha256Stream::Sha256Stream() : ctx_(EVP_MD_CTX_new()) {
  Require(ctx_ != nullptr &&
              EVP_DigestInit_ex(static_cast<EVP_MD_CTX*>(ctx_), EVP_sha256(), nullptr) == 1,
          "cannot start a SHA-256 digest");
}

Sha256Stream::~Sha256Stream() { EVP_MD_CTX_free(static_cast<EVP_MD_CTX*>(ctx_)); }

void Sha256Stream::Update(const void* data, size_t bytes) {
  if (bytes == 0) return;
  Require(EVP_DigestUpdate(static_cast<EVP_MD_CTX*>(ctx_), data, bytes) == 1,
          "SHA-256 update failed");
}

std::string Sha256Stream::Finish() {
  unsigned char digest[EVP_MAX_MD_SIZE];
  unsigned int n = 0;
  Require(EVP_DigestFinal_ex(static_cast<EVP_MD_CTX*>(ctx_), digest, &n) == 1 && n == kSha256Bytes,
          "SHA-256 finish failed");
  return std::string(reinterpret_cast<const char*>(digest), n);
}

std::string Sha256(std::string_view data) {
  Sha256Stream s;
  s.Update(data.data(), data.size());
  return s.Finish();
}

}  // namespace salus
