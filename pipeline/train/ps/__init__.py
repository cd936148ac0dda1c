"""The parameter server: flat float32 weights over an authenticated binary protocol.

It knows neither Spark nor TensorFlow, so it can be started and tested alone:
:mod:`~pipeline.train.ps.server` the server workers connect to and the driver calls,
:mod:`~pipeline.train.ps.core` the center, the clock and the rule under one lock,
:mod:`~pipeline.train.ps.transport` the sockets and the handshake,
:mod:`~pipeline.train.ps.connection` each connection's requests,
:mod:`~pipeline.train.ps.rounds` synchronous rounds, :mod:`~pipeline.train.ps.protocol`
the frames, :mod:`~pipeline.train.ps.shm` shared memory, :mod:`~pipeline.train.ps.client`
a worker's side (:mod:`~pipeline.train.ps.channel` its handshake and frames),
:mod:`~pipeline.train.ps.shards` a sharded server's plan and a worker's connection to all
its shards.
"""

from pipeline.train.ps.client import Client, parse_address
from pipeline.train.ps.protocol import ProtocolError
from pipeline.train.ps.rules import Rule, add_delta
from pipeline.train.ps.server import ParameterServer
from pipeline.train.ps.shards import ShardedClient, connect

__all__ = [
    "Client",
    "ParameterServer",
    "ProtocolError",
    "Rule",
    "ShardedClient",
    "add_delta",
    "connect",
    "parse_address",
]
