// engine/file_io.h: an atomic write replaces the old file or leaves it exactly as it was, with no
// temporary left either way; large and small writes arrive byte for byte; a full disk (a file
// size limit in a forked child) and other failures name the file and the OS error.
#include <catch2/catch.hpp>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <random>
#include <string>
#include <vector>

#include "engine/file_io.h"
#include "engine/safetensors.h"
#include "ops/ops.h"
#include "test_support.h"

using namespace engine;
using Catch::Contains;
using engine::testing::error_of;
using engine::testing::error_with_file_size_limit;
using engine::testing::names_starting_with;
using engine::testing::TempDir;
namespace fs = std::filesystem;

namespace {

std::string slurp(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>());
}

std::vector<std::string> listing(const TempDir& dir) { return names_starting_with(dir.path, ""); }

std::string random_bytes(size_t n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::string s(n, '\0');
  for (char& c : s) c = static_cast<char>(rng() & 0xff);
  return s;
}

constexpr size_t kBuf = FileWriter::kBufferBytes;

}  // namespace

TEST_CASE("file_io: write_file_atomic creates and replaces files, leaving no temporary",
          "[file_io]") {
  TempDir dir;
  const std::string path = dir / "results.json";
  write_file_atomic(path, "first\n", "test");
  CHECK(slurp(path) == "first\n");
  write_file_atomic(path, "a longer second version\n", "test");
  CHECK(slurp(path) == "a longer second version\n");
  write_file_atomic(path, "", "test");  // shorter, here empty: nothing of the old file remains
  CHECK(fs::file_size(path) == 0);
  CHECK(listing(dir) == std::vector<std::string>{"results.json"});

  // A relative name lands in the working directory (its directory is ".").
  const fs::path cwd = fs::current_path();
  fs::current_path(dir.path);
  write_file_atomic("relative.txt", "here", "test");
  fs::current_path(cwd);
  CHECK(slurp(dir / "relative.txt") == "here");
}

TEST_CASE("file_io: temporaries are <path>.tmp.<pid>, next to the file", "[file_io]") {
  CHECK(temporary_path("dir/ckpt.safetensors") ==
        "dir/ckpt.safetensors.tmp." + std::to_string(::getpid()));
  // pretraining removes checkpoint leftovers by this pattern at start-up.
  CHECK(temporary_path("ckpt_000100.safetensors").find(".safetensors.tmp.") != std::string::npos);
}

TEST_CASE("file_io: AtomicFile writes small and large pieces byte for byte", "[file_io]") {
  TempDir dir;
  const std::string path = dir / "big.bin";
  write_file_atomic(path, "old", "test");
  const std::string data = random_bytes(3 * kBuf + 12345, 7);
  // Pieces below, at and above the buffer size, so buffered bytes and direct writes interleave.
  const std::vector<size_t> pieces = {1, 7, kBuf - 1, 2, kBuf, 3, kBuf + 1, 0, 4096};
  AtomicFile f(path, "test");
  CHECK(f.temporary() == temporary_path(path));
  size_t at = 0;
  for (size_t i = 0; at < data.size(); ++i) {
    const size_t n = std::min(pieces[i % pieces.size()], data.size() - at);
    f.write(data.data() + at, n);
    at += n;
  }
  // Until the commit the old file is what a reader sees.
  CHECK(slurp(path) == "old");
  CHECK(names_starting_with(dir.path, "big.bin.tmp.").size() == 1);
  f.commit();
  CHECK(slurp(path) == data);
  CHECK(listing(dir) == std::vector<std::string>{"big.bin"});

  // One write larger than the buffer, nothing buffered before it.
  const std::string one = random_bytes(2 * kBuf + 3, 8);
  write_file_atomic(path, one, "test");
  CHECK(slurp(path) == one);
}

TEST_CASE("file_io: an AtomicFile destroyed without commit leaves the old file, no temporary",
          "[file_io]") {
  TempDir dir;
  const std::string path = dir / "model.safetensors";
  write_file_atomic(path, "the old checkpoint", "test");
  {
    AtomicFile f(path, "test");
    f.write(random_bytes(kBuf + 17, 1));  // some of it already in the temporary on disk
    f.write("tail");
    CHECK(fs::exists(f.temporary()));
  }
  CHECK(slurp(path) == "the old checkpoint");
  CHECK(listing(dir) == std::vector<std::string>{"model.safetensors"});

  // The same when an exception unwinds past it.
  CHECK_THROWS_WITH(
      [&] {
        AtomicFile f(path, "test");
        f.write("half a file");
        throw std::runtime_error("interrupted");
      }(),
      "interrupted");
  CHECK(slurp(path) == "the old checkpoint");
  CHECK(listing(dir) == std::vector<std::string>{"model.safetensors"});

  // No file before: still none after.
  { AtomicFile f(dir / "never.txt", "test"); }
  CHECK(listing(dir) == std::vector<std::string>{"model.safetensors"});
}

