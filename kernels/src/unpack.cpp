// A GGUF tensor's blocks unpacked into the groups the CPU plugin's compressed MatMul and Gather read (the precisions
// "gguf" and "gguf-mixed", and gguf-native's embedding): for Python through ctypes, in place of numpy's unpacking
// (specdemo/models/gguf_weights.py, `unpack`, whose results these are bit for bit), which took 3.6 s of a first start's
// target conversion for its 151,936 x 1,536 Q4_K embedding alone (2-core Xeon family 6 model 207).
//
//   w[r, g·G + j] = scale[r, g] · q[r, g, j] + offset[r, g]      q i8 (rows, groups, G), scale and offset f16 bits
//
//   Q4_K  G = 32: q = nibble − 8, scale = d·sc, offset = 8·scale − dmin·m (both rounded to f16 from f32)
//   Q6_K  G = 16: q = 6-bit value − 32, scale = d·sc (sc signed), no offset
//   Q8_0  G = 32: q as stored, scale = d, no offset
//   Q5_0  G = 32: q = 5-bit value − 16, scale = d, no offset
//
// Baseline x86-64 and no FMA (CMakeLists.txt: -ffp-contract=off), so every product and difference is rounded as
// numpy's f32 arithmetic rounds it.
#include "formats.hpp"

#include <cstdint>
#include <cstring>
#include <string>

namespace {

// Single to half precision bits, rounded to nearest, ties to even, as numpy's astype(float16) rounds (overflow to
// infinity, subnormal halves kept; a NaN stays a NaN).
uint16_t fp32_to_fp16_bits(float value) {
    uint32_t x;
    std::memcpy(&x, &value, 4);
    const uint16_t sign = uint16_t((x >> 16) & 0x8000);
    const uint32_t exponent = (x >> 23) & 0xFF, mantissa = x & 0x7FFFFF;
    if (exponent == 0xFF) return sign | 0x7C00 | (mantissa ? 0x200 | (mantissa >> 13) : 0);
    const int e = int(exponent) - 127 + 15;  // the half's biased exponent
    if (e >= 31) return sign | 0x7C00;
    if (e >= 1) {  // normal: drop 13 bits, round; a carry moves into the exponent (to infinity at the top)
        uint32_t half = (uint32_t(e) << 10) | (mantissa >> 13);
        const uint32_t rest = mantissa & 0x1FFF;
        if (rest > 0x1000 || (rest == 0x1000 && (half & 1))) ++half;
        return sign | uint16_t(half);
    }
    const int shift = 14 - e;  // subnormal half: the full significand in units of 2^-24
    if (shift > 24) return sign;
    const uint32_t significand = mantissa | 0x800000;
    uint32_t half = significand >> shift;
    const uint32_t rest = significand & ((1u << shift) - 1), halfway = 1u << (shift - 1);
    if (rest > halfway || (rest == halfway && (half & 1))) ++half;
    return sign | uint16_t(half);
}

uint16_t read_bits(const uint8_t* p) { return uint16_t(p[0] | (p[1] << 8)); }

void unpack_q4_k(const uint8_t* block, int8_t* q, uint16_t* scale, uint16_t* offset) {
    const float d = specdemo::read_fp16(block), dmin = specdemo::read_fp16(block + 2);
    uint8_t sc[8], m[8];
    specdemo::unpack_q4_k_scales(block + 4, sc, m);
    for (int g = 0; g < 8; ++g) {
        const float s = d * float(sc[g]);
        const float mins = dmin * float(m[g]);
        scale[g] = fp32_to_fp16_bits(s);
        offset[g] = fp32_to_fp16_bits(8.0f * s - mins);
    }
    const uint8_t* qs = block + 16;
    for (int c = 0; c < 4; ++c) {  // 32 bytes: weights 64c + i (low nibbles), then 64c + 32 + i (high)
        for (int i = 0; i < 32; ++i) {
            q[64 * c + i] = int8_t((qs[32 * c + i] & 0x0F) - 8);
            q[64 * c + 32 + i] = int8_t((qs[32 * c + i] >> 4) - 8);
        }
    }
}

void unpack_q6_k(const uint8_t* block, int8_t* q, uint16_t* scale) {
    const uint8_t *ql = block, *qh = block + 128;
    const int8_t* sc = reinterpret_cast<const int8_t*>(block + 192);
    const float d = specdemo::read_fp16(block + 208);
    for (int g = 0; g < 16; ++g) scale[g] = fp32_to_fp16_bits(d * float(sc[g]));
    for (int h = 0; h < 2; ++h) {  // each half: 128 weights from 64 bytes of low nibbles and 32 of high bits
        const uint8_t *low = ql + 64 * h, *high = qh + 32 * h;
        int8_t* out = q + 128 * h;
        for (int i = 0; i < 32; ++i) {
            out[i] = int8_t(((low[i] & 0x0F) | ((high[i] & 3) << 4)) - 32);
            out[32 + i] = int8_t(((low[32 + i] & 0x0F) | (((high[i] >> 2) & 3) << 4)) - 32);
            out[64 + i] = int8_t(((low[i] >> 4) | (((high[i] >> 4) & 3) << 4)) - 32);
            out[96 + i] = int8_t(((low[32 + i] >> 4) | (((high[i] >> 6) & 3) << 4)) - 32);
        }
    }
}

void unpack_q8_0(const uint8_t* block, int8_t* q, uint16_t* scale) {
    scale[0] = read_bits(block);
    std::memcpy(q, block + 2, 32);
}

void unpack_q5_0(const uint8_t* block, int8_t* q, uint16_t* scale) {
    scale[0] = read_bits(block);
    uint32_t fifth;
    std::memcpy(&fifth, block + 2, 4);  // bit j: weight j's fifth bit
    const uint8_t* qs = block + 6;
    for (int i = 0; i < 16; ++i) {
        q[i] = int8_t(((qs[i] & 0x0F) | (((fifth >> i) & 1) << 4)) - 16);
        q[16 + i] = int8_t(((qs[i] >> 4) | (((fifth >> (16 + i)) & 1) << 4)) - 16);
    }
}

}  // namespace

