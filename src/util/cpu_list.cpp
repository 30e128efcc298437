#include "moe/util/cpu_list.h"

#include <algorithm>
#include <sstream>

#include "moe/util/errors.h"

namespace moe {

std::vector<int> parse_cpu_list(const std::string& text, const std::string& what) {
  std::vector<int> cpus;
  auto bad = [&](const std::string& why) {
    return UserError(what + " = \"" + text + "\": " + why +
                     " (expected a CPU list such as \"0-7,16-23\", or \"auto\")");
  };
  std::stringstream in(text);
  std::string part;
  while (std::getline(in, part, ',')) {
    part.erase(0, part.find_first_not_of(" \t"));
    part.erase(part.find_last_not_of(" \t") + 1);
    if (part.empty()) throw bad("an empty entry");
    const auto dash = part.find('-');
    auto number = [&](const std::string& s) {
      if (s.empty() || s.size() > 6 || !std::all_of(s.begin(), s.end(), ::isdigit)) {
        throw bad("'" + part + "' is not a CPU number or range");
      }
      return std::stoi(s);
    };
    const int lo = number(part.substr(0, dash));
    const int hi = dash == std::string::npos ? lo : number(part.substr(dash + 1));
    if (hi < lo) throw bad("the range '" + part + "' runs backwards");
    for (int c = lo; c <= hi; ++c) cpus.push_back(c);
  }
  if (cpus.empty()) throw bad("no CPU");
  std::sort(cpus.begin(), cpus.end());
  cpus.erase(std::unique(cpus.begin(), cpus.end()), cpus.end());
  return cpus;
}

std::string format_cpu_list(const std::vector<int>& cpus) {
  std::string out;
  for (size_t i = 0; i < cpus.size();) {
    size_t j = i;
    while (j + 1 < cpus.size() && cpus[j + 1] == cpus[j] + 1) ++j;
    out += (out.empty() ? "" : ",") + std::to_string(cpus[i]);
    if (j > i) out += "-" + std::to_string(cpus[j]);
    i = j + 1;
  }
  return out;
}

}  // namespace moe
