// The dot products with AVX2 and FMA: 32 weights at a time, u8 × i8 pairs summed by maddubs, then scaled by the
// sub-block's scale with madd (both exact in i16 / i32: |q| ≤ 63, |a| ≤ 127), one f32 FMA per block. A weight block is
// decoded once for R activation rows (R ≤ SHARED), each row's sums in registers of its own.
// Compiled with -mavx2 -mfma -mf16c; chosen only where the CPU has them (dispatch.cpp).
#include <immintrin.h>

#include "formats.hpp"
#include "glu.hpp"

namespace specdemo {

namespace {

constexpr int SHARED = 4;  // activation rows a weight block is decoded once for (their sums stay in registers)

inline float sum_lanes(__m256 v) {
    __m128 x = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    x = _mm_add_ps(x, _mm_movehl_ps(x, x));
    x = _mm_add_ss(x, _mm_movehdup_ps(x));
    return _mm_cvtss_f32(x);
}

inline float sum_lanes(__m128 x) {
    x = _mm_add_ps(x, _mm_movehl_ps(x, x));
    x = _mm_add_ss(x, _mm_movehdup_ps(x));
    return _mm_cvtss_f32(x);
}

inline float half(const uint8_t* p) { return _cvtsh_ss(uint16_t(p[0] | (p[1] << 8))); }
inline __m256i load(const void* p) { return _mm256_loadu_si256(static_cast<const __m256i*>(p)); }

// Σ over 32 pairs of signed bytes, as 8 i32 lanes: |w| · (a with w's sign), so maddubs sees an unsigned operand.
inline __m256i dot_signed(__m256i w, __m256i a) {
    const __m256i pairs = _mm256_maddubs_epi16(_mm256_sign_epi8(w, w), _mm256_sign_epi8(a, w));
    return _mm256_madd_epi16(pairs, _mm256_set1_epi16(1));
}


// Byte indices that repeat i16 lane j (bytes 2j, 2j + 1) of each 128-bit half over all 16 lanes of a ymm.
struct Spread {
    alignas(32) int8_t index[32];
    constexpr Spread(int j) : index{} {
        for (int i = 0; i < 32; ++i) index[i] = int8_t(2 * j + i % 2);
    }
    __m256i vector() const { return _mm256_load_si256(reinterpret_cast<const __m256i*>(index)); }
};
constexpr Spread SPREAD[8] = {{0}, {1}, {2}, {3}, {4}, {5}, {6}, {7}};

template <int R>
void q4_k_rows(const uint8_t* w, int blocks, const BlockQ8K* const* a, float* const* out) {
    const __m256i nibble = _mm256_set1_epi8(0x0F);
    __m256 acc[R];
    __m128 mins[R];
    for (int r = 0; r < R; ++r) { acc[r] = _mm256_setzero_ps(); mins[r] = _mm_setzero_ps(); }
    for (int b = 0; b < blocks; ++b, w += Q4_K_BYTES) {
        prefetch_ahead(w, Q4_K_BYTES);
        uint64_t scales, m;
        unpack_q4_k_scales(w + 4, scales, m);
        const __m128i m16 = _mm_cvtepu8_epi16(_mm_cvtsi64_si128(int64_t(m)));
        // the 8 scales as i16 in both 128-bit halves; scale j spread over a vector is one shuffle (SPREAD[j])
        const __m256i sc16 = _mm256_broadcastsi128_si256(_mm_cvtepu8_epi16(_mm_cvtsi64_si128(int64_t(scales))));
        const float d = half(w), dmin = half(w + 2);
        __m256i sumi[R];
        for (int r = 0; r < R; ++r) sumi[r] = _mm256_setzero_si256();
        for (int c = 0; c < 4; ++c) {  // 64 weights: sub-blocks 2c (low nibbles) and 2c + 1 (high nibbles)
            const __m256i bytes = load(w + 16 + 32 * c);
            const __m256i low = _mm256_and_si256(bytes, nibble);
            const __m256i high = _mm256_and_si256(_mm256_srli_epi16(bytes, 4), nibble);
            const __m256i s_low = _mm256_shuffle_epi8(sc16, SPREAD[2 * c].vector());
            const __m256i s_high = _mm256_shuffle_epi8(sc16, SPREAD[2 * c + 1].vector());
            for (int r = 0; r < R; ++r) {
                const int8_t* q8 = a[r][b].q + 64 * c;
                const __m256i p_low = _mm256_madd_epi16(_mm256_maddubs_epi16(low, load(q8)), s_low);
                const __m256i p_high = _mm256_madd_epi16(_mm256_maddubs_epi16(high, load(q8 + 32)), s_high);
                sumi[r] = _mm256_add_epi32(sumi[r], _mm256_add_epi32(p_low, p_high));
            }
        }
        for (int r = 0; r < R; ++r) {
            acc[r] = _mm256_fmadd_ps(_mm256_set1_ps(a[r][b].d * d), _mm256_cvtepi32_ps(sumi[r]), acc[r]);
            const __m128i sums = _mm_loadu_si128(reinterpret_cast<const __m128i*>(a[r][b].sums32));
            const __m128i summ = _mm_madd_epi16(m16, sums);  // Σ m·Σa, in 4 lanes
            mins[r] = _mm_fmadd_ps(_mm_set1_ps(a[r][b].d * dmin), _mm_cvtepi32_ps(summ), mins[r]);
        }
    }
    for (int r = 0; r < R; ++r) *out[r] = sum_lanes(acc[r]) - sum_lanes(mins[r]);
}

// Byte indices that pick scale 2p eight times, then scale 2p + 1 eight times (Q6_K's scales of 32 weights).
struct Pair {
    alignas(16) int8_t index[16];
    constexpr Pair(int p) : index{} {
        for (int i = 0; i < 16; ++i) index[i] = int8_t(2 * p + i / 8);
    }
    __m128i vector() const { return _mm_load_si128(reinterpret_cast<const __m128i*>(index)); }
};
constexpr Pair PAIRS[8] = {{0}, {1}, {2}, {3}, {4}, {5}, {6}, {7}};

template <int R>
void q6_k_rows(const uint8_t* w, int blocks, const BlockQ8K* const* a, float* const* out) {
    const __m256i nibble = _mm256_set1_epi8(0x0F), two = _mm256_set1_epi8(3);
    __m256 acc[R];
    for (int r = 0; r < R; ++r) acc[r] = _mm256_setzero_ps();
    for (int b = 0; b < blocks; ++b, w += Q6_K_BYTES) {
        prefetch_ahead(w, Q6_K_BYTES);
        const uint8_t *ql = w, *qh = w + 128;
        const __m128i sc = _mm_loadu_si128(reinterpret_cast<const __m128i*>(w + 192));
        const __m256i sc16 = _mm256_cvtepi8_epi16(sc);
        const float d = half(w + 208);
        __m256i sumi[R];
        for (int r = 0; r < R; ++r) {  // the −32 of every q, first: −32 · Σ sc·Σa per 16
            const __m256i offset = _mm256_madd_epi16(sc16, load(a[r][b].bsums));
            sumi[r] = _mm256_sub_epi32(_mm256_setzero_si256(), _mm256_slli_epi32(offset, 5));
        }
        for (int h = 0; h < 2; ++h) {
            const __m256i low0 = load(ql + 64 * h), low1 = load(ql + 64 * h + 32), high = load(qh + 32 * h);
            const __m256i q[4] = {  // weights 128h + 32k … + 31, each 0..63
                _mm256_or_si256(_mm256_and_si256(low0, nibble), _mm256_slli_epi16(_mm256_and_si256(high, two), 4)),
                _mm256_or_si256(_mm256_and_si256(low1, nibble),
                                _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(high, 2), two), 4)),
                _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(low0, 4), nibble),
                                _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(high, 4), two), 4)),
                _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(low1, 4), nibble),
                                _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(high, 6), two), 4)),
            };
            for (int k = 0; k < 4; ++k) {
                // the two scales of these 32 weights, 16 each: i16 lanes 0–7 and 8–15 after maddubs
                const __m256i scale = _mm256_cvtepi8_epi16(_mm_shuffle_epi8(sc, PAIRS[4 * h + k].vector()));
                for (int r = 0; r < R; ++r) {
                    const __m256i a8 = load(a[r][b].q + 128 * h + 32 * k);
                    sumi[r] = _mm256_add_epi32(sumi[r], _mm256_madd_epi16(_mm256_maddubs_epi16(q[k], a8), scale));
                }
            }
        }
        for (int r = 0; r < R; ++r)
            acc[r] = _mm256_fmadd_ps(_mm256_set1_ps(a[r][b].d * d), _mm256_cvtepi32_ps(sumi[r]), acc[r]);
    }
    for (int r = 0; r < R; ++r) *out[r] = sum_lanes(acc[r]);
}

