// The library OpenVINO loads with Core.add_extension: the op, and a C entry for Python to ask which kernels run.
#include "block_matmul.hpp"
#include "formats.hpp"

#include <string>
#include "openvino/core/extension.hpp"
#include "openvino/core/op_extension.hpp"

OPENVINO_CREATE_EXTENSIONS(std::vector<ov::Extension::Ptr>({std::make_shared<ov::OpExtension<specdemo::BlockMatMul>>()}));

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

// The block types the running ISA has a gemm for, comma-separated ("" for none: every call takes the dot products).
extern "C" __attribute__((visibility("default"))) const char* specdemo_kernels_gemm_kinds() {
    thread_local std::string kinds;
    kinds.clear();
    if (const specdemo::Gemms* gemms = specdemo::chosen_kernels().gemms) {
        for (int k = 0; k < 4; ++k)
            if (gemms->gemm[k]) kinds.append(kinds.empty() ? "" : ",").append(specdemo::KIND_NAMES[k]);
    }
    return kinds.c_str();
}
