// Catch2's implementation (without main), compiled once for every test binary of a build: it
// takes ~25 s a copy at -O2 and several times that under the sanitizers. The binaries' mains
// (tests/catch_main.cpp, tests/cuda/cuda_main.cpp, tests/dist/dist_main.cpp) call run_catch.
#define CATCH_CONFIG_RUNNER
#include <catch2/catch.hpp>

#include "catch_run.h"

int run_catch(int argc, char** argv) { return Catch::Session().run(argc, argv); }
