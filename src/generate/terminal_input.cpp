#include "moe/generate/terminal_input.h"

#include <fcntl.h>
#include <poll.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <stdexcept>
#include <utility>

namespace moe::generate {

namespace {

std::atomic<bool> g_interrupted{false};
int g_wake[2] = {-1, -1};  // the self-pipe: the handler writes, the reader polls

void on_interrupt(int) {
  g_interrupted = true;
  const int saved = errno;
  const char byte = 1;
  [[maybe_unused]] const ssize_t n = ::write(g_wake[1], &byte, 1);  // full pipe: already awake
  errno = saved;
}

void drain_wake_pipe() {
  char sink[64];
  while (::read(g_wake[0], sink, sizeof sink) > 0) {
  }
}

[[noreturn]] void fail(const char* what) {
  throw std::runtime_error(std::string("chat: ") + what + ": " + std::strerror(errno));
}

}  // namespace

InterruptibleInput::InterruptibleInput(int fd) : fd_(fd) {
  if (g_wake[0] < 0) {
    if (::pipe(g_wake) != 0) fail("pipe");
    for (int end : g_wake) {
      ::fcntl(end, F_SETFL, ::fcntl(end, F_GETFL) | O_NONBLOCK);
      ::fcntl(end, F_SETFD, FD_CLOEXEC);
    }
  }
  clear();
  struct sigaction sa {};
  sa.sa_handler = on_interrupt;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = 0;  // no SA_RESTART: a blocking call returns EINTR
  sigaction(SIGINT, &sa, &previous_);
}

InterruptibleInput::~InterruptibleInput() { sigaction(SIGINT, &previous_, nullptr); }

bool InterruptibleInput::interrupted() const { return g_interrupted; }

void InterruptibleInput::clear() {
  g_interrupted = false;
  drain_wake_pipe();  // a byte left from the Ctrl-C just forgotten
}

void InterruptibleInput::read_some() {
  pollfd fds[2] = {{fd_, POLLIN, 0}, {g_wake[0], POLLIN, 0}};
  if (::poll(fds, 2, -1) < 0) {
    if (errno == EINTR) return;  // the caller looks at the flag
    fail("poll");
  }
  if (fds[1].revents != 0) drain_wake_pipe();
  if (fds[0].revents == 0) return;
  char chunk[4096];
  const ssize_t n = ::read(fd_, chunk, sizeof chunk);
  if (n < 0 && errno != EINTR && errno != EAGAIN) fail("reading standard input");
  if (n == 0) eof_ = true;
  if (n > 0) buffer_.append(chunk, static_cast<size_t>(n));
}

std::optional<std::string> InterruptibleInput::read_line() {
  while (true) {
    if (const size_t nl = buffer_.find('\n'); nl != std::string::npos) {
      std::string line = buffer_.substr(0, nl);
      buffer_.erase(0, nl + 1);
      return line;
    }
    if (eof_) {
      if (buffer_.empty()) return std::nullopt;
      return std::exchange(buffer_, {});
    }
    if (g_interrupted) return std::nullopt;  // checked before the poll; a later one wakes it
    read_some();
  }
}

}  // namespace moe::generate
