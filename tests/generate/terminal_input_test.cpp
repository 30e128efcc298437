// InterruptibleInput: lines as std::getline gives them, and a Ctrl-C that lands before the read
// (the window the chat once lost a second Ctrl-C in) ends the read instead of waiting for a line.
#include "moe/generate/terminal_input.h"

#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <csignal>
#include <string>

namespace moe::generate {
namespace {

struct Pipe {
  int fds[2] = {-1, -1};
  Pipe() { EXPECT_EQ(::pipe(fds), 0); }
  ~Pipe() {
    for (int fd : fds) {
      if (fd >= 0) ::close(fd);
    }
  }
  void write(const std::string& s) const {
    ASSERT_EQ(::write(fds[1], s.data(), s.size()), ssize_t(s.size()));
  }
  void close_writer() {
    ::close(fds[1]);
    fds[1] = -1;
  }
};

TEST(InterruptibleInput, LinesThenTheEndOfInput) {
  Pipe p;
  InterruptibleInput input(p.fds[0]);
  p.write("first\n\nsecond\nlast without newline");
  p.close_writer();
  EXPECT_EQ(input.read_line(), "first");
  EXPECT_EQ(input.read_line(), "");
  EXPECT_EQ(input.read_line(), "second");
  EXPECT_EQ(input.read_line(), "last without newline");
  EXPECT_EQ(input.read_line(), std::nullopt);
  EXPECT_FALSE(input.interrupted());
}

TEST(InterruptibleInput, CtrlCBeforeTheReadEndsIt) {
  Pipe p;  // open and empty: a read without the fix would wait forever
  InterruptibleInput input(p.fds[0]);
  std::raise(SIGINT);
  EXPECT_TRUE(input.interrupted());
  EXPECT_EQ(input.read_line(), std::nullopt);
  input.clear();
  EXPECT_FALSE(input.interrupted());
  p.write("after\n");
  EXPECT_EQ(input.read_line(), "after");  // the forgotten Ctrl-C leaves nothing behind
}

TEST(InterruptibleInput, CtrlCDuringTheReadEndsIt) {
  Pipe p;
  InterruptibleInput input(p.fds[0]);
  const pid_t self = ::getpid();
  const pid_t child = ::fork();
  if (child == 0) {  // the child sends the signal while the parent waits in poll
    ::usleep(200 * 1000);
    ::kill(self, SIGINT);
    ::_exit(0);
  }
  EXPECT_EQ(input.read_line(), std::nullopt);
  EXPECT_TRUE(input.interrupted());
  ::waitpid(child, nullptr, 0);
}

TEST(InterruptibleInput, RestoresTheHandler) {
  struct sigaction before {
  }, after{};
  sigaction(SIGINT, nullptr, &before);
  { InterruptibleInput input(0); }
  sigaction(SIGINT, nullptr, &after);
  EXPECT_EQ(before.sa_handler, after.sa_handler);
}

}  // namespace
}  // namespace moe::generate
