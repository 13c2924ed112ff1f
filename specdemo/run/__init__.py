"""The run: a loaded model pair, its plan and its lanes (engine.py); one side-by-side run from the instruction to its
record, the one owner of a run's life cycle (sidebyside.py); whether tune's choice keeps greedy output exact, run side
by side (exactness.py); OpenVINO GenAI's pipeline as a lane of its own (genai.py).

May import: specdemo.learning, specdemo.results, specdemo.decoding, specdemo.models, specdemo.host and the root
leaves. The front ends (specdemo.cli, specdemo.ui, specdemo.bench) stream and render what it gives them.
"""
