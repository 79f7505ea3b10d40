#!/usr/bin/env python3
"""Checks core/openapi.json against the code and against a live daemon (python3 and Debian's
python3-jsonschema; JSON Schema draft 2020-12, the dialect of OpenAPI 3.1).

  openapi_check.py static SRCDIR
      The route table of core/server*.c and the document name the same routes; a route
      with a key documents 401 and no `security: []`, one without a key `security: []`; a
      route with a body documents 413 and 415; every operation documents 405 with Allow;
      every $ref resolves; every schema is valid JSON Schema; every example request
      (examples/*/request.json) validates against Request; the event kinds the run (core/run.c and its units)
      emits are exactly the typed events of the document and of docs/http-api.md.
  openapi_check.py live URL KEY SRCDIR
      Drives a daemon (started by tests/openapi.test) into every status it can reach and
      validates each answer: the status is documented for the route, the content type
      too, the body against its schema, documented required headers are present, every
      event of a run and of its SSE stream against Event.

Prints one line per check: "ok - what" or "not ok - what: why"; exits 1 if any failed.
"""

import glob
import http.client
import json
import os
import re
import sys
import urllib.parse
import uuid

try:
    import jsonschema
except ImportError:  # pragma: no cover
    print("SKIP: python3-jsonschema is not installed (apt-get install python3-jsonschema)")
    sys.exit(77)

FAILED = []


def report(ok, what, why=""):
    print(("ok - %s" % what) if ok else ("not ok - %s: %s" % (what, why)))
    if not ok:
        FAILED.append(what)


def load_doc(srcdir):
    with open(os.path.join(srcdir, "core", "openapi.json")) as f:
        return json.load(f)


def resolve(doc, node):
    while isinstance(node, dict) and "$ref" in node and len(node) == 1:
        ref = node["$ref"]
        assert ref.startswith("#/"), ref
        node = doc
        for part in ref[2:].split("/"):
            node = node[part]
    return node


def validator(doc, schema):
    # The document's components ride along in the root, so "#/components/..." resolves
    # without a resolver (whose API differs across jsonschema releases).
    root = {"allOf": [schema], "components": doc["components"]}
    return jsonschema.Draft202012Validator(root, format_checker=jsonschema.FormatChecker())


def errors_of(doc, schema, value):
    return ["%s at /%s" % (e.message[:300], "/".join(map(str, e.absolute_path)))
            for e in validator(doc, schema).iter_errors(value)]


def operations(doc):
    for path, item in doc["paths"].items():
        for method, op in item.items():
            if method in ("get", "post", "put", "patch", "delete", "head", "options"):
                yield method.upper(), path, op


# ------------------------------------------------------------------ static

def server_routes(srcdir):
    """(method, path, auth, body) from the `routes[]` table of core/server*.c."""
    routes = []
    for fn in sorted(glob.glob(os.path.join(srcdir, "core", "server*.c"))):
        text = open(fn).read()
        for table in re.findall(r"route_t routes\[\] = \{(.*?)\n\};", text, re.S):
            for m in re.finditer(r'\{"([A-Z]+)", "([^"]+)", (true|false), (true|false),', table):
                routes.append((m.group(1), m.group(2), m.group(3) == "true",
                               m.group(4) == "true"))
    return routes


def emitted_kinds(srcdir):
    """The kinds the run's units emit (eph_run_emit(run, source, "kind", ...) or
    eph_run_emit_full(...)): core/run.c and the units split from it (core/run_int.h lists
    them)."""
    text = "".join(open(f).read() for f in sorted(glob.glob(os.path.join(srcdir, "core", "*.c"))))
    return set(re.findall(r'\beph_run_emit(?:_full)?\([^,]+,[^,]+, "([a-z_]+)",', text))


def typed_kinds(doc):
    kinds = set()
    for member in doc["components"]["schemas"]["Event"]["oneOf"]:
        kind = resolve(doc, member).get("properties", {}).get("kind", {})
        if "const" in kind:
            kinds.add(kind["const"])
    return kinds


