// Memory layers on real files: full layers with zero pages as holes, diff
// chains applied into RAM, merging, and every kind of damage to headers,
// indexes and page data refused with SNAPSHOT_INVALID.
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstring>
#include <random>
#include <vector>

#include "common/error.h"
#include "base/file_io.h"
#include "snapshot/crc32c.h"
#include "snapshot/memory_layer.h"
#include "snapshot/memory_layer_format.h"
#include "test/check.h"
#include "test/temp_dir.h"

using namespace torpor;
using namespace torpor::memory_format;
using torpor_test::TempDir;

namespace {

// Guest RAM stand-in: two page-aligned regions (like slot 0 and slot 1).
struct Ram {
  std::vector<uint64_t> sizes;
  std::vector<uint8_t*> bases;
  explicit Ram(std::vector<uint64_t> region_pages) {
    for (uint64_t p : region_pages) {
      sizes.push_back(p * kPageSize);
      void* m = ::mmap(nullptr, p * kPageSize, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
      bases.push_back(static_cast<uint8_t*>(m));
    }
  }
  ~Ram() {
    for (size_t i = 0; i < bases.size(); i++) ::munmap(bases[i], sizes[i]);
  }
  Ram(const Ram&) = delete;
  std::vector<RamRegion> regions(bool anonymous = false) const {
    std::vector<RamRegion> r;
    for (size_t i = 0; i < bases.size(); i++) r.push_back({bases[i], sizes[i], anonymous});
    return r;
  }
  uint64_t bytes() const {
    uint64_t t = 0;
    for (uint64_t s : sizes) t += s;
    return t;
  }
  uint64_t pages() const { return bytes() / kPageSize; }
  uint8_t* page(uint64_t n) const {
    for (size_t i = 0; i < bases.size(); i++) {
      if (n < sizes[i] / kPageSize) return bases[i] + n * kPageSize;
      n -= sizes[i] / kPageSize;
    }
    return nullptr;
  }
  void stamp(uint64_t n, uint32_t tag) {
    uint8_t* p = page(n);
    for (size_t i = 0; i < kPageSize; i += 4) {
      uint32_t v = tag * 2654435761u + static_cast<uint32_t>(i);
      std::memcpy(p + i, &v, 4);
    }
  }
  bool same_as(const Ram& o) const {
    for (uint64_t n = 0; n < pages(); n++)
      if (std::memcmp(page(n), o.page(n), kPageSize) != 0) return false;
    return true;
  }
};

std::vector<PageRef> refs(const Ram& ram, const std::vector<uint64_t>& pages) {
  std::vector<PageRef> r;
  for (uint64_t p : pages) r.push_back({p, ram.page(p)});
  return r;
}

// Fills `ram` from a full layer's image (what MAP_PRIVATE would show).
void load_bottom(const MemoryChain& chain, Ram& ram) {
  for (uint64_t n = 0; n < ram.pages(); n++)
    CHECK_EQ(file_io::pread_all(chain.bottom_fd(), ram.page(n), kPageSize, kMemoryDataOffset + n * kPageSize), 0);
}

std::vector<uint8_t> read_file(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY);
  struct stat st;
  ::fstat(fd, &st);
  std::vector<uint8_t> b(st.st_size);
  CHECK_EQ(file_io::pread_all(fd, b.data(), b.size(), 0), 0);
  ::close(fd);
  return b;
}
void write_file(const std::string& path, const std::vector<uint8_t>& b) {
  int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  CHECK_EQ(file_io::pwrite_all(fd, b.data(), b.size(), 0), 0);
  ::close(fd);
}
void patch_file(const std::string& path, uint64_t off, const void* p, size_t n) {
  int fd = ::open(path.c_str(), O_WRONLY);
  CHECK_EQ(file_io::pwrite_all(fd, p, n, off), 0);
  ::close(fd);
}

std::string error_of(const std::function<void()>& fn, std::string* msg = nullptr) {
  try {
    fn();
  } catch (const Error& e) {
    if (msg) *msg = e.what();
    return e.code();
  }
  return "none";
}

// A 96-page machine (64 + 32) with a few non-zero pages, its full layer, and two diffs.
struct Chain3 {
  TempDir dir{"torpor-memlayer"};
  Ram ram{{64, 32}};
  std::string full = dir.file("0.layer"), d1 = dir.file("1.layer"), d2 = dir.file("2.layer");
  Chain3() {
    for (uint64_t p : {0, 1, 2, 10, 63, 64, 65, 95}) ram.stamp(p, static_cast<uint32_t>(p + 1));
    write_full_layer(full, ram.regions());
    for (uint64_t p : {2, 3, 63, 64}) ram.stamp(p, static_cast<uint32_t>(p + 100));
    write_diff_layer(d1, ram.bytes(), layer_identity(full), refs(ram, {64, 2, 3, 63}));
    std::memset(ram.page(10), 0, kPageSize);  // a page zeroed again must come back zero
    ram.stamp(3, 999);
    ram.stamp(80, 7);
    write_diff_layer(d2, ram.bytes(), layer_identity(d1), refs(ram, {3, 10, 80}));
  }
  std::vector<std::string> paths() const { return {full, d1, d2}; }
};

}  // namespace

