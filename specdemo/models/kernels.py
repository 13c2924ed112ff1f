"""specdemo's own kernels: BlockMatMul, a MatMul over a GGUF tensor's own blocks with integer dot products (the C++
extension in kernels/, built by `pip install -r requirements.txt`), and what Python needs of it.

    y (…, rows) f32 = x (…, columns) f32 · Wᵀ,  W the file's raw blocks (rows, bytes per row) u8 of one block type

Each activation row is quantized to 8 bits once a call, and every block's dot product is integer arithmetic times the
two scales, streamed from the file's own bytes (4.5 bits a Q4_K weight, 6.56 a Q6_K). Every call on the SIMD paths runs
the gemm on packed panels (kernels/src/panel.hpp): its activations take a scale per slot (the 32 weights that share a
scale, 16 for Q6_K), except AVX2's Q4_K gemm, which takes llama.cpp's Q8_K (a scale per 256; gemm_q8_k_kinds). The dot
products (the scalar path, AVX2's Q8_0, and either ISA where `gemm_from` holds them) are llama.cpp's arithmetic: Q8_K for
Q4_K and Q6_K, Q8_0 for Q8_0, Q5_0 and Q4_0. Each is written per ISA (scalar reference, AVX2 with FMA, AVX-512 with
VNNI) and chosen once by the CPU's flags (kernels/src/dispatch.cpp); `use` holds another for a test or a bench.

Graphs are built in Python with a stand-in op of the same type and attributes (block_matmul.py); the IR saved from
them holds `BlockMatMul` of version `specdemo`, which a Core with the extension added reads and the CPU plugin runs
inside its graph, its threads shared through TBB. This module imports no OpenVINO until a function needs it (`clean`
and the CLI's help read `runnable`).

Before a process runs them, the ISA path it runs multiplies a product of each block type against the reference
(`check`, once, where the kernels are first needed: `unavailable`); a path that fails leaves the GGUF's blocks to
OpenVINO's own kernels, as where they were not built, and says so.
"""

from __future__ import annotations

import ctypes
import itertools
import sys
import threading
from functools import lru_cache
from pathlib import Path

import numpy as np

from specdemo.models.blocks import KINDS, decode

NATIVE = "gguf-native"  # the precision whose every MatMul is a BlockMatMul (gguf_import.BlockWeights, layout "native")
ON_KERNELS = (NATIVE, "gguf-q4")  # the precisions that run on these kernels only (gguf-q4: the blocks in 4 bits)
ISAS = ("scalar", "avx2", "avx512")  # narrowest first


@lru_cache(maxsize=1)
def library() -> Path | None:
    """The built extension, or None where it was not built, cannot load here or failed its check (unavailable() says
    why)."""
    return None if unavailable() else _built()


def _built() -> Path | None:
    try:
        import specdemo_kernels
    except ImportError:
        return None
    return specdemo_kernels.library_path()


@lru_cache(maxsize=1)
def unavailable() -> str | None:
    """Why specdemo's kernels cannot run in this process, as a sentence; None where they can: built, loaded, and the ISA
    this process runs found to compute what the reference does (check), once, where the kernels are first needed."""
    return _unloadable() or check(isa())


@lru_cache(maxsize=1)
def _unloadable() -> str | None:
    """Why the library cannot be loaded here, as a sentence; None where it loads (its ISAs are not checked yet)."""
    try:
        import specdemo_kernels
    except ImportError:
        return ("specdemo's kernels are not installed (pip install -r requirements.txt builds them from kernels/), so "
                "the GGUF's blocks run on OpenVINO's own kernels")
    refused = getattr(specdemo_kernels, "check_platform", lambda: None)()  # None: a package installed before it
    if refused:
        return (f"specdemo's kernels are not built on this platform ({refused}), so the GGUF's blocks run on "
                "OpenVINO's own kernels")
    path = specdemo_kernels.library_path()
    if path is None:
        reason = (specdemo_kernels.build_error() or "no reason was recorded").strip().splitlines()[-1]
        return (f"specdemo's kernels were not built when they were installed ({reason}), so the GGUF's blocks run on "
                "OpenVINO's own kernels; install a C++ compiler and run pip install --force-reinstall ./kernels")
    import openvino as ov

    built = getattr(specdemo_kernels, "built_against", lambda: None)()
    if built and built != ov.__version__:  # the C++ ABI is the version's: loading it into another could crash, not raise
        return (f"specdemo's kernels were built against OpenVINO {built.split('-')[0]} but {ov.__version__.split('-')[0]} "
                "is installed, so the GGUF's blocks run on OpenVINO's own kernels; rebuild them with pip install "
                "--force-reinstall ./kernels")
    try:
        ov.Core().add_extension(str(path))
        ctypes.CDLL(str(path)).specdemo_kernels_isa()
    except (RuntimeError, OSError, AttributeError) as error:
        return (f"specdemo's kernels did not load ({str(error).strip().splitlines()[0][:200]}), so the GGUF's blocks run "
                "on OpenVINO's own kernels; rebuild them with pip install --force-reinstall ./kernels")
    return None


