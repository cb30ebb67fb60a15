// The CPU sanitizer build's own check (tools/asan_test.sh): each mode commits one bug the build
// must report, so a build whose flags lost the instrumentation fails instead of passing quietly.
//   cpu_probe heap      reads one element past a heap buffer (AddressSanitizer)
//   cpu_probe overflow  overflows a signed int (UndefinedBehaviorSanitizer)
//   cpu_probe leak      loses a heap block (LeakSanitizer)
//   cpu_probe clean     the same work without the bugs: no report
#include <cstdio>
#include <cstring>
#include <vector>

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: cpu_probe heap|overflow|leak|clean\n");
    return 2;
  }
  const char* mode = argv[1];
  volatile int n = 8;  // volatile: the compiler can neither fold nor drop the accesses
  std::vector<int> v(static_cast<size_t>(n), 1);
  int sum = 0;
  const int end = std::strcmp(mode, "heap") == 0 ? n + 1 : n;
  for (int i = 0; i < end; ++i) sum += v.data()[i];
  volatile int big = std::strcmp(mode, "overflow") == 0 ? 2147483647 : 7;
  sum += big + 1;
  if (std::strcmp(mode, "leak") == 0) {
    int* lost = new int[64];
    lost[0] = sum;
    std::printf("%p\n", static_cast<void*>(lost));
    lost = nullptr;
  }
  std::printf("cpu_probe %s: %d\n", mode, sum);
  return 0;
}
