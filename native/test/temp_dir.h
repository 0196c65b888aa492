// A temporary directory for a test's files, removed with everything in it.
#pragma once

#include <stdlib.h>

#include <filesystem>
#include <string>

namespace torpor_test {

struct TempDir {
  std::string path;
  explicit TempDir(const char* prefix = "torpor-test") {
    std::string tmpl = std::string("/tmp/") + prefix + "-XXXXXX";
    path = mkdtemp(tmpl.data());
  }
  ~TempDir() { std::filesystem::remove_all(path); }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  std::string file(const std::string& name) const { return path + "/" + name; }
};

}  // namespace torpor_test
