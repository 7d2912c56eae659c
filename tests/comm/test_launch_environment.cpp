// Which GPU a launched process takes (thdcp/comm_device/nccl.h), and the NCCL-less stand-in: no GPU
// needed (label cpu). Each case sets the launcher variables it needs and clears the rest.
#include <gtest/gtest.h>

#include <cstdlib>
#include <string>

#include "support/expect_error.h"
#include "thdcp/comm/communicator.h"
#include "thdcp/comm_device/nccl.h"

namespace thdcp {
namespace {

constexpr const char* kLauncherVariables[] = {"OMPI_COMM_WORLD_LOCAL_RANK", "SLURM_LOCALID", "MPI_LOCALRANKID",
                                              "PMI_LOCAL_RANK"};

class LaunchEnvironment : public ::testing::Test {
 protected:
  void SetUp() override {
    for (const char* name : kLauncherVariables) unsetenv(name);
  }
  void TearDown() override { SetUp(); }
};

TEST_F(LaunchEnvironment, NoLauncherGivesMinusOne) { EXPECT_EQ(nccl::local_rank_from_environment(), -1); }

TEST_F(LaunchEnvironment, EachLauncherVariableIsRead) {
  int value = 3;
  for (const char* name : kLauncherVariables) {
    SetUp();
    setenv(name, std::to_string(value).c_str(), 1);
    EXPECT_EQ(nccl::local_rank_from_environment(), value) << name;
    ++value;
  }
}

TEST_F(LaunchEnvironment, OpenMpiWinsOverSlurm) {
  setenv("SLURM_LOCALID", "5", 1);
  setenv("OMPI_COMM_WORLD_LOCAL_RANK", "2", 1);
  EXPECT_EQ(nccl::local_rank_from_environment(), 2);
}

TEST_F(LaunchEnvironment, AValueThatIsNotALocalRankThrowsNamingIt) {
  for (const char* bad : {"", "x", "1x", "-1", "99999999999"}) {
    setenv("SLURM_LOCALID", bad, 1);
    EXPECT_THDCP_ERROR(nccl::local_rank_from_environment(),
                       std::string("SLURM_LOCALID='") + bad + "' is not a local rank");
  }
}

TEST(DeviceForLocalRank, SpreadsLocalRanksOverTheDevices) {
  EXPECT_EQ(nccl::device_for_local_rank(0, 8), 0);
  EXPECT_EQ(nccl::device_for_local_rank(7, 8), 7);
  EXPECT_EQ(nccl::device_for_local_rank(9, 8), 1);
  EXPECT_EQ(nccl::device_for_local_rank(3, 1), 0);
}

TEST(DeviceForLocalRank, RejectsNoDevicesAndNegativeRanks) {
  EXPECT_THDCP_ERROR(nccl::device_for_local_rank(0, 0), "device_count=0: this process sees no CUDA device");
  EXPECT_THDCP_ERROR(nccl::device_for_local_rank(-1, 2), "local_rank=-1 must be >= 0");
}

#if !defined(THDCP_HAVE_NCCL)
TEST(NcclUnavailable, CreateSaysHowToGetNccl) {
  EXPECT_FALSE(nccl::built_with_nccl());
  run_in_process(
      1, [](Communicator& host) { EXPECT_THDCP_ERROR(nccl::create(host, 0), "rebuild with -DTHDCP_WITH_NCCL=ON"); });
}
#else
TEST(NcclAvailable, BuiltWithNcclMatchesTheBuild) { EXPECT_TRUE(nccl::built_with_nccl()); }
#endif

}  // namespace
}  // namespace thdcp
