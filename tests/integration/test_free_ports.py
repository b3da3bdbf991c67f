"""Regression: the tests' free-port helpers handed out one port twice.

Each helper binds a socket to port 0, reads the port and closes the socket; the kernel may
return the same port to a later probe. `make test` failed once on it: a Kvd of
ops_fixtures got one port for both its ZMQ and HTTP listeners and exited with "cannot listen
for HTTP on 127.0.0.1:51459: address already in use". 1,000 probes of the ephemeral range
(about 28,000 ports here) repeat one with near certainty, so the helpers must remember what
they handed out. (The helpers now draw from the 12,000 ports below that range, where no
outgoing connection takes one; ops_fixtures' helper is kvd_harness'.)
"""

from __future__ import annotations

import kvd_harness as H
import ops_fixtures as F


def test_free_port_never_hands_out_one_port_twice():
    for free_port in (H.free_port, F.free_port):
        ports = [free_port() for _ in range(1000)]
        assert len(set(ports)) == len(ports), f"{free_port.__module__}: a port was handed out twice"

