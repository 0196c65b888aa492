// The copy-on-write overlay over a real base file in a temporary directory:
// reads through base and overlay, writes, partial-block copy-up, bounds,
// flush and reopen, crash-style reopen without flush, corrupt maps, and a
// base image that is never written.
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "common/error.h"
#include "devices/virtio/blk/overlay_disk.h"
#include "devices/virtio/blk/raw_image.h"
#include "test/check.h"

using namespace torpor;

namespace {

struct TempDir {
  std::string path;
  TempDir() {
    char tmpl[] = "/tmp/torpor-overlay-XXXXXX";
    path = mkdtemp(tmpl);
  }
  ~TempDir() { std::filesystem::remove_all(path); }
  std::string file(const char* name) const { return path + "/" + name; }
};

std::vector<uint8_t> pattern(size_t n, uint8_t seed) {
  std::vector<uint8_t> v(n);
  for (size_t i = 0; i < n; i++) v[i] = static_cast<uint8_t>(seed + i * 7 + (i >> 9));
  return v;
}

void write_file(const std::string& path, const std::vector<uint8_t>& bytes) {
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  f.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
}

std::vector<uint8_t> read_file(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return std::vector<uint8_t>(std::istreambuf_iterator<char>(f), {});
}

std::unique_ptr<OverlayDisk> open_overlay(const TempDir& d, uint64_t size, bool with_base = true, bool ro = false) {
  std::unique_ptr<Disk> base;
  if (with_base) base = std::make_unique<RawImage>(d.file("base.img"), size);
  return std::make_unique<OverlayDisk>(std::move(base), d.file("overlay"), size, ro);
}

std::vector<uint8_t> read_disk(Disk& disk, uint64_t off, size_t len) {
  std::vector<uint8_t> v(len);
  CHECK_EQ(disk.read(off, v.data(), len), 0);
  return v;
}

constexpr uint64_t kBlock = OverlayDisk::kBlockSize;

}  // namespace

TEST("overlay: unwritten blocks read from the base, past the base's end as zeros") {
  TempDir d;
  auto base = pattern(5 * kBlock + 100, 1);  // not a whole number of blocks
  write_file(d.file("base.img"), base);
  auto disk = open_overlay(d, 8 * kBlock);
  CHECK_EQ(disk->size(), 8 * kBlock);
  CHECK(read_disk(*disk, 0, base.size()) == base);
  auto tail = read_disk(*disk, base.size(), 8 * kBlock - base.size());
  CHECK(std::all_of(tail.begin(), tail.end(), [](uint8_t b) { return b == 0; }));
  CHECK_EQ(disk->allocated_blocks(), uint64_t{0});
}

TEST("overlay: whole-block, partial-block and straddling writes; base bytes around them survive") {
  TempDir d;
  auto base = pattern(16 * kBlock, 3);
  write_file(d.file("base.img"), base);
  auto disk = open_overlay(d, 16 * kBlock);
  std::vector<uint8_t> expect = base;
  auto put = [&](uint64_t off, size_t len, uint8_t seed) {
    auto data = pattern(len, seed);
    CHECK_EQ(disk->write(off, data.data(), len), 0);
    std::memcpy(expect.data() + off, data.data(), len);
  };
  put(2 * kBlock, 2 * kBlock, 0x40);        // blocks 2-3 whole
  put(5 * kBlock + 512, 1024, 0x50);        // inside block 5: copy-up
  put(7 * kBlock - 512, kBlock + 1024, 0x60);  // tail of 6, all of 7, head of 8
  put(5 * kBlock + 100, 10, 0x70);          // again into allocated block 5
  CHECK(read_disk(*disk, 0, expect.size()) == expect);
  CHECK(disk->allocated(2) && disk->allocated(3) && disk->allocated(5));
  CHECK(disk->allocated(6) && disk->allocated(7) && disk->allocated(8));
  CHECK(!disk->allocated(4) && !disk->allocated(9));
  CHECK_EQ(disk->allocated_blocks(), uint64_t{6});
  // The base file is byte for byte what it was.
  CHECK(read_file(d.file("base.img")) == base);
}

