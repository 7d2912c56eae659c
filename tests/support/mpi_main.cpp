#include "support/mpi_main.h"

#include <gtest/gtest.h>

#include <cstdio>

#include "thdcp/comm/mpi.h"
#include "thdcp/core/error.h"

namespace thdcp::test {

int run_tests_on_every_rank(Communicator& world, int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  if (world.rank() != 0) {
    delete ::testing::UnitTest::GetInstance()->listeners().Release(
        ::testing::UnitTest::GetInstance()->listeners().default_result_printer());
  }
  const int failed = RUN_ALL_TESTS();
  float any = failed ? 1.0f : 0.0f;
  world.all_reduce_max(&any, 1);
  return any > 0 ? 1 : 0;
}

int mpi_test_main(int argc, char** argv, const char* program, int (*run)(int, char**),
                  const std::function<void()>& release) {
  mpi::Session session(&argc, &argv);
  int code = 1;
  try {
    code = run(argc, argv);
  } catch (const Error& e) {
    std::fprintf(stderr, "%s: %s\n", program, e.what());
    session.abort(1);
  }
  release();
  return code;
}

}  // namespace thdcp::test
