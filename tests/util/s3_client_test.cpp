// The S3 client's parts that need no server: URL parsing, credentials and endpoint from the AWS
// environment and credentials file. The transfers themselves run against a real S3 server in
// tests/train/cloud_storage_test.py.
#include "moe/util/s3_client.h"

#include <gtest/gtest.h>
#include <stdlib.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "moe/util/errors.h"

namespace {

namespace fs = std::filesystem;

// Sets (or unsets, for nullptr) environment variables for one test, restoring them after.
class ScopedEnv {
 public:
  ScopedEnv(std::initializer_list<std::pair<const char*, const char*>> vars) {
    for (auto [name, value] : vars) {
      const char* old = std::getenv(name);
      saved_.emplace_back(name, old ? std::optional<std::string>(old) : std::nullopt);
      if (value)
        setenv(name, value, 1);
      else
        unsetenv(name);
    }
  }
  ~ScopedEnv() {
    for (auto& [name, value] : saved_) {
      if (value)
        setenv(name.c_str(), value->c_str(), 1);
      else
        unsetenv(name.c_str());
    }
  }

 private:
  std::vector<std::pair<std::string, std::optional<std::string>>> saved_;
};

TEST(S3Url, ParsesBucketAndPrefix) {
  auto u = moe::s3::parse_url("s3://my-bucket/datasets/web/", "data.path");
  EXPECT_EQ(u.bucket, "my-bucket");
  EXPECT_EQ(u.key, "datasets/web");
  EXPECT_EQ(u.child("manifest.json").str(), "s3://my-bucket/datasets/web/manifest.json");
  auto root = moe::s3::parse_url("s3://bkt", "x");
  EXPECT_EQ(root.key, "");
  EXPECT_EQ(root.child("latest").str(), "s3://bkt/latest");
  EXPECT_TRUE(moe::s3::is_s3_url("s3://a"));
  EXPECT_FALSE(moe::s3::is_s3_url("/data/s3://x"));
}

TEST(S3Url, RejectsMalformedUrlsNamingTheKey) {
  for (const char* bad : {"s3://", "s3://UPPER/x", "s3://ab/x", "s3://bkt/a//b", "http://bkt/x"}) {
    try {
      moe::s3::parse_url(bad, "checkpoint.remote");
      ADD_FAILURE() << bad;
    } catch (const moe::UserError& e) {
      EXPECT_NE(std::string(e.what()).find("checkpoint.remote: "), std::string::npos) << e.what();
    }
  }
}

TEST(S3Options, EnvironmentCredentialsAndCustomEndpointArePathStyle) {
  ScopedEnv env({{"AWS_ACCESS_KEY_ID", "AKIAEXAMPLE"},
                 {"AWS_SECRET_ACCESS_KEY", "secret"},
                 {"AWS_SESSION_TOKEN", nullptr},
                 {"AWS_ENDPOINT_URL_S3", nullptr},
                 {"AWS_ENDPOINT_URL", "http://127.0.0.1:9000/"},
                 {"AWS_REGION", "eu-west-1"},
                 {"AWS_S3_ADDRESSING_STYLE", nullptr},
                 {"AWS_MAX_ATTEMPTS", "3"}});
  auto o = moe::s3::options_from_environment();
  EXPECT_EQ(o.access_key, "AKIAEXAMPLE");
  EXPECT_EQ(o.endpoint, "http://127.0.0.1:9000");
  EXPECT_EQ(o.region, "eu-west-1");
  EXPECT_TRUE(o.path_style);
  EXPECT_EQ(o.max_attempts, 3);
}

TEST(S3Options, ProfileFromTheCredentialsFile) {
  const fs::path file = fs::temp_directory_path() / "moe_s3_credentials_test";
  std::ofstream(file) << "[default]\naws_access_key_id = DEFAULTKEY\naws_secret_access_key = d\n\n"
                         "# a comment\n[training]\naws_access_key_id=TRAINKEY\n"
                         "aws_secret_access_key = t/s+cret\naws_session_token = tok\n";
  ScopedEnv env({{"AWS_ACCESS_KEY_ID", nullptr},
                 {"AWS_SECRET_ACCESS_KEY", nullptr},
                 {"AWS_SHARED_CREDENTIALS_FILE", file.c_str()},
                 {"AWS_PROFILE", "training"},
                 {"AWS_ENDPOINT_URL", nullptr},
                 {"AWS_ENDPOINT_URL_S3", nullptr},
                 {"AWS_S3_ADDRESSING_STYLE", nullptr}});
  auto o = moe::s3::options_from_environment();
  EXPECT_EQ(o.access_key, "TRAINKEY");
  EXPECT_EQ(o.secret_key, "t/s+cret");
  EXPECT_EQ(o.session_token, "tok");
  EXPECT_FALSE(o.path_style);  // AWS itself: virtual-hosted style
  fs::remove(file);
}

TEST(S3Options, NoCredentialsIsOneUserErrorWithoutSecrets) {
  // Only a session token and an access key id: no secret, and none of the values may appear.
  ScopedEnv env({{"AWS_ACCESS_KEY_ID", "AKIAONLYKEY"},
                 {"AWS_SECRET_ACCESS_KEY", nullptr},
                 {"AWS_SESSION_TOKEN", "SESSIONTOKENVALUE"},
                 {"AWS_SHARED_CREDENTIALS_FILE", "/nonexistent/credentials"},
                 {"AWS_PROFILE", nullptr}});
  try {
    moe::s3::options_from_environment();
    FAIL() << "expected a UserError";
  } catch (const moe::UserError& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("AWS_SECRET_ACCESS_KEY"), std::string::npos) << what;
    EXPECT_EQ(what.find("AKIAONLYKEY"), std::string::npos) << what;
    EXPECT_EQ(what.find("SESSIONTOKENVALUE"), std::string::npos) << what;
    EXPECT_EQ(what.find('\n'), std::string::npos) << what;
  }
}