TEST("overlay: the disk's short last block, bounds, read-only") {
  TempDir d;
  uint64_t size = 3 * kBlock + 1536;  // multiple of 512, not of 4096
  write_file(d.file("base.img"), pattern(size, 9));
  auto disk = open_overlay(d, size);
  auto data = pattern(1536, 0x11);
  CHECK_EQ(disk->write(3 * kBlock, data.data(), data.size()), 0);  // whole short block
  CHECK(read_disk(*disk, 3 * kBlock, 1536) == data);
  CHECK_EQ(disk->write(3 * kBlock + 1024, data.data(), 512), 0);  // partial, allocated
  uint8_t b[16];
  CHECK_EQ(disk->read(size - 8, b, 16), -EINVAL);
  CHECK_EQ(disk->write(size, b, 1), -EINVAL);
  CHECK_EQ(disk->read(~uint64_t{0} - 4, b, 16), -EINVAL);
  CHECK_EQ(disk->read(size, b, 0), 0);
  CHECK_THROWS_CODE(OverlayDisk(nullptr, d.file("x"), 1000), "INVALID_ARGUMENT");
}

TEST("overlay: flush persists; reopen sees flushed writes, not unflushed ones") {
  TempDir d;
  auto base = pattern(8 * kBlock, 5);
  write_file(d.file("base.img"), base);
  auto a = pattern(kBlock, 0xa0), b = pattern(kBlock, 0xb0);
  {
    auto disk = open_overlay(d, 8 * kBlock);
    CHECK_EQ(disk->write(kBlock, a.data(), kBlock), 0);
    CHECK_EQ(disk->flush(), 0);
    CHECK_EQ(disk->generation(), uint64_t{1});
    CHECK_EQ(disk->write(4 * kBlock, b.data(), kBlock), 0);  // never flushed: as if the host crashed
  }
  {
    auto disk = open_overlay(d, 8 * kBlock);
    CHECK(read_disk(*disk, kBlock, kBlock) == a);
    CHECK(read_disk(*disk, 4 * kBlock, kBlock) == std::vector<uint8_t>(base.begin() + 4 * kBlock, base.begin() + 5 * kBlock));
    CHECK_EQ(disk->allocated_blocks(), uint64_t{1});
    CHECK_EQ(disk->write(4 * kBlock, b.data(), kBlock), 0);
    CHECK_EQ(disk->flush(), 0);
    CHECK_EQ(disk->generation(), uint64_t{2});
    CHECK_EQ(disk->flush(), 0);  // nothing new: no new map generation
    CHECK_EQ(disk->generation(), uint64_t{2});
  }
  auto disk = open_overlay(d, 8 * kBlock);
  CHECK(read_disk(*disk, 4 * kBlock, kBlock) == b);
  CHECK(read_file(d.file("base.img")) == base);
  // The data file is sparse: two blocks written, not the whole disk.
  struct stat st;
  CHECK_EQ(stat(d.file("overlay").c_str(), &st), 0);
  CHECK_EQ(static_cast<uint64_t>(st.st_size), 8 * kBlock);
  CHECK(static_cast<uint64_t>(st.st_blocks) * 512 <= 4 * kBlock);
}

// Its files reach the directory at the first flush, not at creation: files lost before it (a
// crash took their entries) reopen as a fresh overlay. The flush syncs the directory through a
// descriptor taken at creation (a device thread may not open one): a directory renamed meanwhile
// is still the one synced, and the data reopens at its new path.
TEST("overlay: files lost before the first flush reopen fresh; the first flush syncs the directory it was created in") {
  TempDir d;
  auto base = pattern(4 * kBlock, 9);
  write_file(d.file("base.img"), base);
  auto a = pattern(kBlock, 0x31);
  {
    auto disk = open_overlay(d, 4 * kBlock);
    CHECK_EQ(disk->write(0, a.data(), kBlock), 0);
  }
  CHECK_EQ(::unlink(d.file("overlay").c_str()), 0);
  CHECK_EQ(::unlink(OverlayDisk::map_path(d.file("overlay")).c_str()), 0);
  {
    auto disk = open_overlay(d, 4 * kBlock);
    CHECK(read_disk(*disk, 0, kBlock) == std::vector<uint8_t>(base.begin(), base.begin() + kBlock));
    CHECK_EQ(disk->write(0, a.data(), kBlock), 0);
    CHECK_EQ(disk->flush(), 0);
  }
  CHECK(read_disk(*open_overlay(d, 4 * kBlock), 0, kBlock) == a);

  TempDir moved;
  std::string sub = moved.file("tops"), renamed = moved.file("tops-renamed");
  CHECK_EQ(::mkdir(sub.c_str(), 0755), 0);
  auto top = std::make_unique<OverlayDisk>(nullptr, sub + "/top", 4 * kBlock);
  CHECK_EQ(::rename(sub.c_str(), renamed.c_str()), 0);
  CHECK_EQ(top->write(kBlock, a.data(), kBlock), 0);
  CHECK_EQ(top->flush(), 0);
  top.reset();
  OverlayDisk again(nullptr, renamed + "/top", 4 * kBlock, /*read_only=*/true);
  CHECK(read_disk(again, kBlock, kBlock) == a);
}

