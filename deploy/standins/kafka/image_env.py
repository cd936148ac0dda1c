"""apache/kafka's start-up settings: the broker properties its image writes from a service's
``KAFKA_*`` variables (docker/resources/common-scripts in Apache Kafka's repository), for the
stand-in image and for the tests that run the compose file's settings.

``python3 image_env.py`` prints the properties for this process's environment;
``python3 image_env.py --cluster-id`` prints the cluster id the storage is formatted with.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping

#: ``configureDefaults``: each variable the service leaves unset takes this value when the
#: container starts.
IMAGE_DEFAULTS = {
    "CLUSTER_ID": "5L6g3nShT-eMCtK--X86sw",
    "KAFKA_NODE_ID": "1",
    "KAFKA_LISTENER_SECURITY_PROTOCOL_MAP": (
        "CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT,PLAINTEXT_HOST:PLAINTEXT"
    ),
    "KAFKA_LISTENERS": "PLAINTEXT://localhost:29092,CONTROLLER://localhost:29093,"
    "PLAINTEXT_HOST://0.0.0.0:9092",
    "KAFKA_ADVERTISED_LISTENERS": "PLAINTEXT://localhost:29092,PLAINTEXT_HOST://localhost:9092",
    "KAFKA_OFFSETS_TOPIC_REPLICATION_FACTOR": "1",
    "KAFKA_GROUP_INITIAL_REBALANCE_DELAY_MS": "0",
    "KAFKA_TRANSACTION_STATE_LOG_MIN_ISR": "1",
    "KAFKA_TRANSACTION_STATE_LOG_REPLICATION_FACTOR": "1",
    "KAFKA_PROCESS_ROLES": "broker,controller",
    "KAFKA_CONTROLLER_QUORUM_VOTERS": "1@localhost:29093",
    "KAFKA_INTER_BROKER_LISTENER_NAME": "PLAINTEXT",
    "KAFKA_CONTROLLER_LISTENER_NAMES": "CONTROLLER",
    "KAFKA_LOG_DIRS": "/tmp/kraft-combined-logs",
}
#: Variables the image reads itself, never written as broker properties.
IMAGE_EXCLUDES = {"KAFKA_VERSION", "KAFKA_HEAP_OPTS", "KAFKA_OPTS", "KAFKA_JMX_OPTS"}


def image_properties(environment: Mapping[str, object]) -> dict[str, str]:
    """The broker properties apache/kafka writes from a service's environment.

    ``KAFKA_`` is dropped, the rest lower-cased, ``___`` becomes ``-``, ``__`` ``_`` and
    ``_`` ``.``.

    Example:
        >>> image_properties({"KAFKA_LOG_RETENTION_HOURS": 24})["log.retention.hours"]
        '24'
    """
    merged = {**IMAGE_DEFAULTS, **{k: str(v) for k, v in environment.items()}}
    props = {}
    for name, value in merged.items():
        if not name.startswith("KAFKA_") or name in IMAGE_EXCLUDES:
            continue
        key = name[len("KAFKA_") :].lower()
        key = key.replace("___", "\0").replace("__", "\1").replace("_", ".")
        props[key.replace("\0", "-").replace("\1", "_")] = value
    return props


if __name__ == "__main__":
    if sys.argv[1:] == ["--cluster-id"]:
        print(os.environ.get("CLUSTER_ID", IMAGE_DEFAULTS["CLUSTER_ID"]))
    else:
        for key, value in sorted(image_properties(os.environ).items()):
            print(f"{key}={value}")
