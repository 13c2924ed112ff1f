// The dot products with AVX-512 (BW, VL) and VNNI: the K-quants 64 weights at a time, maddubs on zmm, each sub-block's
// scale applied and accumulated in one vpdpwssd; Q8_0 and Q5_0 blocks (32 weights, a scale each) with one vpdpbusd on
// ymm. A weight block is decoded once for R activation rows (R ≤ SHARED), each row's sums in its own registers.
// Compiled with -mavx512f -mavx512bw -mavx512vl -mavx512vnni; chosen only where the CPU has them (dispatch.cpp).
#include <immintrin.h>

#include "formats.hpp"
#include "glu.hpp"

namespace specdemo {

namespace {

constexpr int SHARED = 4;  // activation rows a weight block is decoded once for (8 measured no faster: registers spill)

inline float half(const uint8_t* p) { return _cvtsh_ss(uint16_t(p[0] | (p[1] << 8))); }
inline __m256i load(const void* p) { return _mm256_loadu_si256(static_cast<const __m256i*>(p)); }

inline float sum_lanes(__m256 v) {
    __m128 x = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    x = _mm_add_ps(x, _mm_movehl_ps(x, x));
    return _mm_cvtss_f32(_mm_add_ss(x, _mm_movehdup_ps(x)));
}

// Byte indices that pick, for 32 lanes, byte `first` + lane / run of a 16-byte row (repeated in both 128-bit halves).
struct Picks {
    alignas(32) int8_t index[32];
    constexpr Picks(int first, int run) : index{} {
        for (int i = 0; i < 32; ++i) index[i] = int8_t((first + i / run) & 15);
    }
    __m256i vector() const { return _mm256_load_si256(reinterpret_cast<const __m256i*>(index)); }
};
// Q6_K's four scales of 64 weights, 8 lanes each: weights 128h + 64k … for (h, k) = (0, 0), (0, 1), (1, 0), (1, 1)
constexpr Picks Q6_K_PICKS[4] = {{0, 8}, {4, 8}, {8, 8}, {12, 8}};

// i16 lane indices that spread two of Q4_K's 8 scales over 32 lanes, 16 each: the sub-blocks of 64 bytes' low
// (or high) nibbles, bytes 64p…64p + 63: sub-blocks 4p, 4p + 2 (low) and 4p + 1, 4p + 3 (high).
struct Spread {
    alignas(64) int16_t index[32];
    constexpr Spread(int first, int second) : index{} {
        for (int i = 0; i < 32; ++i) index[i] = int16_t(i < 16 ? first : second);
    }
    __m512i vector() const { return _mm512_load_si512(index); }
};
constexpr Spread Q4_K_SPREAD[4] = {{0, 2}, {1, 3}, {4, 6}, {5, 7}};  // (p, low), (p, high) for p = 0, 1

// Q4_K's activations in the order the nibbles of 64 bytes hold weights: each 128 values as sub-blocks 0, 2, 1, 3.
void arrange_q4_k(void* row, int columns) {
    auto* blocks = static_cast<BlockQ8K*>(row);
    for (int b = 0; b < columns / 256; ++b) {
        for (int half = 0; half < 2; ++half) {
            int8_t* q = blocks[b].q + 128 * half;
            int8_t second[32];
            std::memcpy(second, q + 32, 32);
            std::memcpy(q + 32, q + 64, 32);
            std::memcpy(q + 64, second, 32);
        }
    }
}

template <int R>
void q4_k_rows(const uint8_t* w, int blocks, const BlockQ8K* const* a, float* const* out) {
    const __m512i nibble = _mm512_set1_epi8(0x0F);
    __m512 acc[R];
    __m128 mins[R];
    for (int r = 0; r < R; ++r) { acc[r] = _mm512_setzero_ps(); mins[r] = _mm_setzero_ps(); }
    for (int b = 0; b < blocks; ++b, w += Q4_K_BYTES) {
        prefetch_ahead(w, Q4_K_BYTES);
        uint64_t sc, m;
        unpack_q4_k_scales(w + 4, sc, m);
        const __m512i sc16 = _mm512_zextsi128_si512(_mm_cvtepu8_epi16(_mm_cvtsi64_si128(int64_t(sc))));
        const __m128i m16 = _mm_cvtepu8_epi16(_mm_cvtsi64_si128(int64_t(m)));
        int halves;
        std::memcpy(&halves, w, 4);
        const __m128 scales = _mm_cvtph_ps(_mm_cvtsi32_si128(halves));  // d, dmin
        const float d = _mm_cvtss_f32(scales), dmin = _mm_cvtss_f32(_mm_movehdup_ps(scales));
        __m512i sumi[R];
        for (int r = 0; r < R; ++r) sumi[r] = _mm512_setzero_si512();
        for (int p = 0; p < 2; ++p) {  // 128 weights, bytes 64p…: low nibbles sub-blocks 4p, 4p+2; high 4p+1, 4p+3
            const __m512i bytes = _mm512_loadu_si512(w + 16 + 64 * p);
            const __m512i low = _mm512_and_si512(bytes, nibble);
            const __m512i high = _mm512_and_si512(_mm512_srli_epi16(bytes, 4), nibble);
            const __m512i s_low = _mm512_permutexvar_epi16(Q4_K_SPREAD[2 * p].vector(), sc16);
            const __m512i s_high = _mm512_permutexvar_epi16(Q4_K_SPREAD[2 * p + 1].vector(), sc16);
            for (int r = 0; r < R; ++r) {  // the activations arranged to match (arrange_q4_k)
                const int8_t* q8 = a[r][b].q + 128 * p;
                sumi[r] = _mm512_dpwssd_epi32(sumi[r], _mm512_maddubs_epi16(low, _mm512_loadu_si512(q8)), s_low);
                sumi[r] = _mm512_dpwssd_epi32(sumi[r], _mm512_maddubs_epi16(high, _mm512_loadu_si512(q8 + 64)), s_high);
            }
        }
        for (int r = 0; r < R; ++r) {
            acc[r] = _mm512_fmadd_ps(_mm512_set1_ps(a[r][b].d * d), _mm512_cvtepi32_ps(sumi[r]), acc[r]);
            const __m128i sums = _mm_loadu_si128(reinterpret_cast<const __m128i*>(a[r][b].sums32));
            mins[r] = _mm_fmadd_ps(_mm_set1_ps(a[r][b].d * dmin), _mm_cvtepi32_ps(_mm_madd_epi16(m16, sums)), mins[r]);
        }
    }
    for (int r = 0; r < R; ++r) {
        __m128 x = mins[r];
        x = _mm_add_ps(x, _mm_movehl_ps(x, x));
        *out[r] = _mm512_reduce_add_ps(acc[r]) - _mm_cvtss_f32(_mm_add_ss(x, _mm_movehdup_ps(x)));
    }
}

template <int R>
void q6_k_rows(const uint8_t* w, int blocks, const BlockQ8K* const* a, float* const* out) {
    const __m512i nibble = _mm512_set1_epi8(0x0F), two = _mm512_set1_epi8(3);
    __m512 acc[R];
    for (int r = 0; r < R; ++r) acc[r] = _mm512_setzero_ps();
    for (int b = 0; b < blocks; ++b, w += Q6_K_BYTES) {
        prefetch_ahead(w, Q6_K_BYTES);
        const uint8_t *ql = w, *qh = w + 128;
        const __m128i sc = _mm_loadu_si128(reinterpret_cast<const __m128i*>(w + 192));
        const __m256i scales = _mm256_broadcastsi128_si256(sc), sc16 = _mm256_cvtepi8_epi16(sc);
        const float d = half(w + 208);
        __m512i sumi[R];
        for (int r = 0; r < R; ++r) {  // the −32 of every q, first: −32 · Σ sc·Σa per 16
            const __m256i offset = _mm256_slli_epi32(_mm256_madd_epi16(sc16, load(a[r][b].bsums)), 5);
            sumi[r] = _mm512_zextsi256_si512(_mm256_sub_epi32(_mm256_setzero_si256(), offset));
        }
        for (int h = 0; h < 2; ++h) {  // 128 weights: low nibbles weights 128h + 0…63, high nibbles 128h + 64…127
            const __m512i low = _mm512_loadu_si512(ql + 64 * h);
            const __m256i bits = load(qh + 32 * h);
            const __m512i high_a = _mm512_inserti64x4(_mm512_castsi256_si512(bits), _mm256_srli_epi16(bits, 2), 1);
            const __m512i high_b = _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_srli_epi16(bits, 4)),
                                                      _mm256_srli_epi16(bits, 6), 1);
            const __m512i q_a = _mm512_or_si512(_mm512_and_si512(low, nibble),
                                                _mm512_slli_epi16(_mm512_and_si512(high_a, two), 4));
            const __m512i q_b = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(low, 4), nibble),
                                                _mm512_slli_epi16(_mm512_and_si512(high_b, two), 4));
            const __m512i s_a = _mm512_cvtepi8_epi16(_mm256_shuffle_epi8(scales, Q6_K_PICKS[2 * h].vector()));
            const __m512i s_b = _mm512_cvtepi8_epi16(_mm256_shuffle_epi8(scales, Q6_K_PICKS[2 * h + 1].vector()));
            for (int r = 0; r < R; ++r) {
                const int8_t* q8 = a[r][b].q + 128 * h;
                sumi[r] = _mm512_dpwssd_epi32(sumi[r], _mm512_maddubs_epi16(q_a, _mm512_loadu_si512(q8)), s_a);
                sumi[r] = _mm512_dpwssd_epi32(sumi[r], _mm512_maddubs_epi16(q_b, _mm512_loadu_si512(q8 + 64)), s_b);
            }
        }
        for (int r = 0; r < R; ++r)
            acc[r] = _mm512_fmadd_ps(_mm512_set1_ps(a[r][b].d * d), _mm512_cvtepi32_ps(sumi[r]), acc[r]);
    }
    for (int r = 0; r < R; ++r) *out[r] = _mm512_reduce_add_ps(acc[r]);
}

