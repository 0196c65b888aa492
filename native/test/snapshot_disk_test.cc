// Disk layers: a base image, frozen overlays (read-only) and a writable top,
// read newest-first; frozen files never change; merging frozen overlays
// gives the disk the chain shows.
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <fstream>
#include <vector>

#include "common/error.h"
#include "devices/virtio/blk/overlay_disk.h"
#include "snapshot/disk_layers.h"
#include "test/check.h"
#include "test/temp_dir.h"

using namespace torpor;
using torpor_test::TempDir;

namespace {

constexpr uint64_t kBlock = OverlayDisk::kBlockSize;
constexpr uint64_t kDiskSize = 16 * kBlock + 2048;  // a short last block too

std::vector<uint8_t> block_of(uint8_t tag, size_t n = kBlock) { return std::vector<uint8_t>(n, tag); }

std::vector<uint8_t> file_bytes(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return std::vector<uint8_t>(std::istreambuf_iterator<char>(f), {});
}

std::vector<uint8_t> whole_disk(Disk& d) {
  std::vector<uint8_t> b(d.size());
  CHECK_EQ(d.read(0, b.data(), b.size()), 0);
  return b;
}

uint8_t tag_at(Disk& d, uint64_t block) {
  uint8_t b = 0;
  CHECK_EQ(d.read(block * kBlock + 100, &b, 1), 0);
  return b;
}

// base: block i holds 0x10 + i. ov1 (generation 1): blocks 1, 2, last. ov2 (generation 2): blocks 2, 5.
struct Layers {
  TempDir dir{"torpor-disklayers"};
  std::string base = dir.file("base.img"), ov1 = dir.file("disk0.gen1.overlay"), ov2 = dir.file("disk0.gen2.overlay");
  Layers() {
    std::vector<uint8_t> img;
    for (uint64_t i = 0; i < 16; i++) {
      auto b = block_of(static_cast<uint8_t>(0x10 + i));
      img.insert(img.end(), b.begin(), b.end());
    }
    std::ofstream(base, std::ios::binary).write(reinterpret_cast<const char*>(img.data()), img.size());
    {
      auto d = open_disk_chain(base, {}, ov1, kDiskSize);
      CHECK_EQ(d->write(1 * kBlock, block_of(0xA1, 2 * kBlock).data(), 2 * kBlock), 0);
      CHECK_EQ(d->write(16 * kBlock, block_of(0xAF, 2048).data(), 2048), 0);
      CHECK_EQ(d->flush(), 0);
    }
    {
      auto d = open_disk_chain(base, {ov1}, ov2, kDiskSize);
      CHECK_EQ(d->write(2 * kBlock, block_of(0xB2).data(), kBlock), 0);
      CHECK_EQ(d->write(5 * kBlock + 10, block_of(0xB5, 10).data(), 10), 0);  // partial: copied up from base
      CHECK_EQ(d->flush(), 0);
    }
  }
};

}  // namespace

TEST("snapshot disk: chain reads the newest block, writes land in the top only") {
  Layers l;
  const auto ov1_before = file_bytes(l.ov1), ov2_before = file_bytes(l.ov2), base_before = file_bytes(l.base);
  auto disk = open_disk_chain(l.base, {l.ov1, l.ov2}, l.dir.file("top.overlay"), kDiskSize);
  CHECK_EQ(disk->size(), kDiskSize);
  CHECK(!disk->read_only());
  CHECK_EQ(tag_at(*disk, 0), 0x10);  // base
  CHECK_EQ(tag_at(*disk, 1), 0xA1);  // ov1
  CHECK_EQ(tag_at(*disk, 2), 0xB2);  // ov2 over ov1
  CHECK_EQ(tag_at(*disk, 16), 0xAF); // ov1's short last block
  uint8_t b5[kBlock];
  CHECK_EQ(disk->read(5 * kBlock, b5, kBlock), 0);
  CHECK_EQ(b5[0], 0x15);
  CHECK_EQ(b5[10], 0xB5);
  CHECK_EQ(b5[20], 0x15);
  // Writes go to the top; the frozen overlays and the base never change.
  CHECK_EQ(disk->write(2 * kBlock, block_of(0xC2).data(), kBlock), 0);
  CHECK_EQ(disk->write(7 * kBlock + 1, block_of(0xC7, 1).data(), 1), 0);
  CHECK_EQ(disk->flush(), 0);
  CHECK_EQ(tag_at(*disk, 2), 0xC2);
  disk.reset();
  CHECK(file_bytes(l.ov1) == ov1_before);
  CHECK(file_bytes(l.ov2) == ov2_before);
  CHECK(file_bytes(l.base) == base_before);
  // Reopened, the top still holds them; without the top the chain shows generation 2.
  auto again = open_disk_chain(l.base, {l.ov1, l.ov2}, l.dir.file("top.overlay"), kDiskSize);
  CHECK_EQ(tag_at(*again, 2), 0xC2);
  auto gen2 = open_disk_chain(l.base, {l.ov1, l.ov2}, "", kDiskSize);
  CHECK_EQ(tag_at(*gen2, 2), 0xB2);
  auto gen1 = open_disk_chain(l.base, {l.ov1}, "", kDiskSize);
  CHECK_EQ(tag_at(*gen1, 2), 0xA1);
}

