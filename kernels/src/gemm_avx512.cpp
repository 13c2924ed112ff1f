// Many activation rows with AVX-512 VNNI: a packed panel of 32 weight rows (two zmm of 16 rows × 4 values) times 6
// activation rows at a time, each activation's 4 values broadcast, one vpdpbusd per 64 products (u8 weights × i8
// activations, summed in i32 without saturation). Q4_K and Q6_K take Q8_K activations (tile_q8_k: the sub-block scales
// applied in i32, f32 once per 256 weights); Q8_0, Q5_0 and Q4_0 a scale per block of 32 (tile_by_slot). Q5_0's and
// Q4_0's panels are at the file's bytes (PackedQ5Nibbles, PackedQ4Nibbles), as on AVX2.
// Compiled with -mavx512f -mavx512bw -mavx512vl -mavx512vnni; chosen only where the CPU has them (dispatch.cpp).
#include <immintrin.h>

#include <algorithm>

#include "panel.hpp"

namespace specdemo {

namespace {

constexpr int NR = 2, ROWS = 16 * NR;  // zmm of weight rows a tile holds; the panel's rows
// Activation rows a tile holds: 2·6 sums and 2·6 accumulators in registers (f32, or a block's i32 sums for the
// K-quants), with the two zmm of weights, a broadcast and the nibbles' mask 28 of the 32. On the 2-core Zen 4 (EPYC
// family 25 model 17), 28 layers a call from memory, 2 threads, median of 3 (a C++ loop over the gemm alone), a call's
// time ÷ one row's, 6 rows a tile against 4 (both prefetching into L2, activations by slot): Q4_K ffn_up 5 rows 1.01
// against 1.21, 9 rows 1.55 against 1.70; Q6_K ffn_down 0.92 against 1.23, 1.24 against 1.69.
constexpr int MR = 6;
// The panel's next blocks asked for into L2, not L1: on that Zen 4 (as above, 4 rows a tile) a Q4_K layer of 1, 5 and
// 9 rows took 0.86×, 0.97× and 0.89× the time, Q6_K 0.84×, 0.90×, 0.94×. AVX2's gemm keeps L1: held to it, the same
// Zen 4's Q4_K calls took 1.3-2× as long with L2.
constexpr Into PREFETCH_INTO = Into::L2;
// From a single step on: on the 2-core Xeon (AVX-512 VNNI) the whole 1.5B target's step took 0.92–0.94× the dot
// products' time, a call of 5 rows 0.70–0.73× (9 rows: 0.56–0.57× llama.cpp's time, the dot products' ~1.5×); and one
// way for every call, so a row's logits do not depend on how many rows its call holds (gemm_avx2.cpp).
constexpr int FROM_ROWS = 1;
// Q6_K decoded a chunk at a time from 16 rows a call on (panel.hpp: Decoded6). On the 2-core Xeon, 14 ffn_down, 2
// threads, decoded ÷ decoded in each tile: 5 rows 1.17×, 9 rows 1.05×, 13 rows 1.00×, 17 0.97×, 33 0.89×, 64 0.82×.
// With 6 rows a tile, on the 2-core Zen 4 (a C++ loop over the gemm, 28 ffn_down from memory), decoding from 7 rows
// made 8-13 rows 1.2-1.4x slower, and 16 rows the same: 16 kept.
constexpr int DECODED_FROM_ROWS = 16;

inline __m512i broadcast4(const int8_t* p) {
    int32_t word;
    std::memcpy(&word, p, 4);
    return _mm512_set1_epi32(word);
}

// Rows' 32 bytes (16 rows at a time, `stride` apart) as 8 quads of those rows, `quad_bytes` apart: a 16 × 8 transpose
// of i32, the two halves of a zmm (rows i and i + 8) transposed at once as two 8 × 8 (unpacks in 128-bit lanes, then
// one vpermt2q to gather the lanes).
struct Interleave {
    static void run(const uint8_t* v, size_t stride, uint8_t* dst, size_t quad_bytes) {
        for (int group = 0; group < NR; ++group, v += 16 * stride, dst += 64) {
            __m512i r[8], t[8], u[8];
            for (int i = 0; i < 8; ++i) {
                const __m256i low = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(v + i * stride));
                const __m256i high = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(v + (i + 8) * stride));
                r[i] = _mm512_inserti64x4(_mm512_castsi256_si512(low), high, 1);
            }
            for (int i = 0; i < 8; i += 2) {
                t[i] = _mm512_unpacklo_epi32(r[i], r[i + 1]);      // 128-bit lane: a0 b0 a1 b1
                t[i + 1] = _mm512_unpackhi_epi32(r[i], r[i + 1]);  //                a2 b2 a3 b3
            }
            for (int h = 0; h < 8; h += 4) {  // rows 0–3 (h = 0), 4–7: columns c (lane 0) and c + 4 (lane 1) of each
                u[h] = _mm512_unpacklo_epi64(t[h], t[h + 2]);
                u[h + 1] = _mm512_unpackhi_epi64(t[h], t[h + 2]);
                u[h + 2] = _mm512_unpacklo_epi64(t[h + 1], t[h + 3]);
                u[h + 3] = _mm512_unpackhi_epi64(t[h + 1], t[h + 3]);
            }
            const __m512i first = _mm512_setr_epi64(0, 1, 8, 9, 4, 5, 12, 13);
            const __m512i second = _mm512_setr_epi64(2, 3, 10, 11, 6, 7, 14, 15);
            for (int c = 0; c < 4; ++c) {
                _mm512_storeu_si512(dst + c * quad_bytes, _mm512_permutex2var_epi64(u[c], first, u[c + 4]));
                _mm512_storeu_si512(dst + (c + 4) * quad_bytes, _mm512_permutex2var_epi64(u[c], second, u[c + 4]));
            }
        }
    }
};

