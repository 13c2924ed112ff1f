// Which dot products run: chosen once, by the CPU's flags, in this one place.
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <initializer_list>
#include <string>

#include "formats.hpp"

namespace specdemo {

namespace {

bool has_avx2() {
    return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && __builtin_cpu_supports("f16c");
}

bool has_avx512() {
    return has_avx2() && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
           __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512vnni");
}

// A wrong path for a test (SPECDEMO_KERNELS_CORRUPT="avx2:Q6_K", read once): that ISA's results for that block type, by
// its dot products and its gemm, each call's first output one part in a thousand off, so that the known-answer check at
// load (specdemo/models/kernels.py) is seen to catch it. Without the variable every ISA's own kernels are returned.
struct Corruption {
    const Kernels* of = nullptr;  // the kernels it stands in for (nullptr: none)
    Kernels kernels{};            // theirs, but the kind's dot product and gemm wrapped
    Gemms gemms{};
    std::string name;             // "avx2:Q6_K"
};

DotFn true_dot = nullptr;
GemmFn true_gemm = nullptr;

void perturb(float* first) { *first = *first * 1.001f + 1e-3f; }

void corrupt_dot(const uint8_t* weights, int blocks, const uint8_t* activations, size_t row_bytes, int m_rows,
                 float* out, size_t out_stride) {
    true_dot(weights, blocks, activations, row_bytes, m_rows, out, out_stride);
    perturb(out);
}

void corrupt_gemm(const PackedWeights& w, const ManyRows& a, float* y, size_t y_stride, size_t first_panel,
                  size_t last_panel) {
    true_gemm(w, a, y, y_stride, first_panel, last_panel);
    perturb(y);
}

const Kernels* own_kernels_for(const char* isa) {
    if (std::strcmp(isa, "scalar") == 0) return &scalar_kernels();
    if (std::strcmp(isa, "avx2") == 0) return has_avx2() ? avx2_kernels() : nullptr;
    if (std::strcmp(isa, "avx512") == 0) return has_avx512() ? avx512_kernels() : nullptr;
    return nullptr;
}

void read_corruption(Corruption& c) {  // in place: c.kernels points into c
    const char* asked = std::getenv("SPECDEMO_KERNELS_CORRUPT");
    const char* colon = asked ? std::strchr(asked, ':') : nullptr;
    const Kernels* own = colon ? own_kernels_for(std::string(asked, colon).c_str()) : nullptr;
    for (int k = 0; own && k < KINDS; ++k) {
        if (std::strcmp(colon + 1, KIND_NAMES[k]) != 0) continue;
        c.of = own, c.kernels = *own, c.name = asked;
        true_dot = own->dot[k], c.kernels.dot[k] = corrupt_dot;
        if (own->gemms && own->gemms->gemm[k]) {
            c.gemms = *own->gemms, true_gemm = c.gemms.gemm[k], c.gemms.gemm[k] = corrupt_gemm;
            c.kernels.gemms = &c.gemms;
        }
    }
}

const Corruption& corruption() {
    static Corruption c;
    static const bool read = (read_corruption(c), true);
    (void)read;
    return c;
}

}  // namespace

// What SPECDEMO_KERNELS_CORRUPT made wrong ("avx2:Q6_K"; "" for nothing): a test asks it to know the hook is built in.
extern "C" __attribute__((visibility("default"))) const char* specdemo_kernels_corrupted() {
    return corruption().name.c_str();
}

const Kernels* kernels_for(const char* isa) {
    const Kernels* own = own_kernels_for(isa);
    return own && own == corruption().of ? &corruption().kernels : own;
}

namespace {

const Kernels* widest() {
    const char* forced = std::getenv("SPECDEMO_KERNEL_ISA");  // a bench holds a path for a whole process
    if (forced && *forced) {
        if (const Kernels* kernels = kernels_for(forced)) return kernels;
    }
    for (const char* isa : {"avx512", "avx2"}) {
        if (const Kernels* kernels = kernels_for(isa)) return kernels;
    }
    return &scalar_kernels();
}

std::atomic<const Kernels*> chosen{nullptr};

}  // namespace

const Kernels& chosen_kernels() {
    const Kernels* kernels = chosen.load(std::memory_order_acquire);
    if (!kernels) {
        kernels = widest();
        chosen.store(kernels, std::memory_order_release);
    }
    return *kernels;
}

bool use_kernels(const char* isa) {
    const Kernels* kernels = isa && *isa ? kernels_for(isa) : widest();
    if (kernels) chosen.store(kernels, std::memory_order_release);
    return kernels != nullptr;
}

namespace {

std::atomic<int> gemm_rows{0};  // 0: each ISA's own

}  // namespace

int gemm_from(const Gemms& gemms) {
    const int rows = gemm_rows.load(std::memory_order_relaxed);
    return rows > 0 ? rows : gemms.from_rows;
}

void set_gemm_from(int rows) { gemm_rows.store(rows > 0 ? rows : 0, std::memory_order_relaxed); }

}  // namespace specdemo
