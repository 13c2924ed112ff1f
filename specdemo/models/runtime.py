"""One compiled OpenVINO model with its KV cache.

The model is the stateful IR optimum-intel exports for text-generation-with-past: inputs
input_ids / attention_mask / position_ids (1, n) and beam_idx (1,), output logits (1, n, V), and one
state variable per layer for keys and another for values, shaped (1, kv_heads, tokens, head_dim).
The KV cache lives in the plugin; this class is its only owner. Callers feed tokens and ask to roll
back to a length; nobody else touches the state.

Rolling back forgets positions by masking them: the attention mask we pass with every call marks them 0, so no
later token attends to them, exactly as if they were gone (positions are passed explicitly, so the text's positions
stay right). Copying every layer's kept keys and values out of the plugin and back cost 2-4 ms a round, most of a
round's time outside the model calls; masking costs nothing. Forgotten positions stay in the plugin's memory (and in
every attention) until they exceed COMPACT_AFTER, when the cache is compacted by one such copy.

A model on specdemo's kernels keeps its cache in its own attention op instead (cached_attention.own_attention):
each call writes its keys and values at the positions it is given (position_ids), so rolling back is the next call's
earlier position, and nothing is forgotten or copied. Such a model is compiled more than once
(`_compile_fixed`): as it is, with a single token's shapes fixed, which a decoding step runs, and with those of each
call size its loader asks for (`fixed_calls`: a target's verifications, a draft's two tokens after a round it drafted
whole).
"""

from __future__ import annotations

import ctypes
import sys
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Callable, Iterator

import numpy as np
import openvino as ov

from specdemo.host.compat import compile_config
from specdemo.models import cached_attention, graph, kernels, matmul_fusion
from specdemo.models.logits import top_probability
from specdemo.models.split_head import OtherRows
from specdemo.settings import ModelSettings


# Inputs longer than this are fed in pieces: the activations of one call grow with its length (a
# 4,096-token prompt in one call took 5.9 GB), while the KV cache makes pieces cost the same in total.
PREFILL_CHUNK = 512
COMPACT_AFTER = 64  # forgotten positions kept in the plugin's cache before it is compacted (every one is attended to)
# Calls of at least this many tokens can be stopped part-way (OVModel.interruptible): a prefill of 128-300 tokens, which
# the page's learning makes, takes 3-7 s on a 2-core AVX2 CPU, and a visitor who came during one waited for all of it.
LONG_CALL = 32
POLL_MS = 10  # how often such a call asks whether to stop


class Interrupted(Exception):
    """Work stopped part-way because something more urgent wants the machine (a visitor's run): nothing of it is
    kept (a model whose call was stopped has its cache emptied); do it again later."""


