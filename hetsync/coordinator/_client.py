"""What every coordinator service's client shares: one gRPC channel to the rank-0 server, this rank's identity and
the job's secret (sent in every request: auth.py), and a per-call timeout.  Each service's client.py subclasses it
with that service's stub and calls."""
import grpc

# Straight to the server, never through a proxy named in the environment (http_proxy on a cluster's login
# environment would send rank-to-rank traffic to it); keepalive pings notice a server that went away.
CHANNEL_OPTIONS = [("grpc.enable_http_proxy", 0), ("grpc.keepalive_time_ms", 60_000)]


def channel(address):
    """An insecure channel (the job's secret authenticates each request) with :data:`CHANNEL_OPTIONS`."""
    return grpc.insecure_channel(address, options=CHANNEL_OPTIONS)


class ServiceClient:
    """One rank's connection to one coordinator service; every call has ``timeout`` seconds."""

    def __init__(self, address, secret, worker, timeout, stub_class):
        self.worker, self.secret, self.timeout = int(worker), secret, float(timeout)
        self._channel = channel(address)
        self._stub = stub_class(self._channel)

    def close(self):
        self._channel.close()