// The n-th 16 rows' values of quad q of slot j in a packed block.
template <Kind K, typename P>
inline __m512i values(const uint8_t* block, int j, int q, int n) {
    if constexpr (K == Kind::Q4_K) {  // slots 2c and 2c + 1 share the nibbles of quad q of group c
        const __m512i nibbles = _mm512_loadu_si512(block + P::V + ((j / 2) * 8 + q) * P::QUAD + 64 * n);
        return _mm512_and_si512(j % 2 ? _mm512_srli_epi16(nibbles, 4) : nibbles, _mm512_set1_epi8(0x0F));
    } else if constexpr (NIBBLES_AND_HIGHS<P>) {  // the quad's nibbles, and its 2 high bits moved to bits 4 and 5
        const uint8_t* slot = block + P::V + j * P::SLOT_BYTES + 64 * n;
        const __m512i nibbles = _mm512_loadu_si512(slot + (q / 2) * P::QUAD);
        const __m512i highs = _mm512_loadu_si512(slot + 2 * P::QUAD);
        const __m512i low = _mm512_and_si512(q % 2 ? _mm512_srli_epi16(nibbles, 4) : nibbles, _mm512_set1_epi8(0x0F));
        const __m512i high = q == 0 ? _mm512_slli_epi16(highs, 4) : q == 1 ? _mm512_slli_epi16(highs, 2)
                           : q == 2 ? highs : _mm512_srli_epi16(highs, 2);
        return _mm512_or_si512(low, _mm512_and_si512(high, _mm512_set1_epi8(0x30)));
    } else if constexpr (NIBBLES_AND_FIFTHS<P> || NIBBLE_PAIRS<P>) {  // the pair's nibbles, Q5_0's fifth bit q at 4
        const __m512i nibbles = _mm512_loadu_si512(block + P::V + (q % 4) * P::QUAD + 64 * n);
        const __m512i low = _mm512_and_si512(q < 4 ? nibbles : _mm512_srli_epi16(nibbles, 4), _mm512_set1_epi8(0x0F));
        if constexpr (NIBBLE_PAIRS<P>) {
            return low;
        } else {  // the fifths are P's own member
            const __m512i fifths = _mm512_loadu_si512(block + P::FIFTHS + 64 * n);
            const __m512i fifth = q < 4 ? _mm512_slli_epi16(fifths, 4 - q) : _mm512_srli_epi16(fifths, q - 4);
            return _mm512_or_si512(low, _mm512_and_si512(fifth, _mm512_set1_epi8(0x10)));
        }
    } else {
        return _mm512_loadu_si512(block + P::V + (j * (P::SLOT / 4) + q) * P::QUAD + 64 * n);
    }
}

// 16 f16 of a packed block's (d, dmin) as f32.
inline __m512 halves(const uint8_t* p) {
    return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
}

