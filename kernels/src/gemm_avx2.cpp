// Many activation rows with AVX2: a packed panel of 16 weight rows (two ymm of 8 rows × 4 values) times several
// activation rows, each activation's 4 values broadcast and multiplied with maddubs (u8 weights × i8 activations).
// Q4_K takes Q8_K activations (tile_q8_k: the sub-block scales inside madd, f32 once per 256 weights, up to 6 rows a
// tile); Q6_K a scale per slot of 16 (tile_q6: a slot's 4 quads summed in i16 from lane_start, one madd by its scale,
// f32 once per slot, up to 5 rows a tile); Q5_0 a scale per block of 32 (tile_q5: Q6_K's way, f32 once per block, up
// to 5 rows a tile), its panel at the file's 22 bytes a block (PackedQ5Nibbles: a step of a Q5_0 draft streams its
// bytes); Q4_0 as Q5_0, without the fifths (PackedQ4Nibbles, 18 bytes a block). Q8_0 has none here: its unsigned
// values (q + 128) would saturate maddubs, so its many rows take the dot products.
// Compiled with -mavx2 -mfma -mf16c; chosen only where the CPU has them (dispatch.cpp).
#include <immintrin.h>

#include <algorithm>

#include "panel.hpp"

namespace specdemo {

namespace {

constexpr int NR = 2, ROWS = 8 * NR;  // ymm of weight rows a tile holds; the panel's rows
// Q6_K (tile_q6): activation rows a tile holds, both halves of the panel sharing each broadcast, the quads decoded once
// for all of them. On the 2-core Zen 3 (EPYC family 25 model 1), one core, 16,384 rows streamed, the best of 4–8 runs
// alternating with the tiles before (2 rows a tile, the f32 per slot on 2 madds' sums; from 5 rows a chunk decoded to
// bytes first), cycles per 256 weights and row: 5 rows 14.2 against 23.8, 9 rows 15.7 against 18.3, 1 row 32.1
// against 33.3, 2 rows 21.1 against 19.6; held in L2, 5 rows 13.0 against 15.5.
constexpr int MR_Q6 = 5;
// Q5_0 and Q4_0 (tile_q5): activation rows a tile holds, as Q6_K's.
constexpr int MR_Q5 = 5;
// Q4_K (tile_q8_k): activation rows a tile holds, each decoded quad shared by all of them. Measured on the 2-core Zen 3
// (EPYC family 25 model 1), one core, a tile held in L2, cycles per 256 weights and row, the best of 3–6 runs
// alternating with the tile before (2 rows a tile, a scale per slot): 5 rows 8.5–10.5 against 12–19, 1 row 14 against
// 18–30; streamed from memory, 5 rows 9.5 against 15–22. Q6_K did not gain that way (its slots of 16 take two madds
// each, and its 6-bit values cost more to decode than the f32 per slot saved): it keeps the tile below.
constexpr int MR_Q8_K = 6;
constexpr int BOTH_HALVES = 6;  // tiles of up to this many rows multiply both halves of the panel at once
// From a single step on, as on AVX-512, though a step streams at 0.87–0.90× the dot products' rate (28 Q4_K layers with
// the AVX2 path held on the 2-core Xeon; 5 rows 0.70–0.85× their time): one way for every call, so a row's logits do
// not depend on how many rows its call holds (each row quantized and summed alike), and a verification of K drafts
// scores them exactly as K single steps would.
constexpr int FROM_ROWS = 1;
inline __m256i broadcast4(const int8_t* p) {
    int32_t word;
    std::memcpy(&word, p, 4);
    return _mm256_set1_epi32(word);
}

// Rows' 32 bytes (8 rows at a time, `stride` apart) as 8 quads of those rows, `quad_bytes` apart: an 8 × 8 transpose of
// i32 (unpacks in 128-bit lanes, then the lanes gathered).
struct Interleave {
    static void run(const uint8_t* v, size_t stride, uint8_t* dst, size_t quad_bytes) {
        for (int group = 0; group < NR; ++group, v += 8 * stride, dst += 32) {
            __m256i r[8], t[8], u[8];
            for (int i = 0; i < 8; ++i) r[i] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(v + i * stride));
            for (int i = 0; i < 8; i += 2) {
                t[i] = _mm256_unpacklo_epi32(r[i], r[i + 1]);
                t[i + 1] = _mm256_unpackhi_epi32(r[i], r[i + 1]);
            }
            for (int h = 0; h < 8; h += 4) {
                u[h] = _mm256_unpacklo_epi64(t[h], t[h + 2]);
                u[h + 1] = _mm256_unpackhi_epi64(t[h], t[h + 2]);
                u[h + 2] = _mm256_unpacklo_epi64(t[h + 1], t[h + 3]);
                u[h + 3] = _mm256_unpackhi_epi64(t[h + 1], t[h + 3]);
            }
            for (int c = 0; c < 4; ++c) {
                _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + c * quad_bytes),
                                    _mm256_permute2x128_si256(u[c], u[c + 4], 0x20));
                _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + (c + 4) * quad_bytes),
                                    _mm256_permute2x128_si256(u[c], u[c + 4], 0x31));
            }
        }
    }
};

