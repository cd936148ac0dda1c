"""``python -m pipeline``: the streamtrain command."""

from pipeline.cli import main

main()