_said = False


def say_once_if_unavailable(stream=sys.stderr) -> None:
    """Print why the kernels cannot run, once a process, where they cannot."""
    global _said
    if unavailable() and not _said:
        _said = True
        print(unavailable(), file=stream, flush=True)


def runnable(precisions: tuple[str, ...]) -> tuple[str, ...]:
    """`precisions` without ON_KERNELS where the kernels were not built here, or were found not to run (the others
    need nothing of them). Loads no OpenVINO, for `clean` and the CLI's help: a library that was built but cannot load
    or fails its check is found by unavailable, which the app and the CLI ask before they choose a precision."""
    return tuple(p for p in precisions if p not in ON_KERNELS or (_built() is not None and not _found_unavailable()))


def plugin_unit_beyond_ours(flags) -> bool:
    """Whether the plugin multiplies 8-bit weights on a unit these kernels leave unused, given the CPU's flags: AMX
    (amx_int8), or VNNI without AVX-512 (avx_vnni: ours run their AVX2 path there, without it). Only there can the
    plugin's layouts beat ours (target_choice.plugin_may_win, choices.unplanned_draft)."""
    return "amx_int8" in flags or ("avx_vnni" in flags and "avx512f" not in flags)


def _found_unavailable() -> bool:
    """Whether this process has already asked unavailable and been told the kernels cannot run (asking costs OpenVINO's
    import and the check)."""
    return unavailable.cache_info().currsize > 0 and unavailable() is not None


def add_to(core):
    """`core` (an openvino.Core) with the extension added where it runs here (unchanged elsewhere): read_model then
    knows BlockMatMul."""
    if library() is not None:
        core.add_extension(str(library()))
    return core


def new_core():
    """An openvino.Core that reads every IR specdemo writes, BlockMatMul's included where the kernels run here."""
    import openvino as ov

    return add_to(ov.Core())


# ---- the ISA (held by tests and benches)


def _functions():
    if _unloadable():  # a path that failed its check still answers: the check and the tests of each path call it
        raise RuntimeError(_unloadable())
    lib = ctypes.CDLL(str(_built()))  # the same copy the Cores loaded: dlopen shares one per path
    lib.specdemo_kernels_isa.restype = ctypes.c_char_p
    lib.specdemo_kernels_use.argtypes = [ctypes.c_char_p]
    lib.specdemo_kernels_gemm_kinds.restype = ctypes.c_char_p
    return lib


def identity() -> str:
    """Which kernels a measurement was taken on: the ISA running and the built library's size and time (a rebuild is
    other kernels), for the keys of what is learnt about a gguf-native model."""
    stat = library().stat()
    return f"{isa()} {stat.st_size} {int(stat.st_mtime)}"


def isa() -> str:
    """The dot products every BlockMatMul of this process runs: "scalar", "avx2" or "avx512"."""
    return _functions().specdemo_kernels_isa().decode()


def use(name: str = "") -> bool:
    """Run `name`'s dot products from now on ("" : the widest this CPU has); False where this CPU lacks it."""
    return bool(_functions().specdemo_kernels_use(name.encode()))


def gemm_kinds() -> list[str]:
    """The block types the running ISA multiplies many rows of on packed panels (the gemm), the others by dot products."""
    return [kind for kind in _functions().specdemo_kernels_gemm_kinds().decode().split(",") if kind]


