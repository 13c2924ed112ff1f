// Many activation rows at once (a verification of K drafts, a prompt's prefill): a tensor's blocks repacked once into
// panels of ROWS rows, then multiplied with every activation row by broadcast 4-byte dot products (vpdpbusd, maddubs).
//
// A block's dot product with the 8-bit activations is, per slot j (a run of G weights sharing a scale):
//
//     Σ_j  s_j · d_a · (Σ_i v_i·a_i − c·Σ_i a_i)  −  o_j · d_a · Σ_i a_i
//
// with v the weights as unsigned bytes, s_j their scale, c an integer offset (Q6_K 32, Q8_0 128, Q5_0 16) and o_j a
// float one (Q4_K's dmin·m_j). The panel keeps v and what s and o are made of; the activations' side (ManyRows) keeps
// a, d_a and −c·Σa by slot (or as Q8_K blocks, d_a per 256: the sub-block scales then apply in i32), so the inner loop
// is integer sums started at −c·Σa.
//
// A panel is the ROWS rows' blocks one after another; a block of a panel, as the SIMD loop reads it, in address order
// (a "quad" is 4 consecutive weights of a row, ROWS of them make a vector row of the panel):
//   Q4_K  d [ROWS] f16, dmin [ROWS] f16, sc [8][ROWS] u8, m [8][ROWS] u8           s = d·sc, o = dmin·m
//         nibbles [4][8 quads][ROWS][4]: weights 64c + 4q… (low nibbles, slot 2c) and 64c + 32 + 4q… (high, 2c + 1)
//   Q6_K  d [ROWS] f16, sc [16][ROWS] i8, then per slot j (quads 4j + q, q < 4):        s = d·sc, c = 32
//         nibbles [2][ROWS][4] (quads 4j and 4j + 1 low and high, then 4j + 2, 4j + 3), highs [ROWS][4] (2 bits each,
//         quad 4j + q at bits 2q): the 6-bit values (0…63) in 0.75 bytes
//   Q8_0  d [ROWS] f16, values [8 quads][ROWS][4] u8 (q + 128)                     s = d, c = 128
//   Q5_0  d [ROWS] f16, values [8 quads][ROWS][4] u8 (0…31)                        s = d, c = 16
// The same bytes as the file's blocks give or take a few (Q4_K 148 a row's block against 144, Q6_K and Q8_0 the same 210 and 34, Q5_0 34 against 22;
// Q5_0 its 22 in PackedQ5Nibbles, below, on both gemms),
// kept beside them (the dot products of a single step read the file's own) for the model's life.
// Included by each gemm_*.cpp, compiled with its own ISA flags (internal linkage: see formats.hpp).
#pragma once

#include <immintrin.h>

#include <algorithm>
#include <type_traits>

#include "formats.hpp"

namespace specdemo {

namespace {

// A format's packed block of ROWS rows: its layout (above) and `pack<Interleave>(raw, row_bytes, out)`, from ROWS rows
// of the file's blocks (row r at raw + r·row_bytes), each read by its format's decoder (formats.hpp: decode) but Q4_K's
// nibbles, kept as the file has them. The ISA's `Interleave::run(bytes, stride, out, quad_bytes)` turns ROWS rows' 32
// bytes into 8 quads of the ROWS rows (a transpose of i32).
template <Kind K, int ROWS>
struct Packed;

// A decoded block's values as the gemm multiplies them, unsigned: v = q + c (formats.hpp: weight_offset).
template <Kind K>
inline void unsigned_values(const Decoded<K>& block, uint8_t* v) {
    for (int i = 0; i < Decoded<K>::VALUES; ++i) v[i] = uint8_t(block.q[i] + weight_offset(K));
}

template <int ROWS>
struct Packed<Kind::Q4_K, ROWS> {
    static constexpr int SLOT = slot_values(Kind::Q4_K), VALUES = 256;
    static constexpr size_t RAW = Q4_K_BYTES, QUAD = ROWS * 4, D = 0, DMIN = 2 * ROWS, SC = 4 * ROWS, M = 12 * ROWS,
                            V = 20 * ROWS, BYTES = V + 128 * ROWS;

