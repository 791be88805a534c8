"""The root of every error terminus-env raises on purpose.

Catch ``TerminusError`` to handle them all; each message says what to do next. The command line
prints such errors without a traceback.
"""


class TerminusError(Exception):
    """An error with a message meant for the user."""
