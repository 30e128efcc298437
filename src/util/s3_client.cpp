#include "moe/util/s3_client.h"

#include <curl/curl.h>
#include <fcntl.h>
#include <spdlog/spdlog.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cctype>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <mutex>
#include <random>
#include <thread>

#include "moe/util/errors.h"

namespace moe::s3 {

namespace {

std::string env(const char* name) {
  const char* v = std::getenv(name);
  return v ? std::string(v) : std::string();
}

// AWS's URI encoding: unreserved characters as they are, everything else %XX; '/' kept in keys.
std::string uri_encode(std::string_view s, bool keep_slash) {
  static const char* hex = "0123456789ABCDEF";
  std::string out;
  for (unsigned char c : s) {
    if (std::isalnum(c) || c == '-' || c == '_' || c == '.' || c == '~' ||
        (keep_slash && c == '/')) {
      out += static_cast<char>(c);
    } else {
      out += '%';
      out += hex[c >> 4];
      out += hex[c & 15];
    }
  }
  return out;
}

}  // namespace

namespace reply {

// S3's replies are flat enough that a full XML parser buys nothing here.
std::string xml_text(const std::string& xml, const std::string& tag, size_t* from) {
  const std::string open = "<" + tag + ">", close = "</" + tag + ">";
  size_t start = xml.find(open, from ? *from : 0);
  if (start == std::string::npos) return {};
  start += open.size();
  const size_t end = xml.find(close, start);
  if (end == std::string::npos) return {};
  if (from) *from = end + close.size();
  std::string raw = xml.substr(start, end - start), out;
  for (size_t i = 0; i < raw.size(); ++i) {
    if (raw[i] != '&') {
      out += raw[i];
      continue;
    }
    const size_t semi = raw.find(';', i);
    if (semi == std::string::npos) {  // a stray '&': keep the rest as it is
      out += raw.substr(i);
      break;
    }
    const std::string ent = raw.substr(i + 1, semi - i - 1);
    if (ent == "amp")
      out += '&';
    else if (ent == "lt")
      out += '<';
    else if (ent == "gt")
      out += '>';
    else if (ent == "quot")
      out += '"';
    else if (ent == "apos")
      out += '\'';
    else
      out += raw.substr(i, semi - i + 1);
    i = semi;
  }
  return out;
}

ListPage parse_list_page(const std::string& xml, const std::string& what) {
  ListPage page;
  size_t at = 0;
  while (true) {
    size_t item = at;
    const std::string contents = xml_text(xml, "Contents", &item);
    if (item == at) break;
    at = item;
    const std::string key = xml_text(contents, "Key"), size = xml_text(contents, "Size");
    const std::optional<int64_t> bytes = parse_byte_count(size.empty() ? "0" : size);
    if (!bytes) {
      throw UserError("s3: LIST " + what + ": object '" + key + "' has Size '" +
                      size.substr(0, 40) + "': expected a byte count (is AWS_ENDPOINT_URL an " +
                      "S3-compatible server?)");
    }
    page.objects.push_back({key, *bytes});
  }
  if (xml_text(xml, "IsTruncated") == "true")
    page.next_token = xml_text(xml, "NextContinuationToken");
  return page;
}

void add_header_line(std::string_view line, std::map<std::string, std::string>& headers) {
  const size_t colon = line.find(':');
  if (colon == std::string_view::npos) return;
  std::string name(line.substr(0, colon)), value(line.substr(colon + 1));
  for (char& c : name) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  value.erase(0, value.find_first_not_of(" \t"));
  value.erase(value.find_last_not_of(" \t\r\n") + 1);
  headers[name] = value;
}

std::optional<int64_t> parse_byte_count(std::string_view text) {
  if (text.empty() || text.size() > 18) return std::nullopt;
  int64_t n = 0;
  for (char c : text) {
    if (c < '0' || c > '9') return std::nullopt;
    n = n * 10 + (c - '0');
  }
  return n;
}

}  // namespace reply

using reply::xml_text;

namespace {

// [profile] of an AWS credentials file: key = value lines.
std::map<std::string, std::string> read_profile(const std::string& file, const std::string& want) {
  std::map<std::string, std::string> out;
  std::ifstream in(file);
  std::string line, profile;
  auto trim = [](std::string s) {
    s.erase(0, s.find_first_not_of(" \t\r"));
    s.erase(s.find_last_not_of(" \t\r") + 1);
    return s;
  };
  while (std::getline(in, line)) {
    line = trim(line);
    if (line.empty() || line[0] == '#' || line[0] == ';') continue;
    if (line.front() == '[' && line.back() == ']') {
      profile = trim(line.substr(1, line.size() - 2));
      continue;
    }
    const size_t eq = line.find('=');
    if (profile == want && eq != std::string::npos) {
      out[trim(line.substr(0, eq))] = trim(line.substr(eq + 1));
    }
  }
  return out;
}

bool transient_curl_error(CURLcode rc) {
  switch (rc) {
    case CURLE_COULDNT_CONNECT:
    case CURLE_COULDNT_RESOLVE_HOST:
    case CURLE_OPERATION_TIMEDOUT:
    case CURLE_PARTIAL_FILE:
    case CURLE_GOT_NOTHING:
    case CURLE_SEND_ERROR:
    case CURLE_RECV_ERROR:
    case CURLE_HTTP2:
    case CURLE_HTTP2_STREAM:
    case CURLE_SSL_CONNECT_ERROR:
    case CURLE_SEND_FAIL_REWIND:
      return true;
    default:
      return false;
  }
}

void global_init() {
  static std::once_flag once;
  std::call_once(once, [] { curl_global_init(CURL_GLOBAL_DEFAULT); });
}

}  // namespace

Url Url::child(const std::string& name) const {
  Url u = *this;
  u.key = key.empty() ? name : (key.back() == '/' ? key + name : key + "/" + name);
  return u;
}

bool is_s3_url(std::string_view s) { return s.starts_with("s3://"); }

Url parse_url(const std::string& s, const std::string& what) {
  if (!is_s3_url(s)) throw UserError(what + ": " + s + ": expected s3://bucket/prefix");
  const std::string rest = s.substr(5);
  const size_t slash = rest.find('/');
  Url u;
  u.bucket = rest.substr(0, slash);
  if (slash != std::string::npos) u.key = rest.substr(slash + 1);
  while (!u.key.empty() && u.key.back() == '/') u.key.pop_back();
  const bool bucket_ok = u.bucket.size() >= 3 && u.bucket.size() <= 63 &&
                         std::all_of(u.bucket.begin(), u.bucket.end(), [](char c) {
                           return std::islower(static_cast<unsigned char>(c)) ||
                                  std::isdigit(static_cast<unsigned char>(c)) || c == '-' ||
                                  c == '.';
                         });
  if (!bucket_ok) {
    throw UserError(what + ": " + s +
                    ": expected s3://bucket/prefix with a bucket name of 3-63 lowercase letters, "
                    "digits, '-' or '.'");
  }
  if (u.key.find("//") != std::string::npos) {
    throw UserError(what + ": " + s + ": empty path component ('//') in the prefix");
  }
  return u;
}

Options options_from_environment() {
  Options o;
  o.endpoint = env("AWS_ENDPOINT_URL_S3");
  if (o.endpoint.empty()) o.endpoint = env("AWS_ENDPOINT_URL");
  while (!o.endpoint.empty() && o.endpoint.back() == '/') o.endpoint.pop_back();
  if (!env("AWS_REGION").empty())
    o.region = env("AWS_REGION");
  else if (!env("AWS_DEFAULT_REGION").empty())
    o.region = env("AWS_DEFAULT_REGION");
  const std::string style = env("AWS_S3_ADDRESSING_STYLE");
  if (!style.empty() && style != "path" && style != "virtual" && style != "auto") {
    throw UserError("AWS_S3_ADDRESSING_STYLE = " + style + ": expected path, virtual or auto");
  }
  o.path_style = style == "path" || ((style.empty() || style == "auto") && !o.endpoint.empty());
  o.ca_bundle = env("AWS_CA_BUNDLE");
  if (!env("AWS_MAX_ATTEMPTS").empty()) {
    try {
      o.max_attempts = std::max(1, std::stoi(env("AWS_MAX_ATTEMPTS")));
    } catch (const std::exception&) {
      throw UserError("AWS_MAX_ATTEMPTS = " + env("AWS_MAX_ATTEMPTS") + ": expected an integer");
    }
  }
  auto bytes_env = [](const char* name, int64_t& into) {
    if (env(name).empty()) return;
    try {
      into = std::max<int64_t>(1, std::stoll(env(name)));
    } catch (const std::exception&) {
      throw UserError(std::string(name) + " = " + env(name) + ": expected a byte count");
    }
  };
  bytes_env("MOE_S3_MULTIPART_BYTES", o.multipart_bytes);
  bytes_env("MOE_S3_PART_BYTES", o.part_bytes);
  bytes_env("MOE_S3_RANGE_BYTES", o.get_range_bytes);
  o.access_key = env("AWS_ACCESS_KEY_ID");
  o.secret_key = env("AWS_SECRET_ACCESS_KEY");
  o.session_token = env("AWS_SESSION_TOKEN");
  if (o.access_key.empty() || o.secret_key.empty()) {
    std::string file = env("AWS_SHARED_CREDENTIALS_FILE");
    if (file.empty() && !env("HOME").empty()) file = env("HOME") + "/.aws/credentials";
    const std::string profile = env("AWS_PROFILE").empty() ? "default" : env("AWS_PROFILE");
    auto p = read_profile(file, profile);
    o.access_key = p["aws_access_key_id"];
    o.secret_key = p["aws_secret_access_key"];
    o.session_token = p["aws_session_token"];
    if (o.access_key.empty() || o.secret_key.empty()) {
      throw UserError(
          "s3: no credentials: set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, or give profile [" +
          profile + "] aws_access_key_id / aws_secret_access_key in " +
          (file.empty() ? std::string("~/.aws/credentials") : file));
    }
  }
  return o;
}

std::shared_ptr<Client> client_from_environment() {
  return std::make_shared<Client>(options_from_environment());
}

// ---------------------------------------------------------------------------------------------

struct Client::Request {
  std::string method = "GET";
  Url url;
  std::string query;  // already canonical: sorted, encoded, "name=value" joined by '&'
  std::string range;  // "first-last" for a ranged GET
  const std::string* body = nullptr;
  std::string* sink = nullptr;  // the response body goes here when set (else into Response)
  bool missing_ok = false;      // a 404 is an answer, not an error
};

struct Client::Response {
  long status = 0;
  std::string body;
  std::map<std::string, std::string> headers;  // lower-case names
};

struct Client::State {
  std::atomic<int64_t> retries{0};
  std::atomic<bool> aborted{false};
  std::mutex rng_mu;
  std::mt19937_64 rng{std::random_device{}()};
};

namespace {

size_t write_body(char* data, size_t size, size_t n, void* out) {
  static_cast<std::string*>(out)->append(data, size * n);
  return size * n;
}

size_t write_header(char* data, size_t size, size_t n, void* out) {
  reply::add_header_line(std::string_view(data, size * n),
                         *static_cast<std::map<std::string, std::string>*>(out));
  return size * n;
}

struct Upload {
  const std::string* body;
  size_t at = 0;
};
size_t read_body(char* into, size_t size, size_t n, void* p) {
  auto* u = static_cast<Upload*>(p);
  const size_t k = std::min(size * n, u->body->size() - u->at);
  std::memcpy(into, u->body->data() + u->at, k);
  u->at += k;
  return k;
}

// curl rewinds an upload to send it again (a reused connection found dead).
int seek_body(void* p, curl_off_t offset, int origin) {
  auto* u = static_cast<Upload*>(p);
  if (origin != SEEK_SET || offset < 0 || static_cast<size_t>(offset) > u->body->size()) {
    return CURL_SEEKFUNC_CANTSEEK;
  }
  u->at = static_cast<size_t>(offset);
  return CURL_SEEKFUNC_OK;
}

// Progress callback: a non-zero return ends the transfer (Client::abort()).
int check_abort(void* aborted, curl_off_t, curl_off_t, curl_off_t, curl_off_t) {
  return static_cast<std::atomic<bool>*>(aborted)->load() ? 1 : 0;
}

// One easy handle per thread, reset for each request: its connection and DNS caches are reused
// across requests (libcurl does not support sharing connections between concurrent threads, and
// a share handle would tie the thread's handle to one Client's lifetime).
CURL* thread_handle() {
  struct Handle {
    CURL* h = curl_easy_init();
    ~Handle() { curl_easy_cleanup(h); }
  };
  thread_local Handle t;
  curl_easy_reset(t.h);
  return t.h;
}

// One line for a 4xx: bucket, key, status and what to check.
std::string client_error(const std::string& method, const Url& u, long status,
                         const std::string& body) {
  std::string code = xml_text(body, "Code"), message = xml_text(body, "Message");
  std::string hint;
  if (status >= 300 && status < 400)
    hint = "redirected (" + std::string(status == 301 ? "the bucket is in another region: " : "") +
           "set AWS_REGION to the bucket's region, or AWS_ENDPOINT_URL to the address it names)";
  else if (code == "NoSuchBucket")
    hint = "the bucket does not exist: check the bucket name and AWS_ENDPOINT_URL";
  else if (code == "NoSuchKey" || status == 404)
    hint = "no such object: check the path";
  else if (code == "InvalidAccessKeyId")
    hint = "unknown access key: check AWS_ACCESS_KEY_ID (or the profile in ~/.aws/credentials)";
  else if (code == "SignatureDoesNotMatch")
    hint = "the signature was refused: check AWS_SECRET_ACCESS_KEY and AWS_REGION";
  else if (status == 403)
    hint = "access denied: check the credentials and the bucket's policy";
  else
    hint = "check the bucket, the key and AWS_ENDPOINT_URL";
  return "s3: " + method + " " + u.str() + ": HTTP " + std::to_string(status) +
         (code.empty() ? "" : " " + code) + (message.empty() ? "" : " (" + message + ")") + ": " +
         hint;
}

}  // namespace

Client::Client(Options opt) : opt_(std::move(opt)), state_(std::make_unique<State>()) {
  global_init();
}

void Client::abort() { state_->aborted = true; }

Client::~Client() = default;

int64_t Client::retries() const { return state_->retries.load(); }

namespace {

// The request's URL: path-style (endpoint/bucket/key) or virtual-hosted (bucket.endpoint/key).
std::string request_url(const Options& opt, const std::string& base, const Client::Request& r) {
  const std::string key = uri_encode(r.url.key, true);
  std::string url;
  if (opt.path_style) {
    url = base + "/" + r.url.bucket + (key.empty() ? "" : "/" + key);
  } else {
    const size_t scheme = base.find("://");
    url = base.substr(0, scheme + 3) + r.url.bucket + "." + base.substr(scheme + 3) + "/" + key;
  }
  return r.query.empty() ? url : url + "?" + r.query;
}

// One try of a request on this thread's handle; libcurl signs it (SigV4).
CURLcode attempt_once(const Options& opt, std::atomic<bool>* aborted, const std::string& url,
                      const Client::Request& r, Client::Response& resp, std::string* sink) {
  const std::string sigv4 = "aws:amz:" + opt.region + ":s3";
  CURL* h = thread_handle();
  curl_slist* headers = nullptr;
  // libcurl signs with this header's value as the payload hash (curl >= 7.87).
  headers = curl_slist_append(headers, "x-amz-content-sha256: UNSIGNED-PAYLOAD");
  if (!opt.session_token.empty()) {
    headers = curl_slist_append(headers, ("x-amz-security-token: " + opt.session_token).c_str());
  }
  curl_easy_setopt(h, CURLOPT_URL, url.c_str());
  curl_easy_setopt(h, CURLOPT_AWS_SIGV4, sigv4.c_str());
  curl_easy_setopt(h, CURLOPT_USERNAME, opt.access_key.c_str());
  curl_easy_setopt(h, CURLOPT_PASSWORD, opt.secret_key.c_str());
  curl_easy_setopt(h, CURLOPT_NOSIGNAL, 1L);
  curl_easy_setopt(h, CURLOPT_NOPROGRESS, 0L);
  curl_easy_setopt(h, CURLOPT_XFERINFOFUNCTION, check_abort);
  curl_easy_setopt(h, CURLOPT_XFERINFODATA, aborted);
  curl_easy_setopt(h, CURLOPT_CONNECTTIMEOUT_MS, long(opt.connect_timeout_s * 1000));
  curl_easy_setopt(h, CURLOPT_LOW_SPEED_LIMIT, 1024L);
  curl_easy_setopt(h, CURLOPT_LOW_SPEED_TIME, long(opt.low_speed_timeout_s));
  curl_easy_setopt(h, CURLOPT_SSL_VERIFYPEER, 1L);
  curl_easy_setopt(h, CURLOPT_SSL_VERIFYHOST, 2L);
  if (!opt.ca_bundle.empty()) curl_easy_setopt(h, CURLOPT_CAINFO, opt.ca_bundle.c_str());
  sink->clear();
  curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, write_body);
  curl_easy_setopt(h, CURLOPT_WRITEDATA, sink);
  curl_easy_setopt(h, CURLOPT_HEADERFUNCTION, write_header);
  curl_easy_setopt(h, CURLOPT_HEADERDATA, &resp.headers);
  Upload up{r.body};
  if (r.method == "HEAD") {
    curl_easy_setopt(h, CURLOPT_NOBODY, 1L);
  } else if (r.method == "PUT") {
    curl_easy_setopt(h, CURLOPT_UPLOAD, 1L);
    // curl asks `Expect: 100-continue` and waits 1 s for servers that never answer it (an
    // "Expect:" header to drop it would be signed as an empty header by libcurl 7.88).
    curl_easy_setopt(h, CURLOPT_EXPECT_100_TIMEOUT_MS, 50L);
    curl_easy_setopt(h, CURLOPT_READFUNCTION, read_body);
    curl_easy_setopt(h, CURLOPT_READDATA, &up);
    curl_easy_setopt(h, CURLOPT_SEEKFUNCTION, seek_body);
    curl_easy_setopt(h, CURLOPT_SEEKDATA, &up);
    curl_easy_setopt(h, CURLOPT_INFILESIZE_LARGE, curl_off_t(r.body ? r.body->size() : 0));
  } else if (r.method == "POST") {
    // Not curl's default form type: servers would parse the XML body as a form.
    headers = curl_slist_append(headers, "Content-Type: application/xml");
    curl_easy_setopt(h, CURLOPT_POST, 1L);
    curl_easy_setopt(h, CURLOPT_POSTFIELDS, r.body ? r.body->c_str() : "");
    curl_easy_setopt(h, CURLOPT_POSTFIELDSIZE_LARGE, curl_off_t(r.body ? r.body->size() : 0));
  } else if (r.method != "GET") {
    curl_easy_setopt(h, CURLOPT_CUSTOMREQUEST, r.method.c_str());
  }
  if (!r.range.empty()) curl_easy_setopt(h, CURLOPT_RANGE, r.range.c_str());
  curl_easy_setopt(h, CURLOPT_HTTPHEADER, headers);
  const CURLcode rc = curl_easy_perform(h);
  curl_easy_getinfo(h, CURLINFO_RESPONSE_CODE, &resp.status);
  curl_easy_setopt(h, CURLOPT_HTTPHEADER, nullptr);
  curl_slist_free_all(headers);
  return rc;
}

}  // namespace

