"""A tuned machine keeps every feature working: under each compile setting tune can choose on this CPU (every pair of
inference precision and KV cache precision), our lanes and OpenVINO GenAI's pipelines (with a draft model and with
prompt lookup) compile and run on the real pair. Each case writes the tune file into a home of its own."""

import pytest

from specdemo import errors
from specdemo.run import genai


def test_genai_fits_an_f32_cache_beside_bf16_inference_to_a_bf16_cache():
    properties = {"INFERENCE_PRECISION_HINT": "bf16", "KV_CACHE_PRECISION": "f32", "DYNAMIC_QUANTIZATION_GROUP_SIZE": 256}
    fitted, note = genai.fit(properties)
    assert fitted == {**properties, "KV_CACHE_PRECISION": "bf16"}
    assert note.startswith("KV cache bf16 instead of our f32")


@pytest.mark.parametrize("inference, kv", [("f32", "f32"), ("f32", "u8"), ("f32", "f16"), ("bf16", "u8"),
                                           ("bf16", "f16"), ("bf16", "bf16")])
def test_genai_keeps_every_pair_its_paged_attention_takes(inference, kv):
    properties = {"INFERENCE_PRECISION_HINT": inference, "KV_CACHE_PRECISION": kv}
    assert genai.fit(properties) == (properties, "")


def test_an_openvino_refusal_reads_as_one_sentence_with_what_to_try(tiny_target):
    import openvino as ov

    with pytest.raises(RuntimeError) as raised:
        ov.Core().compile_model(tiny_target / "openvino_model.xml", "CPU", {"KV_CACHE_PRECISION": "u1"})
    assert errors.is_openvino(raised.value)
    sentence = errors.describe(raised.value, "compile the target")
    assert "\n" not in sentence and "Exception from" not in sentence and ".cpp" not in sentence
    assert sentence.startswith("OpenVINO could not compile the target (") and "--kv-cache-precision" in sentence
