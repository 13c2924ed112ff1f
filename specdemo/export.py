"""Turning a model source into an OpenVINO IR folder: the conversion `sources.prepare` runs once per model.

GGUF -> transformers (dequantized) -> optimum-intel export (stateful, text-generation-with-past, plus the
OpenVINO tokenizer and detokenizer where the tokenizer converts; specdemo itself decodes with the transformers
tokenizer) -> NNCF weight compression to the requested precision, or, for precision gguf, the GGUF's own
quantized blocks as the weights. A preset is first assembled from its part packages and checked by sha256.
The IR is built in a scratch folder and renamed into place only when complete, so an interrupted conversion
is redone rather than half-loaded. This module imports torch, transformers, optimum and NNCF as it goes: it
runs in the conversion child (specdemo/convert.py), and in the bench where it dequantizes a preset.
"""

from __future__ import annotations

import hashlib
import importlib
import os
import shutil
import tempfile
from pathlib import Path

from specdemo import compat, strict_json
from specdemo.settings import GGUF_LAYOUTS, PRECISIONS, ModelSettings
from specdemo.sources import CACHE_VERSION, COMPLETE_MARKER, PRESETS, EmbeddedModel, ModelSourceError, Progress


def convert(settings: ModelSettings, folder: Path, progress: Progress) -> None:
    """Build the IR for `settings` in a scratch folder beside `folder`, then rename it into place."""
    scratch = Path(tempfile.mkdtemp(prefix=f".{folder.name}-", dir=folder.parent))
    try:
        hf_folder, gguf_file = _hf_input(settings.source, scratch, progress)
        if settings.precision in GGUF_LAYOUTS and gguf_file is None:
            raise ModelSourceError(f"{settings.source}: precision {settings.precision} takes a GGUF file's own weights, and "
                                   f"this source is not a GGUF file; choose "
                                   f"{', '.join(p for p in PRECISIONS if p not in GGUF_LAYOUTS)}")
        export = scratch / "export"
        _export(settings.source, hf_folder, gguf_file, export, progress)
        shutil.rmtree(scratch / "hf", ignore_errors=True)  # the dequantized f32 weights (6 GB for the 1.5B), exported now
        if settings.precision in GGUF_LAYOUTS:
            progress(0.8, f"{settings.source}: taking the GGUF's own quantized blocks as the weights")
            _import_gguf(export, Path(hf_folder) / gguf_file, GGUF_LAYOUTS[settings.precision])
        else:
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


def _hf_input(source: str, scratch: Path, progress: Progress) -> tuple[str, str | None]:
    """What transformers should load: (folder or model id, GGUF file name inside that folder or None)."""
    if source in PRESETS:
        gguf = scratch / "model.gguf"
        assemble_parts(PRESETS[source], gguf, progress)
        return str(scratch), gguf.name
    path = Path(source).expanduser()
    if path.is_file():
        return str(path.resolve().parent), path.name
    return (str(path) if path.is_dir() else source), None


def assemble_parts(model: EmbeddedModel, dest: Path, progress: Progress) -> None:
    """Concatenate the part packages into one GGUF file and check its size and sha256."""
    digest = hashlib.sha256()
    with open(dest, "wb") as out:
        for i in range(1, model.parts + 1):
            part = _part_path(model, i)
            with open(part, "rb") as src:
                while chunk := src.read(1 << 24):
                    digest.update(chunk)
                    out.write(chunk)
            progress(0.1 * i / model.parts, f"{model.title}: assembling and checking {model.parts} parts ({i}/{model.parts})")
    size = dest.stat().st_size
    if size != model.size or digest.hexdigest() != model.sha256:
        raise ModelSourceError(
            f"{model.title}: the assembled file does not match its checksum (size {size:,} bytes, expected "
            f"{model.size:,}); reinstall {model.package}1..{model.parts}=={model.version}"
        )


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


