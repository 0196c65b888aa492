// The state-file envelope and host fingerprint: round trips, every header
// field corrupted, truncation and bit flips refused as SNAPSHOT_INVALID,
// other hosts refused as SNAPSHOT_INCOMPATIBLE naming the difference, and
// the validation order (size, magic, version, length, checksum, fingerprint).
#include <fcntl.h>
#include <unistd.h>

#include <cstring>
#include <fstream>
#include <random>

#include "common/error.h"
#include "snapshot/crc32c.h"
#include "snapshot/envelope.h"
#include "test/check.h"
#include "test/snapshot_fixtures.h"
#include "test/temp_dir.h"

using namespace torpor;
using torpor_test::TempDir;
using torpor_test::golden_host;

namespace {


std::vector<uint8_t> sample_body() {
  std::vector<uint8_t> body(300);
  for (size_t i = 0; i < body.size(); i++) body[i] = static_cast<uint8_t>(i * 31 + 7);
  return body;
}

std::string error_of(const std::vector<uint8_t>& file, const HostFingerprint& here, std::string* message = nullptr) {
  try {
    parse_state_file(file.data(), file.size(), here);
  } catch (const Error& e) {
    if (message) *message = e.what();
    return e.code();
  }
  return "none";
}

void put32(std::vector<uint8_t>& f, size_t off, uint32_t v) { std::memcpy(&f[off], &v, 4); }
void put64(std::vector<uint8_t>& f, size_t off, uint64_t v) { std::memcpy(&f[off], &v, 8); }
// Recomputes the trailing checksum, so a test reaches the checks after it.
void reseal(std::vector<uint8_t>& f) { put32(f, f.size() - 4, crc32c(f.data(), f.size() - 4)); }

}  // namespace

TEST("snapshot crc32c: check value, table = hardware, continuation, pages") {
  CHECK_EQ(crc32c("123456789", 9), 0xE3069283u);
  CHECK_EQ(crc32c_table("123456789", 9), 0xE3069283u);
  std::mt19937 rng(1);
  std::vector<uint8_t> data(70000);
  for (auto& b : data) b = static_cast<uint8_t>(rng());
  for (size_t len : {0, 1, 7, 8, 9, 63, 4096, 70000}) CHECK_EQ(crc32c(data.data(), len), crc32c_table(data.data(), len));
  CHECK_EQ(crc32c(data.data() + 1000, 5000, crc32c(data.data(), 1000)), crc32c(data.data(), 6000));
  const uint8_t* pages[7];
  uint32_t crcs[7];
  for (int i = 0; i < 7; i++) pages[i] = data.data() + i * 9000;
  crc32c_pages(pages, 7, 4096, crcs);
  for (int i = 0; i < 7; i++) CHECK_EQ(crcs[i], crc32c(pages[i], 4096));
}

TEST("snapshot envelope: round trip in memory and through a file") {
  auto file = encode_state_file(golden_host(), sample_body());
  CHECK(parse_state_file(file.data(), file.size(), golden_host()) == sample_body());
  TempDir dir("torpor-envelope");
  write_state_file(dir.file("vm.state"), golden_host(), sample_body());
  CHECK(read_state_file(dir.file("vm.state"), golden_host()) == sample_body());
  // An empty body is a valid (if useless) state.
  auto empty = encode_state_file(golden_host(), {});
  CHECK(parse_state_file(empty.data(), empty.size(), golden_host()).empty());
  // Writing again replaces the file whole.
  write_state_file(dir.file("vm.state"), golden_host(), {1, 2, 3});
  CHECK(read_state_file(dir.file("vm.state"), golden_host()) == std::vector<uint8_t>({1, 2, 3}));
}

TEST("snapshot envelope: fingerprint round trip") {
  StateWriter w;
  write_fingerprint(w, golden_host());
  StateReader r(w.data());
  CHECK(read_fingerprint(r) == golden_host());
  r.expect_end();
}

