#!/usr/bin/env python3
"""Writes the hand-made seed inputs of native/fuzz/corpus/<target> (the kernel
loader's images come from test/vmm-guests.ts: node --import tsx
native/fuzz/make_kernel_seeds.ts). Each seed is a well-formed input of its
target's format (see the comment at the top of each *_fuzz.cc), so mutations
start past the first checks. Run from the repository root."""
import os, struct

root = 'native/fuzz/corpus'

def put(target, name, data):
    with open(os.path.join(root, target, name), 'wb') as f:
        f.write(data)

# --- vsock: [mode][records: ctl u8, len u16, bytes]
def vhdr(op, src_port=5000, dst_port=0, length=0, buf_alloc=65536, fwd=0, flags=0):
    # src_cid u64, dst_cid u64, src_port u32, dst_port u32, len u32, type u16, op u16, flags u32, buf_alloc u32, fwd_cnt u32
    return struct.pack('<QQIIIHHIII', 3, 2, src_port, dst_port, length, 1, op, flags, buf_alloc, fwd)
def rec(ctl, body=b''):
    return bytes([ctl]) + struct.pack('<H', len(body)) + body
put('vsock', 'connect-only', b'\x01')
# ctl & 7 in 0..3 sends a packet; ctl & 8 aims it at the live connection with op 1 + (op % 7).
put('vsock', 'rw-then-drain', b'\x01' + rec(0x08, vhdr(4, length=5) + b'hello') + rec(6))
put('vsock', 'host-write-read', b'\x01' + rec(4, b'from the host') + rec(6) + rec(5) + rec(6))
put('vsock', 'credit-shutdown', b'\x01' + rec(0x08, vhdr(5)) + rec(0x08 | 1, vhdr(3, flags=3)) + rec(6))
put('vsock', 'split-chain', b'\x01' + rec(0x08 | 0x10 | 2, vhdr(4, length=100) + bytes(100)) + rec(6))
put('vsock', 'resets', b'\x01' + rec(7 | 0x08) + rec(6) + rec(7) + rec(6) + rec(7 | 0x10))
put('vsock', 'no-connection-request', b'\x00' + rec(0, vhdr(1, dst_port=1234)) + rec(6))

# --- virtqueue: [qexp][flags][chains-1] per chain [segs-1] per seg [off u16][len/16][kind], then data bytes
def seg(off, len16, kind):
    return struct.pack('<HBB', off, len16, kind)
def blk_header(t, sector):
    return struct.pack('<IIQ', t, 0, sector)
data = bytearray(0x600)
data[0:16] = blk_header(0, 0)          # IN, sector 0
data[0x20:0x30] = blk_header(1, 2)     # OUT, sector 2
data[0x40:0x50] = blk_header(4, 0)     # FLUSH
data[0x60:0x70] = blk_header(8, 0)     # GET_ID
read_chain = bytes([2]) + seg(0, 1, 0) + seg(0x100, 32, 1) + seg(0x500, 1, 1)
write_chain = bytes([2]) + seg(0x20, 1, 0) + seg(0x200, 32, 0) + seg(0x510, 1, 1)
flush_chain = bytes([1]) + seg(0x40, 1, 0) + seg(0x520, 1, 1)
id_chain = bytes([2]) + seg(0x60, 1, 0) + seg(0x300, 2, 1) + seg(0x530, 1, 1)
put('virtqueue', 'blk-read', bytes([3, 0, 0]) + read_chain + bytes(data))
put('virtqueue', 'blk-requests', bytes([4, 1, 3]) + read_chain + write_chain + flush_chain + id_chain + bytes(data))
indirect = bytes([2]) + seg(0, 1, 8) + seg(0x100, 32, 1) + seg(0x500, 1, 1)
put('virtqueue', 'blk-indirect', bytes([3, 2 | 16, 0]) + indirect + bytes(data))
put('virtqueue', 'loop', bytes([2, 0, 0, 1]) + seg(0, 1, 16) + seg(0x100, 1, 16) + bytes(data))
put('virtqueue', 'bad-address', bytes([3, 0, 0, 1]) + seg(0, 1, 0) + seg(0x100, 32, 3) + bytes(data))