TEST("snapshot memory: full layer round trip, zero pages are holes") {
  TempDir dir("torpor-memlayer");
  Ram ram({256, 256});  // 2 MiB
  std::vector<uint64_t> used = {0, 1, 2, 3, 100, 255, 256, 300, 511};
  for (uint64_t p : used) ram.stamp(p, static_cast<uint32_t>(p));
  const std::string path = dir.file("full.layer");
  LayerInfo info = write_full_layer(path, ram.regions());
  CHECK_EQ(info.pages, used.size());
  CHECK_EQ(info.file_bytes, kMemoryDataOffset + ram.bytes());
  struct stat st;
  CHECK_EQ(::stat(path.c_str(), &st), 0);
  CHECK_EQ(static_cast<uint64_t>(st.st_size), kMemoryDataOffset + ram.bytes());
  // Header page + the used pages; filesystems may allocate a little more, never the zero pages.
  uint64_t allocated = static_cast<uint64_t>(st.st_blocks) * 512;
  CHECK_EQ(info.disk_bytes, allocated);
  CHECK(allocated >= (1 + used.size()) * kPageSize);
  CHECK(allocated <= (1 + used.size()) * kPageSize + 64 * 1024);
  // A zero page's offset is a hole.
  int fd = ::open(path.c_str(), O_RDONLY);
  off_t hole = ::lseek(fd, static_cast<off_t>(kMemoryDataOffset + 50 * kPageSize), SEEK_HOLE);
  CHECK_EQ(hole, static_cast<off_t>(kMemoryDataOffset + 50 * kPageSize));
  ::close(fd);

  MemoryChain chain = MemoryChain::open({path}, ram.bytes());
  CHECK_EQ(chain.length(), size_t{1});
  CHECK_STR_EQ(chain.top_identity(), layer_identity(path));
  CHECK_EQ(chain.top_identity().size(), size_t{32});
  Ram back({256, 256});
  load_bottom(chain, back);
  chain.apply_diffs(back.regions());  // no diffs: nothing to do
  CHECK(back.same_as(ram));
  // The image maps MAP_PRIVATE at kMemoryDataOffset, as restore maps it.
  void* m = ::mmap(nullptr, ram.bytes(), PROT_READ | PROT_WRITE, MAP_PRIVATE, chain.bottom_fd(), kMemoryDataOffset);
  CHECK(m != MAP_FAILED);
  CHECK(std::memcmp(m, ram.page(0), 256 * kPageSize) == 0);
  CHECK(std::memcmp(static_cast<uint8_t*>(m) + 256 * kPageSize, ram.page(256), 256 * kPageSize) == 0);
  ::munmap(m, ram.bytes());
  // A second full layer gets another identity.
  write_full_layer(dir.file("again.layer"), ram.regions());
  CHECK(layer_identity(dir.file("again.layer")) != layer_identity(path));
}

