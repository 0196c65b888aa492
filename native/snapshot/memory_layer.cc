#include "snapshot/memory_layer.h"

#include <fcntl.h>
#include <limits.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>

#include "base/fd.h"
#include "base/file_io.h"
#include "common/error.h"
#include "snapshot/crc32c.h"
#include "snapshot/memory_layer_format.h"

namespace torpor {

using namespace memory_format;

struct MemoryChain::Layer {
  std::string path;
  Fd fd;
  Header header;
  std::vector<IndexEntry> index;  // diff layers only
};

namespace {

constexpr size_t kMaxIov = IOV_MAX;
// Pages handled per step when scanning a whole image (zero detection, merge): 1 MiB.
constexpr size_t kChunkPages = 256;

[[noreturn]] void invalid(const std::string& why) { throw Error(code::kSnapshotInvalid, why); }

bool page_is_zero(const uint8_t* p) {
  // 64 bytes per step with an early exit: RAM pages are mostly either all
  // zero or non-zero in their first bytes, and the compiler vectorizes the OR.
  const uint64_t* w = reinterpret_cast<const uint64_t*>(p);
  for (size_t i = 0; i < kPageSize / 8; i += 8) {
    if (w[i] | w[i + 1] | w[i + 2] | w[i + 3] | w[i + 4] | w[i + 5] | w[i + 6] | w[i + 7]) return false;
  }
  return true;
}

uint64_t total_bytes(const std::vector<RamRegion>& ram) {
  uint64_t total = 0;
  for (const RamRegion& r : ram) {
    if (r.bytes == 0 || r.bytes % kPageSize != 0 || !r.host)
      throw Error(code::kInvalidArgument, "RAM regions must be whole pages");
    total += r.bytes;
  }
  return total;
}

// Linear page -> host address over the concatenated regions.
class RamMap {
 public:
  explicit RamMap(const std::vector<RamRegion>& ram) : ram_(ram) {
    uint64_t start = 0;
    for (const RamRegion& r : ram) {
      starts_.push_back(start / kPageSize);
      start += r.bytes;
    }
  }
  size_t region_of(uint64_t n) const { return std::upper_bound(starts_.begin(), starts_.end(), n) - starts_.begin() - 1; }
  uint8_t* page(uint64_t n) const {
    size_t i = region_of(n);
    return ram_[i].host + (n - starts_[i]) * kPageSize;
  }

 private:
  const std::vector<RamRegion>& ram_;
  std::vector<uint64_t> starts_;
};

// Which pages of anonymous memory were never touched, from /proc/self/pagemap
// (one u64 per page: bit 63 present, bit 62 swapped). Without the file (a
// restricted /proc), nothing is known and every page is read.
class Pagemap {
 public:
  Pagemap() : fd_(::open("/proc/self/pagemap", O_RDONLY | O_CLOEXEC)) {}
  // Sets zero[i] for each never-touched page of the n pages at `first`.
  void untouched(const uint8_t* first, size_t n, bool* zero) {
    if (!fd_.valid() || n > kChunkPages || reinterpret_cast<uintptr_t>(first) % kPageSize != 0) return;
    uint64_t entries[kChunkPages];
    uint64_t off = reinterpret_cast<uintptr_t>(first) / kPageSize * sizeof(uint64_t);
    if (file_io::pread_all(fd_.get(), entries, n * sizeof(uint64_t), off) != 0) return;
    for (size_t i = 0; i < n; i++) zero[i] = (entries[i] & (3ull << 62)) == 0;
  }

