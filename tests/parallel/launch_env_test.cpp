// The launcher's environment -> rank, world size, local rank and rendezvous address.
#include <gtest/gtest.h>

#include <map>
#include <string>

#include "moe/parallel/launch_env.h"
#include "moe/util/errors.h"

namespace moe::parallel {
namespace {

LaunchEnv from(const std::map<std::string, std::string>& vars) {
  return launch_env_from([&](const char* name) -> const char* {
    auto it = vars.find(name);
    return it == vars.end() ? nullptr : it->second.c_str();
  });
}

std::string error_of(const std::map<std::string, std::string>& vars) {
  try {
    from(vars);
  } catch (const UserError& e) {
    return e.what();
  }
  return "";
}

TEST(LaunchEnv, AloneWithoutALauncher) {
  const LaunchEnv e = from({});
  EXPECT_EQ(e.world_size, 1);
  EXPECT_EQ(e.rank, 0);
  EXPECT_EQ(e.launcher, "none");
}

TEST(LaunchEnv, Torchrun) {
  const LaunchEnv e = from({{"RANK", "3"},
                            {"WORLD_SIZE", "8"},
                            {"LOCAL_RANK", "3"},
                            {"MASTER_ADDR", "10.0.0.5"},
                            {"MASTER_PORT", "29400"},
                            {"TORCHELASTIC_USE_AGENT_STORE", "True"}});
  EXPECT_EQ(e.launcher, "torchrun");
  EXPECT_EQ(e.rank, 3);
  EXPECT_EQ(e.world_size, 8);
  EXPECT_EQ(e.local_rank, 3);
  EXPECT_EQ(e.master_addr, "10.0.0.5");
  EXPECT_EQ(e.master_port, 29400);
  EXPECT_TRUE(e.agent_store);
}

TEST(LaunchEnv, SlurmTakesTheFirstHostOfTheAllocation) {
  const LaunchEnv e = from({{"SLURM_PROCID", "5"},
                            {"SLURM_NTASKS", "16"},
                            {"SLURM_LOCALID", "1"},
                            {"SLURM_JOB_NODELIST", "gpu[07-08,12],login1"}});
  EXPECT_EQ(e.launcher, "slurm");
  EXPECT_EQ(e.rank, 5);
  EXPECT_EQ(e.world_size, 16);
  EXPECT_EQ(e.local_rank, 1);
  EXPECT_EQ(e.master_addr, "gpu07");
  EXPECT_EQ(e.master_port, 29500);
  EXPECT_EQ(from({{"SLURM_PROCID", "0"},
                  {"SLURM_NTASKS", "2"},
                  {"SLURM_NODELIST", "n1,n2"},
                  {"MASTER_ADDR", "head"}})
                .master_addr,
            "head");
}

TEST(LaunchEnv, FirstSlurmHost) {
  EXPECT_EQ(first_slurm_host("node01"), "node01");
  EXPECT_EQ(first_slurm_host("a,b"), "a");
  EXPECT_EQ(first_slurm_host("node[3-5]"), "node3");
  EXPECT_EQ(first_slurm_host("x1,node[3-5]"), "x1");
  EXPECT_EQ(first_slurm_host("gpu[012,015]"), "gpu012");
}

TEST(LaunchEnv, MalformedValuesNameTheVariable) {
  EXPECT_EQ(error_of({{"RANK", "2"}, {"WORLD_SIZE", "2"}}),
            "distributed: RANK = \"2\": expected an integer in [0, 1]");
  EXPECT_EQ(error_of({{"RANK", "0"}, {"WORLD_SIZE", "two"}}),
            "distributed: WORLD_SIZE = \"two\": expected an integer in [1, 1048576]");
  EXPECT_EQ(error_of({{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"MASTER_PORT", "70000"}}),
            "distributed: MASTER_PORT = \"70000\": expected an integer in [1, 65535]");
}

}  // namespace
}  // namespace moe::parallel