def plugin_literals(srcdir):
    text = "".join(open(f).read() for f in glob.glob(os.path.join(srcdir, "plugins", "*", "*.c")))
    return set(re.findall(r'"([a-z_]+)"', text))


def check_static(srcdir):
    doc = load_doc(srcdir)
    report(doc.get("openapi", "").startswith("3.1."), "the document is OpenAPI 3.1",
           doc.get("openapi"))
    lic = doc["info"].get("license") or {}
    report(bool(lic.get("name")), "info.license names the licence")
    servers = doc.get("servers") or []
    report(all(s["url"].startswith("/") for s in servers) and servers,
           "servers are relative to the daemon serving the document", servers)

    routes = server_routes(srcdir)
    report(len(routes) >= 5, "core/server*.c has a route table (%d routes)" % len(routes))
    served = {(m, p) for m, p, _, _ in routes}
    documented = {(m, p) for m, p, _ in operations(doc)}
    report(served == documented, "every served route is documented and vice versa",
           "served only: %s; documented only: %s" % (sorted(served - documented),
                                                     sorted(documented - served)))
    ops = {(m, p): op for m, p, op in operations(doc)}
    ids = [op.get("operationId") for op in ops.values()]
    report(all(ids) and len(set(ids)) == len(ids), "every operation has a unique operationId")
    bad = []
    for m, p, auth, body in routes:
        op = ops.get((m, p))
        if not op:
            continue
        st = op.get("responses", {})
        if auth and (op.get("security") == [] or "401" not in st):
            bad.append("%s %s: a key is required: 401 and the bearer scheme" % (m, p))
        if not auth and op.get("security") != []:
            bad.append("%s %s: no key is needed: security: []" % (m, p))
        if body and not ("413" in st and "415" in st and op.get("requestBody", {}).get("required")):
            bad.append("%s %s: a JSON body: requestBody, 413 and 415" % (m, p))
        r405 = resolve(doc, st.get("405", {}))
        if "Allow" not in (r405.get("headers") or {}):
            bad.append("%s %s: 405 with Allow" % (m, p))
        for name in re.findall(r"\{(\w+)\}", p):
            params = [resolve(doc, x) for x in op.get("parameters", [])]
            if not any(x.get("in") == "path" and x.get("name") == name for x in params):
                bad.append("%s %s: path parameter %s undeclared" % (m, p, name))
        for code, r in st.items():
            r = resolve(doc, r)
            if not r.get("description"):
                bad.append("%s %s %s: no description" % (m, p, code))
            if code not in ("204",) and not r.get("content"):
                bad.append("%s %s %s: no content" % (m, p, code))
    report(not bad, "each route's keys, bodies, 405 and parameters are documented", "; ".join(bad))
    r429 = resolve(doc, ops[("POST", "/v1/runs")]["responses"]["429"])
    report("Retry-After" in (r429.get("headers") or {}), "429 documents Retry-After")

    # $refs resolve; schemas are valid
    refs = re.findall(r'"\$ref": "([^"]+)"', json.dumps(doc))
    broken = []
    for ref in sorted(set(refs)):
        try:
            resolve(doc, {"$ref": ref})
        except (KeyError, AssertionError):
            broken.append(ref)
    report(not broken, "every $ref resolves (%d)" % len(set(refs)), broken)
    invalid = []
    for name, schema in doc["components"]["schemas"].items():
        try:
            jsonschema.Draft202012Validator.check_schema(schema)
        except jsonschema.SchemaError as e:
            invalid.append("%s: %s" % (name, e.message))
    report(not invalid, "every component schema is valid JSON Schema 2020-12", invalid)

    request = {"$ref": "#/components/schemas/Request"}
    examples = sorted(glob.glob(os.path.join(srcdir, "examples", "*", "request.json")))
    report(any(e.endswith("sandbox-proof/request.json") for e in examples),
           "examples/sandbox-proof/request.json exists")
    for ex in examples:
        errs = errors_of(doc, request, json.load(open(ex)))
        report(not errs, "%s validates against Request" % os.path.relpath(ex, srcdir), errs)
    for bad_req, field in [({"prompt": "x", "timeout_seconds": 5}, "max_cost_micros"),
                           ({"prompt": "x", "timeout_seconds": 0, "max_cost_micros": 1}, "timeout_seconds"),
                           ({"prompt": "x", "timeout_seconds": 5, "max_cost_micros": 1, "colour": "red"}, "colour"),
                           ({"prompt": "x", "timeout_seconds": 5, "max_cost_micros": 1, "shell": "yes"}, "shell")]:
        report(bool(errors_of(doc, request, bad_req)),
               "Request refuses what the daemon refuses (%s)" % field)

    kinds, typed = emitted_kinds(srcdir), typed_kinds(doc)
    report(kinds and kinds <= typed, "every event kind the run emits is typed (%d of %d)"
           % (len(kinds), len(typed)), "untyped: %s" % sorted(kinds - typed))
    stale = typed - kinds - plugin_literals(srcdir)
    report(not stale, "every typed kind is emitted by the run or a bundled plugin", stale)
    guide = open(os.path.join(srcdir, "docs", "http-api.md")).read()
    listed = set(re.findall(r"^ *\|[^|]*", guide, re.M))
    listed = {k for cell in listed for k in re.findall(r"`([a-z_]+)`", cell)}
    missing = sorted(typed - listed)
    report(not missing, "docs/http-api.md's event table names every kind", missing)