// raw (rows, row_bytes) of blocks of `kind` ("Q4_K", "Q6_K", "Q8_0", "Q5_0") into q (rows · row_bytes / block bytes ·
// block values) i8, scale (one per group) and, for Q4_K, offset (one per group) as f16 bits; 0 for another kind.
extern "C" __attribute__((visibility("default"))) int specdemo_kernels_unpack(const char* kind, const uint8_t* raw,
                                                                              int64_t rows, int64_t row_bytes, int8_t* q,
                                                                              uint16_t* scale, uint16_t* offset) {
    const std::string name(kind);
    const int64_t count = rows * row_bytes;
    if (name == "Q4_K") {
        for (int64_t b = 0; b < count / 144; ++b) unpack_q4_k(raw + 144 * b, q + 256 * b, scale + 8 * b, offset + 8 * b);
    } else if (name == "Q6_K") {
        for (int64_t b = 0; b < count / 210; ++b) unpack_q6_k(raw + 210 * b, q + 256 * b, scale + 16 * b);
    } else if (name == "Q8_0") {
        for (int64_t b = 0; b < count / 34; ++b) unpack_q8_0(raw + 34 * b, q + 32 * b, scale + b);
    } else if (name == "Q5_0") {
        for (int64_t b = 0; b < count / 22; ++b) unpack_q5_0(raw + 22 * b, q + 32 * b, scale + b);
    } else {
        return 0;
    }
    return 1;
}

// `count` signed 4-bit values (i8 in [-8, 7]) packed two a byte, low nibble first, as OpenVINO stores i4 (an odd count's
// last byte has a zero high nibble): gguf_weights' i4 Constants, 1.3 s of numpy for the target's embedding.
extern "C" __attribute__((visibility("default"))) void specdemo_kernels_pack_nibbles(const int8_t* values, int64_t count,
                                                                                     uint8_t* out) {
    for (int64_t i = 0; i + 1 < count; i += 2) out[i / 2] = uint8_t((values[i] & 0x0F) | ((values[i + 1] & 0x0F) << 4));
    if (count % 2) out[count / 2] = uint8_t(values[count - 1] & 0x0F);
}
