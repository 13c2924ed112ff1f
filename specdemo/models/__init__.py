"""A model source turned into a compiled model: where a model comes from and the folder its IR lives in (sources.py);
turning a source into an OpenVINO IR folder (export.py), in a child process (convert.py), a GGUF straight to the IR
without torch (gguf_file, gguf_metadata, gguf_graph, gguf_weights, gguf_import); the edits made to a graph before it
is compiled (graph.py) and the draft's trimmed vocabulary (vocab.py); one compiled stateful model and its KV cache
(runtime.py); one model loaded with its tokenizer and facts (loading.py); a conversation's prompt ids, the one chat
encoder for every caller (chat.py).

May import: specdemo.host and the root leaves (settings, errors, text, strict_json, names).
"""