# ------------------------------------------------------------------ live

class Live:
    def __init__(self, doc, url, key):
        self.doc = doc
        u = urllib.parse.urlsplit(url)
        self.host, self.port = u.hostname, u.port
        self.key = key
        self.seen = set()  # (method, path template, status)

    def call(self, method, template, path=None, body=None, headers=None, key=True,
             ctype="application/json"):
        h = dict(headers or {})
        if key:
            h["Authorization"] = "Bearer " + (key if isinstance(key, str) else self.key)
        if body is not None:
            h.setdefault("Content-Type", ctype)
            if not isinstance(body, (bytes, str)):
                body = json.dumps(body)
        conn = http.client.HTTPConnection(self.host, self.port, timeout=120)
        try:
            conn.request(method, path or template, body=body, headers=h)
            resp = conn.getresponse()
            data = resp.read()
            status, rh = resp.status, resp.headers
        finally:
            conn.close()
        what = "%s %s -> %d" % (method, template, status)
        self.seen.add((method, template, status))
        item = self.doc["paths"].get(template, {})
        op = item.get(method.lower())
        if op is None and status == 405:  # a method the path does not serve: any operation
            op = next((o for k, o in item.items() if k in ("get", "post")), None)
        r = op and op["responses"].get(str(status))
        if not r:
            report(False, what, "status not documented for the route")
            return status, rh, data, None
        r = resolve(self.doc, r)
        why = []
        for name, hdr in (r.get("headers") or {}).items():
            if resolve(self.doc, hdr).get("required") and rh.get(name) is None:
                why.append("header %s missing" % name)
        decoded = None
        content = r.get("content")
        if content:
            ct = (rh.get("Content-Type") or "").split(";")[0].strip()
            media = content.get(ct)
            if media is None:
                why.append("Content-Type %s not documented (%s)" % (ct, sorted(content)))
            elif ct == "application/json":
                decoded = json.loads(data)
                why += errors_of(self.doc, media["schema"], decoded)
        elif data:
            why.append("a body where none is documented")
        report(not why, what, "; ".join(why))
        return status, rh, data, decoded


def sse_events(data):
    out = []
    for block in data.decode().split("\n\n"):
        f = {}
        for line in block.splitlines():
            if line and not line.startswith(":"):
                k, _, v = line.partition(": ")
                f[k] = v
        if "data" in f:
            out.append((f.get("id"), f.get("event"), json.loads(f["data"])))
    return out


