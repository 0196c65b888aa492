// KVM-free tests of leaf 0xD shaping: what a guest OS computes from the shaped
// CPUID (the sizes of the components it enables) must equal what CPUID
// reports for them, and no feature bit may be left without its state.
#include <algorithm>
#include <vector>

#include "test/check.h"
#include "vmm/x86_64/cpuid.h"
#include "vmm/x86_64/xstate.h"

using namespace torpor::x86;

namespace {

kvm_cpuid_entry2 leaf(uint32_t fn, uint32_t index, uint32_t eax, uint32_t ebx, uint32_t ecx, uint32_t edx) {
  kvm_cpuid_entry2 e{};
  e.function = fn;
  e.index = index;
  if (fn == 7 || fn == 0xd) e.flags = KVM_CPUID_FLAG_SIGNIFCANT_INDEX;
  e.eax = eax;
  e.ebx = ebx;
  e.ecx = ecx;
  e.edx = edx;
  return e;
}

constexpr uint32_t kFma = 1u << 12, kXsave = 1u << 26, kAvx = 1u << 28, kF16c = 1u << 29;
constexpr uint32_t kAvx2 = 1u << 5, kAvx512f = 1u << 16, kAvx512bw = 1u << 30, kPku = 1u << 3;

// What L1's KVM hands torpor in the nested host (QEMU TCG -cpu max, L1 without
// OSPKE): XCR0 bits 0x207 with PKRU, while leaf 7 offers no PKU.
std::vector<kvm_cpuid_entry2> nested_host_list() {
  return {
      leaf(1, 0, 0, 0, kXsave | kAvx | kFma | kF16c, 0),
      leaf(7, 0, 0, kAvx2, 0, 0),
      leaf(0xd, 0, 0x207, 0xa88, 0xa88, 0),
      leaf(0xd, 1, 0x1, 0, 0, 0),  // XSAVEOPT only
      leaf(0xd, 2, 256, 576, 0, 0),
      leaf(0xd, 9, 8, 0xa80, 0, 0),
  };
}

const kvm_cpuid_entry2* get(const std::vector<kvm_cpuid_entry2>& v, uint32_t fn, uint32_t index) {
  for (const auto& e : v)
    if (e.function == fn && e.index == index) return &e;
  return nullptr;
}

// Linux's check (fpu__init_system_xstate): the components it enables are those
// of 0xD.0 whose feature bit is set; their size from the sub-leaves must equal
// CPUID's size for that XCR0. Returns {enabled components, computed, reported}.
struct GuestView {
  uint64_t xcr0;
  uint32_t computed;
  uint32_t reported;
};
GuestView guest_view(const std::vector<kvm_cpuid_entry2>& v) {
  const auto* l1 = get(v, 1, 0);
  const auto* l7 = get(v, 7, 0);
  const auto* d0 = get(v, 0xd, 0);
  uint64_t x = (static_cast<uint64_t>(d0->edx) << 32) | d0->eax;
  if (!(l1->ecx & kAvx)) x &= ~(1ull << 2);
  if (!(l7 && (l7->ecx & kPku))) x &= ~(1ull << 9);
  if (!(l7 && (l7->ebx & kAvx512f))) x &= ~(0x7ull << 5);
  uint32_t computed = 576;
  for (uint32_t i = 2; i < 64; i++) {
    if (!(x >> i & 1)) continue;
    const auto* s = get(v, 0xd, i);
    CHECK(s != nullptr);  // every enabled component has its sub-leaf
    computed = std::max(computed, s->ebx + s->eax);
  }
  return {x, computed, d0->ebx};
}

}  // namespace

