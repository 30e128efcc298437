// Where this process sits in a data-parallel job, from its launcher's environment: torchrun
// (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT) or Slurm's srun (SLURM_PROCID,
// SLURM_NTASKS, SLURM_LOCALID; MASTER_ADDR/MASTER_PORT from the environment, else the first
// host of SLURM_JOB_NODELIST and port 29500). Neither: one process, world size 1. No LibTorch.
#pragma once

#include <cstdint>
#include <functional>
#include <string>

namespace moe::parallel {

struct LaunchEnv {
  int64_t rank = 0, world_size = 1, local_rank = 0;
  std::string master_addr = "127.0.0.1";
  int64_t master_port = 29500;
  std::string launcher = "none";  // none | torchrun | slurm
  // torchrun's agent already serves the rendezvous store at MASTER_PORT
  // (TORCHELASTIC_USE_AGENT_STORE=True): every rank joins it as a client.
  bool agent_store = false;
};

// `getenv` returns the value of a variable or nullptr. UserError naming the variable when a
// value is malformed or inconsistent (RANK >= WORLD_SIZE, ...).
LaunchEnv launch_env_from(const std::function<const char*(const char*)>& getenv);
LaunchEnv launch_env();  // from this process's environment

// The first host of a Slurm node list: "node[03-05,9],gpu1" -> "node03".
std::string first_slurm_host(const std::string& nodelist);

}  // namespace moe::parallel
