#include "vmm/x86_64/xstate.h"

#include <algorithm>

namespace torpor::x86 {

namespace {

constexpr uint32_t kLeafXstate = 0xd;

// State components (XCR0 / IA32_XSS bit numbers).
constexpr uint64_t kX87 = 1ull << 0;
constexpr uint64_t kSse = 1ull << 1;
constexpr uint64_t kYmm = 1ull << 2;
constexpr uint64_t kMpx = (1ull << 3) | (1ull << 4);                   // BNDREGS, BNDCSR
constexpr uint64_t kAvx512 = (1ull << 5) | (1ull << 6) | (1ull << 7);  // opmask, ZMM_Hi256, Hi16_ZMM
constexpr uint64_t kPkru = 1ull << 9;
constexpr uint64_t kTiles = (1ull << 17) | (1ull << 18);  // XTILECFG, XTILEDATA (dynamic)
constexpr uint64_t kTileData = 1ull << 18;

// The legacy region (x87 + SSE) and the XSAVE header: where extended state starts.
constexpr uint32_t kLegacyAndHeader = 512 + 64;

enum class Reg { Eax, Ebx, Ecx, Edx };

// One CPUID feature bit.
struct Bit {
  uint32_t leaf;
  uint32_t index;
  Reg reg;
  uint32_t bit;
};

// The bit whose absence withdraws a group of state components (the one Linux
// checks before enabling them).
struct Gate {
  uint64_t components;
  Bit feature;
};
constexpr Gate kGates[] = {
    {kYmm, {1, 0, Reg::Ecx, 28}},       // AVX
    {kMpx, {7, 0, Reg::Ebx, 14}},       // MPX
    {kAvx512, {7, 0, Reg::Ebx, 16}},    // AVX512F
    {kPkru, {7, 0, Reg::Ecx, 3}},       // PKU
    {kTiles, {7, 0, Reg::Edx, 24}},     // AMX-TILE
};

// Feature bits that need state components: withdrawn with them. The list
// covers every instruction set whose registers live in an XSAVE component.
struct Needs {
  Bit feature;
  uint64_t components;
};
constexpr uint64_t kYmmAvx512 = kYmm | kAvx512;
constexpr Needs kNeeds[] = {
    {{1, 0, Reg::Ecx, 12}, kYmm},         // FMA
    {{1, 0, Reg::Ecx, 28}, kYmm},         // AVX
    {{1, 0, Reg::Ecx, 29}, kYmm},         // F16C
    {{7, 0, Reg::Ebx, 5}, kYmm},          // AVX2
    {{7, 0, Reg::Ecx, 9}, kYmm},          // VAES
    {{7, 0, Reg::Ecx, 10}, kYmm},         // VPCLMULQDQ
    {{7, 1, Reg::Eax, 4}, kYmm},          // AVX-VNNI
    {{7, 1, Reg::Eax, 23}, kYmm},         // AVX-IFMA
    {{7, 0, Reg::Ebx, 14}, kMpx},         // MPX
    {{7, 0, Reg::Ebx, 16}, kYmmAvx512},   // AVX512F
    {{7, 0, Reg::Ebx, 17}, kYmmAvx512},   // AVX512DQ
    {{7, 0, Reg::Ebx, 21}, kYmmAvx512},   // AVX512_IFMA
    {{7, 0, Reg::Ebx, 26}, kYmmAvx512},   // AVX512PF
    {{7, 0, Reg::Ebx, 27}, kYmmAvx512},   // AVX512ER
    {{7, 0, Reg::Ebx, 28}, kYmmAvx512},   // AVX512CD
    {{7, 0, Reg::Ebx, 30}, kYmmAvx512},   // AVX512BW
    {{7, 0, Reg::Ebx, 31}, kYmmAvx512},   // AVX512VL
    {{7, 0, Reg::Ecx, 1}, kYmmAvx512},    // AVX512_VBMI
    {{7, 0, Reg::Ecx, 6}, kYmmAvx512},    // AVX512_VBMI2
    {{7, 0, Reg::Ecx, 11}, kYmmAvx512},   // AVX512_VNNI
    {{7, 0, Reg::Ecx, 12}, kYmmAvx512},   // AVX512_BITALG
    {{7, 0, Reg::Ecx, 14}, kYmmAvx512},   // AVX512_VPOPCNTDQ
    {{7, 0, Reg::Edx, 2}, kYmmAvx512},    // AVX512_4VNNIW
    {{7, 0, Reg::Edx, 3}, kYmmAvx512},    // AVX512_4FMAPS
    {{7, 0, Reg::Edx, 8}, kYmmAvx512},    // AVX512_VP2INTERSECT
    {{7, 0, Reg::Edx, 23}, kYmmAvx512},   // AVX512_FP16
    {{7, 1, Reg::Eax, 5}, kYmmAvx512},    // AVX512_BF16
    {{7, 0, Reg::Ecx, 3}, kPkru},         // PKU
    {{7, 0, Reg::Ecx, 4}, kPkru},         // OSPKE
    {{7, 0, Reg::Edx, 22}, kTiles},       // AMX-BF16
    {{7, 0, Reg::Edx, 24}, kTiles},       // AMX-TILE
    {{7, 0, Reg::Edx, 25}, kTiles},       // AMX-INT8
    {{7, 1, Reg::Eax, 21}, kTiles},       // AMX-FP16
    {{kLeafXstate, 1, Reg::Eax, 4}, kTileData},  // XFD: only dynamic (tile) state uses it
};

// Leaf 1 ECX and leaf 0xD.1 EAX bits.
constexpr Bit kXsave{1, 0, Reg::Ecx, 26};
constexpr Bit kOsxsave{1, 0, Reg::Ecx, 27};
constexpr Bit kXsavec{kLeafXstate, 1, Reg::Eax, 1};
constexpr Bit kXsaves{kLeafXstate, 1, Reg::Eax, 3};
constexpr Bit kXfd{kLeafXstate, 1, Reg::Eax, 4};

kvm_cpuid_entry2* find(std::vector<kvm_cpuid_entry2>& entries, uint32_t leaf, uint32_t index) {
  for (auto& e : entries) {
    // Leaves 1 and 7.0 may be listed without the significant-index flag: index 0 then.
    bool indexed = e.flags & KVM_CPUID_FLAG_SIGNIFCANT_INDEX;
    if (e.function == leaf && (indexed ? e.index == index : index == 0)) return &e;
  }
  return nullptr;
}
const kvm_cpuid_entry2* find(const std::vector<kvm_cpuid_entry2>& entries, uint32_t leaf, uint32_t index) {
  return find(const_cast<std::vector<kvm_cpuid_entry2>&>(entries), leaf, index);
}

uint32_t* reg(kvm_cpuid_entry2& e, Reg r) {
  switch (r) {
    case Reg::Eax: return &e.eax;
    case Reg::Ebx: return &e.ebx;
    case Reg::Ecx: return &e.ecx;
    case Reg::Edx: return &e.edx;
  }
  return &e.eax;
}

bool has(std::vector<kvm_cpuid_entry2>& entries, const Bit& b) {
  auto* e = find(entries, b.leaf, b.index);
  return e && (*reg(*e, b.reg) >> b.bit & 1);
}

void clear(std::vector<kvm_cpuid_entry2>& entries, const Bit& b) {
  if (auto* e = find(entries, b.leaf, b.index)) *reg(*e, b.reg) &= ~(1u << b.bit);
}

uint64_t pair(uint32_t lo, uint32_t hi) { return (static_cast<uint64_t>(hi) << 32) | lo; }

// The components of `mask` (bit 2 and up) that have a sub-leaf with a size.
uint64_t described(const std::vector<kvm_cpuid_entry2>& entries, uint64_t mask) {
  uint64_t out = mask & (kX87 | kSse);
  for (uint32_t i = 2; i < 64; i++) {
    if (!(mask >> i & 1)) continue;
    auto* sub = find(entries, kLeafXstate, i);
    if (sub && sub->eax != 0) out |= 1ull << i;
  }
  return out;
}

}  // namespace

uint32_t xsave_area_size(const std::vector<kvm_cpuid_entry2>& entries, uint64_t components, bool compacted) {
  uint32_t size = kLegacyAndHeader;
  for (uint32_t i = 2; i < 64; i++) {
    if (!(components >> i & 1)) continue;
    auto* sub = find(entries, kLeafXstate, i);
    if (!sub || sub->eax == 0) continue;
    if (compacted) {
      // ECX bit 1: the component starts 64-byte aligned in the compacted format.
      uint32_t offset = (sub->ecx & 2) ? (size + 63) / 64 * 64 : size;
      size = offset + sub->eax;
    } else {
      size = std::max(size, sub->ebx + sub->eax);
    }
  }
  return size;
}

uint64_t offered_xcr0(const std::vector<kvm_cpuid_entry2>& entries) {
  auto* leaf1 = find(entries, 1, 0);
  auto* d0 = find(entries, kLeafXstate, 0);
  if (!leaf1 || !(leaf1->ecx >> kXsave.bit & 1) || !d0) return 0;
  return pair(d0->eax, d0->edx);
}

void shape_xstate_cpuid(std::vector<kvm_cpuid_entry2>& entries, bool xsaves_usable) {
  auto* d0 = find(entries, kLeafXstate, 0);
  uint64_t user = d0 ? described(entries, pair(d0->eax, d0->edx)) : 0;
  const bool xsave = has(entries, kXsave) && (user & (kX87 | kSse)) == (kX87 | kSse);

  uint64_t keep = 0;
  if (xsave) {
    keep = kX87 | kSse;
    for (const auto& g : kGates) {
      bool whole = (user & g.components) == g.components;
      bool needs_ymm = g.components == kAvx512 && !(keep & kYmm);  // kGates lists YMM first
      // Linux enables dynamic (tile) state only with XFD to trap its first use.
      bool needs_xfd = g.components == kTiles && !has(entries, kXfd);
      if (whole && !needs_ymm && !needs_xfd && has(entries, g.feature)) keep |= g.components;
    }
  }

  if (!xsaves_usable) clear(entries, kXsaves);
  auto* d1 = find(entries, kLeafXstate, 1);
  uint64_t supervisor = 0;
  if (xsave && d1 && has(entries, kXsaves)) supervisor = described(entries, pair(d1->ecx, d1->edx)) & ~keep;

  for (const auto& n : kNeeds)
    if ((keep & n.components) != n.components) clear(entries, n.feature);
  if (!xsave) {
    clear(entries, kXsave);
    clear(entries, kOsxsave);
  }

  // Sub-leaves of components not offered go; the guest reads zeros for them.
  const uint64_t offered = keep | supervisor;
  entries.erase(std::remove_if(entries.begin(), entries.end(),
                               [&](const kvm_cpuid_entry2& e) {
                                 if (e.function != kLeafXstate) return false;
                                 if (!xsave) return true;
                                 return e.index >= 2 && (e.index >= 64 || !(offered >> e.index & 1));
                               }),
                entries.end());
  if (!xsave) return;

  // Erasing moved entries: look the sub-leaves up again.
  d0 = find(entries, kLeafXstate, 0);
  d1 = find(entries, kLeafXstate, 1);
  // EBX: the size for XCR0, which starts at every offered user component
  // (see init_xcr0); ECX: the size for all of them. KVM recomputes EBX when
  // the guest's XCR0 changes.
  d0->eax = static_cast<uint32_t>(keep);
  d0->edx = static_cast<uint32_t>(keep >> 32);
  d0->ebx = d0->ecx = xsave_area_size(entries, keep, false);
  if (d1) {
    d1->ecx = static_cast<uint32_t>(supervisor);
    d1->edx = static_cast<uint32_t>(supervisor >> 32);
    // EBX: the compacted size for XCR0 | IA32_XSS (0 at reset), with a compacting instruction.
    d1->ebx = (has(entries, kXsavec) || has(entries, kXsaves)) ? xsave_area_size(entries, keep, true) : 0;
  }
}

}  // namespace torpor::x86