// Q8_0, Q5_0 and Q4_0, with the activations by slot (ManyRows: a scale per 32): per block, the i32 sums started at
// −c·Σa, to f32 times d·d_a.
template <Kind K, typename P, int M>
void tile_by_slot(const uint8_t* panel, int blocks, const ManyRows& a, int m0, int first_block, float* y,
                  size_t y_stride, bool first) {
    const int a_slots = a.slots();
    __m512 acc[M][NR];
    for (int m = 0; m < M; ++m)
        for (int n = 0; n < NR; ++n)
            acc[m][n] = first ? _mm512_setzero_ps() : _mm512_loadu_ps(y + (m0 + m) * y_stride + 16 * n);
    for (int b = 0; b < blocks; ++b) {
        const uint8_t* block = panel + b * P::BYTES;
        if (m0 == 0) prefetch_slot_of_next<PREFETCH_INTO>(block, 0, 1, P::BYTES);
        const int slot = first_block + b;
        const size_t at = size_t(m0) * a_slots + slot;  // activation row m0's slot
        const int8_t* q = a.q.data() + size_t(m0) * a.columns + slot * P::SLOT;
        __m512i sum[M][NR];
        for (int m = 0; m < M; ++m) {
            const __m512i start = _mm512_set1_epi32(a.start[at + m * a_slots]);
            for (int n = 0; n < NR; ++n) sum[m][n] = start;
        }
        for (int quad = 0; quad < 8; ++quad) {
            __m512i w[NR];
            for (int n = 0; n < NR; ++n) w[n] = values<K, P>(block, 0, quad, n);
            for (int m = 0; m < M; ++m) {
                const __m512i x = broadcast4(q + m * a.columns + 4 * quad);
                for (int n = 0; n < NR; ++n) sum[m][n] = _mm512_dpbusd_epi32(sum[m][n], w[n], x);
            }
        }
        __m512 d[NR];
        for (int n = 0; n < NR; ++n) d[n] = halves(block + P::D + 32 * n);
        for (int m = 0; m < M; ++m) {
            const __m512 da = _mm512_set1_ps(a.scale[at + m * a_slots]);
            for (int n = 0; n < NR; ++n)
                acc[m][n] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(sum[m][n]), _mm512_mul_ps(d[n], da), acc[m][n]);
        }
    }
    for (int m = 0; m < M; ++m)
        for (int n = 0; n < NR; ++n) _mm512_storeu_ps(y + (m0 + m) * y_stride + 16 * n, acc[m][n]);
}

// The 16 weight rows' i16 pairs (lo[r], hi[r]) of two slots' bytes (one a weight row), for vpdpwssd.
inline __m512i two_slots(const uint8_t* lo, const uint8_t* hi) {
    const __m512i low = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(lo)));
    const __m512i high = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(hi)));
    return _mm512_or_si512(low, _mm512_slli_epi32(high, 16));
}

// Q4_K and Q6_K with Q8_K activations (ManyRows::k: a scale per 256), llama.cpp's arithmetic on a panel, as AVX2's
// tile_q8_k: per 256 weights and activation row, isum = Σ_j sc_j · Σ_i (v_i − c)·a_i exactly in i32 (a slot's sums
// started at −c·Σa, from the block's bsums; then one vpmulld by the slot's scale), Q4_K's msum = Σ_j m_j · Σa over slot
// j (vpdpwssd on the pairs of slots), then y += d·d_a·isum − dmin·d_a·msum in f32, kept in y between blocks. Why:
// vpdpbusd, vpmulld and the f32 multiplies share two pipes (a zmm each a cycle on the Zen 4), and by slot each slot
// and row took three f32 multiplies beside its vpdpbusd (8 for Q4_K's 32 weights, 4 for Q6_K's 16), here one vpmulld.
// |isum| < 2^31: Q4_K 8·63·32·15·127, Q6_K 16·128·16·32·127. The same instructions for every M: a row's result does
// not depend on the rows beside it.
template <Kind K, typename P, int M>
void tile_q8_k(const uint8_t* panel, int blocks, const ManyRows& a, int m0, int first_block, float* y,
               size_t y_stride, bool first) {
    constexpr int SLOTS = P::VALUES / P::SLOT, QUADS = P::SLOT / 4;
    const BlockQ8K* rows[M];
    for (int m = 0; m < M; ++m) rows[m] = a.k_row(m0 + m) + first_block;
    for (int b = 0; b < blocks; ++b) {
        const uint8_t* block = panel + b * P::BYTES;
        __m512i isum[M][NR];
        for (int j = 0; j < SLOTS; ++j) {
            if (STREAMED<P> && m0 == 0) prefetch_slot_of_next<PREFETCH_INTO>(block, j, SLOTS, P::BYTES);
            __m512i sum[M][NR];
            for (int m = 0; m < M; ++m) {
                const __m512i start = K == Kind::Q6_K ? _mm512_set1_epi32(-32 * rows[m][b].bsums[j])
                                                      : _mm512_setzero_si512();
                for (int n = 0; n < NR; ++n) sum[m][n] = start;
            }
            for (int quad = 0; quad < QUADS; ++quad) {
                __m512i w[NR];
                for (int n = 0; n < NR; ++n) w[n] = values<K, P>(block, j, quad, n);
                for (int m = 0; m < M; ++m) {
                    const __m512i x = broadcast4(rows[m][b].q + j * P::SLOT + 4 * quad);
                    for (int n = 0; n < NR; ++n) sum[m][n] = _mm512_dpbusd_epi32(sum[m][n], w[n], x);
                }
            }
            for (int n = 0; n < NR; ++n) {
                const uint8_t* scales = block + P::SC + j * ROWS + 16 * n;
                const __m128i bytes = _mm_loadu_si128(reinterpret_cast<const __m128i*>(scales));
                const __m512i sc = K == Kind::Q6_K ? _mm512_cvtepi8_epi32(bytes) : _mm512_cvtepu8_epi32(bytes);
                for (int m = 0; m < M; ++m) {
                    const __m512i product = _mm512_mullo_epi32(sum[m][n], sc);
                    isum[m][n] = j ? _mm512_add_epi32(isum[m][n], product) : product;
                }
            }
        }
        for (int n = 0; n < NR; ++n) {
            const __m512 d = halves(block + P::D + 32 * n);
            __m512i mins[4];  // Q4_K: m_j of slots 2k and 2k + 1 for each weight row, as i16 pairs
            __m512 dmin;
            if constexpr (K == Kind::Q4_K) {
                dmin = halves(block + P::DMIN + 32 * n);
                for (int k = 0; k < 4; ++k)
                    mins[k] = two_slots(block + P::M + 2 * k * ROWS + 16 * n,
                                        block + P::M + (2 * k + 1) * ROWS + 16 * n);
            }
            for (int m = 0; m < M; ++m) {
                float* out = y + (m0 + m) * y_stride + 16 * n;
                const __m512 da = _mm512_set1_ps(rows[m][b].d);
                const __m512 before = first && b == 0 ? _mm512_setzero_ps() : _mm512_loadu_ps(out);
                __m512 sum = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum[m][n]), _mm512_mul_ps(d, da), before);
                if constexpr (K == Kind::Q4_K) {
                    __m512i msum = _mm512_setzero_si512();
                    for (int k = 0; k < 4; ++k) {
                        int32_t sums;  // Σa over slots 2k and 2k + 1, as an i16 pair
                        std::memcpy(&sums, rows[m][b].sums32 + 2 * k, 4);
                        msum = _mm512_dpwssd_epi32(msum, mins[k], _mm512_set1_epi32(sums));
                    }
                    sum = _mm512_fnmadd_ps(_mm512_cvtepi32_ps(msum), _mm512_mul_ps(dmin, da), sum);
                }
                _mm512_storeu_ps(out, sum);
            }
        }
    }
}

