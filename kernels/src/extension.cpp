// The library OpenVINO loads with Core.add_extension: the op, and a C entry for Python to ask which kernels run.
#include "attention.hpp"
#include "block_matmul.hpp"
#include "formats.hpp"

#include <emmintrin.h>

#include <cstdint>
#include <string>
#include "openvino/core/extension.hpp"
#include "openvino/core/op_extension.hpp"

OPENVINO_CREATE_EXTENSIONS(std::vector<ov::Extension::Ptr>({std::make_shared<ov::OpExtension<specdemo::BlockMatMul>>(),
                                                             std::make_shared<ov::OpExtension<specdemo::CachedAttention>>()}));

// For Python through ctypes (specdemo/models/kernels.py): the ISA running, and holding another (tests force each path).
extern "C" __attribute__((visibility("default"))) const char* specdemo_kernels_isa() {
    return specdemo::chosen_kernels().isa;
}

extern "C" __attribute__((visibility("default"))) int specdemo_kernels_use(const char* isa) {
    return specdemo::use_kernels(isa) ? 1 : 0;
}

extern "C" __attribute__((visibility("default"))) void specdemo_kernels_gemm_from(int rows) {
    specdemo::set_gemm_from(rows);
}

extern "C" __attribute__((visibility("default"))) uint64_t specdemo_kernels_packings() {
    return specdemo::packings_so_far();
}

namespace {

// The block types for which the running ISA has a gemm (and, with `q8_k`, whose gemm takes Q8_K activations),
// comma-separated.
const char* gemm_kinds(bool q8_k) {
    thread_local std::string kinds;
    kinds.clear();
    if (const specdemo::Gemms* gemms = specdemo::chosen_kernels().gemms) {
        for (int k = 0; k < specdemo::KINDS; ++k)
            if (gemms->gemm[k] && (!q8_k || gemms->q8_k[k])) kinds.append(kinds.empty() ? "" : ",").append(specdemo::KIND_NAMES[k]);
    }
    return kinds.c_str();
}

}  // namespace

// The block types the running ISA has a gemm for, comma-separated ("" for none: every call takes the dot products).
extern "C" __attribute__((visibility("default"))) const char* specdemo_kernels_gemm_kinds() { return gemm_kinds(false); }

// Those of them whose gemm quantizes the activations as Q8_K (a scale per 256), not a scale per slot.
extern "C" __attribute__((visibility("default"))) const char* specdemo_kernels_gemm_q8_k_kinds() { return gemm_kinds(true); }


// A pass reading `bytes` from `p` (its whole 256-byte runs) as fast as a core can: the read bandwidth the
// kernels' streaming is judged against (specdemo/bench/kernels.py runs one a thread, beside each other). Four
// independent ORs of 16-byte loads keep the loads, not the arithmetic, the limit on every x86-64.
extern "C" __attribute__((visibility("default"))) uint64_t specdemo_kernels_read(const void* p, size_t bytes) {
    const __m128i* v = static_cast<const __m128i*>(p);
    __m128i a = _mm_setzero_si128(), b = a, c = a, d = a;
    for (size_t i = 0; i + 16 <= bytes / 16; i += 16) {
        for (int k = 0; k < 16; k += 4) {
            a = _mm_or_si128(a, _mm_loadu_si128(v + i + k));
            b = _mm_or_si128(b, _mm_loadu_si128(v + i + k + 1));
            c = _mm_or_si128(c, _mm_loadu_si128(v + i + k + 2));
            d = _mm_or_si128(d, _mm_loadu_si128(v + i + k + 3));
        }
    }
    const __m128i all = _mm_or_si128(_mm_or_si128(a, b), _mm_or_si128(c, d));
    return uint64_t(_mm_cvtsi128_si64(all)) | uint64_t(_mm_extract_epi16(all, 4));
}
