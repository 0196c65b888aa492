// Fuzz target: the agent protocol's frame codec as the guest side runs it
// (guest/agent/proto/frame.c, linked by the agent and the test guest): a
// stream of frames from an untrusted peer. Every header is decoded; a frame
// whose payload is there is walked field by field with every typed accessor,
// then re-encoded with the writer and read back: the fields must come back
// identical. Cheap per input: no allocation beyond one static buffer.
//
//   make -C native/fuzz libfuzzer; native/fuzz/campaign.sh   (clang)
//   make -C native/fuzz run                                   (g++: random inputs)
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <vector>

extern "C" {
#include "proto/frame.h"
}

namespace {

long g_frames = 0, g_fields = 0, g_rejected = 0;
uint8_t g_out[TP_FRAME_HEADER_SIZE + TP_MAX_PAYLOAD + 64];

void check_frame(const tp_header& h, const uint8_t* payload) {
  if (tp_payload_validate(payload, h.length) != TP_OK_) {
    g_rejected++;
    return;
  }
  tp_writer w;
  tp_writer_init(&w, g_out, sizeof g_out);
  tp_writer_frame(&w, h.stream, h.type, h.flags);
  tp_reader r;
  tp_reader_init(&r, payload, h.length);
  tp_field f;
  int rc;
  while ((rc = tp_reader_next(&r, &f)) == TP_OK_) {
    g_fields++;
    if (f.len > h.length || f.value < payload || f.value + f.len > payload + h.length) std::abort();
    if (tp_field_check(&f) != TP_OK_) std::abort();  // the reader checked it already
    uint32_t u32;
    uint64_t u64;
    int32_t i32;
    int64_t i64;
    int b;
    (void)tp_field_u32(&f, &u32);
    (void)tp_field_u64(&f, &u64);
    (void)tp_field_i32(&f, &i32);
    (void)tp_field_i64(&f, &i64);
    (void)tp_field_bool(&f, &b);
    tp_put_bytes(&w, f.tag, f.value, f.len);
  }
  if (rc != TP_END) std::abort();  // validate said every field is well formed
  // The writer makes frames up to TP_MAX_PAYLOAD; larger EXEC requests only come in.
  if (h.length > TP_MAX_PAYLOAD) return;
  size_t total = tp_writer_finish(&w);
  if (total != TP_FRAME_HEADER_SIZE + h.length) std::abort();
  tp_header back;
  if (tp_header_decode(g_out, total, &back) != TP_OK_) std::abort();
  if (back.length != h.length || back.stream != h.stream || back.type != h.type || back.flags != h.flags) std::abort();
  if (std::memcmp(g_out + TP_FRAME_HEADER_SIZE, payload, h.length) != 0) std::abort();
  g_frames++;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  size_t pos = 0;
  while (pos < size) {
    tp_header h;
    int rc = tp_header_decode(data + pos, size - pos, &h);
    if (rc == TP_NEED_MORE) break;
    if (rc < 0) {
      g_rejected++;
      break;  // the connection closes
    }
    if (h.length > (h.type == TP_EXEC ? TP_MAX_EXEC_PAYLOAD : TP_MAX_PAYLOAD)) std::abort();
    if (size - pos - TP_FRAME_HEADER_SIZE < h.length) break;  // payload still to come
    check_frame(h, data + pos + TP_FRAME_HEADER_SIZE);
    pos += TP_FRAME_HEADER_SIZE + h.length;
  }
  return 0;
}

#ifdef TORPOR_FUZZ_STANDALONE
// Random frames with plausible headers (length matching what follows, known
// flags) and random field sequences.
int main(int argc, char** argv) {
  long iterations = argc > 1 ? std::atol(argv[1]) : 20000;
  std::mt19937_64 rng(argc > 2 ? std::atoll(argv[2]) : 1);
  std::vector<uint8_t> input;
  for (long it = 0; it < iterations; it++) {
    input.clear();
    int frames = 1 + static_cast<int>(rng() % 4);
    for (int f = 0; f < frames; f++) {
      std::vector<uint8_t> payload;
      int fields = static_cast<int>(rng() % 6);
      for (int i = 0; i < fields; i++) {
        uint16_t tag = static_cast<uint16_t>(rng() % 60);
        uint32_t len = rng() % 3 ? static_cast<uint32_t>(rng() % 9) : static_cast<uint32_t>(rng() % 300);
        uint8_t hdr[6];
        tp_put16(hdr, tag);
        tp_put32(hdr + 2, len);
        payload.insert(payload.end(), hdr, hdr + 6);
        for (uint32_t j = 0; j < len; j++) payload.push_back(static_cast<uint8_t>(rng()));
      }
      if (rng() % 5 == 0 && !payload.empty()) payload[rng() % payload.size()] ^= static_cast<uint8_t>(rng());
      uint8_t hdr[TP_FRAME_HEADER_SIZE];
      tp_header h{static_cast<uint32_t>(payload.size()), static_cast<uint32_t>(rng() % 8),
                  static_cast<uint16_t>(rng() % 80), static_cast<uint16_t>(rng() % 8 ? rng() % 4 : rng())};
      tp_header_encode(hdr, &h);
      input.insert(input.end(), hdr, hdr + sizeof hdr);
      input.insert(input.end(), payload.begin(), payload.end());
    }
    LLVMFuzzerTestOneInput(input.data(), input.size());
  }
  std::printf("agent_frame_fuzz: %ld random inputs, %ld frames round-tripped, %ld fields, %ld rejected, no crash\n",
              iterations, g_frames, g_fields, g_rejected);
  return 0;
}
#endif
