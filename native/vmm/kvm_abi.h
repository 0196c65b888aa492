// KVM ABI details that <linux/kvm.h> gets wrong when compiled as C++.
//
// The 6.1 uapi headers end several structs with __DECLARE_FLEX_ARRAY, which
// in C++ wraps the array in a struct holding an empty struct: g++ gives that
// one byte, so sizeof() and the offset of the array grow (kvm_cpuid2: 12 and
// 12 instead of 8 and 8). The ioctl numbers built from those sizes are then
// refused by the kernel (EINVAL) and the array would be read at the wrong
// offset. Use these C values and header sizes instead of the structs'
// flexible members and of the header's macros for these ioctls.
#pragma once

#include <linux/kvm.h>
#include <sys/ioctl.h>

#include <cstddef>
#include <cstdint>

namespace torpor::kvm_abi {

// Fixed-size headers in front of each flexible array (C layout).
inline constexpr size_t kCpuid2Header = 8;   // u32 nent, u32 padding
inline constexpr size_t kMsrsHeader = 8;     // u32 nmsrs, u32 pad
inline constexpr size_t kMsrListHeader = 4;  // u32 nmsrs
inline constexpr size_t kXsaveBytes = 4096;  // u32 region[1024]

static_assert(sizeof(kvm_cpuid_entry2) == 40);
static_assert(sizeof(kvm_msr_entry) == 16);

inline constexpr unsigned long kGetMsrIndexList = _IOC(_IOC_READ | _IOC_WRITE, KVMIO, 0x02, kMsrListHeader);
inline constexpr unsigned long kGetSupportedCpuid = _IOC(_IOC_READ | _IOC_WRITE, KVMIO, 0x05, kCpuid2Header);
inline constexpr unsigned long kGetMsrFeatureIndexList = _IOC(_IOC_READ | _IOC_WRITE, KVMIO, 0x0a, kMsrListHeader);
inline constexpr unsigned long kGetMsrs = _IOC(_IOC_READ | _IOC_WRITE, KVMIO, 0x88, kMsrsHeader);
inline constexpr unsigned long kSetMsrs = _IOC(_IOC_WRITE, KVMIO, 0x89, kMsrsHeader);
inline constexpr unsigned long kSetCpuid2 = _IOC(_IOC_WRITE, KVMIO, 0x90, kCpuid2Header);
inline constexpr unsigned long kGetCpuid2 = _IOC(_IOC_READ | _IOC_WRITE, KVMIO, 0x91, kCpuid2Header);
inline constexpr unsigned long kGetXsave = _IOC(_IOC_READ, KVMIO, 0xa4, kXsaveBytes);
inline constexpr unsigned long kSetXsave = _IOC(_IOC_WRITE, KVMIO, 0xa5, kXsaveBytes);
inline constexpr unsigned long kGetXsave2 = _IOC(_IOC_READ, KVMIO, 0xcf, kXsaveBytes);

}  // namespace torpor::kvm_abi
