#include "moe/data/checksum.h"

#include <openssl/evp.h>
#include <xxhash.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <memory>
#include <vector>

#include "moe/util/errors.h"

namespace moe::data {

namespace {
std::string to_hex(const unsigned char* p, size_t n) {
  static const char* digits = "0123456789abcdef";
  std::string s(2 * n, '0');
  for (size_t i = 0; i < n; ++i) {
    s[2 * i] = digits[p[i] >> 4];
    s[2 * i + 1] = digits[p[i] & 15];
  }
  return s;
}
}  // namespace

FileDigest digest_file(const std::string& path) {
  std::unique_ptr<std::FILE, int (*)(std::FILE*)> f(std::fopen(path.c_str(), "rb"), std::fclose);
  if (!f) throw UserError("data: " + path + ": cannot open for reading: " + std::strerror(errno));
  std::unique_ptr<EVP_MD_CTX, void (*)(EVP_MD_CTX*)> md5(EVP_MD_CTX_new(), EVP_MD_CTX_free);
  std::unique_ptr<XXH3_state_t, XXH_errorcode (*)(XXH3_state_t*)> xxh(XXH3_createState(),
                                                                      XXH3_freeState);
  EVP_DigestInit_ex(md5.get(), EVP_md5(), nullptr);
  XXH3_64bits_reset(xxh.get());
  std::vector<unsigned char> buf(4 << 20);
  FileDigest d;
  size_t n = 0;
  while ((n = std::fread(buf.data(), 1, buf.size(), f.get())) > 0) {
    EVP_DigestUpdate(md5.get(), buf.data(), n);
    XXH3_64bits_update(xxh.get(), buf.data(), n);
    d.bytes += n;
  }
  if (std::ferror(f.get()))
    throw UserError("data: " + path + ": read error: " + std::strerror(errno));
  unsigned char out[EVP_MAX_MD_SIZE];
  unsigned int len = 0;
  EVP_DigestFinal_ex(md5.get(), out, &len);
  d.md5 = to_hex(out, len);
  XXH64_hash_t h = XXH3_64bits_digest(xxh.get());
  XXH64_canonical_t canon;
  XXH64_canonicalFromHash(&canon, h);  // big-endian bytes, as xxhsum prints
  d.xxh3 = to_hex(canon.digest, sizeof canon.digest);
  return d;
}

}  // namespace moe::data