// The 8·n-th to 8·n + 7-th rows' values of quad q of slot j in a packed block.
template <Kind K, typename P>
inline __m256i values(const uint8_t* block, int j, int q, int n) {
    if constexpr (NIBBLES_AND_HIGHS<P>) {  // the quad's nibbles, and its 2 high bits moved to bits 4 and 5
        const uint8_t* slot = block + P::V + j * P::SLOT_BYTES + 32 * n;
        const __m256i nibbles = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(slot + (q / 2) * P::QUAD));
        const __m256i highs = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(slot + 2 * P::QUAD));
        const __m256i low = _mm256_and_si256(q % 2 ? _mm256_srli_epi16(nibbles, 4) : nibbles, _mm256_set1_epi8(0x0F));
        const __m256i high = q == 0 ? _mm256_slli_epi16(highs, 4) : q == 1 ? _mm256_slli_epi16(highs, 2)
                           : q == 2 ? highs : _mm256_srli_epi16(highs, 2);
        return _mm256_or_si256(low, _mm256_and_si256(high, _mm256_set1_epi8(0x30)));
    } else if constexpr (NIBBLES_AND_FIFTHS<P> || NIBBLE_PAIRS<P>) {  // the pair's nibbles, Q5_0's fifth bit q at 4
        const uint8_t* pair = block + P::V + (q % 4) * P::QUAD + 32 * n;
        const __m256i nibbles = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(pair));
        const __m256i low = _mm256_and_si256(q < 4 ? nibbles : _mm256_srli_epi16(nibbles, 4), _mm256_set1_epi8(0x0F));
        if constexpr (NIBBLE_PAIRS<P>) {
            return low;
        } else {  // the fifths are P's own member
            const __m256i fifths = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(block + P::FIFTHS + 32 * n));
            const __m256i fifth = q < 4 ? _mm256_slli_epi16(fifths, 4 - q) : _mm256_srli_epi16(fifths, q - 4);
            return _mm256_or_si256(low, _mm256_and_si256(fifth, _mm256_set1_epi8(0x10)));
        }
    } else {
        static_assert(NIBBLES_AND_FIFTHS<P>, "AVX2's panels: Q6_K as nibbles and highs, Q5_0 nibbles and fifths, Q4_0 "
                                             "nibbles");
    }
}

// 8 f16 of a packed block's (d, dmin) as f32.
inline __m256 halves(const uint8_t* p) {
    return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
}

// i32 lanes of two slots' 8 bytes each (one per weight row) as the i16 pairs (lo, hi).
inline __m256i two_slots(const uint8_t* lo, const uint8_t* hi) {
    const __m256i low = _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(lo)));
    const __m256i high = _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(hi)));
    return _mm256_blend_epi16(_mm256_slli_epi32(high, 16), low, 0x55);
}

// p[h][m] = Σ over a Q4_K slot's 8 quads of maddubs(weights of half h, activation row m's 4 values), in i16 lanes (two
// a weight row): the slot's low (High false) or high nibbles, quad q of half h at nibbles + q·quad_bytes + 32·h.
template <int H, int M, bool High>
__attribute__((always_inline)) inline void slot_sums(const uint8_t* nibbles, size_t quad_bytes, const int8_t* const* q,
                                                     __m256i (*p)[M]) {
    const __m256i nibble = _mm256_set1_epi8(0x0F);
#pragma GCC unroll 8  // whole: p stays in registers only where every index is a constant
    for (int quad = 0; quad < 8; ++quad) {
        __m256i w[H];
#pragma GCC unroll 2
        for (int h = 0; h < H; ++h) {
            const __m256i bytes = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(nibbles + quad * quad_bytes + 32 * h));
            w[h] = _mm256_and_si256(High ? _mm256_srli_epi16(bytes, 4) : bytes, nibble);
        }
#pragma GCC unroll 8
        for (int m = 0; m < M; ++m) {
            const __m256i x = broadcast4(q[m] + 4 * quad);
#pragma GCC unroll 2
            for (int h = 0; h < H; ++h) {
                const __m256i t = _mm256_maddubs_epi16(w[h], x);
                p[h][m] = quad ? _mm256_add_epi16(p[h][m], t) : t;
                __asm__("" : "+x"(p[h][m]));  // one sum a register, added to in order: GCC would otherwise gather a
                                               // quad's products first and spill them
            }
        }
    }
}

