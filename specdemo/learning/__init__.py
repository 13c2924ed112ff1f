"""What this machine learns, and what specdemo keeps of it: the machine profile, the one owner of what is learnt
(profile/); measuring the call costs the way the loop calls (measuring.py) and what a loaded pair learns before its
first run (warmup.py); timing races (race.py), the compile settings they may race on this CPU class (candidates.py)
and those they choose (tune.py), the draft plan (draft_choice.py), the faithful target layout (target_choice.py) and
whether a faster target stays exact (identity.py); the built-in answers those measurements use (builtin.py); what
specdemo keeps on disk, and `clean` (disk.py).

May import: specdemo.results, specdemo.decoding, specdemo.models, specdemo.host and the root leaves. Never the run
(specdemo.run): it is handed values (runtimes, the profile, keys, encoded examples), never an engine; what a warm-up
learns it keeps in the profile or returns, and the engine assigns it (tests/test_architecture.py holds it).
"""
