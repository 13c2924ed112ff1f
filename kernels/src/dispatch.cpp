// Which dot products run: chosen once, by the CPU's flags, in this one place.
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <initializer_list>

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

}  // namespace

const Kernels* kernels_for(const char* isa) {
    if (std::strcmp(isa, "scalar") == 0) return &scalar_kernels();
    if (std::strcmp(isa, "avx2") == 0) return has_avx2() ? avx2_kernels() : nullptr;
    if (std::strcmp(isa, "avx512") == 0) return has_avx512() ? avx512_kernels() : nullptr;
    return nullptr;
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