 private:
  Fd fd_;
};

void random_identity(uint8_t* id) {
  size_t got = 0;
  while (got < kLayerIdentityBytes) {
    ssize_t n = ::getrandom(id + got, kLayerIdentityBytes - got, 0);
    if (n < 0) {
      if (errno == EINTR) continue;
      throw_sys_error(code::kIo, "getrandom for a layer identity");
    }
    got += static_cast<size_t>(n);
  }
}

Fd create_file(const std::string& path, bool truncate = true) {
  Fd fd(::open(path.c_str(), O_WRONLY | O_CREAT | O_CLOEXEC | (truncate ? O_TRUNC : 0), 0644));
  if (!fd.valid()) throw_sys_error(code::kIo, "create memory layer " + path);
  return fd;
}

void write_at(int fd, const void* p, size_t n, uint64_t off, const std::string& path) {
  if (int rc = file_io::pwrite_all(fd, p, n, off); rc < 0) throw_sys_error(code::kIo, "write memory layer " + path, -rc);
}

// Writes (or reads) every iovec, in order, at `off`: IOV_MAX at a time,
// resuming after short transfers. A read that meets the end of the file
// first is refused: the layer shrank under us.
void transfer_all(bool write, int fd, std::vector<iovec>& iov, uint64_t off, const std::string& path) {
  size_t i = 0;
  while (i < iov.size()) {
    int cnt = static_cast<int>(std::min(kMaxIov, iov.size() - i));
    ssize_t n = write ? ::pwritev(fd, &iov[i], cnt, static_cast<off_t>(off))
                      : ::preadv(fd, &iov[i], cnt, static_cast<off_t>(off));
    if (n < 0) {
      if (errno == EINTR) continue;
      throw_sys_error(code::kIo, (write ? "write memory layer " : "read memory layer ") + path);
    }
    if (n == 0) invalid("memory layer " + path + " ends before its pages (truncated while in use?)");
    off += static_cast<uint64_t>(n);
    size_t left = static_cast<size_t>(n);
    while (i < iov.size() && left >= iov[i].iov_len) left -= iov[i++].iov_len;
    if (left) {
      iov[i].iov_base = static_cast<uint8_t*>(iov[i].iov_base) + left;
      iov[i].iov_len -= left;
    }
  }
}
void pwritev_all(int fd, std::vector<iovec>& iov, uint64_t off, const std::string& path) {
  transfer_all(true, fd, iov, off, path);
}
void preadv_all(int fd, std::vector<iovec>& iov, uint64_t off, const std::string& path) {
  transfer_all(false, fd, iov, off, path);
}

// Appends [p, p+n) to iov, extending the last entry when it ends at p.
void add_iov(std::vector<iovec>& iov, const void* p, size_t n) {
  if (!iov.empty() && static_cast<uint8_t*>(iov.back().iov_base) + iov.back().iov_len == p)
    iov.back().iov_len += n;
  else
    iov.push_back({const_cast<void*>(p), n});
}

LayerInfo finish(int fd, const std::string& path, uint64_t pages, bool sync) {
  if (sync && ::fdatasync(fd) != 0) throw_sys_error(code::kIo, "sync memory layer " + path);
  struct stat st;
  if (::fstat(fd, &st) != 0) throw_sys_error(code::kIo, "stat memory layer " + path);
  return {pages, static_cast<uint64_t>(st.st_size), static_cast<uint64_t>(st.st_blocks) * 512};
}

void write_header_page(int fd, const Header& h, const std::string& path) {
  uint8_t page[kHeaderPageBytes] = {};
  std::memcpy(page, &h, sizeof h);
  write_at(fd, page, sizeof page, 0, path);
}

// Streams a RAM image (chunk by chunk, through `source`, which points
// ptrs[0, k) at pages p0.. of the image and sets known_zero[i] for pages it
// knows are zero without reading them) into a full layer: zero pages are
// found first and left as holes, runs of non-zero pages are written with one
// pwrite each and only they are checksummed. Returns the number of non-zero
// pages; `content_crc` gets the checksum of all page checksums.
template <typename Source>
uint64_t write_image(int fd, uint64_t ram_pages, Source&& source, uint32_t& content_crc, const std::string& path) {
  const uint32_t zero_crc = zero_page_crc();
  uint64_t nonzero = 0;
  uint32_t crcs[kChunkPages];
  const uint8_t* ptrs[kChunkPages];
  const uint8_t* data_ptrs[kChunkPages];
  uint32_t data_crcs[kChunkPages];
  size_t data_at[kChunkPages];
  bool known_zero[kChunkPages];
  uint32_t content = 0;
  for (uint64_t p0 = 0; p0 < ram_pages; p0 += kChunkPages) {
    size_t k = static_cast<size_t>(std::min<uint64_t>(kChunkPages, ram_pages - p0));
    std::fill(known_zero, known_zero + k, false);
    source(p0, k, ptrs, known_zero);
    size_t run_start = 0, m = 0;
    bool in_run = false;
    for (size_t i = 0; i <= k; i++) {
      bool zero = i == k || known_zero[i] || page_is_zero(ptrs[i]);
      bool contiguous = in_run && i < k && ptrs[i] == ptrs[i - 1] + kPageSize;
      if (in_run && (zero || !contiguous)) {
        write_at(fd, ptrs[run_start], (i - run_start) * kPageSize, kMemoryDataOffset + (p0 + run_start) * kPageSize, path);
        in_run = false;
      }
      if (i == k) break;
      crcs[i] = zero_crc;
      if (!zero) {
        data_ptrs[m] = ptrs[i];
        data_at[m++] = i;
        if (!in_run) {
          run_start = i;
          in_run = true;
        }
      }
    }
    crc32c_pages(data_ptrs, m, kPageSize, data_crcs);
    for (size_t j = 0; j < m; j++) crcs[data_at[j]] = data_crcs[j];
    nonzero += m;
    content = crc32c(crcs, k * sizeof(uint32_t), content);
  }
  content_crc = content;
  return nonzero;
}

Header read_header(int fd, const std::string& path, uint64_t& file_bytes) {
  struct stat st;
  if (::fstat(fd, &st) != 0) throw_sys_error(code::kIo, "stat memory layer " + path);
  if (!S_ISREG(st.st_mode)) invalid("memory layer " + path + " is not a regular file");
  file_bytes = static_cast<uint64_t>(st.st_size);
  uint8_t page[kHeaderPageBytes];
  long long n = file_io::pread_upto(fd, page, sizeof page, 0);
  if (n < 0) throw_sys_error(code::kIo, "read memory layer " + path, static_cast<int>(-n));
  try {
    Header h = parse_header(page, static_cast<size_t>(n));
    check_file_size(h, file_bytes, path);
    return h;
  } catch (const Error& e) {
    throw Error(e.code(), std::string(e.what()) + " (" + path + ")");
  }
}

// A merge stops between chunks once its machine is stopping (merge_* say so).
void stop_if_cancelled(const std::atomic<bool>* cancel) {
  if (cancel && cancel->load(std::memory_order_relaxed)) throw Error(code::kInvalidState, "memory layer merge cancelled");
}

// A merged layer written and synced at tmp_path becomes out_path, its directory entry durable.
void publish_merged(const std::string& tmp_path, const std::string& out_path) {
  if (::rename(tmp_path.c_str(), out_path.c_str()) != 0) throw_sys_error(code::kIo, "rename merged layer to " + out_path);
  if (int rc = file_io::fsync_parent_dir(out_path.c_str()); rc < 0)
    throw_sys_error(code::kIo, "sync directory of " + out_path, -rc);
}

}  // namespace

LayerInfo write_full_layer(const std::string& path, const std::vector<RamRegion>& ram, bool sync) {
  uint8_t id[kLayerIdentityBytes];
  random_identity(id);
  return write_full_layer_as(path, ram, id, sync);
}

LayerInfo write_diff_layer(const std::string& path, uint64_t ram_bytes, const std::string& parent_identity,
                           const std::vector<PageRef>& pages, bool sync) {
  uint8_t id[kLayerIdentityBytes];
  random_identity(id);
  return write_diff_layer_as(path, ram_bytes, parent_identity, pages, id, sync);
}

LayerInfo memory_format::write_full_layer_as(const std::string& path, const std::vector<RamRegion>& ram,
                                             const uint8_t* id, bool sync) {
  const uint64_t ram_bytes = total_bytes(ram);
  if (ram_bytes > kMaxRamBytes) throw Error(code::kInvalidArgument, "RAM too large for a memory layer");
  RamMap map(ram);
  Fd fd = create_file(path);
  Pagemap pagemap;
  uint32_t content_crc = 0;
  uint64_t pages = write_image(
      fd.get(), ram_bytes / kPageSize,
      [&](uint64_t p0, size_t k, const uint8_t** ptrs, bool* known_zero) {
        for (size_t i = 0; i < k; i++) ptrs[i] = map.page(p0 + i);
        // Runs of pages inside one anonymous region: ask the pagemap.
        for (size_t i = 0; i < k;) {
          size_t r = map.region_of(p0 + i);
          size_t j = i + 1;
          while (j < k && map.region_of(p0 + j) == r) j++;
          if (ram[r].anonymous) pagemap.untouched(ptrs[i], j - i, known_zero + i);
          i = j;
        }
      },
      content_crc, path);
  if (::ftruncate(fd.get(), static_cast<off_t>(kMemoryDataOffset + ram_bytes)) != 0)
    throw_sys_error(code::kIo, "size memory layer " + path);
  write_header_page(fd.get(), make_header(kKindFull, ram_bytes, id, nullptr, pages, content_crc), path);
  return finish(fd.get(), path, pages, sync);
}

LayerInfo memory_format::write_diff_layer_as(const std::string& path, uint64_t ram_bytes,
                                             const std::string& parent_identity, const std::vector<PageRef>& pages,
                                             const uint8_t* id, bool sync) {
  if (ram_bytes == 0 || ram_bytes % kPageSize != 0 || ram_bytes > kMaxRamBytes)
    throw Error(code::kInvalidArgument, "RAM size must be a whole number of pages");
  uint8_t parent[kLayerIdentityBytes];
  if (!parse_identity_hex(parent_identity, parent))
    throw Error(code::kInvalidArgument, "parent identity '" + parent_identity + "' is not 32 hex digits");
  std::vector<PageRef> sorted = pages;
  std::sort(sorted.begin(), sorted.end(), [](const PageRef& a, const PageRef& b) { return a.page < b.page; });
  const uint64_t ram_pages = ram_bytes / kPageSize;
  for (size_t i = 0; i < sorted.size(); i++) {
    if (sorted[i].page >= ram_pages) throw Error(code::kInvalidArgument, "dirty page outside RAM");
    if (i > 0 && sorted[i].page == sorted[i - 1].page) throw Error(code::kInvalidArgument, "dirty page listed twice");
  }
  const size_t n = sorted.size();
  std::vector<const uint8_t*> ptrs(n);
  for (size_t i = 0; i < n; i++) ptrs[i] = sorted[i].data;
  std::vector<uint32_t> crcs(n);
  crc32c_pages(ptrs.data(), n, kPageSize, crcs.data());

  // Header page + index + padding, then the pages: one buffer and the page data, written with pwritev.
  const uint64_t data_offset = diff_data_offset(n);
  std::vector<uint8_t> head(data_offset, 0);
  auto* index = reinterpret_cast<IndexEntry*>(head.data() + kHeaderPageBytes);
  for (size_t i = 0; i < n; i++) index[i] = {sorted[i].page, crcs[i], 0};
  Header h = make_header(kKindDiff, ram_bytes, id, parent, n, crc32c(index, n * kIndexEntryBytes));
  std::memcpy(head.data(), &h, sizeof h);

  std::vector<iovec> iov;
  iov.reserve(n + 1);
  iov.push_back({head.data(), head.size()});
  for (size_t i = 0; i < n; i++) add_iov(iov, ptrs[i], kPageSize);
  Fd fd = create_file(path, /*truncate=*/false);
  pwritev_all(fd.get(), iov, 0, path);
  if (::ftruncate(fd.get(), static_cast<off_t>(h.file_bytes)) != 0) throw_sys_error(code::kIo, "size memory layer " + path);
  return finish(fd.get(), path, n, sync);
}

void sync_layer_file(const std::string& path) {
  Fd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  if (!fd.valid()) throw_sys_error(code::kIo, "open memory layer " + path);
  if (::fdatasync(fd.get()) != 0) throw_sys_error(code::kIo, "sync memory layer " + path);
}

std::string layer_identity(const std::string& path) {
  Fd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  if (!fd.valid()) throw_sys_error(code::kIo, "open memory layer " + path);
  uint64_t file_bytes;
  Header h = read_header(fd.get(), path, file_bytes);
  return identity_hex(h.identity);
}

MemoryChain::MemoryChain() = default;
MemoryChain::MemoryChain(MemoryChain&& o) noexcept = default;
MemoryChain& MemoryChain::operator=(MemoryChain&& o) noexcept = default;
MemoryChain::~MemoryChain() = default;

MemoryChain MemoryChain::open(const std::vector<std::string>& layer_paths, uint64_t ram_bytes) {
  if (layer_paths.empty()) throw Error(code::kInvalidArgument, "a memory chain needs at least its bottom layer");
  MemoryChain chain;
  chain.ram_bytes_ = ram_bytes;
  for (size_t i = 0; i < layer_paths.size(); i++) {
    auto layer = std::make_unique<Layer>();
    layer->path = layer_paths[i];
    const std::string& path = layer->path;
    layer->fd.reset(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
    if (!layer->fd.valid()) throw_sys_error(code::kIo, "open memory layer " + path);
    uint64_t file_bytes;
    Header& h = layer->header;
    h = read_header(layer->fd.get(), path, file_bytes);
    if (i == 0 && h.kind != kKindFull) invalid("memory layer " + path + " is a diff, the bottom layer must be full");
    if (i > 0 && h.kind != kKindDiff) invalid("memory layer " + path + " is a full layer above the bottom");
    if (h.ram_bytes != ram_bytes)
      invalid("memory layer " + path + " holds " + std::to_string(h.ram_bytes) + " bytes of RAM, the machine has " +
              std::to_string(ram_bytes));
    if (i > 0) {
      const Header& below = chain.layers_.back()->header;
      if (std::memcmp(h.parent, below.identity, kLayerIdentityBytes) != 0)
        invalid("memory layer " + path + " was written over layer " + identity_hex(h.parent) + ", not over " +
                chain.layers_.back()->path + " (" + identity_hex(below.identity) + "): chain out of order or mixed");
      std::vector<uint8_t> bytes(h.page_count * kIndexEntryBytes);
      if (int rc = file_io::pread_all(layer->fd.get(), bytes.data(), bytes.size(), h.index_offset); rc < 0)
        throw_sys_error(code::kIo, "read index of memory layer " + path, -rc);
      try {
        layer->index = parse_index(h, bytes.data(), bytes.size());
      } catch (const Error& e) {
        throw Error(e.code(), std::string(e.what()) + " (" + path + ")");
      }
    }
    chain.layers_.push_back(std::move(layer));
  }
  return chain;
}

int MemoryChain::bottom_fd() const { return layers_.front()->fd.get(); }
std::string MemoryChain::top_identity() const { return identity_hex(layers_.back()->header.identity); }
size_t MemoryChain::length() const { return layers_.size(); }

// Turns off readahead on the RAM while diff pages are read into it. Each
// page read into a MAP_PRIVATE mapping of the bottom layer is a
// copy-on-write fault, and with the default advice every such fault also
// reads ahead around it in the bottom file: for 4096 scattered pages here,
// 230 ms instead of 15 ms. Advice only (errors ignored); restored to
// MADV_NORMAL after, so the guest's own faults read ahead again.
class NoReadahead {
 public:
  explicit NoReadahead(const std::vector<RamRegion>& ram) : ram_(ram) {
    for (const RamRegion& r : ram_) ::madvise(r.host, r.bytes, MADV_RANDOM);
  }
  ~NoReadahead() {
    for (const RamRegion& r : ram_) ::madvise(r.host, r.bytes, MADV_NORMAL);
  }

 private:
  const std::vector<RamRegion>& ram_;
};

void MemoryChain::apply_diffs(const std::vector<RamRegion>& ram) const {
  if (total_bytes(ram) != ram_bytes_) throw Error(code::kInvalidArgument, "RAM regions do not match the chain's RAM size");
  RamMap map(ram);
  NoReadahead no_readahead(ram);
  std::vector<iovec> iov;
  std::vector<const uint8_t*> ptrs;
  std::vector<uint32_t> crcs;
  for (size_t l = 1; l < layers_.size(); l++) {
    const Layer& layer = *layers_[l];
    const size_t n = layer.index.size();
    // Batches of up to 1024 pages: one preadv each (adjacent destinations
    // merge into one iovec), then their checksums while they are in cache.
    constexpr size_t kBatch = 1024;
    for (size_t b = 0; b < n; b += kBatch) {
      size_t k = std::min(kBatch, n - b);
      iov.clear();
      ptrs.resize(k);
      crcs.resize(k);
      for (size_t i = 0; i < k; i++) {
        uint8_t* dst = map.page(layer.index[b + i].page);
        ptrs[i] = dst;
        add_iov(iov, dst, kPageSize);
      }
      preadv_all(layer.fd.get(), iov, layer.header.data_offset + b * kPageSize, layer.path);
      crc32c_pages(ptrs.data(), k, kPageSize, crcs.data());
      for (size_t i = 0; i < k; i++)
        if (crcs[i] != layer.index[b + i].crc)
          invalid("memory layer " + layer.path + ": page " + std::to_string(layer.index[b + i].page) +
                  " fails its checksum (corrupt page data)");
    }
  }
}

LayerInfo merge_memory_layers(const std::vector<std::string>& layer_paths, uint64_t ram_bytes,
                              const std::string& out_path, const std::atomic<bool>* cancel) {
  MemoryChain chain = MemoryChain::open(layer_paths, ram_bytes);
  const auto& layers = chain.layers_;
  const MemoryChain::Layer& bottom = *layers.front();
  const std::string tmp_path = out_path + ".tmp";
  Fd out = create_file(tmp_path);
  try {
    std::vector<uint8_t> buf(kChunkPages * kPageSize);
    std::vector<size_t> cursor(layers.size(), 0);
    uint32_t crcs[kChunkPages];
    uint32_t bottom_content = 0;
    uint64_t bottom_nonzero = 0;
    std::vector<iovec> iov;
    uint32_t content_crc = 0;
    uint64_t pages = write_image(
        out.get(), ram_bytes / kPageSize,
        [&](uint64_t p0, size_t k, const uint8_t** ptrs, bool*) {
          stop_if_cancelled(cancel);
          // The bottom's pages (holes read as zeros), checked against its content checksum as we go.
          if (int rc = file_io::pread_all(bottom.fd.get(), buf.data(), k * kPageSize,
                                          kMemoryDataOffset + p0 * kPageSize); rc < 0) {
            if (rc == -EIO) invalid("memory layer " + bottom.path + " ends before its RAM image (truncated)");
            throw_sys_error(code::kIo, "read memory layer " + bottom.path, -rc);
          }
          for (size_t i = 0; i < k; i++) ptrs[i] = buf.data() + i * kPageSize;
          crc32c_pages(ptrs, k, kPageSize, crcs);
          bottom_content = crc32c(crcs, k * sizeof(uint32_t), bottom_content);
          for (size_t i = 0; i < k; i++) bottom_nonzero += !page_is_zero(ptrs[i]);
          // Then each diff's pages in this chunk, oldest first, each verified.
          for (size_t l = 1; l < layers.size(); l++) {
            const MemoryChain::Layer& layer = *layers[l];
            size_t first = cursor[l], end = first;
            while (end < layer.index.size() && layer.index[end].page < p0 + k) end++;
            if (end == first) continue;
            iov.clear();
            for (size_t e = first; e < end; e++) add_iov(iov, buf.data() + (layer.index[e].page - p0) * kPageSize, kPageSize);
            preadv_all(layer.fd.get(), iov, layer.header.data_offset + first * kPageSize, layer.path);
            for (size_t e = first; e < end; e++) {
              if (crc32c(ptrs[layer.index[e].page - p0], kPageSize) != layer.index[e].crc)
                invalid("memory layer " + layer.path + ": page " + std::to_string(layer.index[e].page) +
                        " fails its checksum (corrupt page data)");
            }
            cursor[l] = end;
          }
        },
        content_crc, tmp_path);
    if (bottom_content != bottom.header.content_crc)
      invalid("memory layer " + bottom.path + " fails its content checksum (corrupt RAM image)");
    if (bottom_nonzero != bottom.header.page_count)
      invalid("memory layer " + bottom.path + " holds " + std::to_string(bottom_nonzero) +
              " non-zero pages, its header says " + std::to_string(bottom.header.page_count));
    if (::ftruncate(out.get(), static_cast<off_t>(kMemoryDataOffset + ram_bytes)) != 0)
      throw_sys_error(code::kIo, "size memory layer " + tmp_path);
    write_header_page(out.get(),
                      make_header(kKindFull, ram_bytes, layers.back()->header.identity, nullptr, pages, content_crc),
                      tmp_path);
    LayerInfo info = finish(out.get(), tmp_path, pages, true);
    publish_merged(tmp_path, out_path);
    return info;
  } catch (...) {
    ::unlink(tmp_path.c_str());
    throw;
  }
}

LayerInfo merge_diff_layers(const std::vector<std::string>& layer_paths, size_t first, uint64_t ram_bytes,
                            const std::string& out_path, uint64_t max_bytes, const std::atomic<bool>* cancel) {
  MemoryChain chain = MemoryChain::open(layer_paths, ram_bytes);
  const auto& layers = chain.layers_;
  if (first == 0 || first >= layers.size()) throw Error(code::kInvalidArgument, "merge_diff_layers: no diff layers in range");
  // Newest copy of each page: walk the layers newest first, keep a page the first time it shows.
  struct Pick {
    uint64_t page;
    size_t layer, entry;
  };
  std::vector<Pick> picks;
  {
    std::vector<uint8_t> seen((ram_bytes / kPageSize + 7) / 8, 0);
    for (size_t l = layers.size(); l-- > first;) {
      const auto& index = layers[l]->index;
      for (size_t e = 0; e < index.size(); e++) {
        uint64_t p = index[e].page;  // inside RAM: MemoryChain::open checked it
        if (seen[p / 8] & (1u << (p % 8))) continue;
        seen[p / 8] |= static_cast<uint8_t>(1u << (p % 8));
        picks.push_back({p, l, e});
      }
    }
  }
  if (picks.size() * kPageSize > max_bytes)
    throw Error(code::kInvalidArgument, "merge_diff_layers: " + std::to_string(picks.size()) + " pages exceed the merge's memory bound");
  std::vector<uint8_t> data(picks.size() * kPageSize);
  std::vector<PageRef> pages;
  pages.reserve(picks.size());
  for (size_t i = 0; i < picks.size(); i++) {
    if (i % 256 == 0) stop_if_cancelled(cancel);
    const MemoryChain::Layer& layer = *layers[picks[i].layer];
    const IndexEntry& entry = layer.index[picks[i].entry];
    uint8_t* dst = data.data() + i * kPageSize;
    if (int rc = file_io::pread_all(layer.fd.get(), dst, kPageSize, layer.header.data_offset + picks[i].entry * kPageSize); rc < 0) {
      if (rc == -EIO) invalid("memory layer " + layer.path + " ends before its pages (truncated)");
      throw_sys_error(code::kIo, "read memory layer " + layer.path, -rc);
    }
    if (crc32c(dst, kPageSize) != entry.crc)
      invalid("memory layer " + layer.path + ": page " + std::to_string(entry.page) + " fails its checksum (corrupt page data)");
    pages.push_back({picks[i].page, dst});
  }
  const std::string tmp_path = out_path + ".tmp";
  try {
    LayerInfo info = write_diff_layer_as(tmp_path, ram_bytes, identity_hex(layers[first - 1]->header.identity), pages,
                                         layers.back()->header.identity, /*sync=*/true);
    publish_merged(tmp_path, out_path);
    return info;
  } catch (...) {
    ::unlink(tmp_path.c_str());
    throw;
  }
}

}  // namespace torpor
