"""streamtrain's pipeline: from the Kafka source to the trained model.

Importing the package is cheap: Spark, TensorFlow and kafka-python load only in
the modules that need them.
"""

from pipeline.errors import BrokerError, ConfigError, DataError, StreamtrainError

__version__ = "0.1.0"
__all__ = ["BrokerError", "ConfigError", "DataError", "StreamtrainError", "__version__"]
