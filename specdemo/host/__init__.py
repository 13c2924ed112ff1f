"""This machine and this software stack, as facts every layer may read: the CPU, its cores and OpenVINO's version
(machine.py); how loaded the host was while something was measured (load.py); the memory bound and what each heavy
step needs (memory.py); what the stack needs here, and the OpenVINO compile configuration every lane uses (compat.py).
And what the kernel can do for us: a sandbox for running code a model wrote (sandbox.py; its first process inside is
sandbox_init.py).

May import: the leaves at specdemo's root (settings, errors, text, strict_json, names) and the standard library or
third-party packages; nothing else of specdemo.
"""
