"""One lane's decoding: the autoregressive and speculative loops yielding token events and round records (loops.py,
events.py); the acceptance rule (verification.py); the drafting strategies, one module each (drafters/); this
machine's call costs as a model (costs.py), the acceptance model and the price of a round in numbers (pricing.py),
the plan and what it says (planner.py), and how a running lane picks each round's K (k_rules.py).

May import: specdemo.models (the compiled model a loop calls), specdemo.host and the root leaves. Nothing here knows
how a run is judged, recorded, learnt from or shown.
"""