TEST("snapshot disk: size 0 takes the base image's size (a fresh config booting a generation's disk)") {
  Layers l;
  auto d = open_disk_chain(l.base, {}, l.dir.file("sized-by-base.overlay"), 0);
  CHECK_EQ(d->size(), 16 * kBlock);
  CHECK_EQ(tag_at(*d, 3), 0x13);
  CHECK_EQ(d->write(3 * kBlock, block_of(0xD3).data(), kBlock), 0);
  CHECK_EQ(tag_at(*d, 3), 0xD3);
  CHECK_THROWS_CODE(open_disk_chain("", {}, l.dir.file("no-size.overlay"), 0), "INVALID_ARGUMENT");
}

TEST("snapshot disk: frozen overlays and read-only chains refuse writes") {
  Layers l;
  auto ro = open_disk_chain(l.base, {l.ov1, l.ov2}, "", kDiskSize);
  CHECK(ro->read_only());
  CHECK_EQ(ro->write(0, block_of(1).data(), kBlock), -EROFS);
  CHECK_EQ(ro->discard(0, kBlock), -EROFS);
  OverlayDisk frozen(nullptr, l.ov1, kDiskSize, /*read_only=*/true);
  CHECK_EQ(frozen.write(kBlock, block_of(1).data(), kBlock), -EROFS);
  auto base_only = open_disk_chain(l.base, {}, "", kDiskSize);
  CHECK_EQ(base_only->write(0, block_of(1).data(), 1), -EROFS);
  CHECK_THROWS_CODE(open_disk_chain("", {}, "", kDiskSize), "INVALID_ARGUMENT");
  CHECK_THROWS_CODE(open_disk_chain(l.base, {l.dir.file("missing.overlay")}, "", kDiskSize), "IO_ERROR");
}

TEST("snapshot disk: merged overlays read like the chain they replace") {
  Layers l;
  // A discard in a newer overlay lets the older copy show again; the merge must agree.
  {
    auto d = open_disk_chain(l.base, {l.ov1, l.ov2}, l.dir.file("gen3.overlay"), kDiskSize);
    CHECK_EQ(d->write(9 * kBlock, block_of(0xD9).data(), kBlock), 0);
    CHECK_EQ(d->write(1 * kBlock, block_of(0xD1).data(), kBlock), 0);
    CHECK_EQ(d->discard(1 * kBlock, kBlock), 0);
    CHECK_EQ(d->flush(), 0);
  }
  const std::vector<std::string> frozen = {l.ov1, l.ov2, l.dir.file("gen3.overlay")};
  auto chain = open_disk_chain(l.base, frozen, "", kDiskSize);
  const auto expected = whole_disk(*chain);
  const std::string merged = l.dir.file("merged.overlay");
  merge_disk_layers(l.base, frozen, merged, kDiskSize);
  auto on_merged = open_disk_chain(l.base, {merged}, "", kDiskSize);
  CHECK(whole_disk(*on_merged) == expected);
  OverlayDisk m(nullptr, merged, kDiskSize, true);
  CHECK_EQ(m.allocated_blocks(), uint64_t{5});  // 1, 2, 5, 9, 16
  CHECK(m.allocated(1) && m.allocated(2) && m.allocated(5) && m.allocated(9) && m.allocated(16));
  CHECK(::access((merged + ".tmp").c_str(), F_OK) != 0);
  // A later generation chains onto the merged overlay.
  auto next = open_disk_chain(l.base, {merged}, l.dir.file("gen4.overlay"), kDiskSize);
  CHECK_EQ(next->write(3 * kBlock, block_of(0xE3).data(), kBlock), 0);
  CHECK_EQ(tag_at(*next, 3), 0xE3);
  CHECK_EQ(tag_at(*next, 9), 0xD9);
  CHECK_THROWS_CODE(merge_disk_layers(l.base, {}, merged, kDiskSize), "INVALID_ARGUMENT");
}