def gemm_q8_k_kinds() -> list[str]:
    """Of gemm_kinds, those whose gemm quantizes the activations as the dot products do (Q8_K: a scale per 256), not a
    scale per slot."""
    function = getattr(_functions(), "specdemo_kernels_gemm_q8_k_kinds", None)  # None: a library built before it
    if function is None:
        return []
    function.restype = ctypes.c_char_p
    return [kind for kind in function().decode().split(",") if kind]


def gemm_from(rows: int = 0) -> None:
    """Calls of at least `rows` activation rows run the gemm (decoded panels) from now on, fewer the dot products (0:
    the default again): a bench times both ways on the same calls, a test holds each."""
    _functions().specdemo_kernels_gemm_from(int(rows))


def packings() -> int:
    """Tensors this process has packed into the gemm's panels so far: each BlockMatMul packs its own at its first call,
    which OVModel makes while it loads a model."""
    function = _functions().specdemo_kernels_packings
    function.restype = ctypes.c_uint64
    return int(function())


def read(part) -> None:
    """Reads `part` (a C-contiguous numpy array, its whole 256-byte runs) once, as fast as a core can: the read pass the
    kernels' streaming is judged against. ctypes lets go of the GIL meanwhile, so threads read beside each other."""
    _functions().specdemo_kernels_read(ctypes.c_void_p(part.ctypes.data), ctypes.c_size_t(part.nbytes))  # → u64, unread


def supported_isas() -> list[str]:
    """The ISAs this CPU runs, widest last."""
    current = isa()
    found = [name for name in ISAS if use(name)]
    use(current)
    return found


# ---- the blocks unpacked into groups (models/gguf_weights.unpack)


def _optional(name: str):
    """The library's C function `name`, or None where the library does not run here or was built before it had one."""
    return getattr(_functions(), name, None) if library() is not None else None


def unpack(kind: str, raw: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray | None] | None:
    """The library's unpacking of `raw`, (rows, bytes per row) u8 blocks of `kind`, into gguf_weights.unpack's groups:
    (q (rows, groups, G) i8, scale (rows, groups) f16, offset (rows, groups) f16 for Q4_K else None), bit for bit
    numpy's there (kernels/src/unpack.cpp); None where the library does not run here."""
    function = _optional("specdemo_kernels_unpack")
    if function is None:
        return None
    values, size = KINDS[kind]
    raw = np.ascontiguousarray(raw)
    rows, blocks = raw.shape[0], raw.shape[1] // size
    group = 16 if kind == "Q6_K" else 32
    groups = blocks * values // group
    q = np.empty((rows, groups, group), dtype=np.int8)
    scale = np.empty((rows, groups), dtype=np.float16)
    offset = np.empty((rows, groups), dtype=np.float16) if kind == "Q4_K" else None
    pointer = lambda a: ctypes.c_void_p(a.ctypes.data if a is not None else 0)  # noqa: E731
    function(kind.encode(), pointer(raw), ctypes.c_int64(rows), ctypes.c_int64(raw.shape[1]), pointer(q), pointer(scale),
             pointer(offset))
    return q, scale, offset


