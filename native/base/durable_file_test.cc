// replace_file_durably: the new bytes or the old, no temporary left behind, errno kept.
#include <errno.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include "base/durable_file.h"
#include "common/error.h"
#include "test/check.h"
#include "test/temp_dir.h"

using namespace torpor;

namespace {
std::string read_all(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}
size_t entries(const std::string& dir) {
  size_t n = 0;
  for ([[maybe_unused]] auto& e : std::filesystem::directory_iterator(dir)) n++;
  return n;
}
}  // namespace

TEST("durable file: creates, then replaces whole; the temporary is gone") {
  torpor_test::TempDir dir("durable-file");
  std::string path = dir.file("meta.json");
  replace_file_durably(dir.file("meta.json.1.tmp"), path, "{\"a\":1}\n");
  CHECK(read_all(path) == std::string("{\"a\":1}\n"));
  std::string big(200000, 'x');  // more than one write(2) may take
  replace_file_durably(dir.file("meta.json.2.tmp"), path, big);
  CHECK(read_all(path) == big);
  replace_file_durably(dir.file("meta.json.3.tmp"), path, "");
  CHECK(read_all(path) == std::string());
  CHECK_EQ(entries(dir.path), size_t(1));
}

TEST("durable file: a directory that is not there fails with ENOENT, nothing written") {
  torpor_test::TempDir dir("durable-file");
  std::string missing = dir.file("gone");
  bool threw = false;
  try {
    replace_file_durably(missing + "/f.tmp", missing + "/f", "x");
  } catch (const Error& e) {
    threw = true;
    CHECK(std::string(e.code()) == std::string("IO_ERROR"));
    CHECK_EQ(e.sys_errno(), ENOENT);
  }
  CHECK(threw);
  CHECK_EQ(entries(dir.path), size_t(0));
}

TEST("durable file: a failed rename removes the temporary and keeps the old file") {
  torpor_test::TempDir dir("durable-file");
  std::string path = dir.file("current");
  std::filesystem::create_directory(path + ".d");
  // rename(2) of a file over a non-empty directory fails (EISDIR): the old "file" stays
  std::string target = path + ".d";
  std::ofstream(target + "/inside") << "keep";
  bool threw = false;
  try {
    replace_file_durably(dir.file("current.tmp"), target, "gen-2\n");
  } catch (const Error& e) {
    threw = true;
    CHECK(e.sys_errno() == EISDIR || e.sys_errno() == ENOTEMPTY);
  }
  CHECK(threw);
  CHECK(!std::filesystem::exists(dir.file("current.tmp")));
  CHECK(read_all(target + "/inside") == std::string("keep"));
}

TEST("durable file: a temporary outside the file's directory is refused") {
  torpor_test::TempDir dir("durable-file");
  bool threw = false;
  try {
    replace_file_durably("/tmp/elsewhere.tmp", dir.file("f"), "x");
  } catch (const Error& e) {
    threw = true;
    CHECK(std::string(e.code()) == std::string("INTERNAL"));
  }
  CHECK(threw);
}
