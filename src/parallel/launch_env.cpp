#include "moe/parallel/launch_env.h"

#include <cstdlib>
#include <string>

#include "moe/util/errors.h"

namespace moe::parallel {

namespace {

int64_t integer(const char* name, const char* value, int64_t lo, int64_t hi) {
  char* end = nullptr;
  const long long v = std::strtoll(value, &end, 10);
  if (end == value || *end != '\0' || v < lo || v > hi) {
    throw UserError(std::string("distributed: ") + name + " = \"" + value +
                    "\": expected an integer in [" + std::to_string(lo) + ", " +
                    std::to_string(hi) + "]");
  }
  return v;
}

}  // namespace

std::string first_slurm_host(const std::string& nodelist) {
  const size_t comma = nodelist.find(',');
  const size_t bracket = nodelist.find('[');
  if (bracket == std::string::npos || (comma != std::string::npos && comma < bracket)) {
    return nodelist.substr(0, comma);
  }
  // prefix[a-b,c] -> prefix + a (keeping a's zero padding)
  const std::string prefix = nodelist.substr(0, bracket);
  size_t end = bracket + 1;
  while (end < nodelist.size() && nodelist[end] != '-' && nodelist[end] != ',' &&
         nodelist[end] != ']') {
    ++end;
  }
  return prefix + nodelist.substr(bracket + 1, end - bracket - 1);
}

LaunchEnv launch_env_from(const std::function<const char*(const char*)>& getenv) {
  LaunchEnv e;
  const char* rank = getenv("RANK");
  const char* world = getenv("WORLD_SIZE");
  if (rank != nullptr && world != nullptr) {
    e.launcher = "torchrun";
    e.world_size = integer("WORLD_SIZE", world, 1, 1 << 20);
    e.rank = integer("RANK", rank, 0, e.world_size - 1);
    if (const char* l = getenv("LOCAL_RANK")) e.local_rank = integer("LOCAL_RANK", l, 0, 1 << 20);
    const char* agent = getenv("TORCHELASTIC_USE_AGENT_STORE");
    e.agent_store = agent != nullptr && std::string(agent) == "True";
  } else if (getenv("SLURM_PROCID") != nullptr && getenv("SLURM_NTASKS") != nullptr) {
    e.launcher = "slurm";
    e.world_size = integer("SLURM_NTASKS", getenv("SLURM_NTASKS"), 1, 1 << 20);
    e.rank = integer("SLURM_PROCID", getenv("SLURM_PROCID"), 0, e.world_size - 1);
    if (const char* l = getenv("SLURM_LOCALID")) {
      e.local_rank = integer("SLURM_LOCALID", l, 0, 1 << 20);
    }
    const char* nodes = getenv("SLURM_JOB_NODELIST");
    if (nodes == nullptr) nodes = getenv("SLURM_NODELIST");
    if (nodes != nullptr && *nodes != '\0') e.master_addr = first_slurm_host(nodes);
  } else {
    return e;  // one process
  }
  if (const char* a = getenv("MASTER_ADDR")) e.master_addr = a;
  if (const char* p = getenv("MASTER_PORT")) e.master_port = integer("MASTER_PORT", p, 1, 65535);
  return e;
}

LaunchEnv launch_env() {
  return launch_env_from([](const char* name) { return std::getenv(name); });
}

}  // namespace moe::parallel
