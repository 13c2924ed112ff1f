// The library OpenVINO loads with Core.add_extension: the op, and a C entry for Python to ask which kernels run.
#include "block_matmul.hpp"
#include "formats.hpp"
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