TEST("snapshot disk: a cancelled merge leaves nothing behind; a live top takes a merged lower disk") {
  Layers l;
  const std::vector<std::string> frozen = {l.ov1, l.ov2};
  const std::string merged = l.dir.file("cancelled.overlay");
  std::atomic<bool> cancel{true};
  CHECK_THROWS_CODE(merge_disk_layers(l.base, frozen, merged, kDiskSize, &cancel), "INVALID_STATE");
  for (const std::string& p : {merged, merged + ".map", merged + ".tmp", merged + ".tmp.map"})
    CHECK(::access(p.c_str(), F_OK) != 0);
  // The swap a machine makes when it adopts a merge: the top keeps its own
  // blocks and reads the rest from the merged layer exactly as before.
  auto top = std::make_unique<OverlayDisk>(open_disk_chain(l.base, frozen, "", kDiskSize), l.dir.file("top.overlay"), kDiskSize);
  CHECK_EQ(top->write(7 * kBlock, block_of(0xF7).data(), kBlock), 0);
  const auto before = whole_disk(*top);
  cancel.store(false);
  merge_disk_layers(l.base, frozen, l.dir.file("merged2.overlay"), kDiskSize, &cancel);
  auto old = top->replace_lower(open_disk_chain(l.base, {l.dir.file("merged2.overlay")}, "", kDiskSize));
  CHECK(old != nullptr);
  old.reset();  // the replaced layers close; nothing reads them any more
  CHECK(whole_disk(*top) == before);
  CHECK_EQ(tag_at(*top, 7), 0xF7);
}

TEST("snapshot disk: a chain opened larger than its layers reads zeros past the old end, keeps writes there") {
  Layers l;
  constexpr uint64_t kGrown = 40 * kBlock;  // the template's disk is kDiskSize
  const std::string top = l.dir.file("grown.overlay");
  const auto ov1_before = file_bytes(l.ov1), base_before = file_bytes(l.base);
  {
    auto d = open_disk_chain(l.base, {l.ov1, l.ov2}, top, kGrown);
    CHECK_EQ(d->size(), kGrown);
    CHECK_EQ(tag_at(*d, 2), 0xB2);  // the layers below read as before
    CHECK_EQ(tag_at(*d, 16), 0xAF);
    std::vector<uint8_t> tail(kGrown - kDiskSize, 0xEE);
    CHECK_EQ(d->read(kDiskSize, tail.data(), tail.size()), 0);
    CHECK(std::all_of(tail.begin(), tail.end(), [](uint8_t b) { return b == 0; }));
    CHECK_EQ(d->write(30 * kBlock, block_of(0xC0).data(), kBlock), 0);
    CHECK_EQ(d->write(kGrown - 512, block_of(0xCF, 512).data(), 512), 0);  // the last sector
    CHECK_EQ(d->flush(), 0);
  }
  // The frozen layers keep their size and bytes: the top alone took the new size.
  CHECK(file_bytes(l.ov1) == ov1_before);
  CHECK(file_bytes(l.base) == base_before);
  OverlayDisk frozen(nullptr, l.ov1, kDiskSize, /*read_only=*/true);
  CHECK_EQ(frozen.size(), kDiskSize);
  // Reopened at the grown size (a connect: the spec recorded it), and frozen in turn under
  // a newer top with no size given (a boot from that generation's disk): the grown size wins.
  for (uint64_t size : {kGrown, uint64_t{0}}) {
    auto d = size ? open_disk_chain(l.base, {l.ov1, l.ov2}, top, size)
                  : open_disk_chain(l.base, {l.ov1, l.ov2, top}, l.dir.file("next.overlay"), 0);
    CHECK_EQ(d->size(), kGrown);
    CHECK_EQ(tag_at(*d, 30), 0xC0);
    uint8_t last = 0;
    CHECK_EQ(d->read(kGrown - 1, &last, 1), 0);
    CHECK_EQ(last, 0xCF);
    CHECK_EQ(tag_at(*d, 20), 0x00);
  }
  // Never silently shrink: a top smaller than the layers, or a layer smaller than one below it.
  CHECK_THROWS_CODE(open_disk_chain(l.base, {l.ov1, l.ov2, top}, l.dir.file("small.overlay"), kDiskSize),
                    "INVALID_ARGUMENT");
  CHECK_THROWS_CODE(open_disk_chain(l.base, {top, l.ov1}, l.dir.file("order.overlay"), kGrown), "INVALID_ARGUMENT");
  // The grown top's map records its size: reopened at another size it is refused.
  CHECK_THROWS_CODE(OverlayDisk(nullptr, top, kDiskSize, true), "INVALID_ARGUMENT");
}

