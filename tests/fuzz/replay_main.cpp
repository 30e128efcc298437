// Replays inputs through one libFuzzer target's LLVMFuzzerTestOneInput without libFuzzer: CI's
// compiler is GCC, so the fuzz targets (fuzz/, clang) are linked here with this main instead,
// and every input that once failed (tests/corpus/fuzz-regressions/<target>-*) plus the seed
// corpora runs on each CI build. A crash, a trap or an escaping exception fails the test.
//   fuzz_replay_TARGET [--prefix P] PATH...   files, or directories (their files whose names
//                                             start with P, when given)
// --skip NAME leaves out a file by name (the libhdf5 heap overflow, docs/reliability.md).
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <set>
#include <string>
#include <vector>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size);

int main(int argc, char** argv) {
  namespace fs = std::filesystem;
  std::string prefix;
  std::set<std::string> skip;
  std::vector<fs::path> inputs;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--prefix" && i + 1 < argc) {
      prefix = argv[++i];
    } else if (a == "--skip" && i + 1 < argc) {
      skip.insert(argv[++i]);
    } else if (fs::is_directory(a)) {
      std::vector<fs::path> files;
      for (const auto& e : fs::directory_iterator(a)) {
        const auto name = e.path().filename().string();
        if (e.is_regular_file() && name.rfind(prefix, 0) == 0) files.push_back(e.path());
      }
      std::sort(files.begin(), files.end());
      inputs.insert(inputs.end(), files.begin(), files.end());
    } else if (fs::is_regular_file(a)) {
      inputs.emplace_back(a);
    } else {
      std::fprintf(stderr, "replay: %s: no such file or directory\n", a.c_str());
      return 2;
    }
  }
  int replayed = 0;
  for (const auto& path : inputs) {
    if (skip.count(path.filename().string())) {
      std::printf("skipped %s\n", path.c_str());
      continue;
    }
    std::ifstream in(path, std::ios::binary);
    const std::vector<char> bytes((std::istreambuf_iterator<char>(in)),
                                  std::istreambuf_iterator<char>());
    std::printf("replaying %s (%zu bytes)\n", path.c_str(), bytes.size());
    std::fflush(stdout);
    LLVMFuzzerTestOneInput(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size());
    ++replayed;
  }
  std::printf("%d inputs replayed\n", replayed);
  return replayed > 0 ? 0 : 1;  // an empty corpus is a broken test, not a pass
}
