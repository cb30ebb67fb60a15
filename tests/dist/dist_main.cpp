// main of dist_tests, run under `mpirun -np 2`: Catch2 inside a DistributedSession, the exit
// status agreed over the ranks (a failure on either fails both). Two modes exercise the failure
// paths instead of the test cases:
//   --throw-on-rank R   rank R throws while the others wait in a barrier: the job must end
//                       through engine::fail_job with a message naming rank R
//   --stall-on-rank R   rank R stops taking part (sleeps) while the others wait in a barrier:
//                       the watchdog must end the job after ENGINE_COMM_TIMEOUT_S
#include <chrono>
#include <cstring>
#include <stdexcept>
#include <string>
#include <thread>

#include "catch_run.h"
#include "engine/comm.h"
#include "engine/error.h"

int main(int argc, char** argv) {
  engine::DistributedSession session;
  engine::Communicator& comm = engine::world();
  try {
    if (argc == 3 && (std::strcmp(argv[1], "--throw-on-rank") == 0 ||
                      std::strcmp(argv[1], "--stall-on-rank") == 0)) {
      const int target = std::stoi(argv[2]);
      if (comm.rank() == target) {
        if (argv[1][2] == 't') throw std::runtime_error("deliberate failure for the test");
        std::this_thread::sleep_for(std::chrono::seconds(300));
      }
      comm.barrier();
      return 0;
    }
    const int failed = run_catch(argc, argv);
    return static_cast<int>(comm.all_reduce(double(failed), engine::ReduceOp::max));
  } catch (const std::exception& e) {
    return engine::fail_job("dist_tests", e.what(), 1);
  }
}
