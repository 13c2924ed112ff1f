// Many activation rows at once (a verification of K drafts, a prompt's prefill): the weights decoded once a call into
// panels, then multiplied with every activation row by broadcast 4-byte dot products (vpdpbusd, maddubs).
//
// A block's dot product with the 8-bit activations is, per slot j (a run of G weights sharing a scale):
//
//     Σ_j  s_j · d_a · (Σ_i v_i·a_i − c·Σ_i a_i)  −  o_j · d_a · Σ_i a_i
//
// with v the weights as unsigned bytes, s_j their scale, c an integer offset (Q6_K 32, Q8_0 128, Q5_0 16) and o_j a
// float one (Q4_K's dmin·m_j). The panel keeps v, s and o; the activations' side (ManyRows) keeps a, d_a, −c·Σa and
// d_a·Σa by slot, so the inner loop is integer sums started at −c·Σa, then two FMAs a slot.
//
// A panel holds ROWS weight rows over a chunk of columns, as the SIMD loop reads them:
//   values  [slot][quad][ROWS][4]  u8: weights 4q…4q+3 of the slot, for each row (a vector = 4 values of ROWS / 4 rows)
//   scale   [slot][ROWS]           f32 s_j
//   offset  [slot][ROWS]           f32 o_j (Q4_K only)
// Included by each gemm_*.cpp, compiled with its own ISA flags (internal linkage: see formats.hpp).
#pragma once

#include <immintrin.h>

#include <vector>

#include "formats.hpp"

