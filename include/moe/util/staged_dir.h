// An output directory that appears complete or not at all: written under a sibling
// `NAME.partial-PID`, renamed into place by commit(), removed if never committed. An existing
// non-empty directory is refused and never touched. Used by prepare-data, import-hf, export-hf.
#pragma once

#include <string>

namespace moe {

class StagedDir {
 public:
  // `refusal`: the UserError message when `out` exists and is not empty. A staging directory
  // that cannot be created is a UserError "COMMAND: OUT: cannot create: why".
  StagedDir(const std::string& command, const std::string& out, const std::string& refusal);
  ~StagedDir();
  StagedDir(const StagedDir&) = delete;
  StagedDir& operator=(const StagedDir&) = delete;
  const std::string& path() const { return tmp_; }  // where to write
  void commit();                                    // rename into place

 private:
  std::string out_, tmp_;
  bool committed_ = false;
};

}  // namespace moe
