// The guest's IPv4 TCP flows that the current backend knows: those whose SYN crossed the device
// since the backend was attached. A backend is per run of the machine (passt after a create, a
// fresh passt after each restore), so a connection the guest opened before a pause is unknown to
// it, and Debian 12's passt drops such segments without an answer: the guest would retransmit
// until its own timeout. The device answers them instead, with the reset docs/architecture.md#network promises
// ("its open TCP connections see a reset"): a segment of an unknown flow is not sent, and an RST
// built from it goes back to the guest.
//
// Bounded: at most kMaxFlows entries; flows end on an RST either way, or once both sides sent
// FIN (kept until the table needs room: a last ACK after them still passes). Once a flow could
// not be tracked (the table full of live flows), unknown segments pass as before until the next
// backend: no reset is better than a wrong one.
// Parsing is bounds-checked at fixed offsets; anything that is not a plain IPv4 TCP segment
// (IPv6, fragments, short frames) passes untouched.
#pragma once

#include <cstddef>
#include <cstdint>
#include <unordered_map>
#include <vector>

namespace torpor {

class TcpFlowTable {
 public:
  static constexpr size_t kMaxFlows = 16384;

  // A new backend: every flow so far is unknown to it.
  void clear() {
    flows_.clear();
    overflowed_ = false;
  }

  // A frame the guest sends. true: send it on. false: do not; `reset` then holds the Ethernet
  // frame to deliver to the guest instead (an RST for the segment's flow).
  bool guest_sends(const uint8_t* frame, size_t len, std::vector<uint8_t>* reset);

  // A frame the backend delivers to the guest: a SYN opens a flow (a forwarded connection), an
  // RST or FIN is noted.
  void backend_sends(const uint8_t* frame, size_t len);

  size_t size() const { return flows_.size(); }
  uint64_t resets() const { return resets_; }

 private:
  // guest address, remote address, guest port, remote port: the guest's view.
  struct Key {
    uint32_t guest_ip, remote_ip;
    uint16_t guest_port, remote_port;
    bool operator==(const Key&) const = default;
  };
  struct KeyHash {
    size_t operator()(const Key& k) const {
      uint64_t a = (uint64_t{k.guest_ip} << 32) | k.remote_ip;
      uint64_t b = (uint64_t{k.guest_port} << 16) | k.remote_port;
      return static_cast<size_t>(a * 0x9e3779b97f4a7c15ull ^ (b + 0x632be59bd9b4e019ull));
    }
  };
  enum : uint8_t { kGuestFin = 1, kRemoteFin = 2 };

  bool add(const Key& k);

  std::unordered_map<Key, uint8_t, KeyHash> flows_;
  // A flow went untracked (the table was full): until the next backend, nothing is reset.
  bool overflowed_ = false;
  uint64_t resets_ = 0;
};

}  // namespace torpor