Client::Response Client::perform(const Request& r) {
  const std::string base =
      opt_.endpoint.empty() ? "https://s3." + opt_.region + ".amazonaws.com" : opt_.endpoint;
  const std::string url = request_url(opt_, base, r);
  for (int attempt = 1;; ++attempt) {
    Response resp;
    std::string* sink = r.sink ? r.sink : &resp.body;
    if (state_->aborted) throw TrainingError("s3: " + r.method + " " + r.url.str() + ": abandoned");
    const CURLcode rc = attempt_once(opt_, &state_->aborted, url, r, resp, sink);
    // Why this try should be repeated ("" = it is the answer).
    std::string transient;
    if (rc == CURLE_ABORTED_BY_CALLBACK) {
      throw TrainingError("s3: " + r.method + " " + r.url.str() + ": abandoned");
    }
    if (rc != CURLE_OK) {
      if (!transient_curl_error(rc)) {
        throw UserError("s3: " + r.method + " " + r.url.str() + ": " + curl_easy_strerror(rc) +
                        " (endpoint " + base +
                        "; check AWS_ENDPOINT_URL and, for TLS, AWS_CA_BUNDLE)");
      }
      transient = curl_easy_strerror(rc);
    } else if (resp.status >= 500 || resp.status == 429 ||
               (resp.status == 400 && xml_text(*sink, "Code") == "RequestTimeout")) {
      transient = "HTTP " + std::to_string(resp.status);
    } else if (r.range.empty() && resp.headers.count("content-length") != 0 && r.method == "GET" &&
               std::to_string(sink->size()) != resp.headers["content-length"]) {
      transient = "short body";  // a cut connection that curl did not flag
    }
    if (transient.empty()) {
      // A missing object may be an answer; a missing bucket never is.
      if (resp.status == 404 && r.missing_ok && xml_text(*sink, "Code") != "NoSuchBucket") {
        return resp;
      }
      // Not 2xx: refused, or redirected (curl does not follow, and a PUT redirected elsewhere
      // would be a lost write).
      if (resp.status < 200 || resp.status >= 300) {
        throw UserError(client_error(r.method, r.url, resp.status, *sink));
      }
      return resp;
    }
    if (attempt >= opt_.max_attempts) {
      throw TrainingError("s3: " + r.method + " " + r.url.str() + ": gave up after " +
                          std::to_string(attempt) + " attempts: " + transient);
    }
    ++state_->retries;
    // Exponential backoff with full jitter: uniform in [0, min(cap, 0.25 s x 2^(attempt-1))].
    const double cap = std::min(opt_.max_backoff_s, 0.25 * std::pow(2.0, attempt - 1));
    double sleep_s;
    {
      std::lock_guard<std::mutex> lock(state_->rng_mu);
      sleep_s = std::uniform_real_distribution<double>(0.0, cap)(state_->rng);
    }
    spdlog::debug("s3: {} {}: {} (attempt {} of {}); retrying in {:.2f} s", r.method, r.url.str(),
                  transient, attempt, opt_.max_attempts, sleep_s);
    const auto until = std::chrono::steady_clock::now() + std::chrono::duration<double>(sleep_s);
    while (std::chrono::steady_clock::now() < until && !state_->aborted) {
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
  }
}

std::optional<std::string> Client::get(const Url& u, bool missing_ok) {
  Request r;
  r.url = u;
  r.missing_ok = missing_ok;
  Response resp = perform(r);
  if (resp.status == 404) return std::nullopt;
  return std::move(resp.body);
}

int64_t Client::get_to_file(const Url& u, int64_t size, const std::string& path) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) throw UserError("s3: " + path + ": cannot create: " + std::strerror(errno));
  std::string chunk;
  int64_t done = 0;
  try {
    while (done < size) {
      const int64_t n = std::min(opt_.get_range_bytes, size - done);
      Request r;
      r.url = u;
      r.range = std::to_string(done) + "-" + std::to_string(done + n - 1);
      r.sink = &chunk;
      // A ranged reply shorter than asked (a dropped connection curl did not flag) is retried.
      for (int tries = 0;; ++tries) {
        perform(r);
        if (static_cast<int64_t>(chunk.size()) == n) break;
        if (tries + 1 >= opt_.max_attempts) {
          throw TrainingError("s3: GET " + u.str() + " bytes " + r.range + ": got " +
                              std::to_string(chunk.size()) + " bytes, expected " +
                              std::to_string(n) +
                              " (is the object smaller than the manifest says?)");
        }
        ++state_->retries;
      }
      if (::pwrite(fd, chunk.data(), chunk.size(), done) != static_cast<ssize_t>(chunk.size())) {
        throw TrainingError("s3: " + path + ": write failed: " + std::strerror(errno));
      }
      done += n;
    }
    if (::fsync(fd) != 0) throw TrainingError("s3: " + path + ": fsync failed");
  } catch (...) {
    ::close(fd);
    throw;
  }
  ::close(fd);
  return done;
}

