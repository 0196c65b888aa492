// What a machine's disk is made of (MachineConfig::disks; a snapshot's spec
// keeps it).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace torpor {

struct BlkOptions {
  std::string base_path;     // read-only base image (may be empty: overlay only)
  std::string overlay_path;  // copy-on-write overlay data file (created if missing)
  uint64_t size_bytes = 0;   // 0: size of the base image
  bool read_only = false;    // refuse guest writes (VIRTIO_BLK_F_RO)
  std::string serial;        // VIRTIO_BLK_T_GET_ID answer (<= 20 bytes)
  // Overlays frozen by earlier snapshot generations, oldest first, between
  // the base and overlay_path (read-only). The machine opens such a chain
  // itself (snapshot/disk_layers.h) and hands the disk to make_virtio_blk_on.
  std::vector<std::string> frozen_overlays;
};

}  // namespace torpor
