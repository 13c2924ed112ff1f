"""What a GGUF file's metadata gives an IR folder besides the graph: config.json, generation_config.json and the
tokenizer's files (tokenizer.json, tokenizer_config.json, chat_template.jinja), made by transformers from the file as
`AutoTokenizer.from_pretrained(folder, gguf_file=…)` makes them, without torch; and the tokenizer as OpenVINO models
(openvino_tokenizer.xml, openvino_detokenizer.xml), as optimum-intel's export writes them: OpenVINO GenAI's pipeline
runs without them, but not with a draft model (its speculative lane checks the two models' tokenizers).

transformers reads a GGUF's metadata with load_gguf_checkpoint, which refuses to run without torch (it is written to
load the tensors too) and parses each of the target's 300,000 tokenizer strings through gguf-py's reader: 17 s a call
on a loaded 2-core Xeon, and a config and a tokenizer take two. For the length of the two calls its answer comes from
specdemo/models/gguf_file.py instead, renamed by transformers' own table (GGUF_TO_TRANSFORMERS_MAPPING); everything else
(the config class, the tokenizer's class and conversion) is transformers' own, so for the default pair the files are
byte for byte those the torch path wrote, but for a config without "dtype" (these weights are not f32) and a
tokenizer_config without "is_local".
"""

from __future__ import annotations

import contextlib
import copy
from pathlib import Path
from unittest import mock

from specdemo.models.gguf_file import GGUFFile
from specdemo.models.gguf_graph import ARCHITECTURES

# Where transformers' GGUF loading calls load_gguf_checkpoint from (the config, AutoTokenizer, the tokenizer itself).
_READERS = ("transformers.configuration_utils", "transformers.models.auto.tokenization_auto",
            "transformers.tokenization_utils_tokenizers")
NO_OPENVINO_TOKENIZER = "--no-openvino-tokenizer"  # for a folder GenAI never loads (export.from_gguf)


def write(file: GGUFFile, folder: Path, openvino_tokenizer: bool = True) -> None:
    """Write the config, generation config and tokenizer of `file` into `folder`, and the tokenizer as OpenVINO models
    where `openvino_tokenizer`."""
    from transformers import AutoConfig, AutoTokenizer, GenerationConfig

    with _answered_from(file):
        config = AutoConfig.from_pretrained(file.path.parent, gguf_file=file.path.name)
        tokenizer = AutoTokenizer.from_pretrained(file.path.parent, gguf_file=file.path.name)
    config.architectures = [ARCHITECTURES[file.architecture]]
    config.save_pretrained(folder)
    GenerationConfig.from_model_config(config).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    if openvino_tokenizer:
        _write_openvino_tokenizer(tokenizer, folder)


def _write_openvino_tokenizer(tokenizer, folder: Path) -> None:
    """openvino_tokenizer.xml and openvino_detokenizer.xml, converted as optimum-intel converts them for a
    text-generation export (padding and truncation on the left); none when openvino_tokenizers cannot convert this
    tokenizer, which costs only GenAI's speculative lane, as it does for an export."""
    import openvino as ov
    from openvino_tokenizers import convert_tokenizer

    tokenizer.padding_side = tokenizer.truncation_side = "left"
    try:
        encoder, decoder = convert_tokenizer(tokenizer, with_detokenizer=True)
    except Exception:  # noqa: BLE001 - any tokenizer it does not take: the folder works without these files
        return
    ov.save_model(encoder, folder / "openvino_tokenizer.xml")
    ov.save_model(decoder, folder / "openvino_detokenizer.xml")


@contextlib.contextmanager
def _answered_from(file: GGUFFile):
    """transformers' load_gguf_checkpoint(path) answered with `file`'s metadata while the block runs."""
    parsed = _parsed(file)

    def metadata(path, return_tensors=False, model_to_load=None):
        if return_tensors or Path(path).resolve() != file.path.resolve():
            raise ValueError(f"only {file.path.name}'s metadata is at hand here")
        return copy.deepcopy(parsed)

    with contextlib.ExitStack() as stack:
        for module in _READERS:
            stack.enter_context(mock.patch(f"{module}.load_gguf_checkpoint", metadata))
        yield


def _parsed(file: GGUFFile) -> dict[str, dict]:
    """{"config": …, "tokenizer": …, "tokenizer_config": …}: the file's fields renamed by transformers' table, as
    load_gguf_checkpoint(return_tensors=False) renames them for the architectures specdemo builds."""
    from transformers.modeling_gguf_pytorch_utils import GGUF_TO_TRANSFORMERS_MAPPING

    parsed = {part: {} for part in GGUF_TO_TRANSFORMERS_MAPPING}
    for key, value in file.fields.items():
        prefix, _, rest = key.partition(".")
        for part, renames in GGUF_TO_TRANSFORMERS_MAPPING.items():
            if rest in renames.get(prefix, {}) and renames[prefix][rest] not in (None, -1):
                parsed[part][renames[prefix][rest]] = value
    parsed["config"]["tie_word_embeddings"] = "output.weight" not in file.tensors
    parsed["config"].setdefault("vocab_size", len(parsed["tokenizer"].get("tokens", ())))
    return parsed


if __name__ == "__main__":  # export.from_gguf runs it beside the graph's building: python -m … GGUF_FILE FOLDER [FLAG]
    import sys

    from specdemo.host import compat

    compat.keep_torch_out()  # the metadata needs no torch (a Llama config would import it through torchvision)
    write(GGUFFile(Path(sys.argv[1])), Path(sys.argv[2]), openvino_tokenizer=NO_OPENVINO_TOKENIZER not in sys.argv[3:])
