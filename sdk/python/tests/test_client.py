"""The Python SDK against a live ephemerald (started by tests/sdk-python.test with model
calls replayed): the product page's request end to end, an idempotent retry after a dropped
answer, event resumption after a dropped stream, cancel, typed errors, paging, and
`python -m ephemeral run`.

Environment: EPH_TEST_URL, EPH_TEST_KEY (an organisation with credit), EPH_TEST_STATE (the
daemon's state directory, read with sqlite3 to count rows), EPH_SRCDIR.
"""

import json
import os
import socket
import sqlite3
import subprocess
import sys
import threading
import time
import unittest
import uuid

import ephemeral
from ephemeral import Client

URL = os.environ.get("EPH_TEST_URL", "")
KEY = os.environ.get("EPH_TEST_KEY", "")
STATE = os.environ.get("EPH_TEST_STATE", "")
SRC = os.environ.get("EPH_SRCDIR", "")
EXAMPLE = os.path.join(SRC, "examples", "sandbox-proof", "request.json")
TRANSCRIPTS = os.path.join(SRC, "tests", "transcripts")


def sq(db, sql, *args):
    con = sqlite3.connect("file:%s?mode=ro" % os.path.join(STATE, db), uri=True, timeout=10)
    try:
        return con.execute(sql, args).fetchone()[0]
    finally:
        con.close()


class Proxy:
    """A TCP proxy in front of the daemon that can fail the way networks fail.

    drop_answer_of: a request line prefix ("POST /v1/runs"): the first such request reaches
    the daemon, its answer is read and thrown away, the client's connection is closed.
    cut_stream_after: after this many SSE events the first event stream is cut.
    Records each request's line and headers in .requests."""

    def __init__(self, upstream, drop_answer_of=None, cut_stream_after=None):
        u = upstream.split("//", 1)[1]
        host, port = u.rsplit(":", 1)
        self.upstream = (host, int(port))
        self.drop_answer_of = drop_answer_of
        self.cut_stream_after = cut_stream_after
        self.requests = []
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.url = "http://127.0.0.1:%d" % self.sock.getsockname()[1]
        self.lock = threading.Lock()
        threading.Thread(target=self._accept, daemon=True).start()

    def close(self):
        self.sock.close()

    def _accept(self):
        while True:
            try:
                c, _ = self.sock.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(c,), daemon=True).start()

    def _serve(self, c):
        with c:
            buf = b""
            while b"\r\n\r\n" not in buf:
                d = c.recv(65536)
                if not d:
                    return
                buf += d
            head, _, body = buf.partition(b"\r\n\r\n")
            lines = head.decode("latin-1").split("\r\n")
            headers = {}
            for line in lines[1:]:
                k, _, v = line.partition(":")
                headers[k.strip().lower()] = v.strip()
            n = int(headers.get("content-length", "0"))
            while len(body) < n:
                d = c.recv(65536)
                if not d:
                    return
                body += d
            with self.lock:
                self.requests.append((lines[0], headers))
                drop = self.drop_answer_of and lines[0].startswith(self.drop_answer_of)
                if drop:
                    self.drop_answer_of = None
                cut = self.cut_stream_after if "/events" in lines[0] else None
                if cut:
                    self.cut_stream_after = None
            # One request per connection, as HTTP/1.0: the daemon answers without chunking
            # (a stream can be cut between two events) and closes after the answer.
            method, target, _ = lines[0].split(" ", 2)
            out = "\r\n".join(["%s %s HTTP/1.0" % (method, target)] + [l for l in lines[1:]
                                             if not l.lower().startswith("connection:")]
                              + ["Connection: close", "", ""]).encode("latin-1") + body
            with socket.create_connection(self.upstream, timeout=60) as u:
                u.sendall(out)
                if drop:
                    u.recv(65536)  # the daemon answered: the answer is lost on the way
                    return
                events, pending = 0, b""
                while True:
                    d = u.recv(65536)
                    if not d:
                        return
                    if not cut:
                        c.sendall(d)
                        continue
                    # Whole blocks only, so that the cut falls between two events.
                    pending += d
                    while b"\n\n" in pending:
                        block, _, pending = pending.partition(b"\n\n")
                        c.sendall(block + b"\n\n")
                        if b"event: " in block:
                            events += 1
                            if events >= cut:
                                return


