#include "vmm/vm_pool.h"

#include <pthread.h>

#include <algorithm>
#include <condition_variable>
#include <cstdlib>
#include <deque>
#include <mutex>
#include <thread>
#include <vector>

#include "common/error.h"
#include "vmm/machine.h"
#include "vmm/reaper.h"
#include "vmm/x86_64/layout.h"

namespace torpor {

namespace {

constexpr size_t kMaxDepth = 16;
constexpr size_t kMaxSizes = 2;  // RAM sizes kept at once

size_t depth_from_env() {
  const char* v = std::getenv("TORPOR_RESTORE_POOL");
  if (!v || !*v) return 2;
  char* end = nullptr;
  unsigned long n = std::strtoul(v, &end, 10);
  if (*end) return 2;
  return std::min<size_t>(n, kMaxDepth);
}

struct Key {
  std::string device;
  uint64_t ram_bytes;
  bool operator==(const Key&) const = default;
};

struct Bucket {
  Key key;
  std::vector<std::unique_ptr<VmShell>> idle;
  size_t building = 0;
  size_t reserved = 0;  // asked for beyond the depth (a fork about to restore its children)
};

// Never destroyed: the thread may still wait on it while the process exits.
struct Pool {
  std::mutex mu;
  std::condition_variable cv;
  std::deque<Bucket> buckets;  // most recently asked first
  size_t depth = depth_from_env();
  bool started = false, failed = false;
};

Pool& pool() {
  static Pool* p = new Pool();
  return *p;
}

void drop_later(std::vector<std::unique_ptr<VmShell>> shells) {
  if (shells.empty()) return;
  auto held = std::make_shared<std::vector<std::unique_ptr<VmShell>>>(std::move(shells));
  reap_later([held] { held->clear(); });
}

Bucket* wanting(Pool& p) {
  for (auto& b : p.buckets)
    if (b.idle.size() + b.building < p.depth + b.reserved) return &b;
  return nullptr;
}

void pool_main(Pool* p) {
  pthread_setname_np(pthread_self(), "torpor-vmpool");
  std::unique_lock<std::mutex> lock(p->mu);
  for (;;) {
    p->cv.wait(lock, [p] { return wanting(*p) != nullptr; });
    Bucket* b = wanting(*p);
    Key key = b->key;
    b->building++;
    lock.unlock();
    std::unique_ptr<VmShell> shell;
    try {
      shell = build_vm_shell(key.device, key.ram_bytes);
    } catch (...) {
      // No shell this time (out of fds or memory): restores build their own.
    }
    lock.lock();
    auto it = std::find_if(p->buckets.begin(), p->buckets.end(), [&](const Bucket& x) { return x.key == key; });
    if (it != p->buckets.end()) it->building--;
    if (!shell) {
      // Do not spin on a host that refuses: wait for the next restore to ask.
      if (it != p->buckets.end()) p->buckets.erase(it);
      continue;
    }
    if (it != p->buckets.end() && it->idle.size() < p->depth + it->reserved) {
      it->idle.push_back(std::move(shell));
    } else {
      std::vector<std::unique_ptr<VmShell>> drop;
      drop.push_back(std::move(shell));
      lock.unlock();
      drop_later(std::move(drop));
      lock.lock();
    }
  }
}

}  // namespace

std::unique_ptr<VmShell> build_vm_shell(const std::string& device, uint64_t ram_bytes, PhaseClock* clock) {
  auto mark = [clock](const char* what) {
    if (clock) clock->mark(what);
  };
  auto s = std::make_unique<VmShell>();
  s->kvm = std::make_unique<KvmSystem>(device);
  s->vm = std::make_unique<KvmVm>(*s->kvm);
  mark("shell: KVM_CREATE_VM");
  // The TSS and identity map matter only to VMX; elsewhere the calls are
  // accepted as no-ops or refused, and either is fine.
  if (s->kvm->check_extension(KVM_CAP_SET_IDENTITY_MAP_ADDR) > 0) {
    try { s->vm->set_identity_map_addr(x86::kIdentityMapAddr); } catch (const Error&) {}
  }
  try { s->vm->set_tss_addr(x86::kTssAddr); } catch (const Error&) {}
  // Slots before the irqchip (see the header).
  s->ram = std::make_unique<GuestRam>(*s->vm, ram_bytes);
  mark("shell: TSS + RAM slots");
  s->vm->create_irqchip();
  mark("shell: KVM_CREATE_IRQCHIP");
  s->vm->create_pit2();
  mark("shell: KVM_CREATE_PIT2");
  return s;
}

std::unique_ptr<VmShell> take_vm_shell(const std::string& device, uint64_t ram_bytes) {
  Pool& p = pool();
  std::unique_ptr<VmShell> shell;
  std::vector<std::unique_ptr<VmShell>> evicted;
  {
    std::lock_guard<std::mutex> lock(p.mu);
    if (p.depth == 0 || p.failed) return nullptr;
    Key key{device, ram_bytes};
    auto it = std::find_if(p.buckets.begin(), p.buckets.end(), [&](const Bucket& b) { return b.key == key; });
    Bucket b = it != p.buckets.end() ? std::move(*it) : Bucket{key, {}, 0};
    if (it != p.buckets.end()) p.buckets.erase(it);
    if (!b.idle.empty()) {
      shell = std::move(b.idle.back());
      b.idle.pop_back();
    }
    if (b.reserved) b.reserved--;  // this restore was one of them, served or not
    while (b.idle.size() > p.depth + b.reserved) {  // what a fork asked for and did not use
      evicted.push_back(std::move(b.idle.back()));
      b.idle.pop_back();
    }
    p.buckets.push_front(std::move(b));
    while (p.buckets.size() > kMaxSizes) {
      for (auto& s : p.buckets.back().idle) evicted.push_back(std::move(s));
      p.buckets.pop_back();  // a shell it is building is dropped when done
    }
    if (!p.started) {
      try {
        std::thread(pool_main, &p).detach();
        p.started = true;
      } catch (...) {
        p.failed = true;
      }
    }
    p.cv.notify_one();
  }
  drop_later(std::move(evicted));
  return shell;
}

void vm_pool_reserve(const std::string& device, uint64_t ram_bytes, size_t count) {
  Pool& p = pool();
  std::lock_guard<std::mutex> lock(p.mu);
  if (p.depth == 0 || p.failed || !p.started) return;  // off, or no restore asked yet
  Key key{device, ram_bytes};
  auto it = std::find_if(p.buckets.begin(), p.buckets.end(), [&](const Bucket& b) { return b.key == key; });
  if (it == p.buckets.end()) return;
  it->reserved = std::min(count > p.depth ? count - p.depth : 0, kMaxDepth);
  p.cv.notify_one();
}

void vm_pool_clear() {
  Pool& p = pool();
  std::vector<std::unique_ptr<VmShell>> drop;
  {
    std::lock_guard<std::mutex> lock(p.mu);
    for (auto& b : p.buckets)
      for (auto& s : b.idle) drop.push_back(std::move(s));
    p.buckets.clear();
  }
  drop_later(std::move(drop));
}

size_t vm_pool_depth() {
  Pool& p = pool();
  std::lock_guard<std::mutex> lock(p.mu);
  return p.depth;
}

void vm_pool_set_depth(size_t depth) {
  Pool& p = pool();
  std::vector<std::unique_ptr<VmShell>> drop;
  {
    std::lock_guard<std::mutex> lock(p.mu);
    p.depth = std::min(depth, kMaxDepth);
    for (auto& b : p.buckets)
      while (b.idle.size() > p.depth) {
        drop.push_back(std::move(b.idle.back()));
        b.idle.pop_back();
      }
    p.cv.notify_one();
  }
  drop_later(std::move(drop));
}

size_t vm_pool_idle() {
  Pool& p = pool();
  std::lock_guard<std::mutex> lock(p.mu);
  size_t n = 0;
  for (auto& b : p.buckets) n += b.idle.size();
  return n;
}

}  // namespace torpor