    template <typename Interleave>
    static void pack(const uint8_t* raw, size_t row_bytes, uint8_t* out) {
        for (int c = 0; c < 4; ++c) Interleave::run(raw + 16 + 32 * c, row_bytes, out + V + 8 * c * QUAD, QUAD);
        auto* d = reinterpret_cast<uint16_t*>(out + D);
        auto* dmin = reinterpret_cast<uint16_t*>(out + DMIN);
        for (int r = 0; r < ROWS; ++r) {  // d, dmin and the scales as decode<Q4_K> reads them (the nibbles: the file's)
            const uint8_t* block = raw + r * row_bytes;
            uint64_t sc, m;
            unpack_q4_k_scales(block + 4, sc, m);
            d[r] = read_bits(block), dmin[r] = read_bits(block + 2);
            for (int j = 0; j < 8; ++j) {
                out[SC + j * ROWS + r] = uint8_t(sc >> 8 * j);
                out[M + j * ROWS + r] = uint8_t(m >> 8 * j);
            }
        }
    }
};

template <int ROWS>
struct Packed<Kind::Q6_K, ROWS> {
    static constexpr int SLOT = slot_values(Kind::Q6_K), VALUES = 256;
    static constexpr size_t RAW = Q6_K_BYTES, QUAD = ROWS * 4, D = 0, SC = 2 * ROWS, V = 18 * ROWS,
                            SLOT_BYTES = 3 * QUAD, BYTES = V + 16 * SLOT_BYTES;

    template <typename Interleave>
    static void pack(const uint8_t* raw, size_t row_bytes, uint8_t* out) {
        alignas(64) uint8_t v[ROWS][256], six[64 * QUAD];  // each row's values unsigned (0…63); as 64 quads of the rows
        auto* d = reinterpret_cast<uint16_t*>(out + D);
        for (int r = 0; r < ROWS; ++r)  // every row's lines asked for at once, not a row's after the row before's decoding
            for (size_t line = 0; line < RAW; line += 64) __builtin_prefetch(raw + r * row_bytes + line, 0, 3);
        for (int r = 0; r < ROWS; ++r) {
            const Decoded<Kind::Q6_K> block = decode<Kind::Q6_K>(raw + r * row_bytes);
            unsigned_values(block, v[r]);
            for (int g = 0; g < 16; ++g) out[SC + g * ROWS + r] = uint8_t(block.sc[g]);
            d[r] = block.d;
        }
        for (int c = 0; c < 8; ++c) Interleave::run(&v[0][32 * c], 256, six + 8 * c * QUAD, QUAD);
        for (int j = 0; j < 16; ++j) {  // slot j's quads 4j + q: two bytes of nibbles (q = 0, 1; 2, 3) and the 2-bit highs
            const uint8_t* q = six + 4 * j * QUAD;
            uint8_t* slot = out + V + j * SLOT_BYTES;
            for (size_t i = 0; i < QUAD; ++i) {
                slot[i] = (q[i] & 0x0F) | (q[QUAD + i] & 0x0F) << 4;
                slot[QUAD + i] = (q[2 * QUAD + i] & 0x0F) | (q[3 * QUAD + i] & 0x0F) << 4;
                slot[2 * QUAD + i] = q[i] >> 4 | (q[QUAD + i] >> 4) << 2 | (q[2 * QUAD + i] >> 4) << 4 |
                                     (q[3 * QUAD + i] >> 4) << 6;
            }
        }
    }
};

// A Q6_K block of a panel decoded for a call of many rows: the same d and sc, then the 6-bit values as bytes, [64
// quads][ROWS][4]. Where a call has many tiles, decoding the nibbles and highs again in each costs more than decoding a
// chunk once into these bytes, which every tile then reads from L1 or L2 (AVX-512's DECODED_FROM_ROWS; AVX2 decodes
// each quad once for a tile of up to 5 rows instead, and never this way).
template <int ROWS>
struct Decoded6 {
    static constexpr int SLOT = 16, VALUES = 256;
    static constexpr size_t QUAD = ROWS * 4, D = 0, SC = 2 * ROWS, V = 18 * ROWS, BYTES = V + 256 * ROWS;
    static_assert(V == Packed<Kind::Q6_K, ROWS>::V, "d and sc are copied as they are");
};

// Whether a layout holds Q6_K's values as nibbles and highs (a panel's), not bytes (Decoded6's).
template <typename P>
constexpr bool NIBBLES_AND_HIGHS = false;
template <int ROWS>
constexpr bool NIBBLES_AND_HIGHS<Packed<Kind::Q6_K, ROWS>> = true;

// Whether a layout holds Q5_0's values as nibble pairs and fifth bits (PackedQ5Nibbles, below), not bytes.
template <int ROWS>
struct PackedQ5Nibbles;
template <typename P>
constexpr bool NIBBLES_AND_FIFTHS = false;
template <int ROWS>
constexpr bool NIBBLES_AND_FIFTHS<PackedQ5Nibbles<ROWS>> = true;

// Whether a layout holds Q4_0's values as nibble pairs alone (PackedQ4Nibbles, below), not bytes.
template <int ROWS>
struct PackedQ4Nibbles;
template <typename P>
constexpr bool NIBBLE_PAIRS = false;
template <int ROWS>
constexpr bool NIBBLE_PAIRS<PackedQ4Nibbles<ROWS>> = true;

// Whether a tile reads its layout from memory (a panel: it asks for the next block) or from cache (Decoded6).
template <typename P>
constexpr bool STREAMED = true;
template <int ROWS>
constexpr bool STREAMED<Decoded6<ROWS>> = false;

// Q8_0 and Q5_0: 32 weights a block, one scale. A row at a time, then the ROWS transposed.
template <Kind K, int ROWS>
struct Packed32 {
    static constexpr int SLOT = 32, VALUES = 32;
    static constexpr size_t RAW = block_bytes(K), QUAD = ROWS * 4, D = 0, V = 2 * ROWS, BYTES = V + 8 * QUAD;

