"""Free local ports for the nodes the app tests start."""

import socket


def free_base_port(start, span):
    """The first base from `start` (in steps of 100) with `span` free ports after it, all below 32768:
    Linux hands out ports from 32768 up to outgoing connections, which could take a fixed port there."""
    def free(port):
        with socket.socket() as probe:
            try:
                probe.bind(("127.0.0.1", port))
                return True
            except OSError:
                return False

    for base in range(start, 32768 - span, 100):
        if all(free(port) for port in range(base, base + span)):
            return base
    raise RuntimeError(f"no {span} free ports in a row from {start} below 32768")