# --- agent_frame: frames [len u32][stream u32][type u16][flags u16] payload of fields [tag u16][len u32][value]
def field(tag, value):
    return struct.pack('<HI', tag, len(value)) + value
def frame(t, fields, stream=0, flags=0):
    p = b''.join(fields)
    return struct.pack('<IIHH', len(p), stream, t, flags) + p
put('agent_frame', 'hello', frame(1, [field(1, struct.pack('<I', 1)), field(2, struct.pack('<Q', 0xff)), field(3, b'nonce-0123')]))
put('agent_frame', 'ping-pong', frame(2, [field(5, struct.pack('<I', 7))]) + frame(3, [field(5, struct.pack('<I', 7))]))
put('agent_frame', 'exec', frame(16, [field(12, b'/bin/echo'), field(12, b'hi'), field(14, b'A=1'), field(18, struct.pack('<I', 1000)), field(40, b'\x01')], stream=1))
put('agent_frame', 'file-write', frame(33, [field(10, b'/tmp/x'), field(25, struct.pack('<Q', 0)), field(27, b'data' * 8), field(28, struct.pack('<I', 0o644))], stream=3, flags=1))
put('agent_frame', 'err', frame(70, [field(7, b'ENOENT'), field(8, struct.pack('<i', 2)), field(9, b'no such file')], stream=3, flags=3))
put('agent_frame', 'nested-entry', frame(34, [field(31, field(10, b'a') + field(32, b'\x01') + field(33, struct.pack('<Q', 5)))], stream=5, flags=1))

# --- overlay_map: [size sel][fix][map len u16][map bytes][ops: op, block, len, byte]
def ops(*o):
    return b''.join(bytes(x) for x in o)
put('overlay_map', 'valid-map-ops', bytes([8, 1]) + struct.pack('<H', 2) + b'\x05\x01' + ops((0, 3, 40, 0x11), (3, 3, 40, 0), (1, 0, 255, 0), (2, 0, 0, 0), (3, 0, 200, 0)))
put('overlay_map', 'valid-map-short-disk', bytes([0x40 | 5, 1]) + struct.pack('<H', 1) + b'\x1f' + ops((1, 0, 255, 0), (3, 0, 255, 0)))
put('overlay_map', 'raw-map', bytes([3, 0]) + struct.pack('<H', 16) + b'TORPOVL1' + bytes(8) + ops((0, 1, 1, 0x22), (3, 0, 9, 0)))
put('overlay_map', 'corrupt-valid', bytes([16, 3 | (5 << 2)]) + struct.pack('<H', 2) + b'\xff\x00' + ops((3, 0, 100, 0)))