TEST("snapshot envelope: each header field corrupted is SNAPSHOT_INVALID") {
  const auto good = encode_state_file(golden_host(), sample_body());
  const HostFingerprint here = golden_host();
  const uint32_t fp_bytes = [&] { uint32_t v; std::memcpy(&v, &good[16], 4); return v; }();
  auto with = [&](auto mutate) {
    auto f = good;
    mutate(f);
    reseal(f);  // past the checksum: the field's own check must refuse it
    return f;
  };
  std::string msg;
  CHECK_STR_EQ(error_of(with([](auto& f) { f[0] = 'X'; }), here, &msg), std::string("SNAPSHOT_INVALID"));
  CHECK(msg.find("magic") != std::string::npos);
  CHECK_STR_EQ(error_of(with([](auto& f) { put32(f, 8, 2); }), here, &msg), std::string("SNAPSHOT_INVALID"));
  CHECK(msg.find("version 2") != std::string::npos);
  CHECK_STR_EQ(error_of(with([](auto& f) { put32(f, 8, 0); }), here), std::string("SNAPSHOT_INVALID"));
  CHECK_STR_EQ(error_of(with([](auto& f) { put32(f, 12, 1); }), here, &msg), std::string("SNAPSHOT_INVALID"));
  CHECK(msg.find("flags") != std::string::npos);
  CHECK_STR_EQ(error_of(with([&](auto& f) { put32(f, 16, fp_bytes + 1); }), here), std::string("SNAPSHOT_INVALID"));
  CHECK_STR_EQ(error_of(with([&](auto& f) { put32(f, 16, fp_bytes - 1); }), here), std::string("SNAPSHOT_INVALID"));
  CHECK_STR_EQ(error_of(with([](auto& f) { put32(f, 16, 0xFFFFFFFF); }), here), std::string("SNAPSHOT_INVALID"));
  CHECK_STR_EQ(error_of(with([](auto& f) { put32(f, 20, 1); }), here), std::string("SNAPSHOT_INVALID"));
  CHECK_STR_EQ(error_of(with([](auto& f) { put64(f, 24, 301); }), here, &msg), std::string("SNAPSHOT_INVALID"));
  CHECK(msg.find("do not match the file size") != std::string::npos);
  CHECK_STR_EQ(error_of(with([](auto& f) { put64(f, 24, 299); }), here), std::string("SNAPSHOT_INVALID"));
  CHECK_STR_EQ(error_of(with([](auto& f) { put64(f, 24, ~0ull); }), here), std::string("SNAPSHOT_INVALID"));
  CHECK_STR_EQ(error_of(with([](auto& f) { put64(f, 24, 1ull << 63); }), here), std::string("SNAPSHOT_INVALID"));
  // A malformed fingerprint under a valid checksum (a writer bug) is refused too.
  CHECK_STR_EQ(error_of(with([](auto& f) { f[32] = 200; }), here), std::string("SNAPSHOT_INVALID"));
  // The checksum itself, the body, the fingerprint: caught by the checksum.
  auto bad_crc = good;
  bad_crc.back() ^= 1;
  CHECK_STR_EQ(error_of(bad_crc, here, &msg), std::string("SNAPSHOT_INVALID"));
  CHECK(msg.find("checksum") != std::string::npos);
}

TEST("snapshot envelope: every truncation, extension and bit flip is SNAPSHOT_INVALID") {
  const auto good = encode_state_file(golden_host(), sample_body());
  for (size_t len = 0; len < good.size(); len++) {
    std::vector<uint8_t> cut(good.begin(), good.begin() + len);
    CHECK_STR_EQ(error_of(cut, golden_host()), std::string("SNAPSHOT_INVALID"));
  }
  auto longer = good;
  longer.push_back(0);
  CHECK_STR_EQ(error_of(longer, golden_host()), std::string("SNAPSHOT_INVALID"));
  for (size_t bit = 0; bit < good.size() * 8; bit++) {
    auto f = good;
    f[bit / 8] ^= static_cast<uint8_t>(1u << (bit % 8));
    CHECK_STR_EQ(error_of(f, golden_host()), std::string("SNAPSHOT_INVALID"));
  }
}

