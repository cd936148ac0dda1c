"""``python -m pipeline`` and the ``streamtrain`` console script.

The CLI is imported inside :func:`main`, so that a Ctrl-C while Python is still
importing it (a second or more on a cold machine) ends with one line and status 130
rather than a traceback.
"""

import os
import sys


def main() -> None:
    try:
        from pipeline.cli import main as cli_main
    except KeyboardInterrupt:
        sys.stderr.write("interrupted while starting; nothing was done\n")
        sys.stderr.flush()
        # Not SystemExit: an interrupt that landed inside an import can leave CPython set to
        # re-raise SIGINT at exit (status -2). Nothing has started that needs cleaning up.
        os._exit(130)
    cli_main()


if __name__ == "__main__":
    main()
