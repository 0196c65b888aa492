// Guest RAM as a chain of immutable layers (docs/architecture.md#memory-and-disk-layers, docs/snapshot.md).
//
// RAM is addressed by its linear offset: the machine's RAM regions
// concatenated (slot 0 then slot 1); page = 4096 bytes.
//  - The bottom layer is a full image: a 4096-byte header page, then the RAM
//    image at kMemoryDataOffset (page aligned, so it can be mmap'ed
//    MAP_PRIVATE straight into guest RAM). All-zero pages are left as holes.
//    Its header carries the RAM size, a random 128-bit identity and a content
//    checksum of the whole image (checked when layers are merged; a restore
//    checks header, size and identity only, the pages stay lazily mapped).
//  - A diff layer holds the pages dirtied since the layer below: header,
//    sorted page index with a checksum per page, page data packed
//    sequentially. It names the identity of the layer below it.
// Every header and index is untrusted input: validated before use, refused
// with Error(SNAPSHOT_INVALID); I/O failures are Error(IO_ERROR).
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "base/guest_memory.h"

namespace torpor {

// kPageSize comes from base/guest_memory.h (one definition per namespace).
inline constexpr uint64_t kMemoryDataOffset = 4096;  // RAM image offset in a full layer
inline constexpr size_t kLayerIdentityBytes = 16;

struct RamRegion {
  uint8_t* host;
  uint64_t bytes;  // a multiple of kPageSize
  // MAP_ANONYMOUS memory: the full-layer writer asks the kernel
  // (/proc/self/pagemap) which pages were never touched (neither present nor
  // swapped: zero by definition) and skips reading them, which would fault
  // each one in. Leave false for file-backed RAM (a restored machine's).
  bool anonymous = false;
};
struct PageRef {
  uint64_t page;         // linear page index
  const uint8_t* data;   // kPageSize bytes
};
struct LayerInfo {
  uint64_t pages = 0;       // pages stored (full layer: non-zero pages)
  uint64_t file_bytes = 0;  // apparent file size
  uint64_t disk_bytes = 0;  // blocks allocated (st_blocks * 512)
};

// Writes a full layer of `ram` (regions concatenated) and, with sync,
// fdatasyncs it. Without sync the data is in the page cache only: call
// sync_layer_file before declaring the generation durable (this split lets a
// capture report its captured and durable times apart).
LayerInfo write_full_layer(const std::string& path, const std::vector<RamRegion>& ram, bool sync = true);
// Writes a diff layer over the layer whose identity is `parent_identity`
// (as layer_identity returns it) and fsyncs it. An existing file at `path`
// is overwritten in place and then cut to size (not truncated first): a
// caller that recycles a dropped generation's layer file this way reuses
// its page-cache pages, several times faster than allocating new ones. `pages` may come in any
// order; duplicates are refused (INVALID_ARGUMENT).
LayerInfo write_diff_layer(const std::string& path, uint64_t ram_bytes, const std::string& parent_identity,
                           const std::vector<PageRef>& pages, bool sync = true);
// fdatasync of a layer written with sync = false.
void sync_layer_file(const std::string& path);
// Reads and validates a layer's header; returns its identity (32 hex digits).
std::string layer_identity(const std::string& path);

// A validated chain of layers, bottom (full) first. Holds the files open.
class MemoryChain {
 public:
  // Validates every header (magic, version, kind, RAM size = ram_bytes, file
  // size), the chain (each diff names the identity of the layer below), and
  // every diff index (sorted, unique, inside RAM, offsets inside the file).
  static MemoryChain open(const std::vector<std::string>& layer_paths, uint64_t ram_bytes);

  MemoryChain(MemoryChain&& o) noexcept;
  MemoryChain& operator=(MemoryChain&& o) noexcept;
  MemoryChain(const MemoryChain&) = delete;
  MemoryChain& operator=(const MemoryChain&) = delete;
  ~MemoryChain();

  // Read-only fd of the bottom layer; its RAM image starts at kMemoryDataOffset.
  int bottom_fd() const;
  // Reads every diff page into place, oldest layer first, verifying each
  // page's checksum (runs of adjacent pages are read with one pread).
  // `ram` must describe ram_bytes in all. Readahead is off on `ram` while it
  // runs (MADV_RANDOM, then MADV_NORMAL: any other read advice is reset).
  void apply_diffs(const std::vector<RamRegion>& ram) const;
  std::string top_identity() const;
  size_t length() const;  // number of layers
  uint64_t ram_bytes() const { return ram_bytes_; }

  struct Layer;  // opaque: fd, identity, index

 private:
  MemoryChain();
  friend LayerInfo merge_memory_layers(const std::vector<std::string>&, uint64_t, const std::string&,
                                       const std::atomic<bool>*);
  friend LayerInfo merge_diff_layers(const std::vector<std::string>&, size_t, uint64_t, const std::string&,
                                     uint64_t, const std::atomic<bool>*);
  std::vector<std::unique_ptr<Layer>> layers_;
  uint64_t ram_bytes_ = 0;
};

// Merges the chain `layer_paths` (bottom first) into one new full layer at
// out_path, verifying every diff page and the bottom's content checksum as
// it merges. The result carries the identity of the newest layer merged (it
// holds the same memory), so diff layers above it still chain onto it. It is
// written to out_path.tmp, synced and renamed: out_path is whole or absent.
// Off the capture path. A set `cancel` stops it between chunks
// (Error(INVALID_STATE), nothing left at out_path or its .tmp).
LayerInfo merge_memory_layers(const std::vector<std::string>& layer_paths, uint64_t ram_bytes,
                              const std::string& out_path, const std::atomic<bool>* cancel = nullptr);
// Merges the diff layers layer_paths[first..] into one diff layer at out_path
// over layer_paths[first - 1] (which keeps its place: a template's full layer
// is not copied). Every page any of them holds, the newest copy, each
// verified against its checksum; the result takes the newest layer's
// identity (diffs above chain onto it) and names the layer below as parent.
// Refuses (INVALID_ARGUMENT, nothing written) when the pages would take more
// than max_bytes of memory while merging: a full merge is the answer then.
// Same output and cancel rules as merge_memory_layers.
LayerInfo merge_diff_layers(const std::vector<std::string>& layer_paths, size_t first, uint64_t ram_bytes,
                            const std::string& out_path, uint64_t max_bytes, const std::atomic<bool>* cancel = nullptr);

}  // namespace torpor