template <Kind K, typename P, int M>
void tile(const uint8_t* panel, int blocks, const ManyRows& a, int m0, int first_block, float* y, size_t y_stride,
          bool first) {
    if constexpr (K == Kind::Q4_K || K == Kind::Q6_K)
        tile_q8_k<K, P, M>(panel, blocks, a, m0, first_block, y, y_stride, first);
    else
        tile_by_slot<K, P, M>(panel, blocks, a, m0, first_block, y, y_stride, first);
}

// A chunk's Q6_K blocks decoded for the tiles of a call of many rows, the next blocks asked for meanwhile.
template <>
void decode6<ROWS>(const uint8_t* packed, int blocks, uint8_t* out) {
    using P = Packed<Kind::Q6_K, ROWS>;
    using D6 = Decoded6<ROWS>;
    for (int b = 0; b < blocks; ++b, packed += P::BYTES, out += D6::BYTES) {
        std::memcpy(out, packed, D6::V);  // d and sc
        for (int j = 0; j < 16; ++j) {
            prefetch_slot_of_next<PREFETCH_INTO>(packed, j, 16, P::BYTES);
            for (int q = 0; q < 4; ++q)
                for (int n = 0; n < NR; ++n)
                    _mm512_storeu_si512(out + D6::V + (4 * j + q) * D6::QUAD + 64 * n, values<Kind::Q6_K, P>(packed, j, q, n));
        }
    }
}

template <Kind K>
constexpr GemmFn GEMM = gemm_panels<K, ROWS, MR, DECODED_FROM_ROWS>;
template <Kind K>
constexpr PackFn PACK = pack_panel<K, ROWS, Interleave>;

}  // namespace

const Gemms* avx512_gemms() {
    static const Gemms gemms{
        {PACK<Kind::Q4_K>, PACK<Kind::Q6_K>, PACK<Kind::Q8_0>, PACK<Kind::Q5_0>, PACK<Kind::Q4_0>},
        {GEMM<Kind::Q4_K>, GEMM<Kind::Q6_K>, GEMM<Kind::Q8_0>, GEMM<Kind::Q5_0>, GEMM<Kind::Q4_0>},
        {Panel<Kind::Q4_K, ROWS>::BYTES, Panel<Kind::Q6_K, ROWS>::BYTES, Panel<Kind::Q8_0, ROWS>::BYTES,
         Panel<Kind::Q5_0, ROWS>::BYTES, Panel<Kind::Q4_0, ROWS>::BYTES},
        {true, true, false, false, false}, ROWS, FROM_ROWS,
        avx2_quantizer()};
    return &gemms;
}

}  // namespace specdemo