// Q4_K with Q8_K activations (ManyRows::k), llama.cpp's arithmetic on a panel: per 256 weights and activation row,
// isum = Σ_j sc_j · Σ_i v_i·a_i exactly in i32 (a slot's 8 quads summed in i16 first, 16 products a lane: 16·15·127 <
// 2^15, then one madd by the slot's scale), msum = Σ_j m_j · Σa over slot j, then y += d·d_a·isum − dmin·d_a·msum in
// f32: the same instructions for every M, so a row's result does not depend on the rows beside it. Each quad is decoded
// once for the tile's M rows, and for tiles of up to BOTH_HALVES rows both halves of the panel (8 weight rows each)
// share each activation's broadcast (their 2·M i16 sums then fill the registers).
template <typename P, int M>
__attribute__((noinline)) void tile_q8_k(const uint8_t* panel, int blocks, const ManyRows& a, int m0, int first_block,
                                         float* y, size_t y_stride, bool first) {
    constexpr int SLOTS = P::VALUES / P::SLOT, H = M <= BOTH_HALVES ? NR : 1;
    const BlockQ8K* rows[M];
    for (int m = 0; m < M; ++m) rows[m] = a.k_row(m0 + m) + first_block;
    __m256 acc[NR][M];
    for (int n = 0; n < NR; ++n)
        for (int m = 0; m < M; ++m)
            acc[n][m] = first ? _mm256_setzero_ps() : _mm256_loadu_ps(y + (m0 + m) * y_stride + 8 * n);
    for (int b = 0; b < blocks; ++b) {
        const uint8_t* block = panel + b * P::BYTES;
        for (int n0 = 0; n0 < NR; n0 += H) {  // H halves at a time, while the block is in L1
            __m256i isum[H][M];
            for (int j = 0; j < SLOTS; ++j) {
                if (m0 == 0) prefetch_slot_of_next(block, n0 / H * SLOTS + j, NR / H * SLOTS, P::BYTES);
                __m256i p[H][M];
                const uint8_t* nibbles = block + P::V + (j / 2) * 8 * P::QUAD + 32 * n0;
                const int8_t* q[M];
                for (int m = 0; m < M; ++m) q[m] = rows[m][b].q + j * P::SLOT;
                if (j % 2) {
                    slot_sums<H, M, true>(nibbles, P::QUAD, q, p);
                } else {
                    slot_sums<H, M, false>(nibbles, P::QUAD, q, p);
                }
                for (int h = 0; h < H; ++h) {  // the slot's scale for each weight row, as the i16 pair (sc, sc)
                    const __m256i sc = _mm256_cvtepu8_epi32(
                        _mm_loadl_epi64(reinterpret_cast<const __m128i*>(block + P::SC + j * ROWS + 8 * (n0 + h))));
                    const __m256i scale = _mm256_blend_epi16(_mm256_slli_epi32(sc, 16), sc, 0x55);
                    for (int m = 0; m < M; ++m) {
                        const __m256i product = _mm256_madd_epi16(p[h][m], scale);
                        isum[h][m] = j ? _mm256_add_epi32(isum[h][m], product) : product;
                    }
                }
            }
            for (int h = 0; h < H; ++h) {
                const int n = n0 + h;
                const __m256 d = halves(block + P::D + 16 * n), dmin = halves(block + P::DMIN + 16 * n);
                __m256i mins[4];  // m_j of slots 2k and 2k + 1 for each weight row, as i16 pairs
                for (int k = 0; k < 4; ++k)
                    mins[k] = two_slots(block + P::M + 2 * k * ROWS + 8 * n, block + P::M + (2 * k + 1) * ROWS + 8 * n);
                for (int m = 0; m < M; ++m) {
                    __m256i msum = _mm256_setzero_si256();
                    for (int k = 0; k < 4; ++k) {
                        int32_t sums;  // Σa over slots 2k and 2k + 1, as an i16 pair
                        std::memcpy(&sums, rows[m][b].sums32 + 2 * k, 4);
                        msum = _mm256_add_epi32(msum, _mm256_madd_epi16(mins[k], _mm256_set1_epi32(sums)));
                    }
                    const __m256 da = _mm256_set1_ps(rows[m][b].d);
                    acc[n][m] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum[h][m]), _mm256_mul_ps(d, da), acc[n][m]);
                    acc[n][m] = _mm256_fnmadd_ps(_mm256_cvtepi32_ps(msum), _mm256_mul_ps(dmin, da), acc[n][m]);
                }
            }
        }
    }
    for (int n = 0; n < NR; ++n)
        for (int m = 0; m < M; ++m) _mm256_storeu_ps(y + (m0 + m) * y_stride + 8 * n, acc[n][m]);
}