TEST("xstate: the nested host's PKRU without PKU is withdrawn, sizes agree") {
  auto v = nested_host_list();
  shape_xstate_cpuid(v, false);
  const auto* d0 = get(v, 0xd, 0);
  CHECK_EQ(d0->eax, 0x7u);
  CHECK_EQ(d0->ebx, 832u);  // 576 + AVX's 256
  CHECK_EQ(d0->ecx, 832u);
  CHECK(get(v, 0xd, 9) == nullptr);
  CHECK(get(v, 0xd, 2) != nullptr);
  CHECK_EQ(offered_xcr0(v), 0x7ull);
  auto g = guest_view(v);
  CHECK_EQ(g.xcr0, offered_xcr0(v));  // what the guest enables is what XCR0 starts at
  CHECK_EQ(g.computed, g.reported);
  // AVX and its kin stay: their state is offered.
  CHECK_EQ(get(v, 1, 0)->ecx & (kAvx | kFma | kF16c), kAvx | kFma | kF16c);
  CHECK_EQ(get(v, 7, 0)->ebx & kAvx2, kAvx2);
}

TEST("xstate: PKRU stays with PKU, ECX the size of all components") {
  auto v = nested_host_list();
  v[1].ecx |= kPku;
  shape_xstate_cpuid(v, false);
  const auto* d0 = get(v, 0xd, 0);
  CHECK_EQ(d0->eax, 0x207u);
  CHECK_EQ(d0->ecx, 0xa88u);
  CHECK_EQ(d0->ebx, 0xa88u);
  auto g = guest_view(v);
  CHECK_EQ(g.xcr0, 0x207ull);
  CHECK_EQ(g.computed, g.reported);
}

TEST("xstate: feature bits whose state is not offered are withdrawn") {
  // YMM listed without its sub-leaf, AVX-512 bits without any ZMM component.
  std::vector<kvm_cpuid_entry2> v = {
      leaf(1, 0, 0, 0, kXsave | kAvx | kFma | kF16c, 0),
      leaf(7, 0, 0, kAvx2 | kAvx512f | kAvx512bw | (1u << 14), 0, 0),
      leaf(0xd, 0, 0x7, 0, 0, 0),
      leaf(0xd, 1, 0, 0, 0, 0),
  };
  shape_xstate_cpuid(v, true);
  CHECK_EQ(get(v, 1, 0)->ecx & (kAvx | kFma | kF16c), 0u);
  CHECK_EQ(get(v, 1, 0)->ecx & kXsave, kXsave);
  CHECK_EQ(get(v, 7, 0)->ebx, 0u);  // AVX2, AVX-512, MPX all gone
  CHECK_EQ(get(v, 0xd, 0)->eax, 0x3u);
  CHECK_EQ(get(v, 0xd, 0)->ebx, 576u);
  CHECK_EQ(offered_xcr0(v), 0x3ull);
}

TEST("xstate: AVX-512 state kept whole, compacted size with 64-byte alignment") {
  std::vector<kvm_cpuid_entry2> v = {
      leaf(1, 0, 0, 0, kXsave | kAvx, 0),
      leaf(7, 0, 0, kAvx2 | kAvx512f, 0, 0),
      leaf(0xd, 0, 0xe7, 0, 0, 0),
      leaf(0xd, 1, 0x2 | 0x8, 0, 0, 0),  // XSAVEC, XSAVES
      leaf(0xd, 2, 256, 576, 0, 0),
      leaf(0xd, 5, 64, 1088, 2, 0),  // opmask, aligned
      leaf(0xd, 6, 512, 1152, 0, 0),
      leaf(0xd, 7, 1024, 1664, 0, 0),
  };
  shape_xstate_cpuid(v, false);  // no IA32_XSS: XSAVES goes, XSAVEC stays
  CHECK_EQ(get(v, 0xd, 1)->eax, 0x2u);
  CHECK_EQ(get(v, 0xd, 0)->eax, 0xe7u);
  CHECK_EQ(get(v, 0xd, 0)->ecx, 2688u);
  // compacted: 576 + 256 = 832, opmask aligned to 832 (already), 896, +512 = 1408, +1024 = 2432
  CHECK_EQ(get(v, 0xd, 1)->ebx, 2432u);
  CHECK_EQ(xsave_area_size(v, 0x7, true), 832u);
  CHECK_EQ(get(v, 7, 0)->ebx & kAvx512f, kAvx512f);
  // A missing ZMM sub-leaf withdraws the whole AVX-512 group and its bits.
  std::vector<kvm_cpuid_entry2> w(v.begin(), v.end() - 1);
  w[0] = leaf(1, 0, 0, 0, kXsave | kAvx, 0);
  w[1] = leaf(7, 0, 0, kAvx2 | kAvx512f, 0, 0);
  w[2] = leaf(0xd, 0, 0xe7, 0, 0, 0);
  shape_xstate_cpuid(w, false);
  CHECK_EQ(get(w, 0xd, 0)->eax, 0x7u);
  CHECK(get(w, 0xd, 5) == nullptr);
  CHECK_EQ(get(w, 7, 0)->ebx, kAvx2);
}