    template <typename Interleave>
    static void pack(const uint8_t* raw, size_t row_bytes, uint8_t* out) {
        alignas(64) uint8_t v[ROWS][32];
        auto* d = reinterpret_cast<uint16_t*>(out + D);
        for (int r = 0; r < ROWS; ++r) {
            const Decoded<K> block = decode<K>(raw + r * row_bytes);
            unsigned_values(block, v[r]);
            d[r] = block.d;
        }
        Interleave::run(&v[0][0], 32, out + V, QUAD);
    }
};

template <int ROWS>
struct Packed<Kind::Q8_0, ROWS> : Packed32<Kind::Q8_0, ROWS> {};
template <int ROWS>
struct Packed<Kind::Q5_0, ROWS> : Packed32<Kind::Q5_0, ROWS> {};

// Q5_0 at the file's 22 bytes a row's block (both gemms' panel; Packed's 34 stream 1.55× the bytes, and a draft of Q5_0
// layers steps at its bytes): d [ROWS] f16, then fifths [ROWS][4]: byte b of a row holds the fifth bits of its weights
// 4q + b as bit q (q < 8), then nibbles [4][ROWS][4]: byte b of pair p holds weight 4p + b (quad p) in its low nibble
// and weight 16 + 4p + b (quad p + 4) in its high one. Quad q's values are a pair's nibbles and bit q of the fifths
// moved to bit 4: each bit stays within its byte (shifts of at most 4), so 16-bit shifts serve.
template <int ROWS>
struct PackedQ5Nibbles {
    static constexpr int SLOT = 32, VALUES = 32;
    static constexpr size_t RAW = Q5_0_BYTES, QUAD = ROWS * 4, D = 0, FIFTHS = 2 * ROWS, V = 6 * ROWS,
                            BYTES = V + 4 * QUAD;

