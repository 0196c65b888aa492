// Golden snapshot files: files written by the current formats, committed
// under native/test/golden/. The test (1) reads each committed file and
// checks what it holds, and (2) writes the same inputs again and compares
// byte for byte, so any drift of a format, deliberate or not, fails here.
//
// A deliberate format change bumps the format's version and regenerates:
//   TORPOR_WRITE_GOLDEN=1 make -s -C native/test run T=golden
// then commit the new files (docs/snapshot.md, "Golden files").
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <vector>

#include "common/error.h"
#include "base/file_io.h"
#include "snapshot/envelope.h"
#include "snapshot/memory_layer.h"
#include "snapshot/memory_layer_format.h"
#include "test/check.h"
#include "test/snapshot_fixtures.h"
#include "test/temp_dir.h"

using namespace torpor;
using namespace torpor::memory_format;
using torpor_test::golden_host;

namespace {

const std::string kGoldenDir = std::filesystem::path(__FILE__).parent_path().string() + "/golden";
constexpr uint64_t kRegionPages = 8;  // two regions of 8 pages: 64 KiB of RAM


std::vector<uint8_t> golden_body() {
  StateWriter w;
  w.header("golden-machine", 1);
  w.u64(0x1122334455667788ull);
  w.str("console tail: hello");
  return w.take();
}

struct GoldenRam {
  std::vector<uint8_t> a = std::vector<uint8_t>(kRegionPages * kPageSize), b = a;
  std::vector<RamRegion> regions() { return {{a.data(), a.size()}, {b.data(), b.size()}}; }
  uint8_t* page(uint64_t n) { return n < kRegionPages ? &a[n * kPageSize] : &b[(n - kRegionPages) * kPageSize]; }
  void stamp(uint64_t n, uint8_t tag) {
    for (size_t i = 0; i < kPageSize; i++) page(n)[i] = static_cast<uint8_t>(tag + i / 16);
  }
};

void identity(uint8_t* id, uint8_t first) {
  for (size_t i = 0; i < kLayerIdentityBytes; i++) id[i] = static_cast<uint8_t>(first + i);
}

// Writes the three golden files into `dir`; `ram` ends as the RAM the chain holds.
void write_goldens(const std::string& dir, GoldenRam& ram) {
  write_state_file(dir + "/state-v1.state", golden_host(), golden_body());
  for (uint64_t p : {0, 3, 9, 15}) ram.stamp(p, static_cast<uint8_t>(0x40 + p));
  uint8_t full_id[kLayerIdentityBytes], diff_id[kLayerIdentityBytes];
  identity(full_id, 0x01);
  identity(diff_id, 0x11);
  write_full_layer_as(dir + "/memory-full-v1.layer", ram.regions(), full_id, true);
  ram.stamp(3, 0xA3);
  ram.stamp(4, 0xA4);
  ram.stamp(12, 0xAC);
  write_diff_layer_as(dir + "/memory-diff-v1.layer", 2 * kRegionPages * kPageSize, identity_hex(full_id),
                      {{12, ram.page(12)}, {3, ram.page(3)}, {4, ram.page(4)}}, diff_id, true);
}

const char* kFiles[] = {"state-v1.state", "memory-full-v1.layer", "memory-diff-v1.layer"};

std::vector<uint8_t> bytes_of(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) torpor_test::fail(__FILE__, __LINE__, "missing golden file " + path);
  return std::vector<uint8_t>(std::istreambuf_iterator<char>(f), {});
}

}  // namespace

TEST("snapshot golden: committed files parse and hold what they were written with") {
  if (std::getenv("TORPOR_WRITE_GOLDEN")) {
    GoldenRam ram;
    write_goldens(kGoldenDir, ram);
    std::printf("  wrote golden snapshot files to %s\n", kGoldenDir.c_str());
    return;
  }
  CHECK(read_state_file(kGoldenDir + "/state-v1.state", golden_host()) == golden_body());
  HostFingerprint hardware = golden_host();
  hardware.host_kind = "hardware";
  CHECK_THROWS_CODE(read_state_file(kGoldenDir + "/state-v1.state", hardware), "SNAPSHOT_INCOMPATIBLE");

  const std::string full = kGoldenDir + "/memory-full-v1.layer", diff = kGoldenDir + "/memory-diff-v1.layer";
  CHECK_STR_EQ(layer_identity(full), "0102030405060708090a0b0c0d0e0f10");
  CHECK_STR_EQ(layer_identity(diff), "1112131415161718191a1b1c1d1e1f20");
  MemoryChain chain = MemoryChain::open({full, diff}, 2 * kRegionPages * kPageSize);
  GoldenRam got;
  for (uint64_t n = 0; n < 2 * kRegionPages; n++)
    CHECK_EQ(file_io::pread_all(chain.bottom_fd(), got.page(n), kPageSize, kMemoryDataOffset + n * kPageSize), 0);
  chain.apply_diffs(got.regions());
  GoldenRam want;
  for (uint64_t p : {0, 9, 15}) want.stamp(p, static_cast<uint8_t>(0x40 + p));
  want.stamp(3, 0xA3);
  want.stamp(4, 0xA4);
  want.stamp(12, 0xAC);
  CHECK(got.a == want.a);
  CHECK(got.b == want.b);
  // Merging checks the full layer's content checksum too.
  torpor_test::TempDir tmp("torpor-golden");
  merge_memory_layers({full, diff}, 2 * kRegionPages * kPageSize, tmp.file("merged"));
}

TEST("snapshot golden: today's writers produce the committed bytes (format drift fails here)") {
  if (std::getenv("TORPOR_WRITE_GOLDEN")) return;
  torpor_test::TempDir tmp("torpor-golden");
  GoldenRam ram;
  write_goldens(tmp.path, ram);
  for (const char* name : kFiles) {
    if (bytes_of(tmp.file(name)) != bytes_of(kGoldenDir + "/" + name))
      torpor_test::fail(__FILE__, __LINE__,
                        std::string("format drift: the writer no longer produces golden/") + name +
                            ". If the change is deliberate, bump the format version and regenerate "
                            "(TORPOR_WRITE_GOLDEN=1 make -s -C native/test run T=golden; docs/snapshot.md)");
  }
}
