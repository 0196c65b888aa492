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
// Files live in /dev/shm (memory): one data file and its map, reset per input (files()).
//
//   make -C native/fuzz libfuzzer; native/fuzz/campaign.sh   (clang)
//   make -C native/fuzz run                                   (g++: random inputs)
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "common/error.h"
#include "devices/virtio/blk/overlay_disk.h"

using namespace torpor;

namespace {

constexpr uint64_t kBlock = OverlayDisk::kBlockSize;
constexpr uint64_t kMaxBlocks = 64;
long g_opened = 0, g_refused = 0, g_ops = 0;

// The lower disk: byte 0xA0 + block number, computed on read (a MemoryDisk filled byte by
// byte per input was most of an input's cost). Read-only: the overlay never writes below
// itself, and a write it tried would fail the operation, which the target checks.
class PatternDisk final : public Disk {
 public:
  explicit PatternDisk(uint64_t size) : size_(size) {}
  uint64_t size() const override { return size_; }
  bool read_only() const override { return true; }
  int read(uint64_t offset, void* dst, size_t len) override {
    if (!disk_range_ok(size_, offset, len)) return -EINVAL;
    auto* out = static_cast<uint8_t*>(dst);
    while (len > 0) {
      size_t n = static_cast<size_t>(std::min<uint64_t>(len, kBlock - offset % kBlock));
      std::memset(out, static_cast<int>(0xA0 + offset / kBlock), n);
      out += n;
      offset += n;
      len -= n;
    }
    return 0;
  }
  int write(uint64_t, const void*, size_t) override { return -EROFS; }
  int flush() override { return 0; }

 private:
  uint64_t size_;
};

// Per-input buffers of the largest disk, allocated once (only the disk's first bytes are used,
// and every one of them is set before it is read).
uint8_t g_model[kMaxBlocks * kBlock], g_all[kMaxBlocks * kBlock], g_buf[kMaxBlocks * kBlock];

// The overlay's two files in /dev/shm (memory), created once per process and kept open here:
// an input resets them through these fds (truncate, write) instead of unlinking, creating and
// reopening them, and the overlay under test still opens them by path as a machine does.
// Every input sets both files' whole contents before the overlay opens them, so no input sees
// another's bytes.
struct OverlayFiles {
  std::string data = "/dev/shm/torpor-overlay-fuzz-" + std::to_string(::getpid());
  std::string map = OverlayDisk::map_path(data);
  int data_fd = open_rw(data);
  int map_fd = open_rw(map);
  static int open_rw(const std::string& path) {
    int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    if (fd < 0) std::abort();
    return fd;
  }
};
OverlayFiles& files() {
  static OverlayFiles* f = [] {
    auto* made = new OverlayFiles();
    std::atexit([] {
      ::unlink(files().data.c_str());
      ::unlink(files().map.c_str());
    });
    return made;
  }();
  return *f;
}

void truncate_file(int fd) {
  if (::ftruncate(fd, 0) != 0) std::abort();
}

// The map's slot layout, as overlay_disk.cc writes it: header then bitmap;
// the checksum is recomputed by writing a map the disk's own way: open a
// fresh overlay (an empty map file), mark the blocks the input's bitmap names,
// flush. The map file then holds the valid map.
void write_valid_map(uint64_t size, const uint8_t* bits, size_t nbits, std::vector<bool>* allocated) {
  truncate_file(files().map_fd);
  OverlayDisk d(nullptr, files().data, size);
  uint64_t blocks = (size + kBlock - 1) / kBlock;
  auto named = [&](uint64_t b) { return b < blocks && b / 8 < nbits && ((bits[b / 8] >> (b % 8)) & 1); };
  // Each run of named blocks in one write (block b holds b + 1): a write per block was a
  // system call per block.
  for (uint64_t b = 0; b < blocks; b++) {
    if (!named(b)) continue;
    uint64_t end = b;
    for (; named(end); end++) {
      std::memset(g_buf + (end - b) * kBlock, static_cast<int>(end + 1), kBlock);
      (*allocated)[end] = true;
    }
    uint64_t len = std::min<uint64_t>(end * kBlock, size) - b * kBlock;
    if (d.write(b * kBlock, g_buf, len) != 0) std::abort();
    b = end;
  }
  if (d.flush() != 0) std::abort();
}

// Flips bits of the map file's byte at (index % its size), when it has any.
void corrupt_map_byte(size_t index, uint8_t mask) {
  struct stat st;
  if (::fstat(files().map_fd, &st) != 0) std::abort();
  if (st.st_size == 0) return;
  off_t at = static_cast<off_t>(index % static_cast<size_t>(st.st_size));
  uint8_t b;
  if (::pread(files().map_fd, &b, 1, at) != 1) std::abort();
  b ^= mask;
  if (::pwrite(files().map_fd, &b, 1, at) != 1) std::abort();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 4) return 0;
  uint64_t blocks = 1 + data[0] % kMaxBlocks;
  uint64_t disk_size = blocks * kBlock - (data[0] & 0x40 ? 512 * (data[0] % 7) : 0);
  bool fix = data[1] & 1;
  size_t map_len = std::min<size_t>(data[2] | (data[3] << 8), size - 4);
  const uint8_t* map = data + 4;
  const uint8_t* ops = map + map_len;
  size_t ops_len = size - 4 - map_len;

  const std::string& path = files().data;
  std::vector<bool> written(blocks, false);  // blocks a valid map says the overlay holds
  if (fix) {
    write_valid_map(disk_size, map, map_len, &written);
    // Corrupt one byte now and then, past the checksum's reach or not.
    if (data[1] & 2) corrupt_map_byte((data[1] >> 2) * 7, 0x5a);
  } else {
    truncate_file(files().data_fd);
    truncate_file(files().map_fd);
    if (map_len && ::pwrite(files().map_fd, map, map_len, 0) != static_cast<ssize_t>(map_len)) std::abort();
  }

  auto lower = std::make_unique<PatternDisk>(disk_size);

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
  uint8_t* model = g_model;
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
      std::memset(g_buf, v, len);
      if (disk->write(off, g_buf, len) != 0) std::abort();
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
      if (disk->read(off, g_buf, len) != 0) std::abort();
      if (std::memcmp(g_buf, &model[off], len) != 0) std::abort();
    }
  }
  // Everything reads back as the model says.
  if (disk->read(0, g_all, disk_size) != 0) std::abort();
  if (std::memcmp(g_all, model, disk_size) != 0) std::abort();
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
  return 0;  // the files go at exit (files())
}
#endif