// A capture freezes the top under a new one: no more writes, and a top never written lets go of
// the directory it held for a first flush (a frozen layer holds its two files, nothing more).
TEST("overlay: freeze refuses writes and lets go of the directory a never-flushed top held") {
  TempDir d;
  auto open_under = [&]() {
    size_t n = 0;
    for (const auto& e : std::filesystem::directory_iterator("/proc/self/fd")) {
      std::error_code ec;
      auto target = std::filesystem::read_symlink(e.path(), ec);
      if (!ec && (target.string() == d.path || target.string().rfind(d.path + "/", 0) == 0)) n++;
    }
    return n;
  };
  auto a = pattern(kBlock, 0x44);
  OverlayDisk top(nullptr, d.file("top"), 4 * kBlock);
  CHECK_EQ(open_under(), size_t{3});  // data, map, and the directory for the first flush
  top.freeze();
  CHECK_EQ(open_under(), size_t{2});
  CHECK_EQ(top.write(0, a.data(), kBlock), -EROFS);
  CHECK_EQ(top.flush(), 0);
  CHECK(top.read_only());

  OverlayDisk written(nullptr, d.file("written"), 4 * kBlock);
  CHECK_EQ(written.write(0, a.data(), kBlock), 0);
  CHECK_EQ(written.flush(), 0);  // the first flush synced the directory and closed it
  written.freeze();
  CHECK(read_disk(written, 0, kBlock) == a);
}

TEST("overlay: a torn latest map slot falls back to the previous generation") {
  TempDir d;
  write_file(d.file("base.img"), pattern(4 * kBlock, 1));
  auto a = pattern(kBlock, 0x21), b = pattern(kBlock, 0x22);
  {
    auto disk = open_overlay(d, 4 * kBlock);
    CHECK_EQ(disk->write(0, a.data(), kBlock), 0);
    CHECK_EQ(disk->flush(), 0);  // generation 1, slot 1
    CHECK_EQ(disk->write(kBlock, b.data(), kBlock), 0);
    CHECK_EQ(disk->flush(), 0);  // generation 2, slot 0
  }
  // Corrupt slot 0's bitmap (generation 2): its checksum fails.
  int fd = open(OverlayDisk::map_path(d.file("overlay")).c_str(), O_RDWR);
  uint8_t junk = 0xff;
  CHECK_EQ(pwrite(fd, &junk, 1, 64), 1);
  close(fd);
  auto disk = open_overlay(d, 4 * kBlock);
  CHECK_EQ(disk->generation(), uint64_t{1});
  CHECK(disk->allocated(0));
  CHECK(!disk->allocated(1));
}

TEST("overlay: corrupt maps, maps for another size and a torn first persist") {
  TempDir d;
  write_file(d.file("base.img"), pattern(4 * kBlock, 1));
  auto a = pattern(kBlock, 0x31);
  {
    auto disk = open_overlay(d, 4 * kBlock);
    CHECK_EQ(disk->write(0, a.data(), kBlock), 0);
    CHECK_EQ(disk->flush(), 0);
    CHECK_EQ(disk->write(0, a.data(), kBlock), 0);
    CHECK_EQ(disk->write(kBlock, a.data(), kBlock), 0);
    CHECK_EQ(disk->flush(), 0);
  }
  // Another disk size: refused, not silently reinterpreted.
  CHECK_THROWS_CODE(open_overlay(d, 8 * kBlock), "INVALID_ARGUMENT");
  // Both slots damaged after a completed flush: refused.
  std::string map = OverlayDisk::map_path(d.file("overlay"));
  auto bytes = read_file(map);
  for (size_t i = 64; i < bytes.size(); i += 4096) bytes[i] ^= 0xff;
  write_file(map, bytes);
  CHECK_THROWS_CODE(open_overlay(d, 4 * kBlock), "IO_ERROR");
  // A map holding only a torn generation-1 slot: the first flush never
  // completed, so the overlay starts empty.
  TempDir e;
  write_file(e.file("base.img"), pattern(4 * kBlock, 1));
  {
    auto disk = open_overlay(e, 4 * kBlock);
    CHECK_EQ(disk->write(0, a.data(), kBlock), 0);
    CHECK_EQ(disk->flush(), 0);
  }
  std::string emap = OverlayDisk::map_path(e.file("overlay"));
  auto eb = read_file(emap);
  eb[4096 + 64] ^= 0xff;  // slot 1's bitmap
  write_file(emap, eb);
  auto disk = open_overlay(e, 4 * kBlock);
  CHECK_EQ(disk->allocated_blocks(), uint64_t{0});
  CHECK_EQ(disk->generation(), uint64_t{0});
}

