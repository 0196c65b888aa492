// Machine::capture and Machine::restore: generations on disk (docs/architecture.md#on-disk-layout,
// docs/snapshot.md).
//
// A generation directory <dir>/gen-<n>/ holds vm.state (envelope around the
// body below), mem.layer (full or diff) and manifest.json (for people, tools
// and lib's store; the loader trusts only vm.state); the names are
// snapshot/generation_layout.h's. It is written as gen-<n>.tmp/,
// fsynced, renamed, and <dir>/current is switched to it atomically
// (current.tmp, fsync, rename, fsync of the directory): a crash at any moment
// leaves the previous generation whole.
//
// Body: "torpor-machine" v1 | machine spec | u64 generation | memory chain
// (bottom first; relative to the directory, or absolute for the layers of
// another directory a machine was restored from, snapshot/layer_path.h) |
// VM state | vCPU states | device states.
#include "vmm/machine_snapshot.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <bit>
#include <cstring>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>

#include "common/error.h"
#include "common/json_writer.h"
#include "devices/virtio/blk/blk_device.h"
#include "devices/virtio/blk/overlay_disk.h"
#include "snapshot/envelope.h"
#include "snapshot/generation_layout.h"
#include "snapshot/layer_path.h"
#include "vmm/fingerprint_probe.h"
#include "vmm/machine.h"
#include "vmm/machine_merge.h"
#include "vmm/machine_spec.h"
#include "vmm/x86_64/cpu_state.h"
#include "vmm/x86_64/layout.h"

namespace torpor {

namespace fs = std::filesystem;

namespace {

constexpr const char* kBodyTag = "torpor-machine";
constexpr uint32_t kBodyVersion = 1;
constexpr uint32_t kMaxChain = 64;      // what a restore accepts

double ms_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}

void fsync_path(const std::string& path, bool directory) {
  int fd = ::open(path.c_str(), (directory ? O_RDONLY | O_DIRECTORY : O_RDONLY) | O_CLOEXEC);
  if (fd < 0) throw_sys_error(code::kIo, "open " + path + " to fsync");
  int r = ::fsync(fd);
  int e = errno;
  ::close(fd);
  if (r < 0) throw_sys_error(code::kIo, "fsync " + path, e);
}

void write_file_synced(const std::string& path, const std::string& text) {
  int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) throw_sys_error(code::kIo, "create " + path);
  const char* p = text.data();
  size_t left = text.size();
  while (left) {
    ssize_t n = ::write(fd, p, left);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      int e = errno;
      ::close(fd);
      throw_sys_error(code::kIo, "write " + path, e);
    }
    p += n;
    left -= static_cast<size_t>(n);
  }
  int r = ::fdatasync(fd);
  int e = errno;
  ::close(fd);
  if (r < 0) throw_sys_error(code::kIo, "fdatasync " + path, e);
}

// "gen-<n>" from <dir>/current; 0 when there is none yet.
uint64_t current_generation(const std::string& dir) {
  std::ifstream f(dir + "/" + kCurrentFile);
  if (!f) return 0;
  std::string line;
  std::getline(f, line);
  const std::string prefix = kGenerationPrefix;
  if (line.rfind(prefix, 0) != 0 || line.size() > 24) throw Error(code::kSnapshotInvalid, dir + "/current is malformed");
  uint64_t n = 0;
  for (char c : line.substr(prefix.size())) {
    if (c < '0' || c > '9') throw Error(code::kSnapshotInvalid, dir + "/current is malformed");
    n = n * 10 + static_cast<uint64_t>(c - '0');
  }
  if (n == 0) throw Error(code::kSnapshotInvalid, dir + "/current names generation 0");
  return n;
}

// A disk layer path from the state file: relative, inside dir, no "..".
void check_relative(const std::string& p) {
  if (p.empty() || p.front() == '/' || p.find("..") != std::string::npos || p.find('\0') != std::string::npos)
    StateReader::fail("disk layer path '" + p + "' is not a plain relative path");
}