std::optional<int64_t> Client::head(const Url& u) {
  Request r;
  r.method = "HEAD";
  r.url = u;
  r.missing_ok = true;
  Response resp = perform(r);
  if (resp.status == 404) return std::nullopt;
  const auto length = resp.headers.find("content-length");
  const std::optional<int64_t> bytes =
      length == resp.headers.end() ? std::nullopt : reply::parse_byte_count(length->second);
  if (!bytes) {
    throw UserError("s3: HEAD " + u.str() + ": no Content-Length byte count in the reply (is " +
                    "AWS_ENDPOINT_URL an S3-compatible server?)");
  }
  return *bytes;
}

void Client::put(const Url& u, const std::string& body) {
  Request r;
  r.method = "PUT";
  r.url = u;
  r.body = &body;
  perform(r);
}

void Client::put_file(const Url& u, const std::string& path) {
  std::error_code ec;
  const int64_t size = static_cast<int64_t>(std::filesystem::file_size(path, ec));
  if (ec) throw UserError("s3: " + path + ": cannot read: " + ec.message());
  std::ifstream in(path, std::ios::binary);
  auto read_part = [&](int64_t n) {
    std::string part(static_cast<size_t>(n), '\0');
    in.read(part.data(), n);
    if (in.gcount() != n)
      throw UserError("s3: " + path + ": short read (changed while uploading?)");
    return part;
  };
  if (size < opt_.multipart_bytes) {
    put(u, read_part(size));
    return;
  }
  Request create;
  create.method = "POST";
  create.url = u;
  create.query = "uploads=";
  const std::string upload_id = xml_text(perform(create).body, "UploadId");
  if (upload_id.empty())
    throw TrainingError("s3: POST " + u.str() + "?uploads: no UploadId in the reply");
  const std::string id_q = "uploadId=" + uri_encode(upload_id, false);
  // S3 takes at most 10,000 parts: larger files get larger parts.
  const int64_t part_bytes = std::max(opt_.part_bytes, (size + 9999) / 10000);
  try {
    std::string done = "<CompleteMultipartUpload>";
    int part_no = 1;
    for (int64_t at = 0; at < size; at += part_bytes, ++part_no) {
      const std::string body = read_part(std::min(part_bytes, size - at));
      Request part;
      part.method = "PUT";
      part.url = u;
      part.query = "partNumber=" + std::to_string(part_no) + "&" + id_q;
      part.body = &body;
      Response resp = perform(part);
      done += "<Part><PartNumber>" + std::to_string(part_no) + "</PartNumber><ETag>" +
              resp.headers["etag"] + "</ETag></Part>";
    }
    done += "</CompleteMultipartUpload>";
    Request complete;
    complete.method = "POST";
    complete.url = u;
    complete.query = id_q;
    complete.body = &done;
    Response resp = perform(complete);
    // S3 may answer 200 with an <Error> body when completing fails late.
    if (!xml_text(resp.body, "Code").empty()) {
      throw TrainingError("s3: completing the upload of " + u.str() + ": " +
                          xml_text(resp.body, "Code") + " " + xml_text(resp.body, "Message"));
    }
  } catch (...) {
    try {
      Request abort;
      abort.method = "DELETE";
      abort.url = u;
      abort.query = id_q;
      abort.missing_ok = true;
      perform(abort);
    } catch (const std::exception&) {
      // The bucket's lifecycle rule reaps what we cannot; the first error is the one to report.
    }
    throw;
  }
}