TEST("snapshot disk: merging layers of different sizes (a grown disk) reads like the chain") {
  Layers l;
  constexpr uint64_t kGrown = 40 * kBlock;
  const std::string g3 = l.dir.file("gen3-grown.overlay"), g4 = l.dir.file("gen4-grown.overlay");
  {
    auto d = open_disk_chain(l.base, {l.ov1, l.ov2}, g3, kGrown);
    CHECK_EQ(d->write(33 * kBlock, block_of(0x33).data(), kBlock), 0);
    CHECK_EQ(d->write(16 * kBlock, block_of(0x16).data(), kBlock), 0);  // over the old short last block
    CHECK_EQ(d->flush(), 0);
  }
  {
    auto d = open_disk_chain(l.base, {l.ov1, l.ov2, g3}, g4, kGrown);
    CHECK_EQ(d->write(39 * kBlock, block_of(0x39).data(), kBlock), 0);
    CHECK_EQ(d->flush(), 0);
  }
  // A machine merges only its own layers (the grown ones) over the template's.
  const std::vector<std::string> own = {g3, g4};
  auto chain = open_disk_chain(l.base, {l.ov1, l.ov2, g3, g4}, "", kGrown);
  CHECK_EQ(chain->size(), kGrown);
  const auto expected = whole_disk(*chain);
  const std::string merged = l.dir.file("merged-grown.overlay");
  merge_disk_layers("", own, merged, kGrown);
  auto on_merged = open_disk_chain(l.base, {l.ov1, l.ov2, merged}, "", kGrown);
  CHECK(whole_disk(*on_merged) == expected);
  // All of them, the template's smaller layers included, at size 0: the newest layer's.
  const std::string all = l.dir.file("merged-all.overlay");
  merge_disk_layers("", {l.ov1, l.ov2, g3, g4}, all, 0);
  auto on_all = open_disk_chain(l.base, {all}, "", 0);
  CHECK_EQ(on_all->size(), kGrown);
  CHECK(whole_disk(*on_all) == expected);
  CHECK_THROWS_CODE(merge_disk_layers("", own, l.dir.file("shrunk.overlay"), kDiskSize), "INVALID_ARGUMENT");
  // A live grown top takes the merged lower disk (same size as the layers it replaces).
  auto top = std::make_unique<OverlayDisk>(open_disk_chain(l.base, {l.ov1, l.ov2, g3, g4}, "", 0),
                                           l.dir.file("live.overlay"), kGrown);
  CHECK(top->replace_lower(open_disk_chain(l.base, {l.ov1, l.ov2, merged}, "", 0)) != nullptr);
  CHECK(whole_disk(*top) == expected);
}