TEST("snapshot memory: the anonymous-memory hint (pagemap) writes the same image") {
  TempDir dir("torpor-memlayer");
  Ram ram({256, 256});
  for (uint64_t p : {0, 5, 255, 256, 400}) ram.stamp(p, static_cast<uint32_t>(p + 3));
  volatile uint8_t sink = ram.page(7)[0];  // read-touched: maps the shared zero page
  (void)sink;
  std::memset(ram.page(300), 0, kPageSize);  // written, yet zero
  ram.page(301)[4095] = 1;                     // written, one byte
  LayerInfo plain = write_full_layer(dir.file("plain"), ram.regions(false));
  LayerInfo hinted = write_full_layer(dir.file("hinted"), ram.regions(true));
  CHECK_EQ(hinted.pages, plain.pages);
  CHECK_EQ(hinted.pages, uint64_t{6});
  auto a = read_file(dir.file("plain")), b = read_file(dir.file("hinted"));
  CHECK(std::memcmp(a.data() + kMemoryDataOffset, b.data() + kMemoryDataOffset, ram.bytes()) == 0);
  // Same content checksum too (the merge verifies it).
  merge_memory_layers({dir.file("hinted")}, ram.bytes(), dir.file("merged"));
  Header ha, hb;
  std::memcpy(&ha, a.data(), sizeof ha);
  std::memcpy(&hb, b.data(), sizeof hb);
  CHECK_EQ(ha.content_crc, hb.content_crc);
}

TEST("snapshot memory: a diff written over an existing file replaces it exactly") {
  Chain3 c;
  // Recycle the (bigger) full layer's file as the next diff: no truncation first.
  const std::string recycled = c.dir.file("recycled.layer");
  write_file(recycled, read_file(c.full));
  c.ram.stamp(50, 50);
  LayerInfo info = write_diff_layer(recycled, c.ram.bytes(), layer_identity(c.d2), refs(c.ram, {50}));
  CHECK_EQ(info.file_bytes, 2 * kPageSize + kPageSize);
  MemoryChain chain = MemoryChain::open({c.full, c.d1, c.d2, recycled}, c.ram.bytes());
  Ram back({64, 32});
  load_bottom(chain, back);
  chain.apply_diffs(back.regions());
  CHECK(back.same_as(c.ram));
}

TEST("snapshot memory: diff chain applies in order, sizes match what was dirtied") {
  Chain3 c;
  LayerInfo i1 = {};
  struct stat st;
  CHECK_EQ(::stat(c.d1.c_str(), &st), 0);
  i1.file_bytes = static_cast<uint64_t>(st.st_size);
  CHECK_EQ(i1.file_bytes, kPageSize /*header*/ + kPageSize /*index, padded*/ + 4 * kPageSize);
  MemoryChain chain = MemoryChain::open(c.paths(), c.ram.bytes());
  CHECK_EQ(chain.length(), size_t{3});
  CHECK_STR_EQ(chain.top_identity(), layer_identity(c.d2));
  Ram back({64, 32});
  load_bottom(chain, back);
  chain.apply_diffs(back.regions());
  CHECK(back.same_as(c.ram));
  // Moving the chain keeps it usable.
  MemoryChain moved = std::move(chain);
  Ram again({64, 32});
  load_bottom(moved, again);
  moved.apply_diffs(again.regions());
  CHECK(again.same_as(c.ram));
  // A prefix of the chain is a valid chain too (an earlier generation).
  CHECK_EQ(MemoryChain::open({c.full, c.d1}, c.ram.bytes()).length(), size_t{2});
}

