// File checksums for the dataset manifest: md5 (what the seed guide checks with md5sum) and
// XXH3-64 (fast enough to verify on every start if wanted). Both stream the file in 4 MiB reads.
#pragma once

#include <cstdint>
#include <string>

namespace moe::data {

struct FileDigest {
  std::string md5;   // 32 lowercase hex digits, equal to `md5sum FILE`
  std::string xxh3;  // 16 lowercase hex digits, equal to `xxh64sum -H3 FILE` (xxhash >= 0.8)
  uint64_t bytes = 0;
};

// Throws UserError naming the file when it cannot be read.
FileDigest digest_file(const std::string& path);

}  // namespace moe::data
