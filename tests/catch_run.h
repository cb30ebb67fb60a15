#pragma once
// Runs the test cases linked into the binary as Catch2's default main does (command line, exit
// status = failed cases, capped at 255); defined in tests/catch_impl.cpp.
int run_catch(int argc, char** argv);
