"""The KV-event stream (lmcache 0.5.6's `kv_event_stream` capability) against kvd, driven by
the real lmcache client: its RequestClient.subscribe_kv_events stream (the ZMQ framing,
credits and acks of lmcache's transport) and the vLLM worker adapter's own subscriber
(enable_kv_events=True, what vLLM's --kv-events-config turns on), which turns the records
into the CacheStoreEvent / CacheRemoveEvent objects vLLM publishes to KV-aware routers.

Checked: the capability is advertised; every chunk stored (both transfer modes) gives one
"stored" record with lmcache's own chunk hash (TokenHasher), its parent's hash and its
tokens, after every rank committed; clear and eviction give "removed" records; replay from a
cursor, loss when the log is trimmed, one stream per instance, and the stream ending when
the log is off (--kv-event-log-size 0).

Run:  KVD_TEST_KVD_BIN=build/kvd .venv/bin/python -m pytest tests/integration/test_kv_events.py -q
"""

from __future__ import annotations

import gc
import queue
import threading
import time

import pytest

import kvd_harness as H

pytestmark = pytest.mark.skipif(H.server_kind() != "kvd", reason="kvd's KV-event stream")

CHUNK = H.CHUNK_SIZE
BPC = CHUNK // H.BLOCK_SIZE


def lmcache_hashes(tokens: list[int]) -> list[bytes]:
    from lmcache.v1.multiprocess.token_hasher import TokenHasher  # noqa: PLC0415

    h = TokenHasher(chunk_size=CHUNK, hash_algorithm="blake3")
    return [TokenHasher.hash_to_bytes(x) for x in h.compute_chunk_hashes(list(tokens))]


class Subscriber:
    """The real client's subscribe_kv_events stream, read on a thread into a queue."""

    def __init__(self, url: str, instance_id: int, model: str, cursor: int = 0,
                 max_events: int = 1024, client=None) -> None:
        # client: another Subscriber's client, to subscribe on the same connection.
        self.owns_client = client is None
        self.client = client or H.make_request_client(url)
        self.stream = self.client.subscribe_kv_events(instance_id, model, cursor, max_events)
        self.batches: queue.Queue = queue.Queue()
        self.ended = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        try:
            for batch in self.stream:
                self.batches.put(batch)
        except Exception as exc:  # noqa: BLE001 - the client raises when the stream ends
            self.batches.put(exc)
        finally:
            self.ended.set()

    def next_batch(self, timeout: float = 10.0):
        b = self.batches.get(timeout=timeout)
        if isinstance(b, Exception):
            raise b
        return b

    def records(self, n: int, timeout: float = 10.0) -> list:
        out = []
        deadline = time.monotonic() + timeout
        while len(out) < n:
            out += self.next_batch(max(0.01, deadline - time.monotonic())).events
        return out

    def close(self) -> None:
        self.stream.close()
        self.thread.join(timeout=10)
        if self.owns_client:
            self.client.close()


@pytest.fixture
def kvd(tmp_path):
    made = []

    def start(*extra: str, l1_gb: float = 0.25) -> H.ServerProc:
        srv = H.ServerProc(kind="kvd", port=H.free_port(), l1_size_gb=l1_gb,
                           log_path=tmp_path / f"kvd{len(made)}.log", extra_args=list(extra))
        made.append(srv)
        return srv.start()

    yield start
    gc.collect()
    for srv in made:
        srv.stop()


