// The fuzz targets without libFuzzer (tests/fuzz/CMakeLists.txt): feeds every file of the
// directories (or files) named on the command line to LLVMFuzzerTestOneInput once, in name order,
// so the seeds and the inputs of fixed findings run in the ordinary test suite. A crash, a
// sanitizer report or an exception the target does not catch fails the test.
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size);

int main(int argc, char** argv) {
  namespace fs = std::filesystem;
  std::vector<fs::path> inputs;
  for (int i = 1; i < argc; ++i) {
    const fs::path p(argv[i]);
    if (fs::is_directory(p)) {
      for (const auto& e : fs::recursive_directory_iterator(p))
        if (e.is_regular_file()) inputs.push_back(e.path());
    } else if (fs::is_regular_file(p)) {
      inputs.push_back(p);
    }  // an absent directory (no regressions yet) is fine
  }
  std::sort(inputs.begin(), inputs.end());
  for (const fs::path& p : inputs) {
    std::ifstream in(p, std::ios::binary);
    const std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    if (!in.good() && !in.eof()) {
      std::fprintf(stderr, "fuzz_replay: cannot read %s\n", p.c_str());
      return 1;
    }
    std::fprintf(stderr, "fuzz_replay: %s (%zu bytes)\n", p.c_str(), bytes.size());
    LLVMFuzzerTestOneInput(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size());
  }
  std::printf("fuzz_replay: %zu inputs, no failure\n", inputs.size());
  return inputs.empty() ? 1 : 0;  // no seeds at all is a broken checkout
}