// Q5_0's 32 weights as signed bytes, q − 16: nibbles (0–15 low, 16–31 high) with bit i of the 32-bit word as the fifth.
inline __m256i q5_0_values(const uint8_t* w) {
    uint32_t fifth;
    std::memcpy(&fifth, w + 2, 4);
    const __m128i nibbles = _mm_loadu_si128(reinterpret_cast<const __m128i*>(w + 6));
    const __m256i low = _mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16(nibbles, 4), nibbles), _mm256_set1_epi8(0x0F));
    // byte i ← byte i/8 of the word, then its bit i%8
    const __m256i spread = _mm256_shuffle_epi8(_mm256_set1_epi32(int(fifth)),
        _mm256_setr_epi64x(0x0000000000000000, 0x0101010101010101, 0x0202020202020202, 0x0303030303030303));
    const __m256i bit = _mm256_set1_epi64x(int64_t(0x8040201008040201));
    const __m256i set = _mm256_cmpeq_epi8(_mm256_and_si256(spread, bit), bit);
    return _mm256_sub_epi8(_mm256_or_si256(low, _mm256_and_si256(set, _mm256_set1_epi8(0x10))), _mm256_set1_epi8(16));
}

inline __m256i q8_0_values(const uint8_t* w) { return load(w + 2); }

