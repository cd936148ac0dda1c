"""Tables: a user's own data, declared by a schema and carried as JSON, CSV or Avro records.

* :mod:`~pipeline.table.schema`: the schema file (features, their kinds, the label, the format).
* :mod:`~pipeline.table.inference`: a schema read off a sample, for the user to edit.
* :mod:`~pipeline.table.transform`: raw values to the model's input (training and serving alike).
* :mod:`~pipeline.table.records`: Kafka values of each format to decoded blocks
  (:mod:`~pipeline.table.arrow_json`: a block of typed JSON objects read by Arrow).
* :mod:`~pipeline.table.registry`: Avro writer schemas from a Confluent Schema Registry.
* :mod:`~pipeline.table.avro_sample`: a topic's Avro records read for ``schema infer``.

Example:
    >>> from pipeline import table
    >>> s = table.infer({"x": [1.0, 2.0, 3.0], "y": ["a", "b", "a"]}, label="y")
    >>> table.decode([b'{"x": 2.0, "y": "b"}'], s).y.tolist()
    [1]
"""

from __future__ import annotations

from pipeline.table.inference import infer
from pipeline.table.records import decode, encode_rows
from pipeline.table.schema import Feature, Label, TableSchema

__all__ = ["Feature", "Label", "TableSchema", "decode", "encode_rows", "infer"]