TEST_CASE("file_io: a write that fails (disk full) keeps the old file and removes the temporary",
          "[file_io]") {
  TempDir dir;
  const std::string path = dir / "out.bin";
  write_file_atomic(path, "previous contents", "test");
  const std::string tmp_prefix = path + ".tmp.";

  // Larger than the limit in one go, and through the buffer in small pieces.
  std::string err = error_with_file_size_limit(
      64 * 1024, [&] { write_file_atomic(path, random_bytes(kBuf + 5, 2), "test"); });
  CHECK_THAT(err, Contains("[test] " + tmp_prefix) && Contains(": write failed (File too large)"));
  CHECK(slurp(path) == "previous contents");
  CHECK(listing(dir) == std::vector<std::string>{"out.bin"});

  err = error_with_file_size_limit(64 * 1024, [&] {
    AtomicFile f(path, "test");
    const std::string piece = random_bytes(1000, 3);
    for (int i = 0; i < 3000; ++i) f.write(piece);
    f.commit();
  });
  CHECK_THAT(err, Contains("[test] " + tmp_prefix) && Contains(": write failed (File too large)"));
  CHECK(slurp(path) == "previous contents");
  CHECK(listing(dir) == std::vector<std::string>{"out.bin"});

  // Within the limit the same child succeeds: the limit, not the forking, made the errors.
  CHECK(error_with_file_size_limit(64 * 1024, [&] { write_file_atomic(path, "fits", "test"); }) ==
        "(no error)");
  CHECK(slurp(path) == "fits");
  CHECK(listing(dir) == std::vector<std::string>{"out.bin"});
}

TEST_CASE("file_io: a checkpoint that does not fit keeps the previous checkpoint", "[file_io]") {
  TempDir dir;
  const std::string path = dir / "ckpt.safetensors";
  Generator g(1);
  save_safetensors(path, {{"w", Tensor::randn({16}, g)}});
  const std::string before = slurp(path);
  const std::string err = error_with_file_size_limit(256 * 1024, [&] {
    save_safetensors(path, {{"w", Tensor::randn({200, 1000}, g)}});  // 800 KB
  });
  CHECK_THAT(err, Contains("[safetensors] " + path + ".tmp.") &&
                      Contains(": write failed (File too large)"));
  CHECK(slurp(path) == before);
  CHECK(listing(dir) == std::vector<std::string>{"ckpt.safetensors"});
}

TEST_CASE("file_io: FileWriter writes a plain file, fsynced on close", "[file_io]") {
  TempDir dir;
  const std::string path = dir / "train.bin";
  const std::string data = random_bytes(2 * kBuf + 99, 4);
  FileWriter w(path, "corpus");
  for (size_t at = 0; at < data.size(); at += 333)
    w.write(data.data() + at, std::min<size_t>(333, data.size() - at));
  w.close();
  CHECK(slurp(path) == data);

  // Created or truncated; a failure names the file.
  FileWriter again(path, "corpus");
  again.write("x");
  again.close();
  CHECK(slurp(path) == "x");
  const std::string err = error_with_file_size_limit(4096, [&] {
    FileWriter big(path, "corpus");
    big.write(data);
    big.close();
  });
  CHECK_THAT(err, Contains("[corpus] " + path + ": write failed (File too large)"));
}

TEST_CASE("file_io: errors name the file, what failed and the OS error", "[file_io]") {
  TempDir dir;
  const std::string missing = dir / "no/such/dir/f.txt";
  CHECK_THAT(
      error_of([&] { write_file_atomic(missing, "x", "glue"); }),
      Contains("[glue] " + missing + ": cannot create the temporary file '" + missing + ".tmp.") &&
          Contains("' (No such file or directory)"));
  CHECK_THAT(error_of([&] { FileWriter w(missing, "corpus"); }),
             Contains("[corpus] " + missing + ": cannot create (No such file or directory)"));

  // A non-empty directory where the file should go: the rename fails, the temporary goes.
  fs::create_directories(dir.path / "taken");
  std::ofstream(dir.path / "taken" / "inside") << "x";
  const std::string taken = dir / "taken";
  CHECK_THAT(error_of([&] { write_file_atomic(taken, "x", "npy"); }),
             Contains("[npy] " + taken + ": cannot rename '" + taken + ".tmp.") &&
                 Contains("' over it (Is a directory)"));
  CHECK(listing(dir) == std::vector<std::string>{"taken"});

  CHECK_THAT(error_of([&] { rename_durably(dir / "absent", dir / "b", "corpus"); }),
             Contains("[corpus] " + (dir / "b") + ": cannot rename '" + (dir / "absent") +
                      "' over it (No such file or directory)"));
  CHECK_THAT(error_of([&] { fsync_directory(dir / "absent", "corpus"); }),
             Contains("[corpus] " + (dir / "absent") +
                      ": cannot open the directory to fsync it (No such file or directory)"));
  fsync_directory(dir.path.string(), "corpus");  // an existing directory is fine
}

TEST_CASE("file_io: rename_durably moves a whole directory over an absent one", "[file_io]") {
  TempDir dir;
  const std::string tmp = temporary_path(dir / "corpus");
  fs::create_directories(tmp);
  FileWriter w((fs::path(tmp) / "meta.json").string(), "corpus");
  w.write("{}\n");
  w.close();
  fsync_directory(tmp, "corpus");
  rename_durably(tmp, dir / "corpus", "corpus");
  CHECK(slurp(dir / "corpus/meta.json") == "{}\n");
  CHECK(listing(dir) == std::vector<std::string>{"corpus"});
}
