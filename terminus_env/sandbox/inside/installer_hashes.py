"""SHA-256 of the files Python's installers write that Python runs at every start (installer_files.py says which and
how an editable finder is normalised first). Made by scripts/installer-hashes.py from the installers' releases."""

INSTALLER_HASHES = frozenset()
