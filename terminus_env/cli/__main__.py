"""``python -m terminus_env.cli``: the ``terminus-env`` command, for a child process started with this interpreter."""

import sys

from terminus_env.cli import main

if __name__ == "__main__":
    sys.exit(main())
