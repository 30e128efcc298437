// A small S3 client over libcurl: SigV4 signing is libcurl's own (CURLOPT_AWS_SIGV4), never ours.
// Endpoint, region and credentials come from the standard AWS environment (AWS_ENDPOINT_URL,
// AWS_REGION, AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY/AWS_SESSION_TOKEN, else the profile in
// ~/.aws/credentials); secrets are never logged. Transient failures (5xx, 429, timeouts,
// refused or reset connections) are retried with exponential backoff and full jitter; a 4xx is a
// UserError naming the bucket, key, status and what to check (exit 2). docs/cloud.md.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace moe::s3 {

// s3://bucket/key-or-prefix
struct Url {
  std::string bucket;
  std::string key;  // no leading '/'; may be empty (the bucket's root)
  std::string str() const { return "s3://" + bucket + (key.empty() ? "" : "/" + key); }
  // This URL with `name` appended as a path component.
  Url child(const std::string& name) const;
};

bool is_s3_url(std::string_view s);
// Throws UserError ("<what>: ...: expected s3://bucket/prefix") for a malformed URL.
Url parse_url(const std::string& s, const std::string& what);

struct Options {
  std::string endpoint;  // scheme://host[:port]; empty = https://s3.<region>.amazonaws.com
  std::string region = "us-east-1";
  bool path_style = false;  // http://endpoint/bucket/key instead of http://bucket.endpoint/key
  std::string access_key, secret_key, session_token;
  std::string ca_bundle;               // AWS_CA_BUNDLE; empty = the system's CAs
  int max_attempts = 10;               // AWS_MAX_ATTEMPTS
  double max_backoff_s = 20.0;         // the backoff's cap
  double connect_timeout_s = 10.0;     // per attempt
  double low_speed_timeout_s = 30.0;   // an attempt moving < 1 KiB/s this long is dropped
  int64_t multipart_bytes = 64 << 20;  // MOE_S3_MULTIPART_BYTES: objects this large or larger
  int64_t part_bytes = 16 << 20;       // go up in parts of MOE_S3_PART_BYTES
  int64_t get_range_bytes = 16 << 20;  // ranged GETs of at most this many bytes
};

// The standard AWS environment: AWS_ENDPOINT_URL_S3 / AWS_ENDPOINT_URL, AWS_REGION /
// AWS_DEFAULT_REGION, AWS_S3_ADDRESSING_STYLE (path | virtual; default path with a custom
// endpoint, virtual on AWS), AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY / AWS_SESSION_TOKEN or
// AWS_SHARED_CREDENTIALS_FILE (default ~/.aws/credentials) with AWS_PROFILE, AWS_MAX_ATTEMPTS,
// AWS_CA_BUNDLE. Throws UserError when no credentials are found.
Options options_from_environment();

struct ObjectInfo {
  std::string key;
  int64_t size = 0;
};

class Client {
 public:
  explicit Client(Options opt);
  ~Client();
  Client(const Client&) = delete;
  Client& operator=(const Client&) = delete;

  // The whole object; nullopt when it does not exist (404) and `missing_ok`.
  std::optional<std::string> get(const Url& u, bool missing_ok = false);
  // The object into `path` (created or truncated) with ranged GETs; `size` from head() or a
  // manifest. Returns the bytes written.
  int64_t get_to_file(const Url& u, int64_t size, const std::string& path);
  // Its size, or nullopt when it does not exist.
  std::optional<int64_t> head(const Url& u);
  void put(const Url& u, const std::string& body);
  // A local file; multipart at or above Options::multipart_bytes (aborted on failure).
  void put_file(const Url& u, const std::string& path);
  // Every object whose key starts with `prefix` (its key), in key order.
  std::vector<ObjectInfo> list(const Url& prefix);
  void remove(const Url& u);
  // The bucket exists and these credentials may list it: else a UserError (exit 2) naming the
  // bucket, the status and what to check. Call before writing anything.
  void check_access(const Url& u);

  // Ends transfers in flight and refuses new ones (each throws TrainingError): a process that
  // must exit stops waiting on the network.
  void abort();

  const Options& options() const { return opt_; }
  // Retries so far (transient failures that were tried again), for logs and tests.
  int64_t retries() const;

  struct Response;
  struct Request;

 private:
  Response perform(const Request& r);
  Options opt_;
  struct State;
  std::unique_ptr<State> state_;
};

// Options from the environment, or the one UserError that says what is missing.
std::shared_ptr<Client> client_from_environment();

// What an S3 server answers, parsed: the replies are untrusted input (tests and the fuzz target
// fuzz/fuzz_s3.cpp call these directly). Linear in the reply's size.
namespace reply {

// The text of the first <tag>...</tag> at or after *from (0 when null) in an S3 XML reply,
// entities decoded ("" if absent); *from moves past it when found.
std::string xml_text(const std::string& xml, const std::string& tag, size_t* from = nullptr);

// One page of a ListObjectsV2 reply: its objects, and the token of the next page ("" on the
// last). UserError naming `what` (the listed URL) for an object whose Size is not a byte count.
struct ListPage {
  std::vector<ObjectInfo> objects;
  std::string next_token;
};
ListPage parse_list_page(const std::string& xml, const std::string& what);

// One header line ("Name: value\r\n") into `headers` (lower-case name, trimmed value); lines
// without a colon (the status line, the blank last one) are skipped.
void add_header_line(std::string_view line, std::map<std::string, std::string>& headers);

// A decimal byte count (a Content-Length or a listed Size): digits only, at most 18 of them;
// nullopt otherwise.
std::optional<int64_t> parse_byte_count(std::string_view text);

}  // namespace reply

}  // namespace moe::s3
