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
