#include "moe/monitor/prometheus.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cmath>
#include <cstring>
#include <sstream>

#include "moe/util/errors.h"

namespace moe::monitor {

PrometheusExporter::PrometheusExporter(const std::string& host, int port) {
  const std::string where = host + ":" + std::to_string(port);
  in_addr addr{};
  if (::inet_pton(AF_INET, host == "localhost" ? "127.0.0.1" : host.c_str(), &addr) != 1) {
    throw UserError("config: monitor.prometheus.host = " + host + ": expected an IPv4 address");
  }
  fd_ = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  int one = 1;
  ::setsockopt(fd_, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  sockaddr_in sa{};
  sa.sin_family = AF_INET;
  sa.sin_port = htons(static_cast<uint16_t>(port));
  sa.sin_addr = addr;
  if (::bind(fd_, reinterpret_cast<sockaddr*>(&sa), sizeof sa) != 0 || ::listen(fd_, 16) != 0) {
    const std::string why = std::strerror(errno);
    ::close(fd_);
    throw UserError("config: monitor.prometheus: cannot listen on " + where + ": " + why);
  }
  thread_ = std::thread([this] { serve(); });
}

PrometheusExporter::~PrometheusExporter() {
  stop_.store(true);
  if (thread_.joinable()) thread_.join();
  ::close(fd_);
}

void PrometheusExporter::serve() {
  while (!stop_.load()) {
    pollfd p{fd_, POLLIN, 0};
    if (::poll(&p, 1, 200) <= 0) continue;  // wake up regularly to notice stop_
    int c = ::accept4(fd_, nullptr, nullptr, SOCK_CLOEXEC);
    if (c < 0) continue;
    timeval tv{2, 0};  // a slow or silent client cannot hold the exporter
    ::setsockopt(c, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    ::setsockopt(c, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
    std::string req;
    char buf[2048];
    while (req.find("\r\n\r\n") == std::string::npos && req.size() < 16384) {
      ssize_t n = ::recv(c, buf, sizeof buf, 0);
      if (n <= 0) break;
      req.append(buf, static_cast<size_t>(n));
    }
    std::string status = "404 Not Found", body = "only /metrics is served here\n";
    if (req.rfind("GET /metrics ", 0) == 0 || req.rfind("GET /metrics?", 0) == 0) {
      status = "200 OK";
      body = render();
    }
    std::string resp = "HTTP/1.1 " + status +
                       "\r\nContent-Type: text/plain; version=0.0.4; charset=utf-8\r\n"
                       "Content-Length: " +
                       std::to_string(body.size()) + "\r\nConnection: close\r\n\r\n" + body;
    for (size_t off = 0; off < resp.size();) {
      ssize_t n = ::send(c, resp.data() + off, resp.size() - off, MSG_NOSIGNAL);
      if (n <= 0) break;
      off += static_cast<size_t>(n);
    }
    ::close(c);
  }
}

void PrometheusExporter::set(const std::vector<Sample>& samples) {
  std::lock_guard<std::mutex> lock(mu_);
  for (const auto& s : samples) {
    Family& f = families_[s.name];
    f.type = s.type;
    f.help = s.help;
    f.samples[s.labels] = s.value;
  }
}

std::string PrometheusExporter::render() const {
  std::lock_guard<std::mutex> lock(mu_);
  std::ostringstream out;
  out.precision(17);
  for (const auto& [name, f] : families_) {
    out << "# HELP " << name << " " << f.help << "\n# TYPE " << name << " " << f.type << "\n";
    for (const auto& [labels, v] : f.samples) {
      out << name << labels << " ";
      if (std::isnan(v)) {
        out << "NaN";
      } else if (std::isinf(v)) {
        out << (v > 0 ? "+Inf" : "-Inf");
      } else {
        out << v;
      }
      out << "\n";
    }
  }
  return out.str();
}

}  // namespace moe::monitor