class OVModel:
    """A stateful causal LM compiled on one device. `length` is the number of tokens in its KV cache."""

    def __init__(self, folder: Path, settings: ModelSettings, core: ov.Core | None = None, cache_dir: Path | None = None,
                 head_ids: np.ndarray | None = None, profiled: bool = False, fixed_calls: tuple[int, ...] = ()):
        """head_ids: keep only these rows of the LM head (sorted token ids); logits then score just them. profiled:
        compile with the plugin's per-node counters on (bench/nodes.py reads them; they cost a little per node).
        fixed_calls: token counts above one whose calls run a compile of their own with every shape fixed, where a
        single token's does (a model with our own attention; _compile_fixed says what it costs and buys)."""
        self.folder = Path(folder)
        self.settings = settings
        if settings.precision in kernels.ON_KERNELS and kernels.unavailable():
            raise RuntimeError(f"{settings.source} at {settings.precision} runs on specdemo's kernels: "
                               f"{kernels.unavailable()}")
        core = core or kernels.new_core()
        model = core.read_model(self.folder / "openvino_model.xml")
        self.vocab_size = model.output("logits").get_partial_shape()[-1].get_length()  # V of the full head
        every_row = graph.lm_head_rows(model) if head_ids is not None else None  # a head of blocks, before its trim
        self.head_ids = head_ids if head_ids is not None and graph.trim_lm_head(model, head_ids) else None
        self.sliced_logits = graph.keep_only_last_logits(model)
        self.fused = graph.fuse_projections(model)  # MatMuls fused (q, k, v into one; gate and up into one)
        self.glu_fused = graph.fuse_glu(model)  # BlockMatMuls of gate and up that apply silu(gate)·up themselves
        self.taken_in = matmul_fusion.fuse_into_matmuls(model)  # bias Adds, residual Adds and norms BlockMatMuls do
        self._seq_axis = _sequence_axis(model)
        self._position_elements = _position_elements(model)  # keys and values of one position, all layers
        # Layers whose attention is specdemo's CachedAttention, which keeps the cache itself (rolled back by calling at
        # an earlier position): on its kernels' models, with the cache at f32 (a u8 or f16 cache asked for is the plugin's).
        self.own_attention = cached_attention.own_attention(model, core) if (
            settings.precision in kernels.ON_KERNELS and settings.kv_cache_precision in ("", "f32")) else 0
        self._beam = np.zeros(1, dtype=np.int32)
        # Compiled more than once (_compile_fixed), but profiled: bench/nodes.py reads the general compile's counters.
        # Its ops' copies share the op's cache, and a model imported from OpenVINO's cache has ops of its own: every
        # compile is of this graph.
        twice = bool(self.own_attention) and not profiled
        config = compile_config(settings, None if twice else cache_dir)
        if profiled:
            config["PERF_COUNT"] = True
        # A trimmed head of blocks: the rows it left out, in a compile of their own (split_head)
        self.other_rows = None
        if every_row is not None and self.head_ids is not None:
            self.other_rows = OtherRows(model, every_row, self.head_ids, self.vocab_size,
                                        lambda rows: core.compile_model(rows, settings.device, config)
                                        .create_infer_request())
        self.greedy_rows = self.rest_rows = 0  # rows greedy_ids chose, and of them those it took the other rows for
        self.compiled = core.compile_model(model, settings.device, config)
        self.request = self.compiled.create_infer_request()
        # what a call of a fixed number of tokens runs (1: a decoding step); any other call, the general compile
        self._fixed = {1: self.request}
        if twice:  # the clones first: the step's compile fixes the graph itself to one token
            self._fixed = {n: self._compile_fixed(model.clone(), core, config, n) for n in fixed_calls if n > 1}
            self._fixed[1] = self._compile_fixed(model, core, config, 1)
        # The fixed compiles' inputs, set once and written in place each call, where nothing reads the attention mask
        # (our own attention: positions, not a mask); any other call passes its inputs anew
        unmasked = twice and not model.input("attention_mask").get_target_inputs()
        self._preset = {n: self._preset_inputs(request, n) for n, request in self._fixed.items()} if unmasked else {}
        self._last = self.request  # the request whose logits the latest call wrote
        self._kv_type = ov.Type.f32 if self.own_attention else _kv_cache_type(self.compiled)
        self._mask = np.zeros(0, dtype=np.int64)  # per position in the plugin's cache: 1 kept, 0 forgotten
        self.length = 0  # tokens kept (the cache as callers see it)
        self.calls = 0  # inference calls since the last reset
        self.last_call_s = 0.0  # seconds of the latest call (the loops record it; specdemo/results/metrics.py sums)
        self.requests = 0  # inference requests since compilation, never reset (a long prompt is several)
        self._interrupted: Callable[[], bool] | None = None  # set while interruptible: long calls ask it
        # For an input longer than PREFILL_CHUNK: called as on_piece(tokens fed, of n) before the first piece
        # (0) and after each piece, so a long prefill can show its progress; None: silent.
        self.on_piece: Callable[[int, int], None] | None = None
        if settings.precision in kernels.ON_KERNELS:
            self._pack()

    def _compile_fixed(self, model: ov.Model, core: ov.Core, config: dict, tokens: int) -> ov.InferRequest:
        """The graph compiled for calls of `tokens` tokens: every shape its nodes see fixed (the attention mask, an
        input no CachedAttention reads, keeps its length free). A model of dynamic shapes costs the plugin its shape
        work at each of its ~400 nodes a call, and at each of our ops (which it does not know) a copy of the op made and
        checked every call: on the 2-core Zen 3 (EPYC family 25 model 1), 300 positions, the 0.5B draft's step took
        0.88× the time of the dynamic graph's, the 1.5B target's 0.95× (both 2.5-3 ms less), and 0.93× and 0.98× again
        when the CachedAttentions read positions, not the mask, and so were static too. On the 2-core Zen 4 (EPYC family
        25 model 17), calls alternating in one process, the target's calls of 2, 5 and 9 tokens took 0.94×, 0.93× and
        0.95× their time (2.5-3 ms less each), the logits bit for bit the same. A compile's ops share their caches and
        packed weights with the others'. Each adds ~0.3 s to a load and 45 MiB (the target; 31 MiB the draft) on that
        Zen 4, whatever its tokens (the step's, 1.3-1.6 s on the busy Zen 3)."""
        fixed = {"input_ids": [1, tokens], "position_ids": [1, tokens]}
        model.reshape({port: fixed.get(port.get_any_name(), port.get_partial_shape()) for port in model.inputs})
        return core.compile_model(model, self.settings.device, config).create_infer_request()

    def _preset_inputs(self, request: ov.InferRequest, tokens: int) -> dict[str, np.ndarray]:
        """Arrays the request reads its inputs from (set once, shared): a call writes its ids, positions and logits to
        keep into them. Why: passed anew, the five inputs cost a call ~0.23 ms before its first node (the plugin binds
        each new tensor); set once, the 0.5B draft's step took 0.974× the time, on the 2-core Zen 4 (EPYC family 25
        model 17)."""
        arrays = {"input_ids": np.zeros((1, tokens), np.int64), "position_ids": np.zeros((1, tokens), np.int64),
                  "attention_mask": np.ones((1, 1), np.int64), "beam_idx": self._beam}  # a mask no node reads
        if self.sliced_logits:
            arrays["logits_to_keep"] = np.ones(1, np.int64)
        for name, values in arrays.items():
            request.set_tensor(name, ov.Tensor(values, shared_memory=True))
        return arrays

    def _pack(self) -> None:
        """One call of one token, the cache emptied after it: each BlockMatMul packs its blocks into the gemm's panels at
        its first call (kernels/src/block_matmul.cpp), and this makes that call part of loading the model, so that no
        prompt, a visitor's first above all, pays for it (2.9 s of the 1.5B target's first call, a later one 0.2 s, on
        the shared 2-core Zen 3)."""
        self.forward([0])
        if self.other_rows is not None:
            self.other_rows.logits(np.ones(1, dtype=np.int64), self._hidden())  # packs its blocks, as the step did
        self.reset()

    # ---- decoding
    def forward(self, ids: list[int], logits_to_keep: int = 1) -> np.ndarray:
        """Feed `ids` after the cached tokens; return logits (logits_to_keep, V) for the last positions.

        Row i scores the token that follows ids[len(ids) - logits_to_keep + i]. A long input (a prompt)
        is fed in pieces of PREFILL_CHUNK tokens; it still counts as one call.
        """
        n = len(ids)
        if n == 0:
            raise ValueError("forward() needs at least one token")
        keep = min(logits_to_keep, n)
        cuts = list(range(0, n - keep, PREFILL_CHUNK))[1:]  # the last piece always holds the kept positions
        start = time.perf_counter()
        if cuts and self.on_piece is not None:
            self.on_piece(0, n)
        for begin, end in zip([0] + cuts, cuts + [n]):
            self._infer(ids[begin:end], keep if end == n else 1)
            if cuts and self.on_piece is not None:
                self.on_piece(end, n)
        self.last_call_s = time.perf_counter() - start
        self.calls += 1
        logits = self._last.get_tensor("logits").data[0]  # (kept or n, V), a view into plugin memory
        return np.array(logits[-keep:], dtype=np.float32)  # copy: the next call overwrites it

    def greedy_ids(self, logits: np.ndarray, confidence: bool = False):
        """The greedy token id (n,) int64 of each row of `logits` (n, V'), rows the latest call returned: the argmax,
        through a trimmed head's ids; with the head's other rows at hand, over them too where split_head's rules say
        the kept rows may not hold it (their seconds added to last_call_s). With `confidence`, also each one's softmax
        probability (n,), over every row where the other rows were taken."""
        best = logits.argmax(axis=-1)
        if self.other_rows is None:
            ids = best if self.head_ids is None else self.head_ids[best]
            return (ids, top_probability(logits)) if confidence else ids
        start = time.perf_counter()
        ids, top, taken = self.other_rows.choose(logits, self._hidden())
        self.greedy_rows, self.rest_rows = self.greedy_rows + len(logits), self.rest_rows + taken
        self.last_call_s += time.perf_counter() - start
        return (ids, top) if confidence else ids

    def sampling_logits(self, logits: np.ndarray) -> tuple[np.ndarray, np.ndarray | None]:
        """What a sampled draft draws from, given `logits` (1, V') the latest call returned: those logits and their
        columns' token ids (None: every token, in order); with a trimmed head's other rows at hand, the logits of every
        row where split_head's rules want them (their seconds added to last_call_s)."""
        if self.other_rows is None:
            return logits, self.head_ids
        start = time.perf_counter()
        every = self.other_rows.whole(logits, self._hidden())
        self.last_call_s += time.perf_counter() - start
        return (logits, self.head_ids) if every is None else (every, None)

    def _hidden(self) -> np.ndarray:
        """(kept positions, width): what the LM head read in the latest call (a view into plugin memory)."""
        return self._last.get_tensor("hidden").data[0]

    def _infer(self, ids: list[int], keep: int) -> None:
        n = len(ids)
        mask = np.concatenate([self._mask, np.ones(n, dtype=np.int64)])
        positions = np.arange(self.length, self.length + n, dtype=np.int64)
        interruptible = self._interrupted is not None and n >= LONG_CALL
        if n in self._preset and not interruptible:
            preset = self._preset[n]
            preset["input_ids"][0], preset["position_ids"][0] = ids, positions
            if "logits_to_keep" in preset:
                preset["logits_to_keep"][0] = keep
            self._last = self._fixed[n]
            self._last.infer(share_outputs=True)  # forward() copies the logits it keeps
        else:
            inputs = {
                "input_ids": np.asarray([ids], dtype=np.int64),
                "attention_mask": mask[None, :],  # the forgotten positions are 0
                "position_ids": positions[None, :],
                "beam_idx": self._beam,
            }
            if self.sliced_logits:
                inputs["logits_to_keep"] = np.asarray([keep], dtype=np.int64)
            if interruptible:
                self._last = self.request
                self._infer_unless_interrupted(inputs)
            else:
                self._last = self._fixed.get(n, self.request)
                self._last.infer(inputs, share_inputs=True)
        self.requests += 1
        self._mask = mask
        self.length += n
        if self.other_rows is not None:
            self.other_rows.fed(ids)

    @contextmanager
    def interruptible(self, interrupted: Callable[[], bool]) -> Iterator[OVModel]:
        """Within it, a call of LONG_CALL tokens or more runs asynchronously, asks `interrupted()` every POLL_MS, and on
        True is cancelled (the CPU plugin stops between two nodes), the cache emptied and Interrupted raised. Shorter
        calls run as always: the background's learning goes this way, never a lane, so single steps and verify calls
        are timed as the lanes make them."""
        self._interrupted = interrupted
        try:
            yield self
        finally:
            self._interrupted = None

    def _infer_unless_interrupted(self, inputs: dict) -> None:
        self.request.start_async(inputs, share_inputs=True)
        while not self.request.wait_for(POLL_MS):
            if self._interrupted():
                self.request.cancel()
                try:
                    self.request.wait()
                except RuntimeError:  # the plugin says it was cancelled
                    pass
                self.reset_cache()  # some layers' keys and values were written, others not
                raise Interrupted("a long call stopped for a visitor")

    def rollback(self, length: int) -> None:
        """Forget every cached token from position `length` on, so the cache holds exactly `length` tokens."""
        if not 0 <= length <= self.length:
            raise ValueError(f"cannot roll back a {self.length}-token cache to {length} tokens")
        if length == self.length:
            return
        if length == 0:
            self.reset_cache()
            return
        if self.other_rows is not None:
            self.other_rows.keep(length)
        if self.own_attention:  # the next call writes its keys and values at `length`, over the forgotten ones
            self._mask, self.length = np.ones(length, dtype=np.int64), length
            return
        kept = np.flatnonzero(self._mask)
        self._mask = self._mask.copy()  # the last call's inputs may still share the old one
        self._mask[kept[length:]] = 0
        self.length = length
        if self.forgotten > COMPACT_AFTER:
            self._compact()

    @property
    def forgotten(self) -> int:
        """Positions the plugin's cache still holds but every call masks (rolled back, not yet compacted)."""
        return len(self._mask) - self.length

    def _compact(self) -> None:
        """Drop the forgotten positions from the plugin's cache: one copy of every layer's kept keys and values."""
        kept = np.flatnonzero(self._mask)
        for state in self.request.query_state():
            state.state = ov.Tensor(np.ascontiguousarray(np.take(state.state.data, kept, axis=self._seq_axis)))
        self._mask = np.ones(len(kept), dtype=np.int64)

    def reset_cache(self) -> None:
        """Empty the cache (the counters stay)."""
        self.request.reset_state()
        self._mask = np.zeros(0, dtype=np.int64)
        self.length = 0
        if self.other_rows is not None:
            self.other_rows.keep(0)

    def reset(self) -> None:
        """Empty the cache and the counters, ready for a new prompt."""
        self.reset_cache()
        self.calls = 0
        self.last_call_s = 0.0

    @property
    def head_tokens(self) -> int:
        """Rows of the LM head: the vocabulary size, or fewer when the head was trimmed."""
        return len(self.head_ids) if self.head_ids is not None else self.vocab_size

    # ---- reporting
    @property
    def kv_cache_precision(self) -> str:
        """The element type the plugin stores the KV cache in, e.g. "u8" or "f16"."""
        return self._kv_type.to_string()

    @property
    def kv_cache_element_bytes(self) -> int:
        return self._kv_type.size

    def kv_cache_bytes(self) -> int:
        """Bytes the cache holds now, at the plugin's KV cache precision (quantization scales not counted)."""
        if self.length == 0:
            return 0
        if self.own_attention:  # CachedAttention's stores hold f32, a position's keys and values side by side
            return len(self._mask) * self._position_elements * self._kv_type.size
        elements = sum(int(np.prod(state.state.shape)) for state in self.request.query_state())
        return elements * self._kv_type.size