TEST("overlay: overlay-only disk reads zeros; a read-only overlay refuses writes") {
  TempDir d;
  {
    auto disk = open_overlay(d, 4 * kBlock, false);
    auto z = read_disk(*disk, 0, 4 * kBlock);
    CHECK(std::all_of(z.begin(), z.end(), [](uint8_t b) { return b == 0; }));
    auto a = pattern(100, 1);
    CHECK_EQ(disk->write(10, a.data(), a.size()), 0);
    CHECK_EQ(disk->flush(), 0);
  }
  auto ro = open_overlay(d, 4 * kBlock, false, true);
  uint8_t b[4] = {};
  CHECK_EQ(ro->write(0, b, 4), -EROFS);
  CHECK(read_disk(*ro, 10, 100) == pattern(100, 1));
  CHECK_THROWS_CODE(OverlayDisk(nullptr, d.file("missing"), 4 * kBlock, true), "IO_ERROR");
}

TEST("raw image: opened read-only, writes refused, missing file is an IO_ERROR") {
  TempDir d;
  write_file(d.file("base.img"), pattern(1000, 2));
  RawImage img(d.file("base.img"));
  CHECK_EQ(img.size(), uint64_t{1024});  // rounded up to a whole sector
  CHECK_EQ(img.file_size(), uint64_t{1000});
  uint8_t b[4] = {};
  CHECK_EQ(img.write(0, b, 4), -EROFS);
  auto v = read_disk(img, 996, 28);
  CHECK_EQ(v[0], pattern(1000, 2)[996]);
  CHECK_EQ(v[4], uint8_t{0});
  CHECK_THROWS_CODE(RawImage(d.file("nope")), "IO_ERROR");
}


TEST("overlay: discard drops whole allocated blocks (base shows again, space freed), keeps partial ones") {
  TempDir d;
  auto base = pattern(16 * kBlock, 4);
  write_file(d.file("base.img"), base);
  auto disk = open_overlay(d, 16 * kBlock);
  auto data = pattern(8 * kBlock, 0x90);
  CHECK_EQ(disk->write(2 * kBlock, data.data(), data.size()), 0);  // blocks 2..9
  CHECK_EQ(disk->allocated_blocks(), uint64_t{8});
  // From the middle of block 3 to the middle of block 7: blocks 4, 5, 6 go.
  CHECK_EQ(disk->discard(3 * kBlock + 100, 4 * kBlock), 0);
  CHECK_EQ(disk->allocated_blocks(), uint64_t{5});
  CHECK(disk->allocated(3) && !disk->allocated(4) && !disk->allocated(6) && disk->allocated(7));
  CHECK(read_disk(*disk, 4 * kBlock, 3 * kBlock) ==
        std::vector<uint8_t>(base.begin() + 4 * kBlock, base.begin() + 7 * kBlock));
  CHECK(read_disk(*disk, 3 * kBlock, kBlock) == std::vector<uint8_t>(data.begin() + kBlock, data.begin() + 2 * kBlock));
  CHECK_EQ(disk->discard(15 * kBlock, 2 * kBlock), -EINVAL);
  CHECK_EQ(disk->flush(), 0);
  struct stat st;
  CHECK_EQ(stat(d.file("overlay").c_str(), &st), 0);
  CHECK(static_cast<uint64_t>(st.st_blocks) * 512 <= 5 * kBlock);
  // The discard is part of the persisted map.
  disk.reset();
  auto again = open_overlay(d, 16 * kBlock);
  CHECK_EQ(again->allocated_blocks(), uint64_t{5});
  CHECK(read_file(d.file("base.img")) == base);
}