std::vector<ObjectInfo> Client::list(const Url& prefix) {
  std::vector<ObjectInfo> out;
  std::string token;
  while (true) {
    Request r;
    r.url = Url{prefix.bucket, ""};
    r.query = (token.empty() ? "" : "continuation-token=" + uri_encode(token, false) + "&") +
              "list-type=2&prefix=" + uri_encode(prefix.key, false);
    reply::ListPage page = reply::parse_list_page(perform(r).body, prefix.str());
    out.insert(out.end(), std::make_move_iterator(page.objects.begin()),
               std::make_move_iterator(page.objects.end()));
    if (page.next_token.empty()) break;
    // A server that hands back the token it was given would be listed forever.
    if (page.next_token == token) {
      throw UserError("s3: LIST " + prefix.str() +
                      ": the server repeats its NextContinuationToken (is AWS_ENDPOINT_URL an " +
                      "S3-compatible server?)");
    }
    token = std::move(page.next_token);
  }
  std::sort(out.begin(), out.end(),
            [](const ObjectInfo& a, const ObjectInfo& b) { return a.key < b.key; });
  return out;
}

void Client::remove(const Url& u) {
  Request r;
  r.method = "DELETE";
  r.url = u;
  r.missing_ok = true;
  perform(r);
}

void Client::check_access(const Url& u) {
  Request r;
  r.url = Url{u.bucket, ""};
  r.query = "list-type=2&max-keys=1&prefix=" + uri_encode(u.key, false);
  perform(r);
}

}  // namespace moe::s3
