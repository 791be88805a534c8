"""MkDocs hooks (mkdocs.yml `hooks:`) that keep the strict build about the pages, not the docstrings' wording.

Docstrings here are prose, not autorefs markup, so `matrix[i][j]` written in one is no broken link. autorefs
would report it as a missing cross-reference and fail the strict build; these warnings, when they come from a
docstring (a `.py` file), are logged as INFO instead. Broken links in the Markdown pages still fail the build.
"""

from __future__ import annotations

import logging
from typing import Any

AUTOREFS_LOGGERS = "mkdocs.plugins.mkdocs_autorefs"
UNRESOLVED = "Could not find cross-reference target"


class DocstringRefsAsInfo(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        if record.levelno == logging.WARNING and UNRESOLVED in message and ".py:" in message:
            record.levelno, record.levelname = logging.INFO, "INFO"
        return True


def on_config(config: Any) -> Any:
    """Plugins are loaded by now, so their loggers exist."""
    names = [name for name in logging.Logger.manager.loggerDict if name.startswith(AUTOREFS_LOGGERS)]
    for name in names:
        logging.getLogger(name).addFilter(DocstringRefsAsInfo())
    return config