def _export(source: str, hf_source: str, gguf_file: str | None, out: Path, progress: Progress) -> None:
    """Export a transformers model (folder, hub id, or GGUF inside a folder) to a stateful OpenVINO IR."""
    compat.hide_broken_torchvision()
    from optimum.exporters.openvino import main_export
    from optimum.intel import OVConfig

    from_model = hf_source
    if gguf_file is not None:
        # optimum-intel exports from a folder or a hub id, so dequantize the GGUF into a plain folder first.
        progress(0.12, f"{source}: dequantizing the GGUF weights")
        from_model = str(out.parent / "hf")
        gguf_to_hf_folder(hf_source, gguf_file, from_model)
    progress(0.35, f"{source}: exporting to OpenVINO IR with optimum-intel")
    try:
        # An OVConfig without quantization stops optimum from compressing on its own; NNCF does it next.
        main_export(from_model, out, task="text-generation-with-past", ov_config=OVConfig(), convert_tokenizer=True)
    except Exception as error:  # noqa: BLE001 - any failure here is reported as one sentence, cause chained
        if gguf_file is None and not Path(hf_source).exists():
            raise ModelSourceError(
                f"could not fetch {source} from the Hugging Face Hub ({type(error).__name__}: {error}); "
                "without network, pass a local folder or .gguf file instead"
            ) from error
        raise ModelSourceError(f"could not export {source} to OpenVINO: {type(error).__name__}: {error}") from error


SHARD_BYTES = 256 << 20  # f32 weights gathered before a shard is written (a larger tensor gets a shard of its own)
ROWS_BYTES = 16 << 20  # f32 output of one dequantization call (its temporaries: ~9 times that for Q5_0)


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
        result = processor.process(weights=_dequantized(tensor), name=tensor.name, tensor_key_mapping=names,
                                   parsed_parameters=parsed)
        if result.name in names:
            shards.add(names[result.name], result.weights)
        del result  # a written tensor goes before the next is dequantized
    shards.close()
    config.architectures = [type(skeleton).__name__]
    config.dtype = torch.float32
    config.save_pretrained(out)
    GenerationConfig.from_model_config(config).save_pretrained(out)


def _dequantized(tensor):
    """A GGUF tensor's values as f32, dequantized ROWS_BYTES of output at a time into one array."""
    import numpy as np
    from gguf import dequantize

    if tensor.data.ndim < 2:
        return np.asarray(dequantize(tensor.data, tensor.tensor_type), dtype=np.float32)
    first = np.asarray(dequantize(tensor.data[:1], tensor.tensor_type), dtype=np.float32)
    values = np.empty((len(tensor.data), *first.shape[1:]), dtype=np.float32)
    step = max(1, ROWS_BYTES // first.nbytes)
    for begin in range(0, len(values), step):
        values[begin:begin + step] = dequantize(tensor.data[begin:begin + step], tensor.tensor_type)
    return values


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


def _import_gguf(folder: Path, gguf_path: Path, layout: str) -> None:
    """Replace the exported IR's weights with the GGUF's own blocks (specdemo/gguf_import.py), in place."""
    import openvino as ov

    from specdemo import gguf_import

    xml = folder / "openvino_model.xml"
    try:
        model = gguf_import.import_blocks(ov.Core().read_model(xml), gguf_path, layout)
    except gguf_import.GGUFMismatchError as error:
        raise ModelSourceError(str(error)) from error
    _save_beside(model, folder)


def _save_beside(model, folder: Path) -> None:
    """Write `model` beside the folder's IR, then swap: the .bin being read must not be overwritten while mapped."""
    import openvino as ov

    ov.save_model(model, folder / "compressed.xml", compress_to_fp16=True)
    del model
    os.replace(folder / "compressed.xml", folder / "openvino_model.xml")
    os.replace(folder / "compressed.bin", folder / "openvino_model.bin")


def _compress(folder: Path, precision: str) -> None:
    """Compress the IR's weights in place: int8_asym per channel, or int4_asym in groups of 128.

    int4 covers every layer, the embeddings and LM head included: for the 0.5B draft the 151,936-wide
    LM head is over a third of the weights read per token, and compressing it too made a draft step
    ~10% faster with no loss of acceptance (0.93 vs 0.92 on the code instructions).
    """
    import nncf
    import openvino as ov
    from nncf.quantization.advanced_parameters import AdvancedCompressionParameters

    xml = folder / "openvino_model.xml"
    model = ov.Core().read_model(xml)
    if precision == "int8":
        model = nncf.compress_weights(model, mode=nncf.CompressWeightsMode.INT8_ASYM)
    elif precision == "int4":
        # Layers narrower than, or not divisible by, 128 get a smaller group instead of an error.
        adjust = AdvancedCompressionParameters(group_size_fallback_mode=nncf.GroupSizeFallbackMode.ADJUST)
        model = nncf.compress_weights(
            model,
            mode=nncf.CompressWeightsMode.INT4_ASYM,
            group_size=128,
            ratio=1.0,
            all_layers=True,
            advanced_parameters=adjust,
        )
    _save_beside(model, folder)
