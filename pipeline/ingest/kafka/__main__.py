"""Resolve what an engine of the embedded broker needs before its first start: Kafka's jars
into the cache (what `tests/run.sh` does before the tests), a binary's path for the others.

    python -m pipeline.ingest.kafka [kafka|tansu|noida ...]
"""

from __future__ import annotations

import os
import sys

from pipeline.errors import StreamtrainError
from pipeline.ingest.kafka import engines


def main(names: list[str]) -> int:
    try:
        for engine in names or ["kafka"]:
            if engine == "kafka":
                jars = engines.kafka_classpath(quiet=False).count(os.pathsep) + 1
                print(f"kafka: {jars} jars")
            else:
                print(f"{engine}: {engines.find_binary(engine)}")
    except StreamtrainError as e:
        print(f"streamtrain: error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