// p[n][m] = Σ over slot j's QUADS quads of maddubs(the quad's values for weight rows 8n…8n + 7, activation row m's 4
// values from q, rows `columns` apart), in i16 lanes started at row m's lane_start (`start`: row 0's, rows a_slots
// apart), so that each lane holds Σ(v − c)·q over its products: Q6_K's, Q5_0's and Q4_0's way (tile_q6 and tile_q5
// say why it cannot overflow). Each quad is decoded once for the tile's M rows; both halves of the panel share each
// broadcast.
template <Kind K, typename P, int M, int QUADS>
__attribute__((always_inline)) inline void lane_sums(const uint8_t* block, int j, const int8_t* q, int columns,
                                                     const int32_t* start, int a_slots, __m256i (*p)[M]) {
#pragma GCC unroll 8
    for (int k = 0; k < QUADS; ++k) {
        __m256i w[NR];
        for (int n = 0; n < NR; ++n) w[n] = values<K, P>(block, j, k, n);
#pragma GCC unroll 8
        for (int m = 0; m < M; ++m) {
            const __m256i x = broadcast4(q + m * columns + 4 * k);
            for (int n = 0; n < NR; ++n) {
                const __m256i sum = k ? p[n][m] : _mm256_set1_epi32(start[m * a_slots]);
                p[n][m] = _mm256_add_epi16(sum, _mm256_maddubs_epi16(w[n], x));
                __asm__("" : "+x"(p[n][m]));  // one sum a register, as in slot_sums
            }
        }
    }
}

// Q5_0 and Q4_0 (K) with a scale per block of 32 (ManyRows by slot): a block's 8 quads' maddubs summed in i16 from the
// activations' lane_start, so that each lane holds Σ(v − c)·q over 16 products (|·| ≤ 16·16·127 < 2^15, Q4_0's
// 8·16·127: the adds may wrap on the way, the sum is exact), one madd by ones to i32, to f32 (exact) times d·d_a.
// Both halves of the panel share each activation's broadcast and each quad is decoded once for the tile's M ≤ MR_Q5
// rows: the same instructions for every M, so a row's result does not depend on the rows beside it.
template <Kind K, typename P, int M>
__attribute__((noinline)) void tile_q5(const uint8_t* panel, int blocks, const ManyRows& a, int m0, int first_block,
                                       float* y, size_t y_stride, bool first) {
    const int a_slots = a.slots();
    const __m256i ones = _mm256_set1_epi16(1);
    __m256 acc[NR][M];
    for (int n = 0; n < NR; ++n)
        for (int m = 0; m < M; ++m)
            acc[n][m] = first ? _mm256_setzero_ps() : _mm256_loadu_ps(y + (m0 + m) * y_stride + 8 * n);
    for (int b = 0; b < blocks; ++b) {
        const uint8_t* block = panel + b * P::BYTES;
        if (m0 == 0) prefetch_slot_of_next(block, 0, 1, P::BYTES);
        const size_t at = size_t(m0) * a_slots + first_block + b;
        const int8_t* q = a.q.data() + size_t(m0) * a.columns + (first_block + b) * 32;
        __m256i p[NR][M];
        lane_sums<K, P, M, 8>(block, 0, q, a.columns, a.lane_start.data() + at, a_slots, p);
        for (int n = 0; n < NR; ++n) {
            const __m256 d = halves(block + P::D + 16 * n);
#pragma GCC unroll 8
            for (int m = 0; m < M; ++m) {
                const __m256 s = _mm256_cvtepi32_ps(_mm256_madd_epi16(p[n][m], ones));
                acc[n][m] = _mm256_fmadd_ps(s, _mm256_mul_ps(d, _mm256_set1_ps(a.scale[at + m * a_slots])), acc[n][m]);
            }
        }
    }
    for (int n = 0; n < NR; ++n)
        for (int m = 0; m < M; ++m) _mm256_storeu_ps(y + (m0 + m) * y_stride + 8 * n, acc[n][m]);
}

