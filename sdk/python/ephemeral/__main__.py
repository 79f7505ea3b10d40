"""python -m ephemeral run [--json] [--idempotency-key KEY] REQUEST.json

Creates a run on $EPHEMERAL_URL with $EPHEMERAL_API_KEY (or --url, --key), prints its
timeline as it happens and the summary, in the format of `ephemeral run`, and exits with
the same codes: 0 succeeded, 1 failed, 3 timed out, 4 budget exhausted, 5 cancelled; 2 for a
refused request, 4 for an insufficient balance.
"""

import argparse
import json
import sys
from typing import Any, Mapping, Optional

from . import Client
from .errors import ApiError, EphemeralError
from .text import shown

_EXIT = {"succeeded": 0, "timed_out": 3, "budget_exhausted": 4, "cancelled": 5}


def dollars(micros: int) -> str:
    """$0.04, $0.0032, $0.00353: 5 decimals rounded half up, trailing zeros down to cents."""
    tens = (abs(micros) + 5) // 10
    sign = "-" if micros < 0 and tens else ""  # -4 micros is $0.00, as the CLI prints it
    text = "%s$%d.%05d" % (sign, tens // 100000, tens % 100000)
    whole, _, frac = text.partition(".")
    while len(frac) > 2 and frac.endswith("0"):
        frac = frac[:-1]
    return whole + "." + frac


def split_dollars(parts):
    """The micros to show for parts of a total (the cost line's model, web and compute) so that
    they add up to the total as dollars() shows it: each rounded down to tens of micros, the
    tens left over one each to the largest remainders, the earlier on a tie. The CLI's rule
    (eph_dollars_split in sdk/support/format.c)."""
    parts = [int(p) for p in parts]
    if any(p < 0 for p in parts):
        return [(p + 5) // 10 * 10 if p >= 0 else -((-p + 5) // 10 * 10) for p in parts]
    shown = [p // 10 * 10 for p in parts]
    left = (sum(parts) + 5) // 10 - sum(shown) // 10
    order = sorted(range(len(parts)), key=lambda i: (-(parts[i] % 10), i))
    for i in order[:left]:
        if parts[i] % 10:
            shown[i] += 10
    return shown


def event_line(e: Mapping[str, Any]) -> str:
    if e.get("kind") in ("output", "model_delta"):  # live output: indented under its command
        text = shown(e.get("text") or "").rstrip("\n")
        return "\n".join(" " * 28 + line for line in text.split("\n"))
    if e.get("kind") == "tool_result":
        return "%6s  %-17s   -> %s" % ("", "", shown(e.get("text")))
    return "%6.2f  %-17s %s" % (float(e.get("t") or 0), shown(e.get("source")),
                                shown(e.get("text")))


def summary(run: Mapping[str, Any]) -> str:
    usage = run.get("usage") or {}
    status = run.get("status") or "?"
    lines = ["", "%s  %s  %s of %s" % (status[:1].upper() + status[1:].replace("_", " "),
                                       run.get("id", ""), dollars(usage.get("billed_micros", 0)),
                                       dollars(usage.get("reserved_micros", 0)))]
    if run.get("error"):
        lines.append("error: %s" % shown(run["error"]))
    output = run.get("output") or {}
    if output.get("answer"):
        lines += ["", "Saved output:", shown(output["answer"])]
    for f in output.get("files") or []:
        path = shown(f.get("path", "?"))
        if f.get("error"):  # not left by the run: not "0 bytes"
            lines.append("output file %s: not saved: %s" % (path, shown(f["error"])))
        else:
            lines.append("output file %s: %d bytes%s" % (path, f.get("bytes", 0),
                                                         " (truncated)" if f.get("truncated") else ""))
    cost = split_dollars([usage.get("model_micros", 0), usage.get("web_micros", 0),
                          usage.get("compute_micros", 0)])
    lines += ["", "Model %s · Web %s · Compute %s" % tuple(dollars(c) for c in cost)]
    return "\n".join(lines)


def cmd_run(args: argparse.Namespace) -> int:
    try:
        with open(args.request, "rb") as f:
            body = f.read()
        json.loads(body)
    except (OSError, ValueError) as e:
        print("ephemeral: %s: %s" % (args.request, e), file=sys.stderr)
        return 2
    client = Client(args.url, args.key)
    try:
        run = client.runs.create(body, idempotency_key=args.idempotency_key)
        if not args.json:
            model = (run.get("request") or {}).get("model") or "default model"
            print("Run %s · %s · %s\n" % (run.id, shown(model), run.get("backend", "?")),
                  flush=True)
            streaming = 0  # the model call whose "streaming" row is printed, as the C CLI does
            for e in client.runs.events(run.id):
                call = (e.get("data") or {}).get("call") if e.get("kind") == "model_delta" else None
                if isinstance(call, int) and call != streaming:
                    streaming = call
                    print(event_line(dict(e, kind="model_stream",
                                          text="model call %d streaming…" % call)), flush=True)
                print(event_line(e), flush=True)
        else:
            for _ in client.runs.events(run.id):
                pass
        final = client.runs.get(run.id)
    except ApiError as e:
        print("ephemeral: %s" % e, file=sys.stderr)
        return 4 if e.type == "insufficient_balance" else (2 if e.status < 500 else 1)
    except EphemeralError as e:
        print("ephemeral: %s" % e, file=sys.stderr)
        return 1
    if args.json:
        print(json.dumps(final, indent=2, ensure_ascii=False))
    else:
        print(summary(final))
    return _EXIT.get(final.get("status"), 1)


def main(argv: Optional[list] = None) -> int:
    p = argparse.ArgumentParser(prog="python -m ephemeral",
                                description="A client of the ephemeral API.")
    p.add_argument("--url", help="the daemon's URL (default $EPHEMERAL_URL)")
    p.add_argument("--key", help="the API key (default $EPHEMERAL_API_KEY)")
    sub = p.add_subparsers(dest="command", required=True)
    r = sub.add_parser("run", help="create a run and follow its timeline")
    r.add_argument("request", help="the request v1 as a JSON file")
    r.add_argument("--json", action="store_true", help="print the run object at the end only")
    r.add_argument("--idempotency-key", help="default: a new UUID")
    args = p.parse_args(argv)
    try:
        return cmd_run(args)
    except ValueError as e:  # no URL
        print("ephemeral: %s" % e, file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