inline __m256i q8_0_values(const uint8_t* w) { return load(w + 2); }

// Q4_0's 32 weights as signed bytes, q − 8: weight i in the low nibbles, 16 + i in the high.
inline __m256i q4_0_values(const uint8_t* w) {
    const __m128i nibbles = _mm_loadu_si128(reinterpret_cast<const __m128i*>(w + 2));
    const __m256i low = _mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16(nibbles, 4), nibbles), _mm256_set1_epi8(0x0F));
    return _mm256_sub_epi8(low, _mm256_set1_epi8(8));
}

inline __m256i q5_0_values(const uint8_t* w) {  // q − 16 as signed bytes; the fifth bits as a mask
    uint32_t fifth;
    std::memcpy(&fifth, w + 2, 4);
    const __m128i nibbles = _mm_loadu_si128(reinterpret_cast<const __m128i*>(w + 6));
    const __m256i low = _mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16(nibbles, 4), nibbles), _mm256_set1_epi8(0x0F));
    const __m256i high = _mm256_maskz_mov_epi8(_cvtu32_mask32(fifth), _mm256_set1_epi8(0x10));
    return _mm256_sub_epi8(_mm256_or_si256(low, high), _mm256_set1_epi8(16));
}

template <size_t Bytes, __m256i (*Values)(const uint8_t*)>
struct Blocks32 {  // Q8_0, Q5_0 and Q4_0: a scale a block of 32, signed values: |w| · (a with w's sign), one vpdpbusd
    template <int R>
    static void rows(const uint8_t* w, int blocks, const BlockQ8_0* const* a, float* const* out) {
        __m256 acc[R];
        for (int r = 0; r < R; ++r) acc[r] = _mm256_setzero_ps();
        for (int b = 0; b < blocks; ++b, w += Bytes) {
            prefetch_ahead(w, 1);  // a line a block: blocks of 18, 22 or 34 bytes share lines
            const __m256i q = Values(w), magnitude = _mm256_sign_epi8(q, q);
            const float d = half(w);
            for (int r = 0; r < R; ++r) {
                const __m256i sums = _mm256_dpbusd_epi32(_mm256_setzero_si256(), magnitude,
                                                         _mm256_sign_epi8(load(a[r][b].q), q));
                acc[r] = _mm256_fmadd_ps(_mm256_set1_ps(d * a[r][b].d), _mm256_cvtepi32_ps(sums), acc[r]);
            }
        }
        for (int r = 0; r < R; ++r) *out[r] = sum_lanes(acc[r]);
    }
};