TEST("xstate: supervisor components only with usable XSAVES") {
  auto make = [] {
    return std::vector<kvm_cpuid_entry2>{
        leaf(1, 0, 0, 0, kXsave, 0),
        leaf(0xd, 0, 0x3, 0, 0, 0),
        leaf(0xd, 1, 0x8, 0, 1u << 11, 0),  // XSAVES; CET_U in IA32_XSS
        leaf(0xd, 11, 16, 0, 1, 0),
    };
  };
  auto off = make();
  shape_xstate_cpuid(off, false);
  CHECK_EQ(get(off, 0xd, 1)->eax, 0u);
  CHECK_EQ(get(off, 0xd, 1)->ecx, 0u);
  CHECK(get(off, 0xd, 11) == nullptr);
  auto on = make();
  shape_xstate_cpuid(on, true);
  CHECK_EQ(get(on, 0xd, 1)->ecx, 1u << 11);
  CHECK(get(on, 0xd, 11) != nullptr);
  CHECK_EQ(get(on, 0xd, 1)->ebx, 576u);  // IA32_XSS starts at 0
}

TEST("xstate: no XSAVE, no leaf 0xD and no AVX") {
  std::vector<kvm_cpuid_entry2> v = {
      leaf(1, 0, 0, 0, kAvx | kFma, 0),
      leaf(7, 0, 0, kAvx2, 0, 0),
      leaf(0xd, 0, 0x7, 832, 832, 0),
      leaf(0xd, 2, 256, 576, 0, 0),
  };
  shape_xstate_cpuid(v, true);
  CHECK_EQ(get(v, 1, 0)->ecx, 0u);
  CHECK_EQ(get(v, 7, 0)->ebx, 0u);
  CHECK(get(v, 0xd, 0) == nullptr);
  CHECK_EQ(offered_xcr0(v), 0ull);
}

TEST("xstate: build_cpuid shapes leaf 0xD") {
  MsrSupport msrs;
  auto out = build_cpuid(nested_host_list(), 1, 2, torpor::HostKind::Hardware, msrs);
  CHECK_EQ(get(out, 0xd, 0)->eax, 0x7u);
  CHECK(get(out, 0xd, 9) == nullptr);
  auto g = guest_view(out);
  CHECK_EQ(g.computed, g.reported);
}

TEST("xstate: tile state only with XFD") {
  auto make = [](uint32_t d1_eax) {
    return std::vector<kvm_cpuid_entry2>{
        leaf(1, 0, 0, 0, kXsave | kAvx, 0),
        leaf(7, 0, 0, 0, 0, (1u << 24) | (1u << 25)),  // AMX-TILE, AMX-INT8
        leaf(0xd, 0, 0x60007, 0, 0, 0),
        leaf(0xd, 1, d1_eax, 0, 0, 0),
        leaf(0xd, 2, 256, 576, 0, 0),
        leaf(0xd, 17, 64, 2752, 0, 0),
        leaf(0xd, 18, 8192, 2816, 2, 0),
    };
  };
  auto with = make(0x10);  // XFD
  shape_xstate_cpuid(with, false);
  CHECK_EQ(get(with, 0xd, 0)->eax, 0x60007u);
  CHECK_EQ(get(with, 0xd, 0)->ecx, 2816u + 8192u);
  CHECK_EQ(get(with, 7, 0)->edx, (1u << 24) | (1u << 25));
  auto without = make(0);
  shape_xstate_cpuid(without, false);
  CHECK_EQ(get(without, 0xd, 0)->eax, 0x7u);
  CHECK_EQ(get(without, 7, 0)->edx, 0u);
  CHECK(get(without, 0xd, 18) == nullptr);
}