TEST("snapshot memory: a large diff with adjacent and scattered pages") {
  TempDir dir("torpor-memlayer");
  Ram ram({2048, 2048});  // 16 MiB
  write_full_layer(dir.file("0"), ram.regions());
  std::vector<uint64_t> dirty;
  std::mt19937 rng(3);
  for (uint64_t p = 0; p < ram.pages(); p++)
    if (p < 1500 || rng() % 3 == 0) {  // a long adjacent run across many preadv batches, then scattered pages
      ram.stamp(p, static_cast<uint32_t>(rng()));
      dirty.push_back(p);
    }
  LayerInfo info = write_diff_layer(dir.file("1"), ram.bytes(), layer_identity(dir.file("0")), refs(ram, dirty));
  CHECK_EQ(info.pages, dirty.size());
  CHECK_EQ(info.file_bytes, diff_data_offset(dirty.size()) + dirty.size() * kPageSize);
  MemoryChain chain = MemoryChain::open({dir.file("0"), dir.file("1")}, ram.bytes());
  Ram back({2048, 2048});
  load_bottom(chain, back);
  chain.apply_diffs(back.regions());
  CHECK(back.same_as(ram));
}

TEST("snapshot memory: chain out of order, mixed or wrong size is refused") {
  Chain3 c;
  const uint64_t ram = c.ram.bytes();
  std::string msg;
  CHECK_STR_EQ(error_of([&] { MemoryChain::open({c.full, c.d2, c.d1}, ram); }, &msg), std::string("SNAPSHOT_INVALID"));
  CHECK(msg.find("chain out of order") != std::string::npos);
  CHECK_STR_EQ(error_of([&] { MemoryChain::open({c.full, c.d2}, ram); }), std::string("SNAPSHOT_INVALID"));
  CHECK_STR_EQ(error_of([&] { MemoryChain::open({c.d1, c.d2}, ram); }, &msg), std::string("SNAPSHOT_INVALID"));
  CHECK(msg.find("bottom layer must be full") != std::string::npos);
  CHECK_STR_EQ(error_of([&] { MemoryChain::open({c.full, c.full}, ram); }), std::string("SNAPSHOT_INVALID"));
  CHECK_STR_EQ(error_of([&] { MemoryChain::open(c.paths(), ram + kPageSize); }, &msg), std::string("SNAPSHOT_INVALID"));
  CHECK(msg.find("the machine has") != std::string::npos);
  // A diff of another machine's chain (same sizes, other bottom).
  write_full_layer(c.dir.file("other.layer"), c.ram.regions());
  CHECK_STR_EQ(error_of([&] { MemoryChain::open({c.dir.file("other.layer"), c.d1}, ram); }), std::string("SNAPSHOT_INVALID"));
  CHECK_THROWS_CODE(MemoryChain::open({c.dir.file("absent")}, ram), "IO_ERROR");
  CHECK_THROWS_CODE(MemoryChain::open({}, ram), "INVALID_ARGUMENT");
  // The writer refuses bad input too.
  CHECK_THROWS_CODE(write_diff_layer(c.dir.file("x"), ram, "not-hex", {}), "INVALID_ARGUMENT");
  CHECK_THROWS_CODE(write_diff_layer(c.dir.file("x"), ram, layer_identity(c.full), refs(c.ram, {1, 1})),
                    "INVALID_ARGUMENT");
  CHECK_THROWS_CODE(write_diff_layer(c.dir.file("x"), ram, layer_identity(c.full), {{96, c.ram.page(0)}}),
                    "INVALID_ARGUMENT");
}