def request_with(prompt, transcript, timeout=60):
    return {"prompt": prompt, "model": "replay:" + os.path.join(TRANSCRIPTS, transcript),
            "shell": True, "timeout_seconds": timeout, "max_cost_micros": 40000}


@unittest.skipUnless(URL and KEY and STATE, "run through tests/sdk-python.test")
class TestClient(unittest.TestCase):
    def setUp(self):
        self.client = Client(URL, KEY, timeout=60)

    def test_product_request_end_to_end(self):
        with open(EXAMPLE) as f:
            request = json.load(f)
        run = self.client.runs.create(request, wait=120)
        self.assertEqual(run.http_status, 201)
        self.assertTrue(run.id.startswith("run_"), run.id)
        self.assertEqual(run.status, "succeeded", run)
        u = run.usage
        self.assertEqual(u["reserved_micros"], 40000)
        self.assertEqual(u["billed_micros"] + u["released_micros"], 40000)
        kinds = [e["kind"] for e in run.events]
        self.assertEqual(kinds[0], "reserved")
        self.assertEqual(kinds[-1], "settled")
        self.assertEqual(kinds.count("tool_call"), 4, kinds)
        self.assertIn("2 3 5 7 11 13", json.dumps(run.events))
        self.assertTrue(run.output["answer"])
        got = self.client.runs.get(run.id)
        self.assertEqual(got.id, run.id)
        self.assertTrue(got.settled)
        streamed = list(self.client.runs.events(run.id))
        self.assertTrue(all(isinstance(e, ephemeral.Event) for e in streamed))
        self.assertEqual([(e.seq, e.kind, e.text) for e in streamed],
                         [(e["seq"], e["kind"], e["text"]) for e in got.events])

    def test_idempotent_retry_after_dropped_answer(self):
        proxy = Proxy(URL, drop_answer_of="POST /v1/runs")
        self.addCleanup(proxy.close)
        marker = "idem-%s" % uuid.uuid4()
        client = Client(proxy.url, KEY, timeout=60, backoff=0.05)
        run = client.runs.create(request_with(marker, "short-sleep.jsonl"))
        posts = [h for line, h in proxy.requests if line.startswith("POST /v1/runs")]
        self.assertEqual(len(posts), 2, proxy.requests)
        self.assertEqual(posts[0]["idempotency-key"], posts[1]["idempotency-key"])
        self.assertEqual(posts[0]["idempotency-key"], run.idempotency_key)
        # The retry was answered with the run the lost answer carried: 200, not a new 201.
        self.assertEqual(run.http_status, 200)
        self.assertEqual(sq("ephemeral.sqlite",
                            "SELECT count(*) FROM runs WHERE request LIKE ?", "%" + marker + "%"), 1)
        self.assertEqual(sq("ledger.sqlite", "SELECT count(*) FROM entries WHERE kind = 'reserve' "
                            "AND run_id = ?", run.id), 1)
        # An explicit key: the caller's own retry gets the same run.
        again = client.runs.create(request_with(marker, "short-sleep.jsonl"),
                                   idempotency_key=run.idempotency_key)
        self.assertEqual((again.id, again.http_status), (run.id, 200))
        with self.assertRaises(ephemeral.IdempotencyError) as cm:
            client.runs.create(request_with(marker + "-other", "short-sleep.jsonl"),
                               idempotency_key=run.idempotency_key)
        self.assertEqual((cm.exception.status, cm.exception.type), (422, "idempotency_error"))
        list(self.client.runs.events(run.id))  # let it settle before the daemon stops

    def test_events_resume_after_a_dropped_stream(self):
        run = self.client.runs.create(request_with("resume", "short-sleep.jsonl"))
        proxy = Proxy(URL, cut_stream_after=2)
        self.addCleanup(proxy.close)
        client = Client(proxy.url, KEY, timeout=60)
        t0 = time.monotonic()
        events = list(client.runs.events(run.id, reconnect_delay=0))
        seqs = [e.seq for e in events]
        self.assertEqual(seqs, list(range(1, len(seqs) + 1)), seqs)
        self.assertEqual(events[-1].kind, "settled")
        streams = [h for line, h in proxy.requests if "/events" in line]
        self.assertGreaterEqual(len(streams), 2, proxy.requests)
        self.assertNotIn("last-event-id", streams[0])
        self.assertEqual(streams[1].get("last-event-id"), "2")
        self.assertLess(time.monotonic() - t0, 60)
        # Resuming from a cursor: only what follows it.
        tail = list(self.client.runs.events(run.id, last_event_id=3))
        self.assertEqual([e.seq for e in tail], seqs[3:])
        # Nothing follows settled: the server's 204 ends the generator at once.
        self.assertEqual(list(self.client.runs.events(run.id, last_event_id=seqs[-1])), [])

    def test_cancel(self):
        run = self.client.runs.create(request_with("cancel me", "sleep.jsonl"))
        for e in self.client.runs.events(run.id):
            if e.kind == "tool_call":
                cancelled = self.client.runs.cancel(run.id)
                self.assertEqual(cancelled.id, run.id)
            last = e
        self.assertEqual(last.kind, "settled")
        final = self.client.runs.get(run.id)
        self.assertEqual(final.status, "cancelled", final)
        self.assertEqual(final.usage["billed_micros"] + final.usage["released_micros"], 40000)
        # The daemon marks a run settled moments after its settled event is out, and answers
        # a cancel in between with 200 (see the report of issue 18): poll, bounded.
        deadline = time.monotonic() + 10
        while True:
            try:
                self.client.runs.cancel(run.id)
            except ephemeral.ConflictError as e:
                self.assertEqual((e.status, e.type), (409, "conflict"))
                break
            self.assertLess(time.monotonic(), deadline, "cancel of a settled run never got 409")
            time.sleep(0.05)

    def test_typed_errors(self):
        bad = {"prompt": "x", "shell": True, "timeout_seconds": 0, "max_cost_micros": 1000}
        with self.assertRaises(ephemeral.InvalidRequestError) as cm:
            self.client.runs.create(bad)
        e = cm.exception
        self.assertEqual((e.status, e.type, e.field), (400, "invalid_request", "timeout_seconds"))
        self.assertIsInstance(e, ephemeral.ApiError)
        with self.assertRaises(ephemeral.InvalidRequestError) as cm:
            self.client.runs.create({"prompt": "x", "timeout_seconds": 5,
                                     "max_cost_micros": 1000, "colour": "red"})
        self.assertEqual(cm.exception.field, "colour")
        with self.assertRaises(ephemeral.InsufficientBalanceError) as cm:
            self.client.runs.create({"prompt": "x", "timeout_seconds": 5,
                                     "max_cost_micros": 5000000})  # above the credit
        self.assertEqual(cm.exception.field, "max_cost_micros")
        with self.assertRaises(ephemeral.NotFoundError):
            self.client.runs.get("run_does_not_exist")
        with self.assertRaises(ephemeral.AuthenticationError) as cm:
            Client(URL, "eph_" + "0" * 48).runs.get("run_x")
        self.assertEqual(cm.exception.status, 401)
        with self.assertRaises(ephemeral.ConnectionError_):
            s = socket.socket()
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
            s.close()  # nothing listens there now
            Client("http://127.0.0.1:%d" % port, KEY, max_retries=1, backoff=0.01).health()

    def test_list_iterates_pages(self):
        for i in range(3):
            self.client.runs.create(request_with("list %d" % i, "short-sleep.jsonl"), wait=60)
        everything = [r.id for r in self.client.runs.list(page_size=1000)]
        paged = [r.id for r in self.client.runs.list(page_size=2)]
        self.assertGreaterEqual(len(everything), 3)
        self.assertEqual(paged, everything)

    def test_python_m_ephemeral_run(self):
        env = dict(os.environ, EPHEMERAL_URL=URL, EPHEMERAL_API_KEY=KEY)
        p = subprocess.run([sys.executable, "-m", "ephemeral", "run", EXAMPLE], env=env,
                           capture_output=True, text=True, timeout=180)
        self.assertEqual(p.returncode, 0, p.stderr + p.stdout)
        lines = p.stdout.splitlines()
        self.assertRegex(lines[0], r"^Run run_\S+ · .+ · \S+$")
        self.assertRegex(p.stdout, r"\n +0\.00  Queued +budget of \$0\.04 reserved\n")
        # the command's output (live output events) under it, then its result
        self.assertRegex(p.stdout, r"\n +[0-9.]+  Shell +\$ pwd; whoami\n {28}/tmp/ephemeral-run-\w+/scratch\n"
                                   r" {28}worker\n {28}-> exit 0")
        self.assertRegex(p.stdout, r"\nSaved output:\n(.*\n)*.*2 3 5 7 11 13")
        self.assertRegex(p.stdout, r"\nSucceeded  run_\S+  \$0\.\d+ of \$0\.04\n")
        self.assertRegex(p.stdout, r"\nModel \$0\.0003\d · Web \$0\.00 · Compute \$0\.\d+\n")
        bad = os.path.join(os.environ.get("TMPDIR", "/tmp"), "bad-%s.json" % uuid.uuid4())
        with open(bad, "w") as f:
            json.dump({"prompt": "x", "timeout_seconds": 0, "max_cost_micros": 1}, f)
        self.addCleanup(os.unlink, bad)
        p = subprocess.run([sys.executable, "-m", "ephemeral", "run", bad], env=env,
                           capture_output=True, text=True, timeout=60)
        self.assertEqual(p.returncode, 2)
        self.assertIn("timeout_seconds", p.stderr)