namespace specdemo {

namespace {

// Each format's block of ROWS rows (row r at w + r·row_bytes) into a panel, at `values` (the block's 64 quads × ROWS × 4
// bytes), `scale` and `offset` (its slots × ROWS): `Format<K>::panel<ROWS, Interleave>(w, row_bytes, values, scale,
// offset)`. The ISA's `Interleave::run(bytes, stride, out, quad_bytes)` turns ROWS rows' 32 bytes into 8 quads of the
// ROWS rows (a transpose of i32); the K-quants transpose their raw bytes first and decode every row at once (nibbles
// and bits are bytewise, so they decode in either order), Q8_0 and Q5_0 decode a row at a time, then transpose.
template <Kind K>
struct Format;

template <>
struct Format<Kind::Q4_K> {
    static constexpr int SLOT = 32, VALUES = 256, OFFSET = 0;
    static constexpr bool FLOAT_OFFSET = true;
    static constexpr size_t BYTES = Q4_K_BYTES;
    // w = d·sc·q − dmin·m: v = q (0…15), s = d·sc, o = dmin·m
    template <int ROWS, typename Interleave>
    static void panel(const uint8_t* w, size_t row_bytes, uint8_t* values, float* scale, float* offset) {
        constexpr size_t QUAD = ROWS * 4;
        alignas(64) uint8_t t[8 * QUAD];
        // bytes 0…31 of each row: quad 0 d and dmin, quads 1–3 the 12 bytes of 6-bit scales and mins (formats.hpp)
        Interleave::run(w, row_bytes, t, QUAD);
        uint32_t word[4][ROWS];
        std::memcpy(word, t, sizeof word);
        float d[ROWS], dmin[ROWS];
        for (int r = 0; r < ROWS; ++r) d[r] = _cvtsh_ss(uint16_t(word[0][r])), dmin[r] = _cvtsh_ss(uint16_t(word[0][r] >> 16));
        for (int r = 0; r < ROWS; ++r) {
            const uint32_t s0 = word[1][r], s1 = word[2][r], s2 = word[3][r];
            const uint32_t sc[2] = {s0 & 0x3F3F3F3Fu, (s2 & 0x0F0F0F0Fu) | ((s0 >> 6) & 0x03030303u) << 4};
            const uint32_t m[2] = {s1 & 0x3F3F3F3Fu, ((s2 >> 4) & 0x0F0F0F0Fu) | ((s1 >> 6) & 0x03030303u) << 4};
            for (int j = 0; j < 8; ++j) {
                scale[j * ROWS + r] = d[r] * float((sc[j / 4] >> (8 * (j % 4))) & 0xFF);
                offset[j * ROWS + r] = dmin[r] * float((m[j / 4] >> (8 * (j % 4))) & 0xFF);
            }
        }
        for (int c = 0; c < 4; ++c) {  // bytes 16 + 32c…: weights 64c + i (low nibbles), 64c + 32 + i (high)
            Interleave::run(w + 16 + 32 * c, row_bytes, t, QUAD);
            uint8_t *low = values + 16 * c * QUAD, *high = values + (16 * c + 8) * QUAD;
            for (size_t i = 0; i < 8 * QUAD; ++i) low[i] = t[i] & 0x0F, high[i] = t[i] >> 4;
        }
    }
};

template <>
struct Format<Kind::Q6_K> {
    static constexpr int SLOT = 16, VALUES = 256, OFFSET = 32;
    static constexpr bool FLOAT_OFFSET = false;
    static constexpr size_t BYTES = Q6_K_BYTES;
    // w = d·sc·(q − 32): v = q (0…63), s = d·sc
    template <int ROWS, typename Interleave>
    static void panel(const uint8_t* w, size_t row_bytes, uint8_t* values, float* scale, float*) {
        constexpr size_t QUAD = ROWS * 4;
        alignas(64) uint8_t low0[8 * QUAD], low1[8 * QUAD], high[8 * QUAD];
        for (int h = 0; h < 2; ++h) {  // each half: 128 weights from 64 bytes of low nibbles and 32 of high bits
            Interleave::run(w + 64 * h, row_bytes, low0, QUAD);
            Interleave::run(w + 64 * h + 32, row_bytes, low1, QUAD);
            Interleave::run(w + 128 + 32 * h, row_bytes, high, QUAD);
            uint8_t* v = values + 32 * h * QUAD;  // weights 128h + 32s + i: quad 32h + 8s + i / 4
            for (size_t i = 0; i < 8 * QUAD; ++i) {
                v[i] = (low0[i] & 0x0F) | (high[i] & 3) << 4;
                v[8 * QUAD + i] = (low1[i] & 0x0F) | ((high[i] >> 2) & 3) << 4;
                v[16 * QUAD + i] = (low0[i] >> 4) | ((high[i] >> 4) & 3) << 4;
                v[24 * QUAD + i] = (low1[i] >> 4) | (high[i] >> 6) << 4;
            }
        }
        // bytes 176…207 of each row: quads 4–7 the 16 scales (i8); d, at 208, a row at a time (32 bytes from 192 would
        // read past the tensor's last block)
        Interleave::run(w + 176, row_bytes, low0, QUAD);
        for (int r = 0; r < ROWS; ++r) {
            const float d = read_fp16(w + r * row_bytes + 208);
            for (int g = 0; g < 16; ++g) scale[g * ROWS + r] = d * float(int8_t(low0[(4 + g / 4) * QUAD + 4 * r + g % 4]));
        }
    }
};

// Q8_0 and Q5_0: 32 weights a block, one scale: each row's block decoded by `decode(block, 32 values)` (returns d),
// then the ROWS rows transposed.
template <int ROWS, typename Interleave, float (*Decode)(const uint8_t*, uint8_t*)>
void panel_of_32s(const uint8_t* w, size_t row_bytes, uint8_t* values, float* scale) {
    alignas(64) uint8_t v[ROWS][32];
    for (int r = 0; r < ROWS; ++r) scale[r] = Decode(w + r * row_bytes, v[r]);
    Interleave::run(&v[0][0], 32, values, ROWS * 4);
}

inline float decode_q8_0(const uint8_t* w, uint8_t* v) {  // v = q + 128: unsigned for vpdpbusd
    for (int i = 0; i < 32; ++i) v[i] = uint8_t(int8_t(w[2 + i]) + 128);
    return read_fp16(w);
}

inline float decode_q5_0(const uint8_t* w, uint8_t* v) {  // v = q (0…31)
    const uint32_t high = uint32_t(w[2]) | uint32_t(w[3]) << 8 | uint32_t(w[4]) << 16 | uint32_t(w[5]) << 24;
    for (int i = 0; i < 32; ++i) {
        const int low = i < 16 ? w[6 + i] & 0x0F : w[6 + i - 16] >> 4;
        v[i] = uint8_t(low | ((high >> i) & 1) << 4);
    }
    return read_fp16(w);
}

template <>
struct Format<Kind::Q8_0> {
    static constexpr int SLOT = 32, VALUES = 32, OFFSET = 128;  // w = d·q: v = q + 128, s = d
    static constexpr bool FLOAT_OFFSET = false;
    static constexpr size_t BYTES = Q8_0_BYTES;
    template <int ROWS, typename Interleave>
    static void panel(const uint8_t* w, size_t row_bytes, uint8_t* values, float* scale, float*) {
        panel_of_32s<ROWS, Interleave, decode_q8_0>(w, row_bytes, values, scale);
    }
};

template <>
struct Format<Kind::Q5_0> {
    static constexpr int SLOT = 32, VALUES = 32, OFFSET = 16;  // w = d·(q − 16): v = q, s = d
    static constexpr bool FLOAT_OFFSET = false;
    static constexpr size_t BYTES = Q5_0_BYTES;
    template <int ROWS, typename Interleave>
    static void panel(const uint8_t* w, size_t row_bytes, uint8_t* values, float* scale, float*) {
        panel_of_32s<ROWS, Interleave, decode_q5_0>(w, row_bytes, values, scale);
    }
};

constexpr int CHUNK_VALUES = 1024;  // columns a panel holds at once: 32 rows of them, 32 KiB of values, stay in L1/L2

template <Kind K, int ROWS>
struct PanelOf {
    using F = Format<K>;
    static constexpr int QUADS = F::SLOT / 4, SLOTS = F::VALUES / F::SLOT;
    std::vector<uint8_t> values;
    std::vector<float> scale, offset;

    PanelOf() : values(size_t(CHUNK_VALUES) * ROWS), scale(CHUNK_VALUES / F::SLOT * ROWS),
                offset(CHUNK_VALUES / F::SLOT * ROWS) {}

    // Rows 0 … ROWS − 1 of `w` (row_bytes apart), blocks first_block … + blocks, decoded into the panel.
    template <typename Interleave>
    void fill(const uint8_t* w, size_t row_bytes, int first_block, int blocks) {
        // The next panel's same columns (its rows follow these), asked for into L2 a row at a time, in address order:
        // so the hardware's streamer sees runs to follow, where this panel's own reads jump from row to row
        const uint8_t* next = w + ROWS * row_bytes + size_t(first_block) * F::BYTES;
        for (int r = 0; r < ROWS; ++r)
            for (size_t line = 0; line < blocks * F::BYTES; line += 64) __builtin_prefetch(next + r * row_bytes + line, 0, 2);
        for (int b = 0; b < blocks; ++b) {
            const uint8_t* block = w + size_t(first_block + b) * F::BYTES;
            F::template panel<ROWS, Interleave>(block, row_bytes, &values[size_t(b) * F::VALUES * ROWS],
                                                &scale[b * SLOTS * ROWS], &offset[b * SLOTS * ROWS]);
        }
    }
};

}  // namespace

}  // namespace specdemo