TEST("snapshot memory: every header byte, truncation and extension refused") {
  Chain3 c;
  for (const std::string& path : {c.full, c.d1}) {
    const auto good = read_file(path);
    const std::vector<std::string> chain = path == c.full ? std::vector<std::string>{c.full}
                                                           : std::vector<std::string>{c.full, c.d1};
    for (size_t byte = 0; byte < kHeaderBytes; byte++) {
      auto f = good;
      f[byte] ^= 0x01;
      write_file(path, f);
      CHECK_STR_EQ(error_of([&] { MemoryChain::open(chain, c.ram.bytes()); }), std::string("SNAPSHOT_INVALID"));
    }
    // A stray byte in the header page past the header.
    auto f = good;
    f[2000] = 1;
    write_file(path, f);
    CHECK_STR_EQ(error_of([&] { MemoryChain::open(chain, c.ram.bytes()); }), std::string("SNAPSHOT_INVALID"));
    for (size_t len : {size_t{0}, size_t{100}, size_t{4095}, good.size() - kPageSize, good.size() - 1}) {
      write_file(path, std::vector<uint8_t>(good.begin(), good.begin() + len));
      std::string msg;
      CHECK_STR_EQ(error_of([&] { MemoryChain::open(chain, c.ram.bytes()); }, &msg), std::string("SNAPSHOT_INVALID"));
      CHECK(msg.find("truncated") != std::string::npos);
    }
    auto longer = good;
    longer.resize(good.size() + kPageSize);
    write_file(path, longer);
    CHECK_STR_EQ(error_of([&] { MemoryChain::open(chain, c.ram.bytes()); }), std::string("SNAPSHOT_INVALID"));
    write_file(path, good);
    CHECK_EQ(MemoryChain::open(chain, c.ram.bytes()).length(), chain.size());
  }
}

TEST("snapshot memory: forged headers and indexes (valid checksums) refused") {
  Chain3 c;
  const auto good = read_file(c.d1);
  Header h;
  std::memcpy(&h, good.data(), sizeof h);
  std::vector<IndexEntry> index(h.page_count);
  std::memcpy(index.data(), good.data() + kPageSize, index.size() * sizeof(IndexEntry));
  // Rewrites d1 with `entries` as its index and a header that checks out.
  auto forge = [&](std::vector<IndexEntry> entries, auto header_edit) {
    auto f = good;
    std::memcpy(f.data() + kPageSize, entries.data(), entries.size() * sizeof(IndexEntry));
    Header g = h;
    g.content_crc = crc32c(entries.data(), entries.size() * sizeof(IndexEntry));
    header_edit(g);
    g.header_crc = crc32c(&g, offsetof(Header, header_crc));
    std::memcpy(f.data(), &g, sizeof g);
    write_file(c.d1, f);
    std::string msg;
    std::string code = error_of([&] { MemoryChain::open({c.full, c.d1}, c.ram.bytes()); }, &msg);
    return code + ": " + msg;
  };
  auto none = [](Header&) {};
  auto refused = [](const std::string& r, const char* words) {
    if (r.rfind("SNAPSHOT_INVALID", 0) != 0 || r.find(words) == std::string::npos)
      torpor_test::fail(__FILE__, __LINE__, "got '" + r + "', want SNAPSHOT_INVALID with '" + words + "'");
  };
  CHECK(forge(index, none).rfind("none", 0) == 0);  // the forger itself is faithful
  auto unsorted = index;
  std::swap(unsorted[0], unsorted[1]);
  refused(forge(unsorted, none), "not strictly increasing");
  auto dup = index;
  dup[1].page = dup[0].page;
  refused(forge(dup, none), "not strictly increasing");
  auto outside = index;
  outside.back().page = c.ram.pages();
  refused(forge(outside, none), "outside RAM");
  auto huge = index;
  huge.back().page = ~0ull;
  refused(forge(huge, none), "outside RAM");
  auto reserved = index;
  reserved[0].reserved = 1;
  refused(forge(reserved, none), "reserved");
  refused(forge(index, [](Header& g) { g.kind = 3; }), "unknown layer kind");
  refused(forge(index, [](Header& g) { g.version = 2; }), "version 2");
  refused(forge(index, [](Header& g) { g.page_count = 5; }), "offsets do not match");
  refused(forge(index, [&](Header& g) { g.page_count = c.ram.pages() + 1; }), "claims");
  refused(forge(index, [](Header& g) { g.ram_bytes = 4095; }), "whole number of pages");
  refused(forge(index, [](Header& g) { g.data_offset += kPageSize; g.file_bytes += kPageSize; }), "offsets do not match");
  refused(forge(index, [](Header& g) { std::memset(g.parent, 0, sizeof g.parent); }), "names no parent");
  refused(forge(index, [](Header& g) { std::memset(g.identity, 0, sizeof g.identity); }), "identity is all zeros");
  refused(forge(index, [](Header& g) { g.content_crc ^= 1; }), "index checksum");
}