_MADV_DONTNEED = 4
_WEIGHT_FILES = (".bin", ".blob")  # an IR's weights; OpenVINO's compiled-model cache entries


def release_weight_pages() -> int:
    """Drop the resident pages of the model files this process maps read-only; returns the bytes of mappings released.

    OpenVINO maps a model's weights file, and on the first inference of a shape the CPU plugin repacks the
    weights into buffers of its own; the mapped pages stay resident though nothing reads them again, which
    made the serving process hold the model files twice (RSS 3.9 GiB for 2.0 GiB of files on the AMX Xeon,
    2.2 GiB after this). MADV_DONTNEED on a read-only file mapping loses nothing: a page read later faults
    back in from the file (from the page cache, usually). Linux only; elsewhere a no-op.
    """
    if not sys.platform.startswith("linux"):
        return 0
    madvise = ctypes.CDLL(None, use_errno=True).madvise
    madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    released = 0
    with open("/proc/self/maps") as maps:
        for line in maps:
            fields = line.split(maxsplit=5)
            if len(fields) < 6 or not fields[1].startswith("r--") or not fields[5].rstrip().endswith(_WEIGHT_FILES):
                continue
            start, end = (int(address, 16) for address in fields[0].split("-"))
            if madvise(start, end - start, _MADV_DONTNEED) == 0:
                released += end - start
    return released


def _kv_cache_type(compiled: ov.CompiledModel) -> ov.Type:
    try:
        return compiled.get_property("KV_CACHE_PRECISION")
    except RuntimeError:  # a plugin without the property keeps the model's own precision
        return ov.Type.f32


def _position_elements(model: ov.Model) -> int:
    """Elements one position adds to the KV cache, every layer's keys and values: Σ over the state variables of their
    static dimensions' product (the batch and token axes are the dynamic ones)."""
    shapes = [op.get_output_partial_shape(0) for op in model.get_ops() if op.get_type_name() == "ReadValue"]
    return sum(int(np.prod([d.get_length() for d in shape if d.is_static])) for shape in shapes)


def _sequence_axis(model: ov.Model) -> int:
    """The token axis of the KV state: the last dynamic dimension of a state variable's shape."""
    for op in model.get_ops():
        if op.get_type_name() == "ReadValue":
            shape = op.get_output_partial_shape(0)
            dynamic = [i for i in range(shape.rank.get_length()) if shape[i].is_dynamic]
            return dynamic[-1]
    raise ValueError("this model has no KV cache state: export it stateful (text-generation-with-past)")
