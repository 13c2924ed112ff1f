"""The lanes' names, defined once: the run's JSON keys, the page's lanes, the terminal's columns and the bench's lane
kinds spell them only through these. Plain strings, not an Enum, so that JSON, f-strings and dict keys read exactly
as they always have on every Python."""

AUTOREGRESSIVE = "autoregressive"  # the target alone, one token per call
SPECULATIVE = "speculative"  # drafts checked by the target, several tokens per call
GENAI = "genai"  # OpenVINO GenAI's speculative pipeline, the page's optional third lane
LANES = (AUTOREGRESSIVE, SPECULATIVE)  # our two lanes, in the order they are shown
