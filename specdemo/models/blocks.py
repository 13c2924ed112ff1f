"""The GGUF block types specdemo's kernels read (kernels/src/formats.hpp), and the name of their op. A leaf: the op's
stand-in (block_matmul.py) and the kernels' Python side (kernels.py, which builds the op to check the kernels at load)
both read it."""

TYPE = "BlockMatMul"
KINDS = {"Q4_K": (256, 144), "Q6_K": (256, 210), "Q8_0": (32, 34), "Q5_0": (32, 22)}  # values, bytes a block
