// Where things live in a torpor guest's physical address space (x86-64).
// docs/platform.md is the guest-visible description of the same map.
#pragma once

#include <cstdint>

namespace torpor::x86 {

inline constexpr uint64_t kMiB = 1024 * 1024;
inline constexpr uint64_t kGiB = 1024 * kMiB;

// Boot structures in low memory (all below the EBDA).
inline constexpr uint64_t kGdtAddr = 0x500;
inline constexpr uint64_t kIdtAddr = 0x520;
inline constexpr uint64_t kStartInfoAddr = 0x6000;   // PVH hvm_start_info
inline constexpr uint64_t kModlistAddr = 0x6040;     // PVH module list (initrd)
inline constexpr uint64_t kMemmapAddr = 0x6100;      // PVH memory map
inline constexpr uint64_t kMemmapMaxEntries = 32;
inline constexpr uint64_t kZeroPageAddr = 0x7000;    // 64-bit boot protocol boot_params
inline constexpr uint64_t kBootStack = 0x8ff0;
inline constexpr uint64_t kPml4Addr = 0x9000;
inline constexpr uint64_t kPdptAddr = 0xa000;
inline constexpr uint64_t kPdAddr = 0xb000;
inline constexpr uint64_t kCmdlineAddr = 0x20000;
inline constexpr uint64_t kCmdlineMax = 0x10000;     // bytes including the NUL

// e820: [0, kEbdaStart) RAM, [kEbdaStart, kHighMemStart) reserved.
inline constexpr uint64_t kEbdaStart = 0x9fc00;
inline constexpr uint64_t kMptableAddr = kEbdaStart;
inline constexpr uint64_t kHighMemStart = 0x100000;

// The 32-bit MMIO hole: [3 GiB, 4 GiB). RAM beyond 3 GiB continues at 4 GiB.
inline constexpr uint64_t kMmioHoleStart = 0xc0000000;
inline constexpr uint64_t kMmioHoleEnd = 0x100000000;

inline constexpr uint64_t kVirtioMmioBase = 0xd0000000;
inline constexpr uint32_t kVirtioFirstGsi = 5;
inline constexpr uint32_t kMaxVirtioDevices = 19;  // GSIs 5..23 of the IOAPIC

inline constexpr uint64_t kIoapicAddr = 0xfec00000;
inline constexpr uint64_t kLapicAddr = 0xfee00000;
// KVM needs three pages for the real-mode TSS and one for the identity map
// (VMX); both sit in the MMIO hole, away from every device.
inline constexpr uint64_t kIdentityMapAddr = 0xfeffc000;
inline constexpr uint64_t kTssAddr = 0xfeffd000;

inline constexpr uint16_t kSerialPort = 0x3f8;
inline constexpr uint32_t kSerialIrq = 4;
inline constexpr uint16_t kI8042DataPort = 0x60;
inline constexpr uint16_t kI8042CommandPort = 0x64;

}  // namespace torpor::x86