    template <typename Interleave>
    static void pack(const uint8_t* raw, size_t row_bytes, uint8_t* out) {
        alignas(64) uint8_t row[ROWS][32] = {}, quads[8 * QUAD];  // a row: 16 bytes of nibbles, 4 of fifths, 12 unused
        auto* d = reinterpret_cast<uint16_t*>(out + D);
        for (int r = 0; r < ROWS; ++r) {
            const Decoded<Kind::Q5_0> block = decode<Kind::Q5_0>(raw + r * row_bytes);
            uint8_t v[32];
            unsigned_values(block, v);
            d[r] = block.d;
            for (int i = 0; i < 16; ++i) row[r][i] = (v[i] & 0x0F) | (v[16 + i] & 0x0F) << 4;
            for (int i = 0; i < 32; ++i) row[r][16 + i % 4] |= (v[i] >> 4) << (i / 4);
        }
        Interleave::run(&row[0][0], 32, quads, QUAD);  // quads 0…3 the nibble pairs, 4 the fifths
        std::memcpy(out + V, quads, 4 * QUAD);
        std::memcpy(out + FIFTHS, quads + 4 * QUAD, QUAD);
    }
};

// Q4_0 at the file's 18 bytes a row's block, PackedQ5Nibbles without the fifths: d [ROWS] f16, then nibbles
// [4][ROWS][4]: byte b of pair p holds weight 4p + b (quad p) in its low nibble and weight 16 + 4p + b (quad p + 4) in
// its high one.
template <int ROWS>
struct PackedQ4Nibbles {
    static constexpr int SLOT = 32, VALUES = 32;
    static constexpr size_t RAW = Q4_0_BYTES, QUAD = ROWS * 4, D = 0, V = 2 * ROWS, BYTES = V + 4 * QUAD;

