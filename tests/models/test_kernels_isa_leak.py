"""No ISA's code leaks into a function the other paths run (issue 61). Each SIMD path is compiled with its own flags
(kernels/CMakeLists.txt), the rest for baseline x86-64. A function of external linkage (an inline of a header, a
template of the standard library) may be compiled in several files, and the linker keeps one copy for every caller:
were it the AVX-512 file's, the AVX2 path would run AVX-512 instructions and a Zen 3 would stop on an illegal
instruction; were it an AVX2 file's, so would an older CPU on the scalar path. So only functions of one file alone
(internal linkage) hold SIMD instructions, read from the built library per function: by their mangled names, since
-fvisibility=hidden makes every symbol local to the library and nm's bindings no longer tell an inline copy from a
file's own function."""

import re
import shutil
import subprocess
from pathlib import Path

import pytest

from specdemo.models import kernels

pytestmark = [
    pytest.mark.skipif(kernels.unavailable() is not None, reason=str(kernels.unavailable())),
    pytest.mark.skipif(not shutil.which("objdump"), reason="binutils (objdump) not installed"),
]

# An instruction a baseline x86-64 CPU lacks, as objdump prints it: every VEX and EVEX encoding begins with v (AVX,
# AVX2, FMA, F16C and AVX-512 alike, on xmm as on ymm and zmm: vpaddd, vfmadd231ps, vcvtph2ps, vzeroupper), the
# AVX-512 mask instructions with k (kmovw).
SIMD = re.compile(r"^\s*[0-9a-f]+:\s+[vk][a-z0-9]+\b", re.M)
# A function of one file alone: in an anonymous namespace (where formats.hpp and panel.hpp put what SIMD files share),
# or static at namespace scope; a compiler's clone (.constprop.0, .cold) is judged as the function it was cut from.
INTERNAL = re.compile(r"_GLOBAL__N_1|^_ZL")
# Each ISA's entry (formats.hpp, attention.hpp), defined once in its file and called by dispatch.cpp (attention.cpp)
# only once the CPU's flags say it runs that ISA.
ENTRIES = re.compile(r"^_ZN8specdemo\d+(avx2|avx512)_(kernels|gemms|attention)Ev$")


def functions(disassembly: str) -> dict[str, str]:
    """{a function's symbol: its instructions} of `objdump -d --no-show-raw-insn`'s output."""
    found, name = {}, None
    for line in disassembly.split("\n"):
        header = re.match(r"^[0-9a-f]+ <(.+)>:$", line)
        if header:
            name = header.group(1)
            found.setdefault(name, "")
        elif name and line.startswith(" "):
            found[name] += line + "\n"
    return found


def leaks(disassembly: str) -> list[str]:
    """The functions of `disassembly` that hold SIMD instructions but that another file's callers may run."""
    return sorted(name for name, text in functions(disassembly).items()
                  if SIMD.search(text) and not INTERNAL.search(name.split(".")[0])
                  and not ENTRIES.match(name.split(".")[0]))


def test_avx_on_xmm_in_an_inline_copy_is_a_leak_and_a_file_s_own_function_is_not():
    disassembly = """
0000000000001000 <_ZN8specdemo18unpack_q4_k_scalesEPKhRmS2_>:
    1000:	vpand  %xmm1,%xmm0,%xmm0
    1004:	ret
0000000000001010 <_ZN8specdemo12_GLOBAL__N_14tileEv>:
    1010:	vpmaddubsw %ymm1,%ymm0,%ymm0
0000000000001020 <_ZN8specdemo12_GLOBAL__N_14tileEv.constprop.0>:
    1020:	kmovw  %k1,%eax
0000000000001030 <_ZN8specdemo12avx2_kernelsEv.cold>:
    1030:	vzeroupper
0000000000001040 <_ZN8specdemo9fp16_roundEf>:
    1040:	pand   %xmm1,%xmm0
"""
    assert leaks(disassembly) == ["_ZN8specdemo18unpack_q4_k_scalesEPKhRmS2_"]


def disassembled(library: Path) -> str:
    return subprocess.run(["objdump", "-d", "--no-show-raw-insn", str(library)], capture_output=True, text=True,
                          check=True).stdout


def test_no_function_the_linker_may_share_between_isa_files_holds_simd_instructions():
    disassembly = disassembled(kernels.library())
    assert "%zmm" in disassembly and "%ymm" in disassembly  # both SIMD paths' code is read
    assert leaks(disassembly) == []
