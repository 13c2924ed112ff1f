"""The command line, `python -m specdemo`: flags to one settings object and each command's dispatch (commands.py);
`generate` streamed in a terminal (terminal.py); `tune` measured and printed (tune_command.py).

May import anything of specdemo below it: the bench (specdemo.bench), the page's modules, the run and everything the
run stands on. Nothing imports the command line but specdemo/__main__.py.
"""
