"""Tooling around turnlog, not part of the library: the demo and the chaos run (``turnlog.tools.demo``)
and the benchmark (``turnlog.tools.bench``).

It may import any part of turnlog; no library module imports it. The command line
(``turnlog.cli``) reaches it only inside the commands that run it (``turnlog demo``,
``turnlog chaos``, ``turnlog bench``), so the other commands never load it.
"""