def check_live(url, key, srcdir):
    doc = load_doc(srcdir)
    L = Live(doc, url, key)
    event_schema = {"$ref": "#/components/schemas/Event"}
    _, _, _, served = L.call("GET", "/v1/openapi.json", key=False)
    report(served == doc, "the daemon serves core/openapi.json unchanged")
    L.call("GET", "/v1/health", key=False)
    L.call("GET", "/metrics", key=False)
    L.call("GET", "/", key=False)
    L.call("GET", "/playground/{file}", "/playground/app.js", key=False)
    L.call("GET", "/playground/{file}", "/playground/no-such-file.js", key=False)
    L.call("DELETE", "/v1/runs")
    L.call("PUT", "/v1/health", key=False)
    L.call("GET", "/v1/runs", key=False)
    for m, p in (("POST", "/v1/runs"), ("GET", "/v1/runs/{id}"), ("GET", "/v1/runs/{id}/events"),
                 ("POST", "/v1/runs/{id}/cancel")):
        L.call(m, p, p.replace("{id}", "run_" + "0" * 32), key=False)
    L.call("GET", "/v1/runs", key="eph_" + "0" * 48)

    example = json.load(open(os.path.join(srcdir, "examples", "sandbox-proof", "request.json")))
    idem = str(uuid.uuid4())
    _, _, _, run = L.call("POST", "/v1/runs", "/v1/runs?wait=120", example,
                          {"Idempotency-Key": idem})
    rid = run["id"]
    report(run.get("status") == "succeeded" and run["events"][-1]["kind"] == "settled",
           "the product page's request ran to settled", run.get("status"))
    L.call("POST", "/v1/runs", body=example, headers={"Idempotency-Key": idem})
    L.call("POST", "/v1/runs", body=dict(example, prompt="other"), headers={"Idempotency-Key": idem})
    L.call("POST", "/v1/runs", body='{"prompt": "x",')
    L.call("POST", "/v1/runs", body={"prompt": "x", "timeout_seconds": 0, "max_cost_micros": 1})
    L.call("POST", "/v1/runs", "/v1/runs?wait=abc", body=example)
    L.call("POST", "/v1/runs", body=json.dumps(example), ctype="text/plain")
    L.call("POST", "/v1/runs", body=json.dumps(dict(example, prompt="x" * 70000)))
    L.call("POST", "/v1/runs", body=dict(example, max_cost_micros=5000000))
    L.call("GET", "/v1/runs", "/v1/runs?limit=2")
    L.call("GET", "/v1/runs", "/v1/runs?limit=0")
    L.call("GET", "/v1/runs/{id}", "/v1/runs/" + rid)
    L.call("GET", "/v1/runs/{id}", "/v1/runs/run_" + "0" * 32)
    _, _, data, _ = L.call("GET", "/v1/runs/{id}/events", "/v1/runs/%s/events" % rid)
    evs = sse_events(data)
    bad = []
    for sid, name, e in evs:
        if sid != str(e.get("seq")) or name != e.get("kind"):
            bad.append("id/event do not match data: %s %s" % (sid, name))
        bad += errors_of(doc, event_schema, e)
    report(evs and not bad, "every SSE event (%d) validates against Event" % len(evs), bad[:5])
    last = evs[-1][2]["seq"] if evs else 1
    L.call("GET", "/v1/runs/{id}/events", "/v1/runs/%s/events" % rid,
           headers={"Last-Event-ID": str(last)})
    L.call("GET", "/v1/runs/{id}/events", "/v1/runs/%s/events" % rid,
           headers={"Last-Event-ID": "abc"})
    L.call("GET", "/v1/runs/{id}/events", "/v1/runs/run_%s/events" % ("0" * 32))
    L.call("POST", "/v1/runs/{id}/cancel", "/v1/runs/%s/cancel" % rid)
    L.call("POST", "/v1/runs/{id}/cancel", "/v1/runs/run_%s/cancel" % ("0" * 32))

    # A run that sleeps holds the only worker (max_concurrent_runs = 1, no queue): the next
    # POST is 429; then it is cancelled.
    sleepy = {"prompt": "sleep", "model": "replay:" + os.path.join(srcdir, "tests", "transcripts",
                                                                   "sleep.jsonl"),
              "shell": True, "timeout_seconds": 60, "max_cost_micros": 40000}
    _, _, _, s = L.call("POST", "/v1/runs", body=sleepy)
    L.call("POST", "/v1/runs", body=sleepy)
    L.call("POST", "/v1/runs/{id}/cancel", "/v1/runs/%s/cancel" % s["id"])
    _, _, data, _ = L.call("GET", "/v1/runs/{id}/events", "/v1/runs/%s/events" % s["id"])
    bad = [x for _, _, e in sse_events(data) for x in errors_of(doc, event_schema, e)]
    report(not bad, "the cancelled run's events validate", bad[:5])

    # Zero data retention: redacted events, from the store, still validate.
    zdr = {"prompt": "zdr", "model": "replay:" + os.path.join(srcdir, "tests", "transcripts",
                                                              "zdr.jsonl"),
           "shell": True, "timeout_seconds": 60, "max_cost_micros": 40000,
           "zero_data_retention": True}
    L.call("POST", "/v1/runs", "/v1/runs?wait=120", body=zdr)

    # Webhooks (the daemon allows loopback targets): registered and deleted after the last
    # run, so nothing is delivered to the unserved address.
    _, _, _, wh = L.call("POST", "/v1/webhooks", body={"url": "http://127.0.0.1/hook"})
    L.call("POST", "/v1/webhooks", body={"url": "http://10.0.0.1/hook"})
    L.call("POST", "/v1/webhooks", body='{"url": 1')
    L.call("POST", "/v1/webhooks", body=json.dumps({"url": "http://127.0.0.1/"}), ctype="text/plain")
    L.call("POST", "/v1/webhooks", body=json.dumps({"url": "x" * 70000}))
    L.call("POST", "/v1/webhooks", body={"url": "http://127.0.0.1/"}, key=False)
    L.call("GET", "/v1/webhooks")
    L.call("GET", "/v1/webhooks", key=False)
    L.call("GET", "/v1/webhooks/deliveries")
    L.call("GET", "/v1/webhooks/secret")
    L.call("GET", "/v1/webhooks/secret", key=False)
    L.call("GET", "/v1/webhooks/deliveries", "/v1/webhooks/deliveries?limit=0")
    L.call("GET", "/v1/webhooks/deliveries", key=False)
    L.call("DELETE", "/v1/webhooks/{id}", "/v1/webhooks/" + (wh or {}).get("id", "wh_none"))
    L.call("DELETE", "/v1/webhooks/{id}", "/v1/webhooks/wh_0000000000000000")
    L.call("DELETE", "/v1/webhooks/{id}", "/v1/webhooks/wh_0000000000000000", key=False)

    # The admin API: the plain key gets 403 everywhere; the admin key (EPH_ADMIN_KEY, made
    # by `ephemeral keys create --admin`) provokes the rest.
    adm = os.environ.get("EPH_ADMIN_KEY", "")
    admin_calls = (("POST", "/v1/admin/keys", None), ("GET", "/v1/admin/keys", "/v1/admin/keys?org=openapi"),
                   ("POST", "/v1/admin/keys/{id}/revoke", "/v1/admin/keys/key_0/revoke"),
                   ("POST", "/v1/admin/orgs/{id}/credit", "/v1/admin/orgs/openapi/credit"),
                   ("GET", "/v1/admin/orgs/{id}/balance", "/v1/admin/orgs/openapi/balance"),
                   ("GET", "/v1/admin/orgs/{id}/usage", "/v1/admin/orgs/openapi/usage"),
                   ("GET", "/v1/admin/audit", None))
    for m, t, path in admin_calls:
        body = {"org": "openapi", "name": "n", "amount_micros": 1} if m == "POST" else None
        L.call(m, t, path, body=body)
        L.call(m, t, path, body=body, key=False)
    _, _, _, k = L.call("POST", "/v1/admin/keys", body={"org": "openapi", "name": "made"}, key=adm)
    L.call("POST", "/v1/admin/keys", body={"org": "openapi", "name": "made"}, key=adm)
    L.call("POST", "/v1/admin/keys", body={"org": "a/b", "name": "x"}, key=adm)
    L.call("POST", "/v1/admin/keys", body=json.dumps({"org": "o"}), ctype="text/plain", key=adm)
    L.call("POST", "/v1/admin/keys", body=json.dumps({"org": "x" * 70000}), key=adm)
    L.call("GET", "/v1/admin/keys", "/v1/admin/keys?org=openapi", key=adm)
    L.call("GET", "/v1/admin/keys", key=adm)
    L.call("POST", "/v1/admin/keys/{id}/revoke", "/v1/admin/keys/%s/revoke" % (k or {}).get("id", "key_0"), key=adm)
    L.call("POST", "/v1/admin/keys/{id}/revoke", "/v1/admin/keys/key_0/revoke", key=adm)
    L.call("POST", "/v1/admin/orgs/{id}/credit", "/v1/admin/orgs/openapi/credit", body={"amount_micros": 5}, key=adm)
    L.call("POST", "/v1/admin/orgs/{id}/credit", "/v1/admin/orgs/openapi/credit", body={"amount_micros": 0}, key=adm)
    L.call("POST", "/v1/admin/orgs/{id}/credit", "/v1/admin/orgs/openapi/credit", body="{}", ctype="text/plain", key=adm)
    L.call("POST", "/v1/admin/orgs/{id}/credit", "/v1/admin/orgs/openapi/credit", body=json.dumps({"amount_micros": "x" * 70000}), key=adm)
    L.call("GET", "/v1/admin/orgs/{id}/balance", "/v1/admin/orgs/openapi/balance", key=adm)
    L.call("GET", "/v1/admin/orgs/{id}/balance", "/v1/admin/orgs/a~b/balance", key=adm)
    L.call("GET", "/v1/admin/orgs/{id}/usage", "/v1/admin/orgs/openapi/usage", key=adm)
    L.call("GET", "/v1/admin/orgs/{id}/usage", "/v1/admin/orgs/openapi/usage?from_us=x", key=adm)
    L.call("GET", "/v1/admin/audit", key=adm)
    L.call("GET", "/v1/admin/audit", "/v1/admin/audit?limit=0", key=adm)

    statuses = {(m, p): set() for m, p, _ in operations(doc)}
    for m, p, s_ in L.seen:
        statuses.setdefault((m, p), set()).add(str(s_))
    # What the test cannot provoke on a healthy daemon: a failing store (500), a draining
    # daemon (503: tests/daemon-drain.test), a missing playground (404). Anything else
    # documented must have been seen.
    unreachable = {"500", "503"}
    missed = []
    for m, p, op in operations(doc):
        for code in op["responses"]:
            if code in unreachable or (p in ("/", "/v1/openapi.json") and code == "404"):
                continue
            if code == "405" and m != "GET" and p != "/v1/runs":
                continue  # 405 is a property of the path: seen on /v1/runs and /v1/health
            if code not in statuses.get((m, p), set()) and code != "405":
                missed.append("%s %s %s" % (m, p, code))
    report(not missed, "every documented status was provoked and validated", missed)


def main():
    if len(sys.argv) >= 3 and sys.argv[1] == "static":
        check_static(sys.argv[2])
    elif len(sys.argv) >= 5 and sys.argv[1] == "live":
        check_live(sys.argv[2], sys.argv[3], sys.argv[4])
    else:
        print(__doc__, file=sys.stderr)
        return 2
    return 1 if FAILED else 0


if __name__ == "__main__":
    sys.exit(main())
