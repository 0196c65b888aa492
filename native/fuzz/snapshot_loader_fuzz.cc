// Fuzz target: the snapshot loaders, which read untrusted files. The first
// input byte picks what the rest is fed to:
//   0  parse_state_file (the state-file envelope and fingerprint)
//   1  the same after fixing the trailing checksum, to reach the checks after it
//   2  a memory layer's header page and index parsers (memory_layer_format.h)
//   3  the same after fixing the header and index checksums
//   4  a diff layer file (checksums fixed, in a memfd) over a fixed 16-page
//      bottom layer: MemoryChain::open + apply_diffs into 64 KiB of RAM
// Every outcome must be a parsed result or Error(SNAPSHOT_INVALID /
// SNAPSHOT_INCOMPATIBLE); anything else (another code, a crash, a sanitizer
// report) is a bug. Cheap per input: no threads, no sockets, no disk files.
//
// libFuzzer (clang):  make -C native/fuzz snapshot_libfuzzer, then
//   native/test/out/fuzz/snapshot_loader_libfuzzer -max_total_time=60 CORPUS_DIR native/fuzz/corpus/snapshot_loader
// Without clang (g++ only), a driver mutating the golden files is built in:
//   make -C native/fuzz all; native/test/out/fuzz/snapshot_loader_fuzz [iterations] [seed]
#include <sys/mman.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "common/error.h"
#include "snapshot/crc32c.h"
#include "snapshot/envelope.h"
#include "snapshot/memory_layer.h"
#include "snapshot/memory_layer_format.h"
#include "test/snapshot_fixtures.h"

using namespace torpor;
using namespace torpor::memory_format;

