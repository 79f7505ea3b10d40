#!/usr/bin/env python3
"""bench/client.py URL KEY BODY_FILE: a warm client of one ephemerald for the benchmarks.

Reads a number N per line on stdin, POSTs BODY_FILE to URL/v1/runs?wait=60 N times at once
(one kept-alive connection each, reused from round to round, as an SDK's pool does) and
writes the N status codes on one line when all have answered. A curl process per round
would charge the daemon's row with a client start-up (~10 ms of wall time and ~6.5 ms of
CPU here) that bwrap's row, N sandboxes started by a shell, does not have. Figures only:
nothing here passes or fails on speed. Standard library only."""
import http.client
import sys
import threading
import urllib.parse


def main():
    url, key, body_file = sys.argv[1:4]
    u = urllib.parse.urlsplit(url)
    body = open(body_file, "rb").read()
    headers = {"Authorization": "Bearer " + key, "Content-Type": "application/json"}
    pool = []

    def post(conn, out, i):
        for attempt in (1, 2):  # a kept-alive connection the server closed: once more
            try:
                conn.request("POST", "/v1/runs?wait=60", body=body, headers=headers)
                resp = conn.getresponse()
                resp.read()
                out[i] = str(resp.status)
                return
            except (http.client.HTTPException, OSError) as e:
                conn.close()
                out[i] = "error:" + type(e).__name__
                if attempt == 2:
                    return

    for line in sys.stdin:
        n = int(line)
        while len(pool) < n:
            pool.append(http.client.HTTPConnection(u.hostname, u.port, timeout=120))
        out = [None] * n
        threads = [threading.Thread(target=post, args=(pool[i], out, i)) for i in range(n)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        print(" ".join(out), flush=True)


if __name__ == "__main__":
    main()
