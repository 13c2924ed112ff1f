"""Serving the page to strangers who take turns on one machine, in layers that each own one thing:

- server.py: the Server, the one owner of the state the page serves from (the line, the engines, the runs, the
  background work, the visitors' memories), made once in app.py and handed to every handler;
- values.py: what a visitor asks for (PageValues), checked and capped on the server;
- visitors.py: who asks (session, address) and what is theirs alone (their drafters' memories);
- waiting.py: the line of runs, one at a time, each told its place;
- engines.py: engines and GenAI's pipeline, loaded once per process in the background and shared, optional ones
  admitted within the memory bound and released when idle;
- lanes.py: one run's worker threads, the events they send, Stop;
- turn.py: one press of Generate, from its place in the line to its end, said as what happened (Waiting, Preparing,
  Running, Finished, …) for the page to render;
- tuning.py, work.py, progress.py: a new machine's background work (its steps; the one this server started, stopped
  while visitors' runs hold the machine; where it stands);
- learning.py: the server's own turns in the line (the rest of a quick warm-up, a new tune applied).
- downloads.py: each finished run as its own page's download, without the machine's details; nothing written.

No gradio here: the page (specdemo.ui) renders what this serves.

May import: specdemo.run, specdemo.learning, specdemo.results, specdemo.decoding, specdemo.models, specdemo.host and the
root leaves; never the page, the bench or the command line.
"""