TEST("snapshot memory: corrupt diff page data is found while applying") {
  Chain3 c;
  const auto good = read_file(c.d2);
  Header h;
  std::memcpy(&h, good.data(), sizeof h);
  uint8_t flip = 0x80;
  auto f = good;
  f[h.data_offset + kPageSize + 17] ^= flip;  // second page of d2 (page 10)
  write_file(c.d2, f);
  MemoryChain chain = MemoryChain::open(c.paths(), c.ram.bytes());  // headers and index are fine
  Ram back({64, 32});
  load_bottom(chain, back);
  std::string msg;
  CHECK_STR_EQ(error_of([&] { chain.apply_diffs(back.regions()); }, &msg), std::string("SNAPSHOT_INVALID"));
  CHECK(msg.find("page 10 fails its checksum") != std::string::npos);
  // RAM regions that do not add up to the chain's RAM.
  Ram small({64});
  CHECK_THROWS_CODE(chain.apply_diffs(small.regions()), "INVALID_ARGUMENT");
}

TEST("snapshot memory: merge equals applying the chain, keeps the top identity, verifies as it goes") {
  Chain3 c;
  const std::string merged = c.dir.file("merged.layer");
  LayerInfo info = merge_memory_layers(c.paths(), c.ram.bytes(), merged);
  // Non-zero pages of the final RAM: 0 1 2 3 63 64 65 95 80 (10 was zeroed again).
  CHECK_EQ(info.pages, uint64_t{9});
  CHECK(info.disk_bytes < (1 + 9) * kPageSize + 64 * 1024);
  CHECK_STR_EQ(layer_identity(merged), layer_identity(c.d2));
  MemoryChain chain = MemoryChain::open({merged}, c.ram.bytes());
  Ram back({64, 32});
  load_bottom(chain, back);
  CHECK(back.same_as(c.ram));
  // A diff written over the old top chains onto the merged layer.
  c.ram.stamp(40, 40);
  write_diff_layer(c.dir.file("3.layer"), c.ram.bytes(), layer_identity(c.d2), refs(c.ram, {40}));
  MemoryChain on_merged = MemoryChain::open({merged, c.dir.file("3.layer")}, c.ram.bytes());
  Ram back2({64, 32});
  load_bottom(on_merged, back2);
  on_merged.apply_diffs(back2.regions());
  CHECK(back2.same_as(c.ram));
  // Merging a merged layer with nothing above it reproduces it.
  merge_memory_layers({merged}, c.ram.bytes(), c.dir.file("remerged.layer"));
  CHECK(read_file(c.dir.file("remerged.layer")) == read_file(merged));
  // No temporary left behind.
  CHECK(::access((merged + ".tmp").c_str(), F_OK) != 0);
}