class TestOffline(unittest.TestCase):
    def test_dollars_as_the_cli_prints_them(self):
        from ephemeral.__main__ import dollars, shown
        self.assertEqual([dollars(m) for m in (40000, 3200, 3530, 330, 0, 1234567)],
                         ["$0.04", "$0.0032", "$0.00353", "$0.00033", "$0.00", "$1.23457"])
        self.assertEqual([dollars(m) for m in (-4, -5)], ["$0.00", "-$0.00001"])
        self.assertEqual(shown("a\x1b[2Jb\x9bc\n"), "a\\x1b[2Jb\\xc2\\x9bc\n")

    def test_cost_line_adds_up_to_the_billed_total(self):
        # 332 + 0 + 13 = 345 billed ("$0.00035"): not "$0.00033 · $0.00 · $0.00001" ($0.00034).
        from ephemeral.__main__ import summary
        text = summary({"id": "run_x", "status": "succeeded", "usage": {
            "reserved_micros": 40000, "billed_micros": 345, "released_micros": 39655,
            "model_micros": 332, "web_micros": 0, "compute_micros": 13}})
        self.assertIn("run_x  $0.00035 of $0.04\n", text)
        self.assertTrue(text.endswith("Model $0.00033 · Web $0.00 · Compute $0.00002"), text)

    def test_summary_output_files(self):
        # A file the run did not leave is "not saved" with the reason, as ephemeral(1) says.
        from ephemeral.__main__ import summary
        text = summary({"id": "run_x", "status": "succeeded", "usage": {}, "output": {"files": [
            {"path": "a.txt", "bytes": 3, "truncated": False},
            {"path": "big.bin", "bytes": 1048576, "truncated": True},
            {"path": "gone.txt", "error": "reading gone.txt: No such file or directory"}]}})
        self.assertIn("output file a.txt: 3 bytes\n", text)
        self.assertIn("output file big.bin: 1048576 bytes (truncated)\n", text)
        self.assertIn("output file gone.txt: not saved: reading gone.txt: No such file or directory",
                      text)

    def test_error_mapping(self):
        e = ephemeral.errors.from_response(400, {"error": {"type": "invalid_request",
                                                           "message": "m", "field": "f"}})
        self.assertIsInstance(e, ephemeral.InvalidRequestError)
        self.assertEqual((e.field, e.message), ("f", "m"))
        e = ephemeral.errors.from_response(503, {"error": {"type": "overloaded", "message": "m",
                                                           "field": None}}, 2.0)
        self.assertIsInstance(e, ephemeral.UnavailableError)
        self.assertEqual((e.type, e.field, e.retry_after), ("overloaded", None, 2.0))
        e = ephemeral.errors.from_response(429, None, 2.0)
        self.assertIsInstance(e, ephemeral.RateLimitError)
        self.assertEqual(e.retry_after, 2.0)


if __name__ == "__main__":
    unittest.main()
