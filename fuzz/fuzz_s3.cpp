// libFuzzer target: arbitrary bytes as what an S3 server answers (moe::s3::reply): a
// ListObjectsV2 page, an <Error> or multipart reply's XML fields, and header lines (Content-Length
// among them). An answer we cannot use is a UserError naming the URL; anything else (crash,
// sanitizer report, other exception) is a bug.
#include <cstddef>
#include <cstdint>
#include <map>
#include <string>
#include <string_view>

#include "moe/util/errors.h"
#include "moe/util/s3_client.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  namespace reply = moe::s3::reply;
  const std::string body(reinterpret_cast<const char*>(data), size);
  try {
    const reply::ListPage page = reply::parse_list_page(body, "s3://bucket/prefix");
    for (const auto& o : page.objects) {
      if (o.size < 0) __builtin_trap();  // sizes are byte counts
    }
  } catch (const moe::UserError&) {
  }
  for (const char* tag : {"Code", "Message", "UploadId", "IsTruncated", "Key"}) {
    size_t from = 0;
    const std::string text = reply::xml_text(body, tag, &from);
    if (from > body.size() || text.size() > body.size()) __builtin_trap();
  }
  // The same bytes as header lines, as libcurl hands them over (one line per call).
  std::map<std::string, std::string> headers;
  std::string_view rest(body);
  while (!rest.empty()) {
    const size_t nl = rest.find('\n');
    const size_t n = nl == std::string_view::npos ? rest.size() : nl + 1;
    reply::add_header_line(rest.substr(0, n), headers);
    rest.remove_prefix(n);
  }
  for (const auto& [name, value] : headers) {
    const auto bytes = reply::parse_byte_count(value);
    if (bytes && *bytes < 0) __builtin_trap();
  }
  return 0;
}