template <int R> struct Q4K { static void run(const uint8_t* w, int n, const BlockQ8K* const* a, float* const* o) { q4_k_rows<R>(w, n, a, o); } };
template <int R> struct Q6K { static void run(const uint8_t* w, int n, const BlockQ8K* const* a, float* const* o) { q6_k_rows<R>(w, n, a, o); } };
template <int R> struct Q80 { static void run(const uint8_t* w, int n, const BlockQ8_0* const* a, float* const* o) { Blocks32<Q8_0_BYTES, q8_0_values>::rows<R>(w, n, a, o); } };
template <int R> struct Q50 { static void run(const uint8_t* w, int n, const BlockQ8_0* const* a, float* const* o) { Blocks32<Q5_0_BYTES, q5_0_values>::rows<R>(w, n, a, o); } };
template <int R> struct Q40 { static void run(const uint8_t* w, int n, const BlockQ8_0* const* a, float* const* o) { Blocks32<Q4_0_BYTES, q4_0_values>::rows<R>(w, n, a, o); } };

}  // namespace

const Kernels* avx512_kernels() {
    static const Kernels kernels{"avx512", {shared_rows<BlockQ8K, Q4K, SHARED>, shared_rows<BlockQ8K, Q6K, SHARED>,
                                            shared_rows<BlockQ8_0, Q80, SHARED>, shared_rows<BlockQ8_0, Q50, SHARED>,
                                          shared_rows<BlockQ8_0, Q40, SHARED>},
                                           {arrange_q4_k, nullptr, nullptr, nullptr},
                                           avx512_gemms(), silu_times_ymm};
    return &kernels;
}

}  // namespace specdemo