TEST("snapshot memory: merge refuses a corrupt bottom image or diff page and leaves no output") {
  Chain3 c;
  const std::string out = c.dir.file("merged.layer");
  // A byte in a stored page of the bottom.
  const auto good_full = read_file(c.full);
  uint8_t one = 1;
  patch_file(c.full, kMemoryDataOffset + 1 * kPageSize + 5, &one, 1);
  std::string msg;
  CHECK_STR_EQ(error_of([&] { merge_memory_layers(c.paths(), c.ram.bytes(), out); }, &msg), std::string("SNAPSHOT_INVALID"));
  CHECK(msg.find("content checksum") != std::string::npos);
  CHECK(::access(out.c_str(), F_OK) != 0);
  CHECK(::access((out + ".tmp").c_str(), F_OK) != 0);
  // A byte written into a hole.
  write_file(c.full, good_full);
  patch_file(c.full, kMemoryDataOffset + 30 * kPageSize, &one, 1);
  CHECK_STR_EQ(error_of([&] { merge_memory_layers(c.paths(), c.ram.bytes(), out); }), std::string("SNAPSHOT_INVALID"));
  // A diff page.
  write_file(c.full, good_full);
  const auto d1 = read_file(c.d1);
  Header h;
  std::memcpy(&h, d1.data(), sizeof h);
  patch_file(c.d1, h.data_offset + 3 * kPageSize + 4095, &one, 1);
  CHECK_STR_EQ(error_of([&] { merge_memory_layers(c.paths(), c.ram.bytes(), out); }, &msg), std::string("SNAPSHOT_INVALID"));
  CHECK(msg.find("fails its checksum") != std::string::npos);
  CHECK(::access(out.c_str(), F_OK) != 0);
}

TEST("snapshot memory: diffs merged into one diff over the same bottom equal the chain, keep the top identity, bounded and verified") {
  Chain3 c;
  const std::string merged = c.dir.file("merged-diff.layer");
  // Over the full layer (kept in place, as a template's would be): d1 and d2 become one diff.
  LayerInfo info = merge_diff_layers(c.paths(), 1, c.ram.bytes(), merged, 1u << 20);
  CHECK_STR_EQ(layer_identity(merged), layer_identity(c.d2));
  MemoryChain chain = MemoryChain::open({c.full, merged}, c.ram.bytes());
  CHECK_EQ(chain.length(), size_t{2});
  Ram back({64, 32});
  load_bottom(chain, back);
  chain.apply_diffs(back.regions());
  CHECK(back.same_as(c.ram));
  CHECK_EQ(info.pages, uint64_t{6});  // 2 3 63 64 from d1, 3 10 80 from d2: the union
  // A diff written over the old top chains onto the merged one.
  c.ram.stamp(40, 40);
  write_diff_layer(c.dir.file("3.layer"), c.ram.bytes(), layer_identity(c.d2), refs(c.ram, {40}));
  MemoryChain on_merged = MemoryChain::open({c.full, merged, c.dir.file("3.layer")}, c.ram.bytes());
  Ram back2({64, 32});
  load_bottom(on_merged, back2);
  on_merged.apply_diffs(back2.regions());
  CHECK(back2.same_as(c.ram));
  // More pages than the bound: refused, nothing written (the caller merges a full layer instead).
  const std::string small = c.dir.file("bounded.layer");
  CHECK_STR_EQ(error_of([&] { merge_diff_layers(c.paths(), 1, c.ram.bytes(), small, kPageSize); }), std::string("INVALID_ARGUMENT"));
  CHECK(::access(small.c_str(), F_OK) != 0);
  // A corrupt diff page is refused, nothing left.
  const auto d1 = read_file(c.d1);
  Header h;
  std::memcpy(&h, d1.data(), sizeof h);
  uint8_t one = 1;
  patch_file(c.d1, h.data_offset + 3 * kPageSize + 7, &one, 1);
  const std::string bad = c.dir.file("bad.layer");
  std::string msg;
  // (d1's 4th stored page is page 64, which d2 does not shadow: its newest copy is the bad one.)
  CHECK_STR_EQ(error_of([&] { merge_diff_layers(c.paths(), 1, c.ram.bytes(), bad, 1u << 20); }, &msg), std::string("SNAPSHOT_INVALID"));
  CHECK(msg.find("fails its checksum") != std::string::npos);
  CHECK(::access(bad.c_str(), F_OK) != 0);
  CHECK(::access((bad + ".tmp").c_str(), F_OK) != 0);
  CHECK_STR_EQ(error_of([&] { merge_diff_layers(c.paths(), 0, c.ram.bytes(), bad, 1u << 20); }), std::string("INVALID_ARGUMENT"));
}
