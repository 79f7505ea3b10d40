"""The ephemeral API client (standard library only).

    from ephemeral import Client
    client = Client("http://127.0.0.1:8080", api_key)
    run = client.runs.create(json.load(open("request.json")), wait=120)
    for event in client.runs.events(run.id):
        print(event.t, event.source, event.text)

Retries: a request that got no answer (connection refused or dropped, timeout) and a 429 or
503 answer are retried up to `max_retries` times, waiting Retry-After when the API sends it,
else an exponential back-off. POST /v1/runs is retried only because it carries an
Idempotency-Key, generated once per create() and sent unchanged on every retry, so a
retry after a lost answer returns the run the first attempt created (never a second run or
a second reservation). Cancel is not retried after a lost answer (a second cancel of the now
ended run would be a 409): call get() to learn the outcome.
"""

import http.client
import json
import os
import time
import urllib.parse
import uuid
from typing import Any, Dict, Iterator, Mapping, Optional, Tuple, Union

from .errors import ConnectionError_, from_response

__all__ = ["Client", "Run", "Event"]

_NO_ANSWER = (OSError, http.client.HTTPException)
_RETRY_AFTER_MAX = 60.0


class _Record(dict):
    """A JSON object of the API with its keys readable as attributes too (run.id)."""

    def __getattr__(self, name: str) -> Any:
        try:
            return self[name]
        except KeyError:
            raise AttributeError(name) from None


class Event(_Record):
    """One timeline event: seq (int, from 1), t (seconds since the run was queued), source,
    kind (see docs/http-api.md, "Event stream for clients"), text, data (object or absent)."""


class Run(_Record):
    """A run object: id, status, reason, created_at, request, usage (micro-dollars), output,
    events (when asked for). `http_status` is 201 for a run this call created, 200 for one an
    earlier request with the same Idempotency-Key created."""

    http_status: int = 200

    @property
    def ended(self) -> bool:
        return self.get("status") not in ("queued", "running")

    @property
    def settled(self) -> bool:
        events = self.get("events") or []
        return bool(events) and events[-1].get("kind") == "settled"


def _retry_after(value: Optional[str]) -> Optional[float]:
    if value is None:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        return None  # an HTTP date: fall back on the back-off


class Client:
    """A client of one ephemerald.

    url: the daemon's base URL (default $EPHEMERAL_URL); api_key: an organisation member's
    key (default $EPHEMERAL_API_KEY); timeout: seconds per HTTP exchange (a ?wait adds its
    own seconds); max_retries: further attempts after a lost answer or a 429/503;
    backoff: the first back-off in seconds, doubled per attempt.
    """

    def __init__(self, url: Optional[str] = None, api_key: Optional[str] = None, *,
                 timeout: float = 60.0, max_retries: int = 3, backoff: float = 0.25):
        url = url or os.environ.get("EPHEMERAL_URL")
        if not url:
            raise ValueError("no URL: pass url= or set EPHEMERAL_URL")
        parts = urllib.parse.urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError("url %r: expected http://HOST:PORT or https://HOST" % url)
        self.url = url.rstrip("/")
        self._https = parts.scheme == "https"
        self._host = parts.hostname
        self._port = parts.port
        self._prefix = parts.path.rstrip("/")
        self.api_key = api_key if api_key is not None else os.environ.get("EPHEMERAL_API_KEY")
        self.timeout = timeout
        self.max_retries = max_retries
        self.backoff = backoff
        self.runs = Runs(self)

    # -- transport
    def _connection(self, timeout: float) -> http.client.HTTPConnection:
        cls = http.client.HTTPSConnection if self._https else http.client.HTTPConnection
        return cls(self._host, self._port, timeout=timeout)

    def _headers(self, extra: Optional[Mapping[str, str]] = None) -> Dict[str, str]:
        h = {"Accept": "application/json", "User-Agent": "ephemeral-python"}
        if self.api_key:
            h["Authorization"] = "Bearer " + self.api_key
        if extra:
            h.update(extra)
        return h

    def _path(self, path: str, query: Optional[Mapping[str, Any]] = None) -> str:
        q = {k: v for k, v in (query or {}).items() if v is not None}
        return self._prefix + path + ("?" + urllib.parse.urlencode(q) if q else "")

    def _once(self, method: str, target: str, body: Optional[bytes], headers: Dict[str, str],
              timeout: float) -> Tuple[int, http.client.HTTPMessage, bytes]:
        conn = self._connection(timeout)
        try:
            conn.request(method, target, body=body, headers=headers)
            resp = conn.getresponse()
            return resp.status, resp.headers, resp.read()
        finally:
            conn.close()

    def request(self, method: str, path: str, *, query: Optional[Mapping[str, Any]] = None,
                body: Optional[bytes] = None, headers: Optional[Mapping[str, str]] = None,
                timeout: Optional[float] = None, retry: bool = True) -> Tuple[int, Any]:
        """One API call: (HTTP status, decoded JSON body). Raises the typed ApiError of an
        error answer, ConnectionError_ when no answer came (after the retries)."""
        h = self._headers(headers)
        if body is not None:
            h["Content-Type"] = "application/json"
        target = self._path(path, query)
        attempt = 0
        while True:
            try:
                status, rh, data = self._once(method, target, body, h, timeout or self.timeout)
            except _NO_ANSWER as e:
                if not retry or attempt >= self.max_retries:
                    raise ConnectionError_("%s %s: no answer from %s: %s"
                                           % (method, path, self.url, e)) from e
                time.sleep(self.backoff * (2 ** attempt))
                attempt += 1
                continue
            ra = _retry_after(rh.get("Retry-After"))
            if status in (429, 503) and retry and attempt < self.max_retries:
                time.sleep(min(ra if ra is not None else self.backoff * (2 ** attempt),
                               _RETRY_AFTER_MAX))
                attempt += 1
                continue
            try:
                decoded = json.loads(data) if data else None
            except ValueError:
                decoded = None
            if status >= 400:
                raise from_response(status, decoded, ra)
            return status, decoded

    def health(self) -> Dict[str, Any]:
        """GET /v1/health (no key needed): {"status", "version", "queued", "running"}."""
        return self.request("GET", "/v1/health", retry=False)[1]


