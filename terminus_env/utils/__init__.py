"""The base floor: small helpers and constants every other floor uses, importing nothing of the package above it.

``named`` (enums that read as their value), ``plain_numbers`` (decimals as JSON writes them), ``limits`` (the bounds
of every number a task may set), ``process_group`` (ending a child and its descendants), ``output_cap`` (capping long
output the way Terminus does), ``text_space`` (the env's text spaces), ``sidecars`` (a task's service containers as
records) and ``bridge`` (the background event loop behind the sync wrappers).
"""