def pack_nibbles(values: np.ndarray) -> np.ndarray | None:
    """`values` (i8 in [-8, 7], any shape) packed two a byte, low nibble first, as OpenVINO's i4 (u8, half as many,
    rounded up); None where the library does not run here."""
    function = _optional("specdemo_kernels_pack_nibbles")
    if function is None:
        return None
    values = np.ascontiguousarray(values, dtype=np.int8).reshape(-1)
    out = np.empty((values.size + 1) // 2, dtype=np.uint8)
    function(ctypes.c_void_p(values.ctypes.data), ctypes.c_int64(values.size), ctypes.c_void_p(out.ctypes.data))
    return out


# ---- the reference the kernels are held to


def quantize_activations(x: np.ndarray, kind: str, way: str = "dots") -> np.ndarray:
    """(M, columns) f32 as the kernels quantize it before `kind`'s dot products ("dots": llama.cpp's way) or before the
    running ISA's gemm ("gemm": llama.cpp's way where the gemm takes Q8_K, else a scale a slot), dequantized again: d·q,
    f32."""
    if way == "gemm" and kind not in gemm_q8_k_kinds():
        return quantize_slots(x, 16 if kind == "Q6_K" else 32)
    values = KINDS[kind][0]
    blocks = x.astype(np.float32).reshape(x.shape[0], -1, values)
    if values == 256:  # Q8_K: the value of largest magnitude becomes ∓127; ties to even; d = 1 / (−127 / largest)
        index = np.abs(blocks).argmax(axis=-1)[..., None]
        largest = np.take_along_axis(blocks, index, axis=-1)
        with np.errstate(divide="ignore", invalid="ignore"):
            inverse = np.where(largest != 0, np.float32(-127.0) / largest, np.float32(0)).astype(np.float32)
            q = np.minimum(np.rint(inverse * blocks), 127)
            d = np.where(inverse != 0, np.float32(1) / inverse, np.float32(0)).astype(np.float32)
    else:  # Q8_0: d = max|x| / 127, rounded half away from zero, d kept as f16
        d = (np.abs(blocks).max(axis=-1, keepdims=True) / np.float32(127)).astype(np.float32)
        with np.errstate(divide="ignore"):
            inverse = np.where(d != 0, np.float32(1) / d, np.float32(0)).astype(np.float32)
        scaled = blocks * inverse
        q = np.sign(scaled) * np.floor(np.abs(scaled) + np.float32(0.5))
        d = d.astype(np.float16).astype(np.float32)
    return (q * d).reshape(x.shape).astype(np.float32)


def quantize_slots(x: np.ndarray, slot: int) -> np.ndarray:
    """The gemm's activations (formats.hpp, ManyRows): each `slot` values with a scale max|x| / 127, q = x · (127 /
    max|x|) rounded to nearest, ties to even, all in f32; dequantized again."""
    slots = x.astype(np.float32).reshape(x.shape[0], -1, slot)
    amax = np.abs(slots).max(axis=-1, keepdims=True)
    with np.errstate(divide="ignore"):
        inverse = np.where(amax > 0, np.float32(127) / amax, np.float32(0)).astype(np.float32)
    q = np.clip(np.rint(slots * inverse), -127, 127)
    return (q * (amax / np.float32(127))).reshape(x.shape).astype(np.float32)


def reference(x: np.ndarray, raw: np.ndarray, kind: str, way: str = "dots") -> tuple[np.ndarray, np.ndarray]:
    """What the kernels are held to, for x (M, columns) f32 times `raw`, (rows, bytes per row) u8 blocks of `kind`, with
    the activations quantized `way`'s: the product (M, rows) f64 of the blocks as blocks.decode dequantizes them
    (gguf-py's dequantization, bit for bit) and those activations, in f64; and what summing in f32 in another order
    allows around each output (M, rows): 1e-6 of Σ|w·a|."""
    a = quantize_activations(x, kind, way).astype(np.float64)
    w = decode(kind, raw).dequantize().astype(np.float64)
    return _times_transposed(a, w), 1e-6 * _times_transposed(np.abs(a), np.abs(w))


def _times_transposed(a: np.ndarray, w: np.ndarray) -> np.ndarray:
    """a (M, columns) · wᵀ (columns, rows), not through BLAS: OpenBLAS's threads beside a busy machine's took 67 ms for
    17 × 1280 × 37 in f64, a plain loop 1 ms."""
    return np.einsum("mk,nk->mn", a, w)


def mismatch(got: np.ndarray, x: np.ndarray, raw: np.ndarray, kind: str, way: str = "dots") -> float:
    """How far `got` (M, rows), the kernels' x · Wᵀ, is from reference(x, raw, kind, way): ≤ 1 is a match."""
    return distance(got, *reference(x, raw, kind, way))


def distance(got: np.ndarray, expected: np.ndarray, allowed: np.ndarray) -> float:
    """The largest |got − expected| in units of `allowed` (reference's pair), over every output: ≤ 1 is a match (nan
    where `got` holds one)."""
    return float(np.max(np.abs(got - expected) / (allowed + 1e-30)))


HALVES = {"Q4_K": (0, 2), "Q6_K": (208,), "Q8_0": (0,), "Q5_0": (0,), "Q4_0": (0,)}  # where a block's f16 scales are


def random_blocks(kind: str, rows: int, columns: int, rng: np.random.Generator) -> np.ndarray:
    """(rows, bytes per row) u8: random blocks of `kind`, every byte random but the scales, which are finite halves of
    either sign (a random half can be inf or nan)."""
    values, size = KINDS[kind]
    raw = rng.integers(0, 256, (rows, columns // values, size), dtype=np.uint8)
    for at in HALVES[kind]:
        scales = rng.uniform(1e-3, 2e-2, raw.shape[:2]) * rng.choice([-1, 1], raw.shape[:2])
        raw[..., at:at + 2] = scales.astype(np.float16)[..., None].view(np.uint8)
    return raw.reshape(rows, -1)


# ---- the known-answer check at load (issue 61; ggml's test-backend-ops is the model)

CHECKED_ROWS, CHECKED_COLUMNS = 37, 1280  # whole panels of 16 or 32 rows and 5 past them; more than a panel's 1024
# activation rows: a step; a verification (two tiles on AVX2: 6 + 1 Q4_K, 5 + 2 Q6_K); a prefill (AVX-512 from 16)
CHECKED_CALLS = (1, 7, 17)
_CHECKING = threading.Lock()  # a check holds the process's ISA and way (gemm_from) while it runs


@lru_cache(maxsize=None)
def check(isa_name: str) -> str | None:
    """Why `isa_name`'s kernels cannot be trusted on this CPU, as a sentence naming the path and block type that failed;
    None where they can: each block type's product (CHECKED_ROWS × CHECKED_COLUMNS) on each of CHECKED_CALLS, by the
    dot products and by the gemm, through the real op on the CPU plugin, is the reference as test_kernels.py holds
    every path, and so is its attention (cached_attention.misfit). 0.3-0.8 s once a process (the busy 2-core Zen 3,
    EPYC family 25 model 1), most of it two compiles."""
    import tempfile

    with _CHECKING, tempfile.TemporaryDirectory(prefix="specdemo-check-") as folder:
        running = isa()
        if not use(isa_name):
            raise ValueError(f"this CPU does not run specdemo's {isa_name} kernels (it runs {supported_isas()})")
        try:
            return _compare(isa_name, Path(folder))
        except RuntimeError as error:  # the op refused or failed inside the plugin: as wrong as a wrong sum
            return _describe_failure(isa_name, f"which stopped: {str(error).strip().splitlines()[0][:200]}")
        finally:
            use(running)
            gemm_from(0)


def _compare(isa_name: str, folder: Path) -> str | None:
    """check's products on the running ISA, each way, then its attention (cached_attention.misfit); the first that is
    not the reference, described."""
    import openvino as ov

    from specdemo.models import cached_attention
    from specdemo.models.block_matmul import compiled

    core = ov.Core()
    core.add_extension(str(_built()))
    rng = np.random.default_rng(61)
    blocks = {kind: random_blocks(kind, CHECKED_ROWS, CHECKED_COLUMNS, rng) for kind in KINDS}
    model = compiled(blocks, core, folder)  # one compile for all four: 40-60 ms, not 4 × 45-85
    for m, way in itertools.product(CHECKED_CALLS, ("dots", "gemm")):
        gemm_from(1 if way == "gemm" else 10**6)
        x = rng.standard_normal((m, CHECKED_COLUMNS)).astype(np.float32)
        got = model(x)
        for i, (kind, raw) in enumerate(blocks.items()):
            ran = way if kind in gemm_kinds() else "dots"  # an ISA without a gemm for the kind dots both times
            off = mismatch(got[i], x, raw, kind, ran)
            if not off <= 1:
                path = "the gemm" if ran == "gemm" else "the dot products"
                return _describe_failure(isa_name, f"for {kind} blocks ({path}, {m} activation row{'s' * (m > 1)}: "
                                                   f"off by {off:.3g} times what f32 rounding allows)")
    wrong = cached_attention.misfit(core)
    return _describe_failure(isa_name, wrong) if wrong else None


def _describe_failure(isa_name: str, what: str) -> str:
    """The sentence for a path that failed the check: what failed, what runs instead, what to do."""
    narrower = ISAS[ISAS.index(isa_name) - 1] if isa_name != "scalar" else None
    remedy = (f"SPECDEMO_KERNEL_ISA={narrower} runs them on the {narrower} path instead" if narrower else
              "rebuild them with pip install --force-reinstall ./kernels")
    return (f"specdemo's kernels failed their check at load on this CPU's {isa_name} path {what}, so the GGUF's blocks "
            f"run on OpenVINO's own kernels; {remedy}")