class Runs:
    """client.runs: create, get, list, cancel, events."""

    def __init__(self, client: Client):
        self._c = client

    def create(self, request: Union[Mapping[str, Any], str, bytes], *,
               idempotency_key: Optional[str] = None, wait: Optional[int] = None) -> Run:
        """POST /v1/runs. request: the request v1 (a mapping, or its JSON text). wait:
        seconds to hold the answer until the run ends (the API's ?wait=). The same
        Idempotency-Key (idempotency_key, or a UUID generated here) goes with every retry."""
        if isinstance(request, Mapping):
            body = json.dumps(request).encode()
        elif isinstance(request, str):
            body = request.encode()
        else:
            body = bytes(request)
        key = idempotency_key or str(uuid.uuid4())
        status, obj = self._c.request("POST", "/v1/runs", query={"wait": wait}, body=body,
                                      headers={"Idempotency-Key": key},
                                      timeout=self._c.timeout + (wait or 0))
        run = Run(obj)
        run.http_status = status
        run.idempotency_key = key
        return run

    def get(self, run_id: str) -> Run:
        """GET /v1/runs/{id}: the run with its events."""
        return Run(self._c.request("GET", "/v1/runs/" + urllib.parse.quote(run_id, safe=""))[1])

    def list(self, *, page_size: Optional[int] = None) -> Iterator[Run]:
        """GET /v1/runs, newest first, following next_cursor through every page."""
        cursor = None
        while True:
            _, page = self._c.request("GET", "/v1/runs",
                                      query={"limit": page_size, "cursor": cursor})
            for r in page.get("data") or []:
                yield Run(r)
            cursor = page.get("next_cursor")
            if not cursor:
                return

    def cancel(self, run_id: str) -> Run:
        """POST /v1/runs/{id}/cancel: the run, now ending as cancelled. ConflictError when it
        had already ended. Not retried after a lost answer (see the module's doc)."""
        path = "/v1/runs/%s/cancel" % urllib.parse.quote(run_id, safe="")
        return Run(self._c.request("POST", path, retry=False)[1])

    def events(self, run_id: str, *, last_event_id: Optional[int] = None,
               reconnect_delay: Optional[float] = None) -> Iterator[Event]:
        """GET /v1/runs/{id}/events as a generator of Events, from after last_event_id.

        Like an EventSource: when the stream drops it reconnects with Last-Event-ID (after
        reconnect_delay seconds, default the server's `retry:`), so no event is lost or
        repeated; it ends after the `settled` event or when a reconnect gets 204. Gives up
        with ConnectionError_ after max_retries reconnects in a row that brought nothing."""
        c = self._c
        target = c._path("/v1/runs/%s/events" % urllib.parse.quote(run_id, safe=""))
        last = last_event_id
        delay = 2.0
        fruitless = 0
        while True:
            headers = c._headers({"Accept": "text/event-stream"})
            if last is not None:
                headers["Last-Event-ID"] = str(last)
            # Keep-alive comments come every 15 s: a longer silence is a dead connection.
            conn = c._connection(max(c.timeout, 30.0))
            got = False
            try:
                try:
                    conn.request("GET", target, headers=headers)
                    resp = conn.getresponse()
                except _NO_ANSWER as e:
                    err: Exception = e
                else:
                    if resp.status == 204:
                        return
                    if resp.status != 200:
                        data = resp.read()
                        try:
                            decoded = json.loads(data) if data else None
                        except ValueError:
                            decoded = None
                        raise from_response(resp.status, decoded,
                                            _retry_after(resp.headers.get("Retry-After")))
                    err = ConnectionError_("the stream ended before the run settled")
                    try:
                        for field, value in _sse_blocks(resp):
                            if field == "retry":
                                delay = value / 1000.0
                                continue
                            event = Event(value)
                            last = event.get("seq", last)
                            got = True
                            yield event
                            if event.get("kind") == "settled":
                                return
                    except _NO_ANSWER as e:
                        err = e
            finally:
                conn.close()
            fruitless = 0 if got else fruitless + 1
            if fruitless > c.max_retries:
                raise ConnectionError_("events of %s: %s" % (run_id, err)) from err
            time.sleep(delay if reconnect_delay is None else reconnect_delay)


def _sse_blocks(resp: http.client.HTTPResponse) -> Iterator[Tuple[str, Any]]:
    """Parses text/event-stream: yields ("retry", ms) and ("event", decoded data object)."""
    data = []
    while True:
        raw = resp.readline()
        if not raw:
            return
        line = raw.decode("utf-8").rstrip("\r\n")
        if line == "":
            if data:
                yield "event", json.loads("\n".join(data))
            data = []
            continue
        if line.startswith(":"):
            continue
        name, _, value = line.partition(":")
        if value.startswith(" "):
            value = value[1:]
        if name == "data":
            data.append(value)
        elif name == "retry" and value.isdigit():
            yield "retry", int(value)