TEST("snapshot envelope: validation order (version before checksum, checksum before fingerprint)") {
  auto f = encode_state_file(golden_host(), sample_body());
  put32(f, 8, 7);  // wrong version and now a wrong checksum too
  std::string msg;
  CHECK_STR_EQ(error_of(f, golden_host(), &msg), std::string("SNAPSHOT_INVALID"));
  CHECK(msg.find("version 7") != std::string::npos);
  // A corrupt file from another host kind: corrupt wins (nothing in it can be trusted).
  HostFingerprint hw = golden_host();
  hw.host_kind = "hardware";
  auto g = encode_state_file(hw, sample_body());
  g[40] ^= 0x10;
  CHECK_STR_EQ(error_of(g, golden_host()), std::string("SNAPSHOT_INVALID"));
}

TEST("snapshot envelope: another host is SNAPSHOT_INCOMPATIBLE naming the difference") {
  const HostFingerprint here = golden_host();
  auto refused = [&](auto mutate, const char* words) {
    HostFingerprint saved = golden_host();
    mutate(saved);
    auto f = encode_state_file(saved, sample_body());
    std::string msg;
    CHECK_STR_EQ(error_of(f, here, &msg), std::string("SNAPSHOT_INCOMPATIBLE"));
    if (msg.find(words) == std::string::npos) torpor_test::fail(__FILE__, __LINE__, "message '" + msg + "' lacks '" + words + "'");
  };
  refused([](auto& s) { s.host_kind = "hardware"; }, "taken on a hardware host and this is a pvm host");
  refused([](auto& s) { s.cpu_vendor = "AuthenticAMD"; }, "CPU vendor AuthenticAMD there, GenuineIntel here");
  refused([](auto& s) { s.features[2] |= 1u << 2; }, "lacks feature CPUID.7.0:EBX bit 2");
  refused([](auto& s) { s.features.pop_back(); }, "describe CPU features differently");
  refused([](auto& s) { s.tsc_khz = 3000000; }, "TSC frequency 3000000 kHz there, 2000000 kHz here");
  refused([](auto& s) { s.kvm_api = 11; }, "KVM API version 11");
  refused([](auto& s) { s.kvm_module_id = "OTHER"; }, "KVM module 'OTHER' there");
  // A snapshot from a CPU with fewer features restores on this one; model and stepping may differ.
  HostFingerprint older = golden_host();
  older.features[0] &= ~(1u << 30);
  older.model = 85;
  older.stepping = 1;
  auto f = encode_state_file(older, sample_body());
  CHECK(parse_state_file(f.data(), f.size(), here) == sample_body());
  // Hardware and PVM never interchange, either way round.
  HostFingerprint hw = golden_host();
  hw.host_kind = "hardware";
  hw.kvm_module_id = "";
  auto pvm_file = encode_state_file(golden_host(), sample_body());
  CHECK_STR_EQ(error_of(pvm_file, hw), std::string("SNAPSHOT_INCOMPATIBLE"));
  // An unknown host kind in a well-formed file is malformed, not another host.
  HostFingerprint odd = golden_host();
  odd.host_kind = "tcg";
  auto odd_file = encode_state_file(odd, sample_body());
  CHECK_STR_EQ(error_of(odd_file, here), std::string("SNAPSHOT_INVALID"));
}

TEST("snapshot envelope: size cap, missing file, body over the cap") {
  TempDir dir("torpor-envelope");
  const std::string big = dir.file("big.state");
  {
    int fd = ::open(big.c_str(), O_CREAT | O_WRONLY, 0644);
    CHECK(fd >= 0);
    CHECK_EQ(::ftruncate(fd, static_cast<off_t>(kMaxStateFileBytes + 1)), 0);  // sparse: costs nothing
    ::close(fd);
  }
  CHECK_THROWS_CODE(read_state_file(big, golden_host()), "SNAPSHOT_INVALID");
  CHECK_THROWS_CODE(read_state_file(dir.file("absent.state"), golden_host()), "IO_ERROR");
  std::vector<uint8_t> huge(kMaxStateFileBytes);
  CHECK_THROWS_CODE(encode_state_file(golden_host(), huge), "INVALID_ARGUMENT");
}