// anonymous: RAM is MAP_ANONYMOUS (a booted machine), not a layer file mapped
// MAP_PRIVATE (a restored one): the full-layer writer may then skip pages the
// kernel says were never touched.
std::vector<RamRegion> ram_regions(GuestMemory& mem, bool anonymous) {
  std::vector<RamRegion> out;
  for (const auto& r : mem.regions()) out.push_back({r.host, r.size, anonymous});
  return out;
}

uint8_t* page_ptr(const std::vector<RamRegion>& ram, uint64_t page) {
  uint64_t off = page * kPageSize;
  for (const auto& r : ram) {
    if (off < r.bytes) return r.host + off;
    off -= r.bytes;
  }
  return nullptr;
}

// A frozen disk layer into a generation: a hard link (the old top is never
// written again), or a sparse copy across filesystems. Data and map.
void link_or_copy(const std::string& from, const std::string& to) {
  if (::link(from.c_str(), to.c_str()) == 0) return;
  if (errno != EXDEV && errno != EPERM) throw_sys_error(code::kIo, "link " + from + " -> " + to);
  int in = ::open(from.c_str(), O_RDONLY | O_CLOEXEC);
  if (in < 0) throw_sys_error(code::kIo, "open " + from);
  int out = ::open(to.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (out < 0) {
    int e = errno;
    ::close(in);
    throw_sys_error(code::kIo, "create " + to, e);
  }
  struct stat st;
  int rc = ::fstat(in, &st);
  std::vector<uint8_t> buf(1 << 20);
  off_t pos = 0;
  while (rc == 0 && pos < st.st_size) {
    off_t data = ::lseek(in, pos, SEEK_DATA);
    if (data < 0) break;  // only a hole is left
    off_t hole = ::lseek(in, data, SEEK_HOLE);
    if (hole < 0) hole = st.st_size;
    for (off_t o = data; o < hole && rc == 0;) {
      size_t n = static_cast<size_t>(std::min<off_t>(hole - o, static_cast<off_t>(buf.size())));
      if (::pread(in, buf.data(), n, o) != static_cast<ssize_t>(n) || ::pwrite(out, buf.data(), n, o) != static_cast<ssize_t>(n))
        rc = -1;
      o += static_cast<off_t>(n);
    }
    pos = hole;
  }
  if (rc == 0) rc = ::ftruncate(out, st.st_size);
  if (rc == 0) rc = ::fdatasync(out);
  int e = errno;
  ::close(in);
  ::close(out);
  if (rc != 0) throw_sys_error(code::kIo, "copy " + from + " -> " + to, e);
}

// Paths of disk layers in the state: relative to the snapshot directory
// when inside it (the directory can move), absolute otherwise.
std::string path_for_state(const std::string& dir, const std::string& p) {
  std::string prefix = dir + "/";
  return p.rfind(prefix, 0) == 0 ? p.substr(prefix.size()) : p;
}

std::string path_from_state(const std::string& dir, const std::string& p) {
  if (!p.empty() && p.front() == '/') return p;
  check_relative(p);
  return dir + "/" + p;
}

// A new, unique top overlay for a disk under <dir>/tops/.
std::string new_top_path(const std::string& dir, size_t disk, const char* why, uint64_t generation) {
  static std::atomic<uint64_t> seq{0};
  fs::create_directories(dir + "/tops");
  return dir + "/tops/disk" + std::to_string(disk) + "-" + why + std::to_string(generation) + "-" +
         std::to_string(::getpid()) + "-" + std::to_string(seq.fetch_add(1)) + ".overlay";
}

uint64_t file_bytes(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0 ? static_cast<uint64_t>(st.st_size) : 0;
}

// What a sparse file takes on disk (a disk overlay's apparent size is the whole disk's).
uint64_t allocated_bytes(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0 ? static_cast<uint64_t>(st.st_blocks) * 512 : 0;
}

}  // namespace

// ---------------------------------------------------------------- capture