// Q4_0's 32 weights as signed bytes, q − 8: weight i in the low nibbles, 16 + i in the high.
inline __m256i q4_0_values(const uint8_t* w) {
    const __m128i nibbles = _mm_loadu_si128(reinterpret_cast<const __m128i*>(w + 2));
    const __m256i low = _mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16(nibbles, 4), nibbles), _mm256_set1_epi8(0x0F));
    return _mm256_sub_epi8(low, _mm256_set1_epi8(8));
}

template <size_t Bytes, __m256i (*Values)(const uint8_t*)>
struct Blocks32 {  // Q8_0, Q5_0 and Q4_0: a scale a block of 32, signed values
    template <int R>
    static void rows(const uint8_t* w, int blocks, const BlockQ8_0* const* a, float* const* out) {
        __m256 acc[R];
        for (int r = 0; r < R; ++r) acc[r] = _mm256_setzero_ps();
        for (int b = 0; b < blocks; ++b, w += Bytes) {
            prefetch_ahead(w, 1);  // a line a block: blocks of 18, 22 or 34 bytes share lines
            const __m256i q = Values(w);
            const float d = half(w);
            for (int r = 0; r < R; ++r) {
                const __m256i sums = dot_signed(q, load(a[r][b].q));
                acc[r] = _mm256_fmadd_ps(_mm256_set1_ps(d * a[r][b].d), _mm256_cvtepi32_ps(sums), acc[r]);
            }
        }
        for (int r = 0; r < R; ++r) *out[r] = sum_lanes(acc[r]);
    }
};

// The DotFn of a kernel over R rows: M rows in groups of SHARED, then the rest.
template <int R> struct Q4K { static void run(const uint8_t* w, int n, const BlockQ8K* const* a, float* const* o) { q4_k_rows<R>(w, n, a, o); } };
template <int R> struct Q6K { static void run(const uint8_t* w, int n, const BlockQ8K* const* a, float* const* o) { q6_k_rows<R>(w, n, a, o); } };
template <int R> struct Q80 { static void run(const uint8_t* w, int n, const BlockQ8_0* const* a, float* const* o) { Blocks32<Q8_0_BYTES, q8_0_values>::rows<R>(w, n, a, o); } };
template <int R> struct Q50 { static void run(const uint8_t* w, int n, const BlockQ8_0* const* a, float* const* o) { Blocks32<Q5_0_BYTES, q5_0_values>::rows<R>(w, n, a, o); } };
template <int R> struct Q40 { static void run(const uint8_t* w, int n, const BlockQ8_0* const* a, float* const* o) { Blocks32<Q4_0_BYTES, q4_0_values>::rows<R>(w, n, a, o); } };

}  // namespace

const Kernels* avx2_kernels() {
    static const Kernels kernels{"avx2", {shared_rows<BlockQ8K, Q4K, SHARED>, shared_rows<BlockQ8K, Q6K, SHARED>,
                                          shared_rows<BlockQ8_0, Q80, SHARED>, shared_rows<BlockQ8_0, Q50, SHARED>,
                                          shared_rows<BlockQ8_0, Q40, SHARED>}, {},
                                 avx2_gemms(), silu_times_ymm};
    return &kernels;
}

}  // namespace specdemo
