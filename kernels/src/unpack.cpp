// A GGUF tensor's blocks unpacked into the groups the CPU plugin's compressed MatMul and Gather read (the precisions
// "gguf" and "gguf-mixed", and gguf-native's embedding): for Python through ctypes, in place of numpy's unpacking
// (specdemo/models/gguf_weights.py, `unpack`, whose results these are bit for bit), which took 3.6 s of a first start's
// target conversion for its 151,936 x 1,536 Q4_K embedding alone (2-core Xeon family 6 model 207).
//
//   w[r, g·G + j] = scale[r, g] · q[r, g, j] + offset[r, g]      q i8 (rows, groups, G), scale and offset f16 bits
//
// from each block as its format's decoder reads it (formats.hpp: decode, w = d·sc·q − dmin·m, G its groups):
// scale = d·sc (d itself for Q8_0 and Q5_0), q as decoded, but Q4_K's less 8 (an i4) with offset = 8·scale − dmin·m.
//
// Baseline x86-64 and no FMA (CMakeLists.txt: -ffp-contract=off), so every product and difference is rounded as
// numpy's f32 arithmetic rounds it.
#include "formats.hpp"

#include <cstdint>
#include <cstring>

namespace specdemo {

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

// One block of kind K unpacked into its groups: q as decode gives it (Q4_K's less 8, an i4), scale = d·sc, and for Q4_K
// offset = 8·scale − dmin·m, each rounded to f16 from f32.
template <Kind K>
void unpack_block(const uint8_t* block, int8_t* q, uint16_t* scale, uint16_t* offset) {
    using Block = Decoded<K>;
    const Block v = decode<K>(block);
    constexpr int I4 = K == Kind::Q4_K ? 8 : 0;
    for (int i = 0; i < Block::VALUES; ++i) q[i] = int8_t(v.q[i] - I4);
    for (int g = 0; g < Block::GROUPS; ++g) {
        const float s = fp16_to_fp32(v.d) * float(v.sc[g]);
        scale[g] = fp32_to_fp16_bits(s);
        if constexpr (K == Kind::Q4_K)
            offset[g] = fp32_to_fp16_bits(8.0f * s - fp16_to_fp32(v.dmin) * float(v.m[g]));
    }
}

template <Kind K>
void unpack_blocks(const uint8_t* raw, int64_t blocks, int8_t* q, uint16_t* scale, uint16_t* offset) {
    using Block = Decoded<K>;
    for (int64_t b = 0; b < blocks; ++b)
        unpack_block<K>(raw + b * block_bytes(K), q + b * Block::VALUES, scale + b * Block::GROUPS,
                        K == Kind::Q4_K ? offset + b * Block::GROUPS : nullptr);
}

using UnpackFn = void (*)(const uint8_t*, int64_t, int8_t*, uint16_t*, uint16_t*);
constexpr UnpackFn UNPACK[KINDS] = {unpack_blocks<Kind::Q4_K>, unpack_blocks<Kind::Q6_K>, unpack_blocks<Kind::Q8_0>,
                                    unpack_blocks<Kind::Q5_0>, unpack_blocks<Kind::Q4_0>};  // by Kind

}  // namespace

}  // namespace specdemo

// raw (rows, row_bytes) of blocks of `kind` ("Q4_K", "Q6_K", "Q8_0", "Q5_0", "Q4_0") into q (rows · row_bytes / block
// bytes · block values) i8, scale (one per group) and, for Q4_K, offset (one per group) as f16 bits; 0 for another
// kind.
extern "C" __attribute__((visibility("default"))) int specdemo_kernels_unpack(const char* kind, const uint8_t* raw,
                                                                              int64_t rows, int64_t row_bytes, int8_t* q,
                                                                              uint16_t* scale, uint16_t* offset) {
    using namespace specdemo;
    for (int k = 0; k < KINDS; ++k) {
        if (std::strcmp(kind, KIND_NAMES[k]) != 0) continue;
        UNPACK[k](raw, rows * row_bytes / int64_t(block_bytes(Kind(k))), q, scale, offset);
        return 1;
    }
    return 0;
}

// `count` signed 4-bit values (i8 in [-8, 7]) packed two a byte, low nibble first, as OpenVINO stores i4 (an odd count's
// last byte has a zero high nibble): gguf_weights' i4 Constants, 1.3 s of numpy for the target's embedding.
extern "C" __attribute__((visibility("default"))) void specdemo_kernels_pack_nibbles(const int8_t* values, int64_t count,
                                                                                     uint8_t* out) {
    for (int64_t i = 0; i + 1 < count; i += 2) out[i / 2] = uint8_t((values[i] & 0x0F) | ((values[i + 1] & 0x0F) << 4));
    if (count % 2) out[count / 2] = uint8_t(values[count - 1] & 0x0F);
}