uint64_t Machine::dirty_page_count() {
  std::lock_guard<std::mutex> serial(stop_mu_);
  if (released_.load() || !ram_) return 0;
  ram_->collect_dirty(*vm_, dirty_);
  uint64_t n = 0;
  for (uint64_t w : dirty_) n += static_cast<uint64_t>(std::popcount(w));
  return n;
}

std::vector<uint64_t> Machine::dirty_page_bitmap() {
  std::lock_guard<std::mutex> serial(stop_mu_);
  if (released_.load() || !ram_) return {};
  ram_->collect_dirty(*vm_, dirty_);
  return dirty_;
}

std::vector<std::pair<std::string, std::vector<uint8_t>>> Machine::state_parts() {
  std::lock_guard<std::mutex> serial(stop_mu_);
  if (released_.load()) throw Error(code::kInvalidState, "the machine was stopped");
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (state_ != MachineState::Paused) throw Error(code::kInvalidState, "state_parts: pause the machine first");
  }
  x86::StateParts parts;
  {
    StateWriter w;
    x86::save_vm(*vm_, w);
    StateReader r(w.data());
    x86::describe_vm(r, parts);
  }
  for (auto& v : vcpus_) {
    StateWriter w;
    x86::save_vcpu(*kvm_, *vm_, v->kvm(), w);
    StateReader r(w.data());
    x86::describe_vcpu(r, "vcpu" + std::to_string(v->index()) + ".", parts);
  }
  for (auto& [base, dev] : devices()) {
    StateWriter w;
    dev->save(w);
    char at[32];
    std::snprintf(at, sizeof at, "@0x%llx", static_cast<unsigned long long>(base));
    parts.emplace_back(std::string("dev.") + dev->name() + at, w.take());
  }
  return parts;
}

std::vector<std::pair<std::string, std::vector<uint8_t>>> Machine::snapshot_parts(const std::string& dir) {
  const uint64_t n = current_generation(dir);
  if (n == 0) throw Error(code::kSnapshotInvalid, dir + " holds no snapshot (no 'current')");
  KvmSystem sys("/dev/kvm");
  auto body = read_state_file(dir + "/" + generation_layout(n).state, probe_fingerprint(sys, detect_host_kind()));
  StateReader in(body);
  in.expect_header(kBodyTag, kBodyVersion, kBodyVersion);
  MachineSpec spec = read_machine_spec(in);
  in.u64();
  uint32_t len = in.u32();
  if (len > kMaxChain) StateReader::fail("bad memory chain length");
  for (uint32_t i = 0; i < len; i++) check_layer_path(in.str(kMaxLayerPath));
  x86::StateParts parts;
  x86::describe_vm(in, parts);
  uint32_t vcpus = in.u32();
  if (vcpus != spec.config.vcpus) StateReader::fail("vCPU state count differs from the spec");
  for (uint32_t i = 0; i < vcpus; i++) x86::describe_vcpu(in, "vcpu" + std::to_string(i) + ".", parts);
  uint32_t nd = in.u32();
  if (nd > 64) StateReader::fail("too many devices");
  for (uint32_t i = 0; i < nd; i++) {
    std::string name = in.str(64);
    uint64_t base = in.u64();
    char at[32];
    std::snprintf(at, sizeof at, "@0x%llx", static_cast<unsigned long long>(base));
    parts.emplace_back("dev." + name + at, in.bytes(16u << 20));
  }
  return parts;
}

CaptureResult Machine::capture(const std::string& dir, const std::function<void()>& on_captured) {
  try {
    return capture_locked(dir, on_captured);
  } catch (const fs::filesystem_error& e) {
    throw Error(code::kIo, std::string("snapshot into ") + dir + ": " + e.what(), e.code().value());
  }
}