# --- net: [event_idx][records: op, then by op % 10 (net_fuzz.cc): tx/frame [len u16][bytes],
# rx buffer [len u16], egress policy [port u16], save/restore [index][xor], stream [len u8][bytes]]
GUEST_MAC, GW_MAC = bytes.fromhex('525400010203'), bytes.fromhex('9a55'+'9a55'+'9a55')
GUEST_IP, GW_IP, OUTSIDE_IP = bytes([10, 0, 2, 15]), bytes([10, 0, 2, 2]), bytes([192, 0, 2, 1])
def ip_sum(b):
    s = sum(struct.unpack('!%dH' % (len(b) // 2), b + b'\0' * (len(b) % 2)))
    while s >> 16:
        s = (s & 0xffff) + (s >> 16)
    return ~s & 0xffff
def eth(dst, src, kind, payload):
    return dst + src + struct.pack('!H', kind) + payload
def arp(op, sha, spa, tha, tpa):
    return struct.pack('!HHBBH', 1, 0x0800, 6, 4, op) + sha + spa + tha + tpa
def tcp(src, dst, sport, dport, flags, seq=1000, ack=0):
    seg = struct.pack('!HHIIBBHHH', sport, dport, seq, ack, 5 << 4, flags, 65535, 0, 0)
    seg = seg[:16] + struct.pack('!H', ip_sum(src + dst + struct.pack('!BBH', 0, 6, len(seg)) + seg)) + seg[18:]
    ip = struct.pack('!BBHHHBBH4s4s', 0x45, 0, 20 + len(seg), 0, 0x4000, 64, 6, 0, src, dst)
    return ip[:10] + struct.pack('!H', ip_sum(ip)) + ip[12:] + seg
SYN, ACK, FIN, PSH = 0x02, 0x10, 0x01, 0x08
HDR = bytes(12)  # virtio_net_hdr_v1, no offloads
def tx(frame, op=0):
    return bytes([op]) + struct.pack('<H', len(HDR) + len(frame)) + HDR + frame
def rx_buffer(n=1600):
    return bytes([2]) + struct.pack('<H', n)
def from_net(frame, op=3):
    return bytes([op]) + struct.pack('<H', len(frame)) + frame
arp_request = eth(b'\xff' * 6, GUEST_MAC, 0x0806, arp(1, GUEST_MAC, GUEST_IP, bytes(6), GW_IP))
arp_reply = eth(GUEST_MAC, GW_MAC, 0x0806, arp(2, GW_MAC, GW_IP, GUEST_MAC, GUEST_IP))
def guest_tcp(dst, dport, flags, **kw):
    return eth(GW_MAC, GUEST_MAC, 0x0800, tcp(GUEST_IP, dst, 40000, dport, flags, **kw))
def net_tcp(src, sport, flags, **kw):
    return eth(GUEST_MAC, GW_MAC, 0x0800, tcp(src, GUEST_IP, sport, 40000, flags, **kw))
os.makedirs(os.path.join(root, 'net'), exist_ok=True)
put('net', 'arp', b'\x01' + tx(arp_request) + rx_buffer() + from_net(arp_reply, 3 | 0x10))
put('net', 'tcp-flow', b'\x01' + rx_buffer() + rx_buffer() + tx(guest_tcp(OUTSIDE_IP, 80, SYN)) +
    from_net(net_tcp(OUTSIDE_IP, 80, SYN | ACK, seq=5000, ack=1001)) +
    tx(guest_tcp(OUTSIDE_IP, 80, ACK | PSH, seq=1001, ack=5001) + b'GET / HTTP/1.0\r\n\r\n', 0x10) +
    tx(guest_tcp(OUTSIDE_IP, 80, FIN | ACK, seq=1019, ack=5001)))
# A segment of a flow the backend never saw: the device answers with an RST on rx.
put('net', 'tcp-unknown-flow-reset', b'\x01' + rx_buffer() + tx(guest_tcp(OUTSIDE_IP, 443, ACK | PSH, seq=7, ack=9) + b'x'))
put('net', 'egress-off', b'\x00' + bytes([7 | 0x10]) + struct.pack('<H', 8080) + rx_buffer() +
    tx(guest_tcp(OUTSIDE_IP, 80, SYN)) + tx(arp_request) +
    from_net(net_tcp(GW_IP, 50000, SYN, seq=1)) +
    tx(eth(GW_MAC, GUEST_MAC, 0x0800, tcp(GUEST_IP, GW_IP, 8080, 50000, SYN | ACK, seq=1, ack=2))))
put('net', 'backpressure-save-reset', b'\x01' + bytes([5]) + tx(arp_request) + tx(arp_request, 0x20) +
    bytes([5 | 0x40]) + bytes([8, 3, 0x40]) + bytes([6 | 0x10, 6]) + bytes([8 | 0x10]) + tx(arp_request))
put('net', 'stream-frame', b'\x00' + bytes([9, 4 + len(arp_reply)]) + struct.pack('!I', len(arp_reply)) + arp_reply)
