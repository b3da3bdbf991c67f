"""A client that floods kvd (driven by test_faults.py; not a test module).

    python faults_flood.py URL MODEL SECONDS SOCKETS WINDOW TOKENS

Opens SOCKETS DEALER sockets and keeps WINDOW requests in flight on each for SECONDS: LOOKUP
of a TOKENS-long prompt (fresh request ids; the server hashes every chunk and locks hits),
QUERY_PREFETCH_STATUS and END_SESSION for it, as fast as replies come back. Prints one line
"FLOOD sent=N replies=M" at the end. Bounded: stops at SECONDS (+2 s to drain) whatever
happens.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from faults_util import RawClient, cache_key  # noqa: E402


def main() -> int:
    url, model = sys.argv[1], sys.argv[2]
    seconds, nsock, window, ntok = float(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5]), int(sys.argv[6])
    import zmq

    ctx = zmq.Context()
    socks = [RawClient(url, ctx) for _ in range(nsock)]
    toks = [(i * 7) % 50_000 + 1 for i in range(ntok)]
    end = ntok // 256 * 256
    sent = replies = 0
    n = 0

    def one(c: RawClient) -> None:
        nonlocal sent, n
        n += 1
        rid = f"flood-{n}"
        c.send("lookup", cache_key(model, 1, None, toks, 0, end, rid), 1)
        c.send("query_prefetch_status", rid)
        c.send("end_session", rid)
        sent += 3

    outstanding = {id(c): 0 for c in socks}
    deadline = time.monotonic() + seconds
    poller = zmq.Poller()
    for c in socks:
        poller.register(c.sock, zmq.POLLIN)
    while time.monotonic() < deadline:
        for c in socks:
            while outstanding[id(c)] < window:
                one(c)
                outstanding[id(c)] += 3
        for s, _ in poller.poll(50):
            c = next(x for x in socks if x.sock is s)
            while True:
                try:
                    c.sock.recv_multipart(zmq.NOBLOCK)
                except zmq.Again:
                    break
                replies += 1
                outstanding[id(c)] -= 1
    drain = time.monotonic() + 2.0
    while time.monotonic() < drain and sum(outstanding.values()) > 0:
        for s, _ in poller.poll(50):
            c = next(x for x in socks if x.sock is s)
            try:
                c.sock.recv_multipart(zmq.NOBLOCK)
                replies += 1
                outstanding[id(c)] -= 1
            except zmq.Again:
                pass
    print(f"FLOOD sent={sent} replies={replies}", flush=True)
    for c in socks:
        c.close()
    ctx.term()
    return 0


if __name__ == "__main__":
    sys.exit(main())
