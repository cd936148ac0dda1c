"""The parameter server: flat float32 weights over an authenticated binary protocol.

It knows neither Spark nor TensorFlow, so it can be started and tested alone.
"""

from pipeline.ps.client import Client, parse_address
from pipeline.ps.protocol import ProtocolError
from pipeline.ps.server import ParameterServer, add_delta

__all__ = ["Client", "ParameterServer", "ProtocolError", "add_delta", "parse_address"]
