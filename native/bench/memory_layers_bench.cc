// Memory-layer write/read costs on this host, outside any VM: what a capture
// pays to get 4096 dirty pages (16 MiB) of a 512 MiB machine into a diff
// layer, with and without a recycled file, the full layer of a mostly
// untouched machine with and without the anonymous-memory hint, applying a
// diff into a MAP_PRIVATE mapping of the bottom, and a merge.
// Release build (-O2, no sanitizers):  make -C native/bench run [DIR=/path/on/the/disk/to/measure]
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "snapshot/crc32c.h"
#include "snapshot/memory_layer.h"

using namespace torpor;

namespace {

constexpr uint64_t kRamBytes = 512ull << 20;
constexpr uint64_t kTouchedPages = 16384;  // 64 MiB of the 512 MiB hold data
constexpr size_t kDirty = 4096;
constexpr int kReps = 7;

using Clock = std::chrono::steady_clock;
double ms_since(Clock::time_point t) { return std::chrono::duration<double, std::milli>(Clock::now() - t).count(); }

struct Best {
  double write = 1e9, sync = 0;
};

// Writes the diff kReps times (best write time, with its fdatasync); `recycle`
// writes each over the file left by the previous round instead of a new one.
Best time_diff(const std::string& dir, const std::string& parent, const std::vector<PageRef>& pages, bool recycle) {
  Best best;
  const std::string path = dir + "/bench-diff.layer";
  for (int rep = 0; rep < kReps; rep++) {
    if (!recycle) ::unlink(path.c_str());
    auto t = Clock::now();
    write_diff_layer(path, kRamBytes, parent, pages, /*sync=*/false);
    double w = ms_since(t);
    t = Clock::now();
    sync_layer_file(path);
    double s = ms_since(t);
    if (w < best.write) best = {w, s};
  }
  return best;
}

}  // namespace

int main(int argc, char** argv) {
  const std::string dir = argc > 1 ? argv[1] : "/tmp";
  auto* ram = static_cast<uint8_t*>(::mmap(nullptr, kRamBytes, PROT_READ | PROT_WRITE,
                                           MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0));
  for (uint64_t p = 0; p < kTouchedPages; p++) std::memset(ram + p * kPageSize, static_cast<int>(p | 1), kPageSize);
  std::printf("memory layers, 512 MiB machine (64 MiB touched), files in %s, best of %d where repeated\n", dir.c_str(), kReps);

  const std::string full = dir + "/bench-full.layer";
  for (bool hint : {false, true}) {
    auto t = Clock::now();
    LayerInfo info = write_full_layer(full, {{ram, kRamBytes, hint}}, false);
    double w = ms_since(t);
    t = Clock::now();
    sync_layer_file(full);
    std::printf("  full layer%s: write %.1f ms, fdatasync %.1f ms (%llu pages, %llu MiB on disk)\n",
                hint ? " (anonymous hint)" : " (no hint)      ", w, ms_since(t),
                static_cast<unsigned long long>(info.pages), static_cast<unsigned long long>(info.disk_bytes >> 20));
  }
  std::string parent = layer_identity(full);

  std::mt19937_64 rng(1);
  std::vector<uint64_t> all(kRamBytes / kPageSize);
  for (uint64_t i = 0; i < all.size(); i++) all[i] = i;
  std::shuffle(all.begin(), all.end(), rng);
  for (bool scattered : {false, true}) {
    std::vector<PageRef> pages;
    for (size_t i = 0; i < kDirty; i++) {
      uint64_t p = scattered ? all[i] : 1000 + i;
      ram[p * kPageSize + 7] ^= 0x5a;
      pages.push_back({p, ram + p * kPageSize});
    }
    std::vector<const uint8_t*> ptrs;
    for (const PageRef& r : pages) ptrs.push_back(r.data);
    std::vector<uint32_t> crcs(kDirty);
    auto t = Clock::now();
    crc32c_pages(ptrs.data(), kDirty, kPageSize, crcs.data());
    double crc = ms_since(t);
    Best fresh = time_diff(dir, parent, pages, false), recycled = time_diff(dir, parent, pages, true);
    std::printf("  diff of %zu %s pages -> page cache: new file %.2f ms (fdatasync %.1f ms), recycled file %.2f ms "
                "(fdatasync %.1f ms); page checksums alone %.2f ms\n",
                kDirty, scattered ? "scattered" : "adjacent ", fresh.write, fresh.sync, recycled.write, recycled.sync, crc);

    MemoryChain chain = MemoryChain::open({full, dir + "/bench-diff.layer"}, kRamBytes);
    auto* back = static_cast<uint8_t*>(
        ::mmap(nullptr, kRamBytes, PROT_READ | PROT_WRITE, MAP_PRIVATE, chain.bottom_fd(), kMemoryDataOffset));
    t = Clock::now();
    chain.apply_diffs({{back, kRamBytes}});
    double apply = ms_since(t);
    bool same = std::memcmp(back, ram, kRamBytes) == 0;
    ::munmap(back, kRamBytes);
    std::printf("  apply that diff into a MAP_PRIVATE mapping of the bottom: %.2f ms (%s)\n", apply,
                same ? "RAM matches" : "RAM DIFFERS");
    if (!same) return 1;
    if (!scattered) {
      auto tm = Clock::now();
      merge_memory_layers({full, dir + "/bench-diff.layer"}, kRamBytes, dir + "/bench-merged.layer");
      std::printf("  merge full + diff into a new full layer (verifying): %.1f ms\n", ms_since(tm));
    }
    // The next round's diff lies over a bottom holding this round's pages.
    write_full_layer(full, {{ram, kRamBytes, true}});
    parent = layer_identity(full);
  }
  for (const char* f : {"/bench-full.layer", "/bench-diff.layer", "/bench-merged.layer"}) ::unlink((dir + f).c_str());
  return 0;
}