def store(c: H.TPCluster, toks: list[int], tag: str) -> None:
    req = f"{tag}-{toks[0]}"
    assert c.store(req, toks, list(range(1, 1 + len(toks) // CHUNK * BPC))) == [True] * c.tp
    c.end_session(req)


@pytest.mark.parametrize("mode", ["lmcache_driven", "engine_driven"])
def test_stored_and_removed_records_carry_lmcaches_hashes(kvd, mode):
    srv = kvd()
    client = H.make_request_client(srv.url)
    assert "kv_event_stream" in client.get_experimental().result(timeout=10)
    client.close()
    model = f"ev-{mode}"
    sub = Subscriber(srv.url, instance_id=4242, model=model)
    c = H.TPCluster(srv.url, mode=mode, model_name=model, tp=2)
    try:
        first = sub.next_batch()
        assert first.enabled and first.events == [] and first.lost is False
        toks = H.unique_tokens(3 * CHUNK)
        hashes = lmcache_hashes(toks)
        store(c, toks, "a")
        recs = sub.records(3)
        assert [r.kind for r in recs] == ["stored"] * 3
        assert [r.block_hashes for r in recs] == [[h] for h in hashes]
        assert [r.parent_block_hash for r in recs] == [None, hashes[0], hashes[1]]
        assert [r.token_ids for r in recs] == [toks[i * CHUNK:(i + 1) * CHUNK] for i in range(3)]
        assert all(r.medium == "CPU" and r.model_name == model for r in recs)
        assert [r.seq for r in recs] == sorted(r.seq for r in recs)
        # A later request extending the prefix: the new chunk's parent is the old last one.
        more = toks + H.unique_tokens(CHUNK)
        req = "b-ext"
        start = 3 * CHUNK
        for r_ in range(c.tp):
            c.workers[r_]  # noqa: B018 - both ranks store the new chunk below
        assert c.store(req, more, list(range(1, 1 + BPC)), start=start, end=4 * CHUNK) == [True] * c.tp
        c.end_session(req)
        (ext,) = sub.records(1)
        assert ext.kind == "stored" and ext.parent_block_hash == hashes[2]
        assert ext.block_hashes == [lmcache_hashes(more)[3]]
        # Storing what is already cached announces nothing new.
        store(c, toks, "again")
        c.settle()
        settle_recs = sub.records(1)
        assert all(r.block_hashes[0] not in hashes for r in settle_recs)
        # Clear: "removed" records (one per L1 index shard) naming every chunk that was stored.
        rc = H.make_request_client(srv.url)
        rc.clear().result(timeout=10)
        rc.close()
        want = set(hashes) | set(ext.block_hashes)
        gone: set = set()
        deadline = time.monotonic() + 10
        while not want <= gone and time.monotonic() < deadline:
            for r in sub.next_batch(max(0.01, deadline - time.monotonic())).events:
                assert r.kind == "removed" and r.model_name == model
                gone |= set(r.block_hashes)
        assert want <= gone
    finally:
        c.close()
        sub.close()


def test_eviction_is_announced_and_evicted_chunks_miss(kvd):
    # 16 MiB of L1; one chunk of the harness model is 1 MiB over both ranks.
    srv = kvd(l1_gb=16 / 1024)
    model = "ev-evict"
    sub = Subscriber(srv.url, instance_id=1, model=model)
    c = H.TPCluster(srv.url, mode="lmcache_driven", model_name=model, tp=2)
    try:
        sub.next_batch()
        prompts = [H.unique_tokens(4 * CHUNK) for _ in range(6)]  # 24 chunks
        for i, p in enumerate(prompts):
            store(c, p, f"p{i}")
        stored, removed = [], []
        deadline = time.monotonic() + 20
        while len(stored) < 24 and time.monotonic() < deadline:
            for r in sub.next_batch().events:
                (stored if r.kind == "stored" else removed).append(r)
        assert len(stored) == 24
        gone = {h for r in removed for h in r.block_hashes}
        assert gone, "24 MiB into 16 MiB of L1 must evict"
        assert gone <= {r.block_hashes[0] for r in stored}
        for p in prompts:
            hs = lmcache_hashes(p)
            hit_chunks = c.probe(p) // CHUNK
            # A hit prefix never contains a chunk announced as removed.
            assert not set(hs[:hit_chunks]) & gone
    finally:
        c.close()
        sub.close()


def test_replay_from_a_cursor_one_stream_per_instance_and_log_trim(kvd):
    srv = kvd("--kv-event-log-size", "4")
    model = "ev-replay"
    c = H.TPCluster(srv.url, mode="lmcache_driven", model_name=model, tp=2)
    try:
        a = Subscriber(srv.url, instance_id=7, model=model)
        a.next_batch()
        # 6 records in two stores; the log keeps 4, and `a` keeps up, so it loses none.
        store(c, H.unique_tokens(3 * CHUNK), "r1")
        recs = a.records(3)
        store(c, H.unique_tokens(3 * CHUNK), "r2")
        recs += a.records(3)
        assert len(recs) == 6
        seqs = [r.seq for r in recs]
        # Replay after the 4th record: exactly the two newer ones.
        b = Subscriber(srv.url, instance_id=8, model=model, cursor=seqs[3])
        first = b.next_batch()
        assert first.lost is False and [r.seq for r in first.events] == seqs[4:]
        # From the start: the oldest records are gone, so the batch says lost.
        d = Subscriber(srv.url, instance_id=9, model=model, cursor=1)
        first = d.next_batch()
        assert first.lost is True and [r.seq for r in first.events] == seqs[2:]
        # Another model's subscriber sees none of them.
        e = Subscriber(srv.url, instance_id=10, model="someone-else", cursor=0)
        assert e.next_batch().events == []
        # A subscription of instance 7 from another connection does not end the first stream
        # (streams belong to the connection that opened them: issue 27, finding 9) ...
        other = Subscriber(srv.url, instance_id=7, model=model, cursor=seqs[-1])
        other.next_batch()
        assert not a.ended.wait(2), "another connection ended instance 7's stream"
        # ... a second subscription of instance 7 on the same connection does.
        a2 = Subscriber(srv.url, instance_id=7, model=model, cursor=seqs[-1], client=a.client)
        a2.next_batch()
        assert a.ended.wait(10), "the older stream of instance 7 must end"
        for s in (a2, other, b, d, e, a):
            s.close()
    finally:
        c.close()


def test_log_size_zero_turns_the_stream_off(kvd):
    srv = kvd("--kv-event-log-size", "0")
    client = H.make_request_client(srv.url)
    assert "kv_event_stream" not in client.get_experimental().result(timeout=10)
    client.close()
    sub = Subscriber(srv.url, instance_id=3, model="m")
    try:
        assert sub.next_batch().enabled is False
        assert sub.ended.wait(10), "a disabled stream ends after its status batch"
    finally:
        sub.close()


def test_the_vllm_worker_adapter_publishes_the_servers_events(kvd):
    srv = kvd()
    model = "ev-adapter"
    c = H.TPCluster(srv.url, mode="lmcache_driven", model_name=model, tp=2, enable_kv_events=True)
    try:
        w0 = c.workers[0]

        def drain(pred, timeout=15.0):
            got = []
            deadline = time.monotonic() + timeout
            while time.monotonic() < deadline:
                got += w0.get_kv_events()  # starts the adapter's subscription on first call
                if pred(got):
                    return got
                time.sleep(0.05)
            return got

        drain(lambda g: False, timeout=1.0)  # let the subscription start
        assert w0._kv_event_server_source, "the adapter must use the server's stream"  # noqa: SLF001
        toks = H.unique_tokens(2 * CHUNK)
        hashes = lmcache_hashes(toks)
        store(c, toks, "ad")
        events = drain(lambda g: sum(len(e.block_hashes) for e in g
                                     if type(e).__name__ == "CacheStoreEvent") >= 2)
        stores = [e for e in events if type(e).__name__ == "CacheStoreEvent"]
        assert [h for e in stores for h in e.block_hashes] == hashes
        assert stores[0].token_ids == toks[:CHUNK] and stores[0].parent_block_hash is None
        rc = H.make_request_client(srv.url)
        rc.clear().result(timeout=10)
        rc.close()
        events = drain(lambda g: set(hashes) <= {h for e in g if type(e).__name__ == "CacheRemoveEvent"
                                                 for h in e.block_hashes})
        removes = [e for e in events if type(e).__name__ == "CacheRemoveEvent"]
        assert removes and set(hashes) <= {h for e in removes for h in e.block_hashes}
    finally:
        c.close()
