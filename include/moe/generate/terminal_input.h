// Lines from the chat's standard input that Ctrl-C can interrupt at any moment. SIGINT sets a
// flag and writes a byte to a pipe that the reader polls beside the input, so a Ctrl-C that
// lands just before the read still wakes it (a flag checked before a blocking read can be missed:
// the signal arrives after the check, the read waits for a line forever).
#pragma once

#include <csignal>
#include <optional>
#include <string>

namespace moe::generate {

class InterruptibleInput {
 public:
  // Installs the SIGINT handler for the object's lifetime (one at a time); reads `fd`.
  explicit InterruptibleInput(int fd = 0);
  ~InterruptibleInput();
  InterruptibleInput(const InterruptibleInput&) = delete;
  InterruptibleInput& operator=(const InterruptibleInput&) = delete;

  // Whether Ctrl-C came since the last clear().
  bool interrupted() const;
  // Forget an earlier Ctrl-C: the next one is new.
  void clear();
  // The next line without its newline (a last line without one counts); nullopt at the end of
  // the input, or when Ctrl-C came (interrupted() says which).
  std::optional<std::string> read_line();

 private:
  void read_some();
  int fd_;
  std::string buffer_;
  bool eof_ = false;
  struct sigaction previous_ {};
};

}  // namespace moe::generate
