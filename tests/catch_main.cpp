// Catch2's default main, for the test binaries without a main of their own.
#include "catch_run.h"

int main(int argc, char** argv) { return run_catch(argc, argv); }
