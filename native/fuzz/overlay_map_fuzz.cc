// Fuzz target: the overlay disk's allocation map (docs/overlay.md), a file
// that survives the machine and is read back at restore: two checksummed
// slots, the newest valid one wins. The input is the map file's bytes (with
// the checksums fixed half of the time, to get past them) and a sequence of
// block operations; every open must end in a disk or Error(IO_ERROR /
// INVALID_ARGUMENT), and after the operations every byte read must match a
// model of the disk (lower bytes, allocated blocks as the overlay had them,
// writes applied, discards back to the lower bytes).
//
// Input: [size sel u8][fix u8][map len u16][map bytes][ops: op u8, block u8, len u8, byte u8]...
// Files live in /dev/shm (memory): one data file and its map per input.
//
//   make -C native/fuzz libfuzzer; native/fuzz/campaign.sh   (clang)
//   make -C native/fuzz run                                   (g++: random inputs)
#include <fcntl.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "common/error.h"
#include "devices/virtio/blk/memory_disk.h"
#include "devices/virtio/blk/overlay_disk.h"

using namespace torpor;

namespace {

constexpr uint64_t kBlock = OverlayDisk::kBlockSize;
long g_opened = 0, g_refused = 0, g_ops = 0;

std::string data_path() {
  static std::string p = "/dev/shm/torpor-overlay-fuzz-" + std::to_string(::getpid());
  return p;
}

void write_file(const std::string& path, const uint8_t* p, size_t n) {
  int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) std::abort();
  if (n && ::write(fd, p, n) != static_cast<ssize_t>(n)) std::abort();
  ::close(fd);
}

