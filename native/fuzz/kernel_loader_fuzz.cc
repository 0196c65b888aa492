// Fuzz target: the guest kernel loader (vmm/x86_64/kernel_loader.h), which
// parses a file the user names (ELF32 with a PVH note, ELF64, bzImage). Every
// outcome must be a loaded kernel whose entry and end lie in RAM, or
// Error(BOOT_FAILED); anything else is a bug. The seed corpus holds one image
// of each form (native/fuzz/corpus/kernel_loader), so mutations start from
// headers that parse. Cheap per input: the bytes are loaded into a static
// 16 MiB buffer posing as guest RAM (only the pages an image touches are
// ever backed).
//
//   make -C native/fuzz libfuzzer; native/fuzz/campaign.sh   (clang)
//   make -C native/fuzz run                                   (g++: random inputs)
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <vector>

#include "common/error.h"
#include "vmm/x86_64/kernel_loader.h"

using namespace torpor;

namespace {

constexpr uint64_t kRam = 16ull << 20;
alignas(4096) uint8_t g_ram[kRam];
long g_loaded = 0, g_refused = 0;

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::vector<uint8_t> image(data, data + size);
  GuestMemory mem({{0, kRam, g_ram}});
  try {
    x86::LoadedKernel k = x86::load_kernel_image(mem, image, kRam);
    if (k.entry >= kRam || k.end > kRam) std::abort();
    g_loaded++;
  } catch (const Error& e) {
    if (std::strcmp(e.code(), code::kBootFailed) != 0) {
      std::fprintf(stderr, "loader threw %s (%s), want BOOT_FAILED\n", e.code(), e.what());
      std::abort();
    }
    g_refused++;
  }
  return 0;
}

#ifdef TORPOR_FUZZ_STANDALONE
// Mutations of the seed images given on the command line (or random bytes).
#include <fstream>
#include <iterator>
int main(int argc, char** argv) {
  long iterations = argc > 1 ? std::atol(argv[1]) : 20000;
  std::mt19937_64 rng(1);
  std::vector<std::vector<uint8_t>> seeds;
  for (int i = 2; i < argc; i++) {
    std::ifstream f(argv[i], std::ios::binary);
    seeds.emplace_back(std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>());
  }
  std::vector<uint8_t> input;
  for (long it = 0; it < iterations; it++) {
    if (seeds.empty()) {
      input.resize(rng() % 2048);
      for (auto& b : input) b = static_cast<uint8_t>(rng());
    } else {
      input = seeds[rng() % seeds.size()];
      int flips = 1 + static_cast<int>(rng() % 8);
      for (int f = 0; f < flips && !input.empty(); f++) {
        size_t at = rng() % std::min<size_t>(input.size(), 1024);  // the headers
        input[at] = static_cast<uint8_t>(rng() % 3 ? rng() : input[at] ^ (1u << (rng() % 8)));
      }
      if (rng() % 10 == 0) input.resize(rng() % (input.size() + 1));
    }
    LLVMFuzzerTestOneInput(input.data(), input.size());
  }
  std::printf("kernel_loader_fuzz: %ld inputs, %ld loaded, %ld refused with BOOT_FAILED, no crash\n", iterations, g_loaded,
              g_refused);
  return 0;
}
#endif