TEST(S3Options, BadAddressingStyleIsRefused) {
  ScopedEnv env({{"AWS_ACCESS_KEY_ID", "a"},
                 {"AWS_SECRET_ACCESS_KEY", "b"},
                 {"AWS_S3_ADDRESSING_STYLE", "sideways"}});
  EXPECT_THROW(moe::s3::options_from_environment(), moe::UserError);
}

// What a server answers is untrusted input (fuzz/fuzz_s3.cpp): a listed size that is not a byte
// count is one UserError naming the URL, never std::out_of_range (exit 1) or a negative size.
TEST(S3Reply, ListPagesSizesAndHeaders) {
  namespace reply = moe::s3::reply;
  const auto page = reply::parse_list_page(
      "<ListBucketResult><IsTruncated>true</IsTruncated><NextContinuationToken>t&amp;1"
      "</NextContinuationToken><Contents><Key>a&lt;b</Key><Size>12</Size></Contents>"
      "<Contents><Key>c</Key></Contents></ListBucketResult>",
      "s3://bucket/p");
  ASSERT_EQ(page.objects.size(), 2u);
  EXPECT_EQ(page.objects[0].key, "a<b");
  EXPECT_EQ(page.objects[0].size, 12);
  EXPECT_EQ(page.objects[1].size, 0);
  EXPECT_EQ(page.next_token, "t&1");
  EXPECT_EQ(reply::parse_list_page("<IsTruncated>false</IsTruncated><NextContinuationToken>x"
                                   "</NextContinuationToken>",
                                   "s3://bucket/p")
                .next_token,
            "");
  for (const char* size : {"99999999999999999999", "-5", "1e3", "abc"}) {
    try {
      reply::parse_list_page(
          std::string("<Contents><Key>k</Key><Size>") + size + "</Size></Contents>",
          "s3://bucket/p");
      FAIL() << size;
    } catch (const moe::UserError& e) {
      EXPECT_NE(std::string(e.what()).find("s3: LIST s3://bucket/p: object 'k'"), std::string::npos)
          << e.what();
    }
  }
  std::map<std::string, std::string> headers;
  reply::add_header_line("HTTP/1.1 200 OK\r\n", headers);
  reply::add_header_line("Content-Length:  434234 \r\n", headers);
  reply::add_header_line("ETAG: \"x\"\r\n", headers);
  EXPECT_EQ(headers.size(), 2u);
  EXPECT_EQ(reply::parse_byte_count(headers["content-length"]), 434234);
  EXPECT_EQ(headers["etag"], "\"x\"");
  EXPECT_EQ(reply::parse_byte_count("-1"), std::nullopt);
  EXPECT_EQ(reply::parse_byte_count(""), std::nullopt);
  EXPECT_EQ(reply::parse_byte_count("1234567890123456789"), std::nullopt);
}

}  // namespace