CaptureResult Machine::capture_locked(const std::string& dir, const std::function<void()>& on_captured) {
  std::lock_guard<std::mutex> serial(stop_mu_);
  if (released_.load()) throw Error(code::kInvalidState, "capture: the machine was stopped");
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (state_ != MachineState::Paused)
      throw Error(code::kInvalidState, std::string("capture: machine is ") + machine_state_name(state_) +
                                           " (pause it first: every vCPU out of KVM_RUN, devices quiesced)");
  }
  // Paused: a finished merge's disk layers can go under the live tops now.
  adopt_merges(/*wait=*/merge_due());
  auto t0 = std::chrono::steady_clock::now();
  CaptureResult res;
  fs::create_directories(dir);
  const uint64_t prev = current_generation(dir);
  res.generation = prev + 1;
  const GenerationLayout files = generation_layout(res.generation, config_.disks.size());
  const std::string& gen = files.dir;
  // A diff only continues a chain this machine wrote or was restored from,
  // in this directory, whose top is the generation `current` names.
  const bool diff = !mem_chain_.empty() && snapshot_dir_ == dir && prev == generation_ && mem_chain_.size() < kMemoryChainBound;
  std::vector<std::string> chain = diff ? mem_chain_ : std::vector<std::string>{};
  chain.push_back(files.memory);
  res.full_layer = !diff;

  // --- state, in memory
  StateWriter body;
  body.header(kBodyTag, kBodyVersion);
  MachineSpec spec;
  spec.host_kind = host_kind_name(host_kind_);
  spec.config = config_;
  // Disks: each writable top is frozen into the generation (disk<i>.overlay)
  // and a new top takes the writes from here on; a restore opens base +
  // frozen layers + a top of its own.
  struct Freeze {
    size_t disk;
    std::string old_top, frozen, new_top;
  };
  std::vector<Freeze> freezes;
  for (size_t i = 0; i < spec.config.disks.size(); i++) {
    BlkOptions& d = spec.config.disks[i];
    VirtioBlkDevice* blk = virtio_blk_of(*virtio_[i].dev);
    if (!blk) throw Error(code::kInternal, "disk " + std::to_string(i) + " is not a virtio-blk device");
    d.size_bytes = blk->disk().size();
    if (!d.read_only && !d.overlay_path.empty()) {
      Freeze f{i, d.overlay_path, dir + "/" + files.disk_overlays[i], ""};
      d.frozen_overlays.push_back(f.frozen);
      freezes.push_back(std::move(f));
    }
    d.overlay_path.clear();
    for (auto& p : d.frozen_overlays) p = path_for_state(dir, p);
    res.disk_layers.push_back(d.frozen_overlays);
  }
  for (auto& [base, dev] : devices()) spec.devices.emplace_back(dev->name(), base);
  write_machine_spec(body, spec);
  body.u64(res.generation);
  body.u32(static_cast<uint32_t>(chain.size()));
  for (const auto& p : chain) body.str(p);
  x86::save_vm(*vm_, body);
  body.u32(static_cast<uint32_t>(vcpus_.size()));
  for (auto& v : vcpus_) x86::save_vcpu(*kvm_, *vm_, v->kvm(), body);
  auto devs = devices();
  body.u32(static_cast<uint32_t>(devs.size()));
  for (auto& [base, dev] : devs) {
    StateWriter w;
    dev->save(w);
    body.str(dev->name());
    body.u64(base);
    body.bytes(w.data().data(), w.data().size());
  }
  auto history = console_->tail(config_.console_ring_bytes);
  body.bytes(history.data(), history.size());
  ram_->collect_dirty(*vm_, dirty_);
  std::vector<RamRegion> ram = ram_regions(ram_->memory(), !ram_->file_backed());
  const std::string tmp = dir + "/" + gen + ".tmp";
  fs::remove_all(tmp);
  fs::create_directory(tmp);
  uint64_t disk_bytes = 0;
  for (auto& f : freezes) {
    VirtioMmioDevice& dev = *virtio_[f.disk].dev;
    if (int rc = virtio_blk_flush(dev); rc < 0) throw_sys_error(code::kIo, "flush disk " + std::to_string(f.disk), -rc);
    std::string name = "/" + disk_overlay_file(f.disk);
    link_or_copy(f.old_top, tmp + name);
    link_or_copy(OverlayDisk::map_path(f.old_top), OverlayDisk::map_path(tmp + name));
    // Immutable from here: read-only for everyone (a sign to whoever held the
    // old path; root is not stopped by it, the docs say not to reuse the path).
    ::chmod((tmp + name).c_str(), 0444);
    ::chmod(OverlayDisk::map_path(tmp + name).c_str(), 0444);
    disk_bytes += allocated_bytes(tmp + name) + allocated_bytes(OverlayDisk::map_path(tmp + name));
    f.new_top = new_top_path(dir, f.disk, "g", res.generation);
    if (int rc = virtio_blk_push_overlay(dev, f.new_top); rc < 0)
      throw_sys_error(code::kIo, "new top layer for disk " + std::to_string(f.disk), -rc);
    // The disk's layout changed whatever happens next: the old top is a lower layer now.
    config_.disks[f.disk].frozen_overlays.push_back(f.old_top);
    config_.disks[f.disk].overlay_path = f.new_top;
  }
  // Memory, while the machine is still stopped: the dirty pages copied out
  // (diff), or the whole image written into the page cache (full layer).
  LayerInfo layer;
  std::vector<PageRef> pages;
  if (diff) {
    uint64_t n = 0;
    for (uint64_t w : dirty_) n += static_cast<uint64_t>(std::popcount(w));
    // Kept from one capture to the next: its pages are already faulted in
    // (first touches of fresh memory cost more than the copy).
    std::vector<uint8_t>& copy = capture_buf_;
    if (copy.size() < n * kPageSize) copy.resize(n * kPageSize);
    for (uint64_t w = 0; w < dirty_.size(); w++)
      for (uint64_t bits = dirty_[w]; bits; bits &= bits - 1) {
        uint64_t page = w * 64 + static_cast<uint64_t>(std::countr_zero(bits));
        const uint8_t* p = page_ptr(ram, page);
        if (!p) continue;
        uint8_t* dst = copy.data() + pages.size() * kPageSize;
        std::memcpy(dst, p, kPageSize);
        pages.push_back({page, dst});
      }
  } else {
    layer = write_full_layer(tmp + "/" + kMemoryLayerFile, ram, /*sync=*/false);
    res.dirty_pages = layer.pages;
  }
  res.captured_ms = ms_since(t0);
  // The machine may continue now: what is left reads only the copies above.
  if (on_captured) on_captured();

  // --- durable
  if (diff) {
    std::string parent = layer_identity(resolve_layer_path(dir, mem_chain_.back()));
    layer = write_diff_layer(tmp + "/" + kMemoryLayerFile, ram_->size(), parent, pages);
    res.dirty_pages = pages.size();
  } else {
    sync_layer_file(tmp + "/" + kMemoryLayerFile);
  }
  HostFingerprint fp = probe_fingerprint(*kvm_, host_kind_);
  write_state_file(tmp + "/" + kStateFile, fp, body.data());
  JsonWriter manifest;
  manifest.begin_object().key("generation").value(res.generation).key("parent").value(prev);
  manifest.key("memory").begin_object().key("kind").value(diff ? "diff" : "full").key("pages").value(layer.pages).end_object();
  manifest.key("layers").string_array(chain);
  manifest.key("disks").begin_array();
  for (const auto& disk : res.disk_layers) manifest.string_array(disk);
  manifest.end_array();
  manifest.key("state").value(files.state);
  manifest.end_object();
  const std::string m = manifest.str() + "\n";
  write_file_synced(tmp + "/" + kManifestFile, m);
  fsync_path(tmp, true);
  fs::remove_all(dir + "/" + gen);  // a leftover of a capture that died after its rename but before `current`
  fs::rename(tmp, dir + "/" + gen);
  fsync_path(dir, true);
  write_file_synced(dir + "/current.tmp", gen + "\n");
  fs::rename(dir + "/current.tmp", dir + "/" + kCurrentFile);
  fsync_path(dir, true);
  res.bytes = layer.file_bytes + file_bytes(dir + "/" + files.state) + m.size() + disk_bytes;
  // The frozen layers now live in the generation (same inode, or a copy).
  for (auto& f : freezes) config_.disks[f.disk].frozen_overlays.back() = f.frozen;
  res.durable_ms = ms_since(t0);
  res.state_file = files.state;
  res.memory_layer = files.memory;
  res.manifest = files.manifest;
  res.memory_layers = chain;

  // Only now, with the generation durable: the next diff starts from here.
  std::fill(dirty_.begin(), dirty_.end(), 0);
  snapshot_dir_ = dir;
  mem_chain_ = chain;
  generation_ = res.generation;
  start_merges();
  return res;
}

