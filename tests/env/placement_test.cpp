// CPU lists, the NUMA topology from a sysfs-like tree, a GPU's nearby CPUs, and pinning this
// process (to the CPUs it already has: the test must not change what else runs).
#include "moe/env/placement.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include <unistd.h>

#include "moe/util/errors.h"

namespace moe::env {
namespace {

namespace fs = std::filesystem;

TEST(Placement, CpuListsParseAndFormat) {
  EXPECT_EQ(parse_cpu_list("0-3,8,10-11", "k"), (std::vector<int>{0, 1, 2, 3, 8, 10, 11}));
  EXPECT_EQ(parse_cpu_list(" 5 , 1-2,2", "k"), (std::vector<int>{1, 2, 5}));
  EXPECT_EQ(format_cpu_list({0, 1, 2, 3, 8, 10, 11}), "0-3,8,10-11");
  EXPECT_EQ(format_cpu_list({7}), "7");
  for (const char* bad : {"", "0-", "a", "3-1", "1,,2", "-1", "0-1x"}) {
    try {
      parse_cpu_list(bad, "training.cpu_affinity");
      ADD_FAILURE() << "accepted '" << bad << "'";
    } catch (const UserError& e) {
      EXPECT_NE(std::string(e.what()).find("training.cpu_affinity = \""), std::string::npos);
    }
  }
}

TEST(Placement, NumaNodesAndPciLocalCpusFromSysfs) {
  const fs::path root =
      fs::temp_directory_path() / ("placement-test-" + std::to_string(::getpid()));
  fs::create_directories(root / "devices/system/node/node0");
  fs::create_directories(root / "devices/system/node/node1");
  fs::create_directories(root / "devices/system/node/possible");  // not a node directory
  std::ofstream(root / "devices/system/node/node0/cpulist") << "0-3\n";
  std::ofstream(root / "devices/system/node/node0/meminfo") << "Node 0 MemTotal:  2097152 kB\n";
  std::ofstream(root / "devices/system/node/node1/cpulist") << "4-7\n";
  fs::create_directories(root / "bus/pci/devices/0000:17:00.0");
  std::ofstream(root / "bus/pci/devices/0000:17:00.0/local_cpulist") << "4-7\n";
  const auto nodes = numa_nodes(root.string());
  ASSERT_EQ(nodes.size(), 2u);
  EXPECT_EQ(nodes[0].cpus, (std::vector<int>{0, 1, 2, 3}));
  EXPECT_EQ(nodes[0].memory_mib, 2048);
  EXPECT_EQ(nodes[1].id, 1);
  EXPECT_EQ(pci_local_cpus("0000:17:00.0", root.string()), (std::vector<int>{4, 5, 6, 7}));
  EXPECT_TRUE(pci_local_cpus("0000:99:00.0", root.string()).empty());
  fs::remove_all(root);
}

TEST(Placement, PinsToAllowedCpusAndRefusesOthers) {
  const auto mine = allowed_cpus();
  ASSERT_FALSE(mine.empty());
  pin_process_to(mine, "training.cpu_affinity");  // a no-op change
  EXPECT_EQ(allowed_cpus(), mine);
  try {
    pin_process_to({mine.back() + 1000}, "training.cpu_affinity");
    ADD_FAILURE() << "pinned to a CPU this process does not have";
  } catch (const UserError& e) {
    EXPECT_NE(std::string(e.what()).find("is not available to this process"), std::string::npos);
  }
  EXPECT_EQ(allowed_cpus(), mine);
}

}  // namespace
}  // namespace moe::env
