"""What a run's records mean: a lane's stream drained into its Result (lane.py); every figure of a run from its
records (metrics.py), each described once for whoever shows it (figures.py); where greedy lanes part and whether that
is noise (parting.py, with the batching noise of fidelity.py); where the drafts fail (failures.py); what each K would
have given (counterfactual.py walks it, would.py keeps and says it); a finished run, all it says, as one typed Record
that the terminal, the page and `show` render (record.py); the run as one JSON object to take home, and `show`
(runfile.py).

May import: specdemo.decoding, specdemo.models, specdemo.host and the root leaves. Nothing here loads a model, learns
or shows; the Record is made by the run's owner (run/sidebyside.py) and needs no engine, so neither does the run file.
"""