// ---------------------------------------------------------------- restore

// A restored disk asked to be larger than the generation saved it: its new
// top takes the size (the chain reads zeros past its layers' ends), and the
// blk device, finding its saved capacity smaller, signals a config change.
static void grow_restored_disk(BlkOptions& d, size_t i, uint64_t bytes) {
  if (bytes == 0 || bytes == d.size_bytes) return;
  const std::string what = "restore: disk " + std::to_string(i) + " ";
  if (bytes % 512) throw Error(code::kInvalidArgument, what + "size must be a multiple of 512 bytes");
  if (bytes < d.size_bytes)
    throw Error(code::kInvalidArgument, what + "of " + std::to_string(bytes) + " bytes is smaller than saved (" +
                                            std::to_string(d.size_bytes) + "): a disk never shrinks");
  if (d.read_only || d.overlay_path.empty()) throw Error(code::kInvalidArgument, what + "is read-only: it cannot grow");
  d.size_bytes = bytes;
}

void restore_ram(GuestRam& ram, RestorePlan& plan) {
  if (ram.size() != plan.memory->ram_bytes()) throw Error(code::kInternal, "VM shell RAM size differs from the snapshot's");
  ram.map_file(plan.memory->bottom_fd(), kMemoryDataOffset);
  plan.clock.mark("ram: map bottom layer");
  plan.memory->apply_diffs(ram_regions(ram.memory(), false));
}

