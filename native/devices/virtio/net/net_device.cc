#include "devices/virtio/net/net_device.h"

#include <cstdio>
#include <cstring>

#include "common/error.h"
#include "devices/virtio/serve_queue.h"

namespace torpor {

using namespace virtio_net;

bool parse_mac(const std::string& text, MacAddress* out) {
  if (text.size() != 17) return false;
  MacAddress mac{};
  for (size_t i = 0; i < 6; i++) {
    if (i < 5 && text[i * 3 + 2] != ':') return false;
    unsigned v = 0;
    for (size_t j = 0; j < 2; j++) {
      char c = text[i * 3 + j];
      unsigned d;
      if (c >= '0' && c <= '9') d = static_cast<unsigned>(c - '0');
      else if (c >= 'a' && c <= 'f') d = static_cast<unsigned>(c - 'a' + 10);
      else if (c >= 'A' && c <= 'F') d = static_cast<unsigned>(c - 'A' + 10);
      else return false;
      v = v * 16 + d;
    }
    mac[i] = static_cast<uint8_t>(v);
  }
  if (mac[0] & 1) return false;  // multicast: never an interface's own address
  *out = mac;
  return true;
}

std::string format_mac(const MacAddress& mac) {
  char buf[18];
  std::snprintf(buf, sizeof(buf), "%02x:%02x:%02x:%02x:%02x:%02x", mac[0], mac[1], mac[2], mac[3], mac[4], mac[5]);
  return buf;
}

VirtioNetDevice::VirtioNetDevice(GuestMemory& mem, const MacAddress& mac) : mem_(mem), mac_(mac) {
  if (mac_[0] & 1) throw Error(code::kInvalidArgument, "a MAC address must not be multicast");
}

uint64_t VirtioNetDevice::device_features() const { return kFMac | kFStatus | virtio::kFRingFeatures; }

void VirtioNetDevice::read_config(uint64_t offset, uint8_t* data, size_t len) {
  uint8_t cfg[kConfigLen] = {};
  std::memcpy(cfg, mac_.data(), 6);
  uint16_t status = link_up() ? kStatusLinkUp : 0;
  std::memcpy(cfg + 6, &status, 2);
  uint16_t pairs = 1;
  std::memcpy(cfg + 8, &pairs, 2);
  for (size_t i = 0; i < len; i++) data[i] = offset + i < kConfigLen ? cfg[offset + i] : 0;
}

void VirtioNetDevice::activate() {
  rx_waiting_ = false;
  tx_stalled_ = false;
  rx_unsignalled_ = false;
  // Frames the backend held back for want of a driver can flow now.
  if (backend_) backend_->rx_ready();
}

void VirtioNetDevice::reset() {
  flows_.clear();
  rx_waiting_ = false;
  tx_stalled_ = false;
  rx_unsignalled_ = false;
}

void VirtioNetDevice::unquiesce() {
  quiesced_ = false;
  if (rx_waiting_ && backend_) {
    rx_waiting_ = false;
    backend_->rx_ready();
  }
  if (tx_stalled_ && transport_ && transport_->active()) process_tx();
}

void VirtioNetDevice::own_backend(std::unique_ptr<NetBackend> backend) {
  std::unique_ptr<NetBackend> old;
  if (!transport_) {
    owned_backend_ = std::move(backend);
    return;
  }
  std::lock_guard<std::mutex> lock(transport_->lock());
  old = std::move(owned_backend_);  // declared first: destroyed after the lock is released
  owned_backend_ = std::move(backend);
}

void VirtioNetDevice::drop_backend() {
  std::unique_ptr<NetBackend> old;
  if (!transport_) {
    old = std::move(owned_backend_);
    return;
  }
  std::lock_guard<std::mutex> lock(transport_->lock());
  old = std::move(owned_backend_);  // declared first: destroyed after the lock is released
}

void VirtioNetDevice::set_backend(NetBackend* backend) {
  bool was_up = link_up();
  backend_ = backend;
  rx_waiting_ = false;
  // A new backend knows none of the guest's connections (after a restore, or a backend that
  // died and was replaced): their next segments are answered with a reset (tcp_flows.h).
  if (backend_) flows_.clear();
  if (transport_ && transport_->active() && was_up != link_up()) transport_->signal_config_change();
  if (backend_ && tx_stalled_ && transport_ && transport_->active() && !quiesced_) process_tx();
}

void VirtioNetDevice::queue_notify(uint32_t index) {
  if (!transport_ || quiesced_) return;
  if (index == kRxQueue) {
    // New rx buffers: a refused frame can be delivered now.
    if (rx_waiting_ && backend_) {
      rx_waiting_ = false;
      backend_->rx_ready();
    }
  } else if (index == kTxQueue) {
    process_tx();
  }
}

void VirtioNetDevice::tx_ready() {
  if (!tx_stalled_ || !transport_ || !transport_->active() || quiesced_) return;
  process_tx();
}

void VirtioNetDevice::process_tx() {
  tx_stalled_ = false;
  if (!transport_->queue(kTxQueue).ready()) return;
  serve_queue(
      *transport_, mem_, kTxQueue, tx_chain_,
      [this](const DescriptorChain& chain) {
        send_chain(chain);
        return uint32_t{0};  // the device writes nothing into a tx buffer
      },
      [this] {
        if (quiesced_) return true;
        if (backend_ && !backend_->can_send()) {
          if (!tx_stalled_) stats_.tx_stalls++;
          tx_stalled_ = true;
          return true;
        }
        return false;
      });
  if (reset_unsignalled_) {
    reset_unsignalled_ = false;
    end_rx_batch();
  }
}

void VirtioNetDevice::send_chain(const DescriptorChain& chain) {
  uint64_t total = chain.readable_bytes();
  if (total < kHeaderLen + kEthHeaderLen || total > kHeaderLen + kMaxFrameLen || !backend_) {
    stats_.tx_dropped++;
    return;
  }
  size_t frame_len = static_cast<size_t>(total - kHeaderLen);
  scratch_.resize(frame_len);
  if (!chain.read(mem_, kHeaderLen, scratch_.data(), frame_len)) {
    stats_.tx_dropped++;
    return;
  }
  if (!egress_allows(policy_, scratch_.data(), frame_len)) {
    stats_.tx_filtered++;
    return;
  }
  if (!flows_.guest_sends(scratch_.data(), frame_len, &reset_)) {
    stats_.tx_reset++;
    deliver_reset();
    return;
  }
  backend_->send(scratch_.data(), frame_len);
  stats_.tx_frames++;
  stats_.tx_bytes += frame_len;
}

void VirtioNetDevice::refused() {
  if (!rx_waiting_) stats_.rx_refused++;
  rx_waiting_ = true;
}

// The RST for a stale flow goes up the rx queue like a backend's frame. No rx buffer now: it is
// dropped (not owed to the backend), and the guest's retransmission gets another one.
void VirtioNetDevice::deliver_reset() {
  bool waiting = rx_waiting_;
  uint64_t refusals = stats_.rx_refused;
  if (receive(reset_.data(), reset_.size())) {
    reset_unsignalled_ = true;
  } else {
    rx_waiting_ = waiting;
    stats_.rx_refused = refusals;
  }
}

bool VirtioNetDevice::receive(const uint8_t* frame, size_t len) {
  if (quiesced_) {
    refused();
    return false;
  }
  if (!transport_ || !transport_->active() || !transport_->queue(kRxQueue).ready() || len < kEthHeaderLen ||
      len > kMaxFrameLen) {
    stats_.rx_dropped++;  // no driver to take it, or not a frame: Ethernet may drop
    return true;
  }
  Virtqueue& q = transport_->queue(kRxQueue);
  PopStatus st = q.pop(mem_, rx_chain_);
  if (st == PopStatus::kEmpty) {
    refused();
    return false;
  }
  if (st == PopStatus::kBroken) {
    transport_->fail(q.error().c_str());
    stats_.rx_dropped++;
    return true;
  }
  if (rx_chain_.writable_bytes() < kHeaderLen + len) {
    // Too large for the buffers this driver posts: drop the frame, keep the buffer.
    q.undo_pop();
    stats_.rx_dropped++;
    return true;
  }
  uint8_t hdr[kHeaderLen] = {};
  uint16_t num_buffers = 1;
  std::memcpy(hdr + 10, &num_buffers, 2);
  if (!rx_chain_.write(mem_, 0, hdr, kHeaderLen) || !rx_chain_.write(mem_, kHeaderLen, frame, len)) {
    transport_->fail("virtio-net: rx buffer not writable");
    return true;
  }
  if (!q.add_used(mem_, rx_chain_.head(), static_cast<uint32_t>(kHeaderLen + len))) {
    transport_->fail(q.error().c_str());
    return true;
  }
  rx_unsignalled_ = true;
  stats_.rx_frames++;
  stats_.rx_bytes += len;
  flows_.backend_sends(frame, len);
  return true;
}

void VirtioNetDevice::end_rx_batch() {
  if (!rx_unsignalled_ || !transport_ || !transport_->active()) return;
  rx_unsignalled_ = false;
  transport_->signal_used(kRxQueue);
}

void VirtioNetDevice::save(StateWriter& out) const {
  out.header("virtio-net", 1);
  out.raw(mac_.data(), mac_.size());
  out.boolean(link_up());
}

void VirtioNetDevice::restore(StateReader& in) {
  in.expect_header("virtio-net", 1, 1);
  MacAddress mac;
  in.raw(mac.data(), mac.size());
  if (mac[0] & 1) StateReader::fail("virtio-net: multicast MAC in the snapshot");
  (void)in.boolean();  // the link follows the backend attached now, not the one saved
  mac_ = mac;
  flows_.clear();  // the connections in the snapshot belong to a backend that is gone
  rx_waiting_ = false;
  tx_stalled_ = false;
  rx_unsignalled_ = false;
}

}  // namespace torpor