// Q6_K with a scale per slot of 16 (ManyRows by slot): each slot's 4 quads' maddubs summed in i16 from the
// activations' lane_start, so that each lane holds Σ(v − 32)·q over 8 products (|·| ≤ 8·32·127 < 2^15: the adds may
// wrap on the way, the sum is exact), one madd by the slot's scale as the i16 pair (sc, sc), to f32 (exact: < 2^24)
// times the slot's d_a, and d once per block. Both halves of the panel share each activation's broadcast and each quad
// is decoded once for the tile's M ≤ MR_Q6 rows: the same instructions for every M, so a row's result does not depend
// on the rows beside it.
template <typename P, int M>
__attribute__((noinline)) void tile_q6(const uint8_t* panel, int blocks, const ManyRows& a, int m0, int first_block,
                                       float* y, size_t y_stride, bool first) {
    const int a_slots = a.slots();
    for (int b = 0; b < blocks; ++b) {
        const uint8_t* block = panel + b * P::BYTES;
        __m256 sums[NR][M];  // Σ over the block's slots of sc·Σ(v − 32)·q · d_a, for each weight row and activation row
        for (int j = 0; j < 16; ++j) {
            if (m0 == 0) prefetch_slot_of_next(block, j, 16, P::BYTES);
            const int slot = (first_block + b) * 16 + j;
            const size_t at = size_t(m0) * a_slots + slot;
            const int8_t* q = a.q.data() + size_t(m0) * a.columns + slot * 16;
            __m256i p[NR][M];
            lane_sums<Kind::Q6_K, P, M, 4>(block, j, q, a.columns, a.lane_start.data() + at, a_slots, p);
            for (int n = 0; n < NR; ++n) {
                const __m256i sc = _mm256_cvtepi8_epi32(
                    _mm_loadl_epi64(reinterpret_cast<const __m128i*>(block + P::SC + j * ROWS + 8 * n)));
                const __m256i scale = _mm256_blend_epi16(_mm256_slli_epi32(sc, 16), sc, 0x55);
#pragma GCC unroll 8
                for (int m = 0; m < M; ++m) {
                    const __m256 s = _mm256_cvtepi32_ps(_mm256_madd_epi16(p[n][m], scale));
                    const __m256 da = _mm256_set1_ps(a.scale[at + m * a_slots]);
                    sums[n][m] = j ? _mm256_fmadd_ps(s, da, sums[n][m]) : _mm256_mul_ps(s, da);
                }
            }
        }
        for (int n = 0; n < NR; ++n) {
            const __m256 d = halves(block + P::D + 16 * n);
            for (int m = 0; m < M; ++m) {
                float* out = y + (m0 + m) * y_stride + 8 * n;
                const __m256 before = first && b == 0 ? _mm256_setzero_ps() : _mm256_loadu_ps(out);
                _mm256_storeu_ps(out, _mm256_fmadd_ps(sums[n][m], d, before));
            }
        }
    }
}

template <Kind K, typename P, int M>
void tile(const uint8_t* panel, int blocks, const ManyRows& a, int m0, int first_block, float* y, size_t y_stride,
          bool first) {
    if constexpr (K == Kind::Q4_K)
        tile_q8_k<P, M>(panel, blocks, a, m0, first_block, y, y_stride, first);
    else if constexpr (K == Kind::Q6_K)
        tile_q6<P, M>(panel, blocks, a, m0, first_block, y, y_stride, first);
    else
        tile_q5<K, P, M>(panel, blocks, a, m0, first_block, y, y_stride, first);
}

template <Kind K>
constexpr GemmFn GEMM =
    gemm_panels<K, ROWS, K == Kind::Q4_K ? MR_Q8_K : K == Kind::Q6_K ? MR_Q6 : MR_Q5, NEVER_DECODED>;
template <Kind K>
constexpr PackFn PACK = pack_panel<K, ROWS, Interleave>;

}  // namespace

const Gemms* avx2_gemms() {  // no Q8_0: its unsigned values (q + 128) would saturate maddubs
    static const Gemms gemms{{PACK<Kind::Q4_K>, PACK<Kind::Q6_K>, nullptr, PACK<Kind::Q5_0>, PACK<Kind::Q4_0>},
                             {GEMM<Kind::Q4_K>, GEMM<Kind::Q6_K>, nullptr, GEMM<Kind::Q5_0>, GEMM<Kind::Q4_0>},
                             {Panel<Kind::Q4_K, ROWS>::BYTES, Panel<Kind::Q6_K, ROWS>::BYTES, 0,
                              Panel<Kind::Q5_0, ROWS>::BYTES, Panel<Kind::Q4_0, ROWS>::BYTES},
                             {true, false, false, false, false}, ROWS, FROM_ROWS,
                             avx2_quantizer()};
    return &gemms;
}

}  // namespace specdemo