std::unique_ptr<Machine> Machine::restore(const std::string& dir, Callbacks callbacks, const std::string& into,
                                          const std::vector<uint64_t>& disk_bytes) {
  try {
    return restore_from(dir, std::move(callbacks), into, disk_bytes);
  } catch (const fs::filesystem_error& e) {
    throw Error(code::kIo, std::string("restore from ") + dir + ": " + e.what(), e.code().value());
  }
}

std::unique_ptr<Machine> Machine::restore_from(const std::string& dir, Callbacks callbacks, const std::string& into,
                                               const std::vector<uint64_t>& disk_bytes) {
  const uint64_t n = current_generation(dir);
  if (n == 0) throw Error(code::kSnapshotInvalid, dir + " holds no snapshot (no 'current')");
  // Restored into another directory: nothing is written into `dir` (new disk
  // tops go under `into`), the chain keeps dir's layers by absolute path, and
  // the machine continues as if `into` held its generation 0, so its first
  // capture there is a diff over them.
  const bool elsewhere = !into.empty() && into != dir;
  const std::string home = elsewhere ? into : dir;
  // dir's layers as the machine keeps them: absolute when it continues elsewhere.
  const std::string src = elsewhere ? fs::absolute(dir).lexically_normal().string() : dir;
  auto plan = std::make_unique<RestorePlan>();
  plan->dir = home;
  {
    // The fingerprint check needs this host's KVM; nothing else is touched yet.
    KvmSystem sys("/dev/kvm");
    HostKind kind = detect_host_kind();
    plan->body = read_state_file(dir + "/" + generation_layout(n).state, probe_fingerprint(sys, kind));
    plan->clock.mark("state file read + fingerprint");
    plan->in = std::make_unique<StateReader>(plan->body);
    StateReader& in = *plan->in;
    in.expect_header(kBodyTag, kBodyVersion, kBodyVersion);
    MachineSpec spec = read_machine_spec(in);
    if (spec.host_kind != host_kind_name(kind))
      throw Error(code::kSnapshotIncompatible,
                  "the snapshot was taken on a " + spec.host_kind + " host; this one is " + host_kind_name(kind));
    plan->generation = in.u64();
    if (plan->generation != n) StateReader::fail("vm.state is for another generation than its directory");
    uint32_t len = in.u32();
    if (len == 0 || len > kMaxChain) StateReader::fail("bad memory chain length");
    std::vector<std::string> paths;
    for (uint32_t i = 0; i < len; i++) {
      std::string p = in.str(kMaxLayerPath);
      paths.push_back(resolve_layer_path(src, p));
      plan->chain.push_back(elsewhere ? paths.back() : p);
    }
    if (elsewhere) plan->generation = 0;
    if (disk_bytes.size() > spec.config.disks.size())
      throw Error(code::kInvalidArgument, "restore: sizes for " + std::to_string(disk_bytes.size()) +
                                              " disks, the snapshot has " + std::to_string(spec.config.disks.size()));
    for (size_t i = 0; i < spec.config.disks.size(); i++) {
      BlkOptions& d = spec.config.disks[i];
      for (auto& p : d.frozen_overlays) p = path_from_state(src, p);
      if (!d.read_only) d.overlay_path = new_top_path(home, i, "r", n);
      grow_restored_disk(d, i, i < disk_bytes.size() ? disk_bytes[i] : 0);
    }
    uint64_t ram_bytes = spec.config.memory_mib * x86::kMiB;
    plan->memory = std::make_unique<MemoryChain>(MemoryChain::open(paths, ram_bytes));
    plan->clock.mark("memory chain opened");
    plan->devices = spec.devices;
    auto m = std::unique_ptr<Machine>(new Machine(spec.config, std::move(callbacks), plan.get()));
    {
      // Its layers merge while it runs; its next capture adopts the result.
      std::lock_guard<std::mutex> serial(m->stop_mu_);
      m->start_merges();
    }
    return m;
  }
}