    template <typename Interleave>
    static void pack(const uint8_t* raw, size_t row_bytes, uint8_t* out) {
        alignas(64) uint8_t row[ROWS][32] = {}, quads[8 * QUAD];  // a row: its 16 bytes of nibbles, 16 unused
        auto* d = reinterpret_cast<uint16_t*>(out + D);
        for (int r = 0; r < ROWS; ++r) {
            d[r] = read_bits(raw + r * row_bytes);
            std::memcpy(row[r], raw + r * row_bytes + 2, 16);  // the file's own order: weight i low, 16 + i high
        }
        Interleave::run(&row[0][0], 32, quads, QUAD);  // quads 0…3 the nibble pairs
        std::memcpy(out + V, quads, 4 * QUAD);
    }
};

// Each kind's panel as both gemms pack it: Q5_0's and Q4_0's at the file's bytes (PackedQ5Nibbles, PackedQ4Nibbles),
// the others' as Packed.
template <Kind K, int ROWS>
using Panel = std::conditional_t<K == Kind::Q5_0, PackedQ5Nibbles<ROWS>,
                                 std::conditional_t<K == Kind::Q4_0, PackedQ4Nibbles<ROWS>, Packed<K, ROWS>>>;

// How far ahead of the tile a stream asks for the panel: at least this many bytes, whole blocks. One Q5_0 block of a
// panel (352 bytes) is ~40 cycles of work, too short a lead for memory's latency: on the 2-core Zen 3 (EPYC family 25
// model 1), one core, 65,536 rows streamed at M = 1, 2 KiB ahead took 45–50 cycles per 256 weights against 62–68 one
// block ahead, and 4–8 KiB no better; a K-quant block (2.3–3.4 KiB) is lead enough, and 4–8 KiB ahead were not faster.
constexpr size_t PREFETCH_BYTES = 2048;

// Where a prefetch puts its lines: __builtin_prefetch's locality, 3 into L1 (prefetcht0), 2 into L2 (prefetcht1).
enum class Into { L1 = 3, L2 = 2 };

// The first tile of a chunk reads the panel from memory, the others from cache: while it multiplies slot j of `block`,
// it asks for the j-th of `slots` parts of the block PREFETCH_BYTES or more ahead (its lines in order, so the
// hardware's streamer follows on), into L1 or L2 as the ISA's gemm measured best.
template <Into To = Into::L1>
inline void prefetch_slot_of_next(const uint8_t* block, int j, int slots, size_t bytes) {
    const size_t part = (bytes + slots - 1) / slots, ahead = (PREFETCH_BYTES + bytes - 1) / bytes * bytes;
    for (size_t line = j * part; line < (j + 1) * part; line += 64)
        __builtin_prefetch(block + ahead + line, 0, static_cast<int>(To));
}

// Columns of a panel multiplied with every activation row before the next ones: 32 rows of 1024 columns are 38 KiB of
// packed Q4_K, 35 KiB of Q6_K, kept in L1 and L2 while the activation rows pass.
constexpr int CHUNK_VALUES = 1024;

// A panel of ROWS rows (from `rows`, row_bytes apart) packed into panel `panel` of `out`: block b at
// (panel·blocks + b)·BYTES.
template <Kind K, int ROWS, typename Interleave, typename P = Panel<K, ROWS>>
void pack_panel(const uint8_t* rows, size_t row_bytes, size_t panel, int blocks, PackedWeights& out) {
    for (int b = 0; b < blocks; ++b)
        P::template pack<Interleave>(rows + b * P::RAW, row_bytes, out.bytes.get() + (panel * blocks + b) * P::BYTES);
}

// Each ISA's tile, defined in its gemm_*.cpp: y[m0 + m, 0…ROWS) (+)= a panel's `blocks` blocks in layout P (from
// `panel`; the activations' block first_block on) dotted with activation row m0 + m, m < M; `first`: y is written, not
// added to.
template <Kind K, typename P, int M>
void tile(const uint8_t* panel, int blocks, const ManyRows& a, int m0, int first_block, float* y, size_t y_stride,
          bool first);

// Each ISA's decoding of `blocks` Q6_K blocks of a panel (from `packed`) into Decoded6 blocks at `out` (where its gemm
// decodes first: DECODED_FROM is not NEVER_DECODED).
template <int ROWS>
void decode6(const uint8_t* packed, int blocks, uint8_t* out);
constexpr int NEVER_DECODED = 0;

// An ISA's gemm (GemmFn): each panel first_panel … last_panel − 1, its columns CHUNK_VALUES at a time (kept in cache),
// times every activation row, MR rows a tile, then what is left. Q6_K's chunk is decoded once first in a call of at
// least DECODED_FROM rows, where the ISA does so (its crossover; the bytes are the same either way, so a row's result
// does not depend on how many rows its call holds).
template <Kind K, int ROWS, int MR, int DECODED_FROM, typename P = Panel<K, ROWS>>
void gemm_panels(const PackedWeights& w, const ManyRows& a, float* y, size_t y_stride, size_t first_panel,
                 size_t last_panel) {
    constexpr int CHUNK = CHUNK_VALUES / P::VALUES > 1 ? CHUNK_VALUES / P::VALUES : 1;
    for (size_t p = first_panel; p < last_panel; ++p) {
        const uint8_t* panel = w.bytes.get() + p * w.blocks * P::BYTES;
        for (int b0 = 0; b0 < w.blocks; b0 += CHUNK) {
            const int blocks = std::min(CHUNK, w.blocks - b0);
            float* y_panel = y + (p - first_panel) * ROWS;
            if constexpr (K == Kind::Q6_K && DECODED_FROM != NEVER_DECODED) {
                if (a.rows >= DECODED_FROM) {
                    using D6 = Decoded6<ROWS>;
                    alignas(64) static thread_local uint8_t decoded[CHUNK * D6::BYTES];  // each worker's own
                    decode6<ROWS>(panel + b0 * P::BYTES, blocks, decoded);
                    in_groups_of_rows<MR>(a.rows, [&]<int R>(int m0) {
                        tile<K, D6, R>(decoded, blocks, a, m0, b0, y_panel, y_stride, b0 == 0);
                    });
                    continue;
                }
            }
            in_groups_of_rows<MR>(a.rows, [&]<int R>(int m0) {
                tile<K, P, R>(panel + b0 * P::BYTES, blocks, a, m0, b0, y_panel, y_stride, b0 == 0);
            });
        }
    }
}

}  // namespace

}  // namespace specdemo
