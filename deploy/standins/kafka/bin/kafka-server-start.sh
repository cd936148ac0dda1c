#!/bin/sh
# The broker (and controller), as Kafka's script starts it: a 1 GB heap unless told.
export KAFKA_HEAP_OPTS="${KAFKA_HEAP_OPTS:--Xmx1G -Xms1G}"
export KAFKA_LOG4J_CONFIG=/opt/kafka/config/log4j2.properties
exec /opt/kafka/bin/kafka-run-class.sh kafka.Kafka "$@"
