"""The page, in layers that each own one thing:

- render.py, charts.py: pure renderers (events and summaries to HTML and chart frames);
- handlers.py: what Generate, Stop and page load do, as generators of whole page updates: what happens in a visitor's
  turn (serve/turn.py says it in small values), each turned into the page's update;
- background.py: the line under the status that follows the background work;
- asgi.py: middleware around Gradio's app;
- page.py: the Gradio layout and glue, the only module that imports gradio.

What it serves (the line, the engines, the runs, the background work, the visitors) is specdemo.serve's.

May import: specdemo.serve, specdemo.run, specdemo.learning, specdemo.results, specdemo.decoding, specdemo.models,
specdemo.host and the root leaves; never the bench or the command line (the bench measures the page, not the other way
round).
"""
