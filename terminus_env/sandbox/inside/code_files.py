"""Which files are code, and where programs are looked up: facts the daemon's watch and the host's rules share (the
host imports them from here, so the two cannot drift)."""

CODE_SUFFIXES = (".py", ".pyc", ".pyo", ".so", ".pm", ".pl", ".rb", ".js", ".mjs", ".cjs", ".sh", ".jar")
"""Files an interpreter or the loader runs when it opens them. A ``.pth`` is not among them: Python reads it, and runs
only its import lines, which the host's rules judge line by line."""
CODE_MAGIC = (b"\x7fELF", b"#!", b"PK\x03\x04")  # a program, a script, a zip Python imports from
PATH_DIRS = ("/usr/local/sbin", "/usr/local/bin", "/usr/sbin", "/usr/bin", "/sbin", "/bin")
"""Debian's PATH for root, in order: a program found in an earlier folder hides one of a later folder."""
