"""``python -m producers DATASET [PATH] ...``: the replay producer (``streamtrain produce``)."""

import sys

from pipeline.cli import main

main(["produce", *sys.argv[1:]])
