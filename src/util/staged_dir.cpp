#include "moe/util/staged_dir.h"
#include "moe/util/remove_tree.h"

#include <unistd.h>

#include <filesystem>

#include "moe/util/errors.h"

namespace moe {

namespace fs = std::filesystem;

StagedDir::StagedDir(const std::string& command, const std::string& out, const std::string& refusal)
    : out_(out) {
  std::error_code ec;
  if (fs::exists(out, ec) && !(fs::is_directory(out, ec) && fs::is_empty(out, ec))) {
    throw UserError(refusal);
  }
  const fs::path abs = fs::absolute(out);
  tmp_ = (abs.parent_path() / (abs.filename().string() + ".partial-" + std::to_string(::getpid())))
             .string();
  remove_tree(tmp_, ec);
  fs::create_directories(tmp_, ec);
  if (ec) throw UserError(command + ": " + out + ": cannot create: " + ec.message());
}

StagedDir::~StagedDir() {
  if (committed_) return;
  std::error_code ec;
  remove_tree(tmp_, ec);
}

void StagedDir::commit() {
  std::error_code ec;
  if (fs::exists(out_, ec)) fs::remove(out_, ec);  // empty: checked in the constructor
  fs::rename(tmp_, out_);
  committed_ = true;
}

}  // namespace moe
