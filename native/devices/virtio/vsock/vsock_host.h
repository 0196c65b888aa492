// The vsock device as its host sees it: the options it is made with, its
// counters, and the host side of its connections (VsockHost), which the
// machine hands out (Machine::vsock).
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <utility>
#include <vector>

namespace torpor {

struct VsockOptions {
  uint64_t guest_cid = 3;
};

// Counters of the vsock device (VsockHost::stats).
struct VsockStats {
  uint64_t tx_packets = 0;     // packets taken from the tx queue
  uint64_t rx_packets = 0;     // packets written to the rx queue
  uint64_t dropped = 0;        // malformed packets dropped
  uint64_t rst_sent = 0;
  uint64_t connections = 0;    // connections established
  uint64_t live = 0;           // connections now in the table
  uint64_t events = 0;         // transport reset events delivered
  uint64_t knocks = 0;         // guest REQUESTs to a knock port (VsockHost::set_knock_ports)
  // Host REQUESTs that waited after a transport reset until the guest re-posted its event buffer.
  uint64_t held_requests = 0;
  std::string last_drop;       // why the last packet was dropped
};

// Host side of the vsock device: host-initiated stream connections.
class VsockHost {
 public:
  virtual ~VsockHost() = default;
  // Opens a connection to the guest's port. `done` runs on the I/O thread
  // once the guest answered: with the host end of a socketpair (the caller
  // owns it) or with fd = -1 and an error code/message (VSOCK_REFUSED on RST,
  // TIMEOUT when the guest never answered within timeout_ms).
  virtual void connect(uint32_t port, uint32_t timeout_ms,
                       std::function<void(int fd, const char* code, const std::string& message)> done) = 0;
  // Sends a transport-reset event to the guest and drops every connection
  // (used after restore).
  virtual void transport_reset() = 0;
  // Host ports (1..1023, below every ephemeral port of ours) on which a
  // guest-initiated REQUEST is a knock: the guest saying "I listen now"
  // (docs/protocol.md, the agent's knock). A knock is counted per port,
  // answered RST, and reported through `knocked`, called on the I/O thread
  // with no lock held, with at most one report outstanding: a guest knocking
  // in a loop costs a counter, never memory. Call before the machine starts;
  // replaces any earlier set (and keeps no counts).
  virtual void set_knock_ports(const std::vector<uint32_t>& ports, std::function<void()> knocked) = 0;
  // Knocks counted on each knock port since set_knock_ports (latched: a
  // waiter that looks late still sees them), in port order.
  virtual std::vector<std::pair<uint32_t, uint64_t>> knocks() const = 0;
  // The device's counters (takes the transport's lock).
  virtual VsockStats stats() const = 0;
};

}  // namespace torpor