// The map's slot layout, as overlay_disk.cc writes it: header then bitmap;
// the checksum is recomputed by writing a map the disk's own way: open a
// fresh overlay, mark the blocks the input's bitmap names, flush.
std::vector<uint8_t> valid_map(uint64_t size, const uint8_t* bits, size_t nbits, std::vector<bool>* allocated) {
  std::string path = data_path();
  ::unlink(path.c_str());
  ::unlink(OverlayDisk::map_path(path).c_str());
  {
    OverlayDisk d(nullptr, path, size);
    uint64_t blocks = (size + kBlock - 1) / kBlock;
    std::vector<uint8_t> block(kBlock, 0);
    for (uint64_t b = 0; b < blocks && b / 8 < nbits; b++) {
      if ((bits[b / 8] >> (b % 8)) & 1) {
        uint64_t len = std::min<uint64_t>(kBlock, size - b * kBlock);
        std::memset(block.data(), static_cast<int>(b + 1), len);
        if (d.write(b * kBlock, block.data(), len) != 0) std::abort();
        (*allocated)[b] = true;
      }
    }
    if (d.flush() != 0) std::abort();
  }
  std::vector<uint8_t> out;
  int fd = ::open(OverlayDisk::map_path(path).c_str(), O_RDONLY | O_CLOEXEC);
  uint8_t buf[4096];
  ssize_t n;
  while ((n = ::read(fd, buf, sizeof buf)) > 0) out.insert(out.end(), buf, buf + n);
  ::close(fd);
  return out;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 4) return 0;
  uint64_t blocks = 1 + data[0] % 64;
  uint64_t disk_size = blocks * kBlock - (data[0] & 0x40 ? 512 * (data[0] % 7) : 0);
  bool fix = data[1] & 1;
  size_t map_len = std::min<size_t>(data[2] | (data[3] << 8), size - 4);
  const uint8_t* map = data + 4;
  const uint8_t* ops = map + map_len;
  size_t ops_len = size - 4 - map_len;

  std::string path = data_path();
  std::vector<bool> written(blocks, false);  // blocks a valid map says the overlay holds
  std::vector<uint8_t> map_bytes;
  if (fix) {
    map_bytes = valid_map(disk_size, map, map_len, &written);
    // Corrupt one byte now and then, past the checksum's reach or not.
    if (data[1] & 2 && !map_bytes.empty()) map_bytes[(data[1] >> 2) * 7 % map_bytes.size()] ^= 0x5a;
  } else {
    map_bytes.assign(map, map + map_len);
    write_file(path, nullptr, 0);
  }
  write_file(OverlayDisk::map_path(path), map_bytes.data(), map_bytes.size());

  // The lower disk: byte 0xA0 + block number.
  auto lower = std::make_unique<MemoryDisk>(disk_size);
  std::vector<uint8_t> fill(disk_size);
  for (uint64_t o = 0; o < disk_size; o++) fill[o] = static_cast<uint8_t>(0xA0 + o / kBlock);
  lower->write(0, fill.data(), fill.size());

  std::unique_ptr<OverlayDisk> disk;
  try {
    disk = std::make_unique<OverlayDisk>(std::move(lower), path, disk_size);
  } catch (const Error& e) {
    if (std::strcmp(e.code(), code::kIo) != 0 && std::strcmp(e.code(), code::kInvalidArgument) != 0) {
      std::fprintf(stderr, "overlay open threw %s (%s)\n", e.code(), e.what());
      std::abort();
    }
    g_refused++;
    return 0;
  }
  g_opened++;
  // The model: what a read of each byte must return now.
  std::vector<uint8_t> model(disk_size);
  std::vector<uint8_t> got(kBlock * 2);
  for (uint64_t b = 0; b < blocks; b++) {
    uint64_t len = std::min<uint64_t>(kBlock, disk_size - b * kBlock);
    if (!disk->allocated(b)) {
      std::memset(&model[b * kBlock], static_cast<int>(0xA0 + b), len);
    } else {
      // Allocated per the map: the data file's bytes (a valid map we wrote
      // holds b + 1; a raw one points at an empty data file: zeros).
      std::memset(&model[b * kBlock], fix && written[b] ? static_cast<int>(b + 1) : 0, len);
    }
  }
  for (size_t i = 0; i + 4 <= ops_len && i < 4 * 64; i += 4) {
    uint8_t op = ops[i] % 4;
    uint64_t off = (ops[i + 1] * uint64_t{509}) % disk_size;
    uint64_t len = std::min<uint64_t>(1 + ops[i + 2] * uint64_t{37}, disk_size - off);
    uint8_t v = ops[i + 3];
    g_ops++;
    if (op == 0) {
      std::vector<uint8_t> buf(len, v);
      if (disk->write(off, buf.data(), len) != 0) std::abort();
      std::memset(&model[off], v, len);
    } else if (op == 1) {
      if (disk->discard(off, len) != 0) std::abort();
      // Whole blocks inside the range read from the lower disk again.
      // (the disk's last block may be short: it counts as whole at its end).
      for (uint64_t b = (off + kBlock - 1) / kBlock; b < blocks; b++) {
        uint64_t end = std::min<uint64_t>((b + 1) * kBlock, disk_size);
        if (end > off + len) break;
        std::memset(&model[b * kBlock], static_cast<int>(0xA0 + b), end - b * kBlock);
      }
    } else if (op == 2) {
      if (disk->flush() != 0) std::abort();
    } else {
      std::vector<uint8_t> buf(len);
      if (disk->read(off, buf.data(), len) != 0) std::abort();
      if (std::memcmp(buf.data(), &model[off], len) != 0) std::abort();
    }
  }
  // Everything reads back as the model says.
  std::vector<uint8_t> all(disk_size);
  if (disk->read(0, all.data(), disk_size) != 0) std::abort();
  if (all != model) std::abort();
  return 0;
}

#ifdef TORPOR_FUZZ_STANDALONE
int main(int argc, char** argv) {
  long iterations = argc > 1 ? std::atol(argv[1]) : 2000;
  std::mt19937_64 rng(argc > 2 ? std::atoll(argv[2]) : 1);
  std::vector<uint8_t> input;
  for (long it = 0; it < iterations; it++) {
    size_t map_len = rng() % 3 ? rng() % 16 : rng() % 9000;
    size_t ops = rng() % 40;
    input.resize(4 + map_len + 4 * ops);
    for (auto& b : input) b = static_cast<uint8_t>(rng());
    input[1] = static_cast<uint8_t>(rng() % 4 ? (input[1] | 1) : (input[1] & ~1));
    input[2] = static_cast<uint8_t>(map_len);
    input[3] = static_cast<uint8_t>(map_len >> 8);
    LLVMFuzzerTestOneInput(input.data(), input.size());
  }
  std::printf("overlay_map_fuzz: %ld random inputs, %ld opened, %ld refused with a coded error, %ld operations checked, no crash\n",
              iterations, g_opened, g_refused, g_ops);
  ::unlink(data_path().c_str());
  ::unlink(OverlayDisk::map_path(data_path()).c_str());
  return 0;
}
#endif
