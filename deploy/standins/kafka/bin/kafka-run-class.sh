#!/bin/sh
# Kafka's bin/kafka-run-class.sh at its core: a main class on the jars in libs/, the heap
# from KAFKA_HEAP_OPTS, log4j2's settings from KAFKA_LOG4J_CONFIG (the tools' by default).
exec java ${KAFKA_HEAP_OPTS:--Xmx256M} ${KAFKA_OPTS:-} \
  -Dlog4j2.configurationFile="${KAFKA_LOG4J_CONFIG:-/opt/kafka/config/tools-log4j2.properties}" \
  -cp '/opt/kafka/libs/*' "$@"