void Machine::load_state(RestorePlan& plan) {
  StateReader& in = *plan.in;
  // The platform was rebuilt from the spec: every device must be where it was.
  auto devs = devices();
  if (devs.size() != plan.devices.size()) StateReader::fail("the snapshot's devices differ from the rebuilt platform");
  for (size_t i = 0; i < devs.size(); i++)
    if (plan.devices[i].first != devs[i].second->name() || plan.devices[i].second != devs[i].first)
      StateReader::fail("device " + plan.devices[i].first + " is not where the snapshot had it");
  x86::restore_vm(*vm_, in);
  uint32_t n = in.u32();
  if (n != config_.vcpus) StateReader::fail("vCPU state count differs from the spec");
  x86::RestoredTsc tsc;
  for (uint32_t i = 0; i < n; i++) {
    auto kv = std::make_unique<KvmVcpu>(*kvm_, *vm_, i);
    x86::restore_vcpu(*kvm_, *kv, in, tsc);
    x86::notify_clock_paused(*kv);
    vcpus_.push_back(std::make_unique<Vcpu>(std::move(kv), static_cast<VcpuHost&>(*this)));
  }
  uint32_t nd = in.u32();
  if (nd != devs.size()) StateReader::fail("device state count differs from the spec");
  for (auto& [base, dev] : devs) {
    std::string name = in.str(64);
    uint64_t b = in.u64();
    if (name != dev->name() || b != base) StateReader::fail("device state out of order: " + name);
    auto blob = in.bytes(16u << 20);
    StateReader r(blob);
    dev->restore(r);
  }
  auto history = in.bytes(64u << 20);
  console_->seed(history.data(), history.size());
  in.expect_end();
  restored_ = true;
  snapshot_dir_ = plan.dir;
  mem_chain_ = plan.chain;
  generation_ = plan.generation;
}

}  // namespace torpor