namespace {

constexpr uint64_t kRamPages = 16;
constexpr uint64_t kRamBytes = kRamPages * kPageSize;


void expect_snapshot_error(const Error& e) {
  if (std::strcmp(e.code(), code::kSnapshotInvalid) != 0 && std::strcmp(e.code(), code::kSnapshotIncompatible) != 0) {
    std::fprintf(stderr, "loader threw %s (%s), want a SNAPSHOT_* code\n", e.code(), e.what());
    std::abort();
  }
}

std::string fd_path(int fd) { return "/proc/self/fd/" + std::to_string(fd); }

// A 16-page bottom layer with identity 01..10, in a memfd, made once.
struct Bottom {
  int fd = -1;
  std::string path;
  std::vector<uint8_t> ram = std::vector<uint8_t>(kRamBytes);
  Bottom() {
    int tmp = ::memfd_create("bottom-build", 0);
    for (uint64_t p = 0; p < kRamPages; p += 3) std::memset(&ram[p * kPageSize], static_cast<int>(p + 1), kPageSize);
    uint8_t id[kLayerIdentityBytes];
    for (size_t i = 0; i < kLayerIdentityBytes; i++) id[i] = static_cast<uint8_t>(1 + i);
    write_full_layer_as(fd_path(tmp), {{ram.data(), kRamBytes}}, id, false);
    fd = tmp;
    path = fd_path(fd);
  }
};

void reseal_state(std::vector<uint8_t>& f) {
  if (f.size() < 4) return;
  uint32_t crc = crc32c(f.data(), f.size() - 4);
  std::memcpy(&f[f.size() - 4], &crc, 4);
}

// Fixes the header checksum and, where the index fits, the index checksum.
void reseal_layer(std::vector<uint8_t>& f) {
  if (f.size() < kHeaderPageBytes) return;
  Header h;
  std::memcpy(&h, f.data(), sizeof h);
  if (h.page_count <= kRamPages && kHeaderPageBytes + h.page_count * kIndexEntryBytes <= f.size())
    h.content_crc = crc32c(f.data() + kHeaderPageBytes, h.page_count * kIndexEntryBytes);
  h.header_crc = crc32c(&h, offsetof(Header, header_crc));
  std::memcpy(f.data(), &h, sizeof h);
}

void fuzz_state(const uint8_t* data, size_t size, bool reseal) {
  std::vector<uint8_t> f(data, data + size);
  if (reseal) reseal_state(f);
  try {
    parse_state_file(f.data(), f.size(), torpor_test::golden_host());
  } catch (const Error& e) {
    expect_snapshot_error(e);
  }
}

void fuzz_layer_parsers(const uint8_t* data, size_t size, bool reseal) {
  std::vector<uint8_t> f(data, data + size);
  if (reseal) reseal_layer(f);
  try {
    Header h = parse_header(f.data(), f.size());
    check_file_size(h, f.size(), "input");
    if (h.kind == kKindDiff) parse_index(h, f.data() + h.index_offset, h.page_count * kIndexEntryBytes);
  } catch (const Error& e) {
    expect_snapshot_error(e);
  }
}

void fuzz_chain(const uint8_t* data, size_t size) {
  static Bottom bottom;
  static std::vector<uint8_t> ram(kRamBytes);
  std::vector<uint8_t> f(data, data + size);
  reseal_layer(f);
  // One memfd for the process (creating and closing one per input was ~10% of its cost),
  // emptied and rewritten per input: the chain sees exactly this input's file.
  static const int fd = ::memfd_create("diff", 0);
  if (fd < 0) return;
  if (::ftruncate(fd, 0) != 0) std::abort();
  if (!f.empty() && ::pwrite(fd, f.data(), f.size(), 0) != static_cast<ssize_t>(f.size())) std::abort();
  try {
    MemoryChain chain = MemoryChain::open({bottom.path, fd_path(fd)}, kRamBytes);
    std::memcpy(ram.data(), bottom.ram.data(), kRamBytes);
    chain.apply_diffs({{ram.data(), kRamBytes}});
  } catch (const Error& e) {
    expect_snapshot_error(e);
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  switch (data[0] % 5) {
    case 0: fuzz_state(data + 1, size - 1, false); break;
    case 1: fuzz_state(data + 1, size - 1, true); break;
    case 2: fuzz_layer_parsers(data + 1, size - 1, false); break;
    case 3: fuzz_layer_parsers(data + 1, size - 1, true); break;
    case 4: fuzz_chain(data + 1, size - 1); break;
  }
  return 0;
}

#ifdef TORPOR_FUZZ_STANDALONE
#include <fstream>
#include <random>

// Mutations of the golden files: bit flips, byte stores, truncations and
// extensions, with every selector.
int main(int argc, char** argv) {
  long iterations = argc > 1 ? std::atol(argv[1]) : 20000;
  std::mt19937_64 rng(argc > 2 ? std::atoll(argv[2]) : 1);
#ifndef TORPOR_GOLDEN_DIR
#define TORPOR_GOLDEN_DIR "native/test/golden"
#endif
  const std::string golden = std::string(TORPOR_GOLDEN_DIR) + "/";
  auto load = [&](const char* name) {
    std::ifstream in(golden + name, std::ios::binary);
    return std::vector<uint8_t>(std::istreambuf_iterator<char>(in), {});
  };
  const std::vector<uint8_t> state = load("state-v1.state"), diff = load("memory-diff-v1.layer");
  if (state.empty() || diff.empty()) {
    std::fprintf(stderr, "golden files not found under %s\n", golden.c_str());
    return 1;
  }
  for (long it = 0; it < iterations; it++) {
    uint8_t mode = static_cast<uint8_t>(rng() % 5);
    std::vector<uint8_t> in = {mode};
    const std::vector<uint8_t>& base = mode < 2 ? state : diff;
    in.insert(in.end(), base.begin(), base.end());
    int edits = 1 + static_cast<int>(rng() % 4);
    for (int e = 0; e < edits && in.size() > 1; e++) {
      // Mostly in the header/index, where the parsers look.
      size_t span = mode < 2 ? in.size() - 1 : std::min<size_t>(in.size() - 1, 4096 + 256);
      size_t at = 1 + rng() % span;
      switch (rng() % 4) {
        case 0: in[at] ^= static_cast<uint8_t>(1u << (rng() % 8)); break;
        case 1: in[at] = static_cast<uint8_t>(rng()); break;
        case 2: in.resize(1 + rng() % (in.size() - 1)); break;
        case 3: in.resize(in.size() + rng() % 64, static_cast<uint8_t>(rng())); break;
      }
    }
    LLVMFuzzerTestOneInput(in.data(), in.size());
  }
  std::printf("snapshot_loader_fuzz: %ld mutated inputs, no crash, only SNAPSHOT_* errors\n", iterations);
  return 0;
}
#endif
