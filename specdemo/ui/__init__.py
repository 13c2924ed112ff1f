"""The page, in layers that each own one thing:

- values.py: the page's values (PageValues), the server-side checks and caps;
- engines.py: engines and GenAI's pipeline, loaded once per process in the background and shared;
- lanes.py: one run's worker threads, the events they send, Stop;
- render.py: pure renderers (events and summaries to HTML and chart frames);
- handlers.py: what Generate, Stop and page load do, as generators of whole page updates;
- learning.py: the page's learning of the machine (the rest of a quick warm-up, a new tune applied), in turns of its
  own in the visitors' line;
- page.py: the Gradio layout and glue, the only module that imports gradio.

May import: specdemo.run, specdemo.learning, specdemo.results, specdemo.decoding, specdemo.models, specdemo.host and the
root leaves; never the bench or the command line (the bench measures the page, not the other way round).
"""
