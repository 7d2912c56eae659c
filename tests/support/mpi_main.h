// The main() of a GoogleTest program that mpirun starts once per rank.
#pragma once

#include <functional>

#include "thdcp/comm/communicator.h"

namespace thdcp::test {

// Runs every test on every rank of `world` (InitGoogleTest, RUN_ALL_TESTS): only rank 0
// prints the per-test lines, every rank's failures still print. Returns 0 when every rank
// passed, 1 otherwise (the same on every rank: the job fails if any rank failed).
int run_tests_on_every_rank(Communicator& world, int argc, char** argv);

// An MPI session around `run(argc, argv)`, which returns the program's exit code. A
// thdcp::Error thrown by `run` is printed as "program: message" and ends every process of the
// job (MPI_Abort): the others may be waiting in a collective for this one. `release` runs
// after `run`, before MPI is finalised (it destroys what the tests kept between them).
int mpi_test_main(int argc, char** argv, const char* program, int (*run)(int, char**),
                  const std::function<void()>& release);

// The same, where what the tests kept between them is `kept` (std::unique_ptr), reset in the
// order given.
template <typename... Kept>
int mpi_test_main(int argc, char** argv, const char* program, int (*run)(int, char**), Kept&... kept) {
  return mpi_test_main(argc, argv, program, run, std::function<void()>([&] { (kept.reset(), ...); }));
}

}  // namespace thdcp::test
