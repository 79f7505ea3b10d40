# tests/deb.test, inside its private copy of the machine: the microVM backend
# (ephemeral-backend-qemu) under the unit's privileges. Sourced by deb.test's stage 3 (its
# functions and variables: ck, skip, diag, as_unit, daemon_start/stop, post, field, url, key,
# user, uid, t, work), after the jail runs; three checks.
# ---- the microVM backend (ephemeral-backend-qemu) under the unit: its guest image built
# as an operator builds it (the installed script, into the daemon's state directory; the
# kernel and busybox packages: those the microVM tests downloaded, copied by stage 1, else
# from the network), then the daemon's default backend switched to it.
cache=$work/guest-image-cache
img=/var/lib/ephemeral
qemu_ok=
if dpkg-query -W -f='${Status}' ephemeral-backend-qemu 2>/dev/null | grep -q installed &&
  command -v qemu-system-x86_64 >/dev/null; then
  mkdir -p "$img/guest-image-cache"
  [ -d "$cache" ] && cp "$cache"/*.deb "$img/guest-image-cache/" 2>/dev/null
  if sh /usr/share/ephemeral/build-image.sh --state-dir "$img" /usr/libexec/ephemeral/ephemeral-guest \
    >"$work/image.log" 2>&1; then
    chown -R "$user:$group" "$img/guest-image" "$img/guest-image-cache"
    qemu_ok=1
  else
    qemu_why="the guest image cannot be built here: $(tail -n1 "$work/image.log")"
  fi
else
  qemu_why="ephemeral-backend-qemu or qemu-system-x86_64 not installed"
fi
if [ -n "$qemu_ok" ]; then
  # QEMU's ids from a range of the test's own, as the jail's (the host's tests use the default).
  sed -i 's/^backend = .*/backend = "backend-qemu";/' /etc/ephemeral/ephemeral.conf
  sed -i -e 's/^  uid_base = .*/  uid_base = 2100000000;/' -e 's/^  slots = .*/  slots = 16;/' \
    /etc/ephemeral/conf.d/11-backend-qemu.conf
  daemon_start || diag "the daemon did not start: $(tail -n 5 "$work/daemon.log")"
  post "$t/request.json" "$work/vm.json"
  [ "$(python3 -c 'import json,sys; r=json.load(open(sys.argv[1])); print(r["status"], [e["data"]["backend"] for e in r["events"] if e["kind"]=="sandbox_ready"])' "$work/vm.json" 2>/dev/null)" = "succeeded ['backend-qemu']" ]
  ck "under the unit's privileges the example runs in a microVM (backend-qemu, TCG)" ||
    { head -c 2000 "$work/vm.json" | sed 's/^/# /'; tail -n 20 "$work/daemon.log" | sed 's/^/# /'; }
  : >"$work/upstream.log"
  post "$t/tools.json" "$work/tools.post"
  run3=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["id"])' "$work/tools.post" 2>/dev/null)
  curl -sS "$url/v1/runs/$run3" -H "Authorization: Bearer $key" >"$work/tools.out"
  [ "$(field "r['status'], [e['data']['backend'] for e in r['events'] if e['kind']=='sandbox_ready']")" = "succeeded ['backend-qemu']" ] &&
    [ "$(field "[e['text'] for e in r['events'] if e['kind']=='egress' and e['data']['allowed']]")" = "['GET http://127.0.0.1:$port/web/page.txt']" ] &&
    field "[e['data']['result'] for e in r['events'] if e['kind']=='tool_result' and e['data']['tool']=='shell']" | grep -q "worker.*upstream-ok-5d2a" &&
    grep -qx '/web/page.txt -' "$work/upstream.log" && grep -qxF "/api/whoami Bearer $secret" "$work/upstream.log"
  ck "and a microVM run granted web and a connection reaches the upstream through the proxy and the broker" ||
    { diag "status $(field "r['status']")"; field "'\n'.join(e['kind'] + ': ' + e['text'] for e in r['events'])" | sed 's/^/# /';
      field "[e['data'] for e in r['events'] if e['kind'] in ('tool_result', 'sandbox_ready')]" | sed 's/^/# /';
      sed 's/^/# upstream: /' "$work/upstream.log"; tail -n 20 "$work/daemon.log" | sed 's/^/# /'; }
  # A guest that escapes into QEMU holds QEMU's ids. Under the unit they are the microVM's
  # own (QEMU used to run as the unit's user whenever the daemon was not root: the state
  # directory, the secrets of the unit's group and the daemon itself were in its reach).
  printf '%s\n' '{"id": "chatcmpl-h1", "object": "chat.completion", "created": 1759849323, "model": "gpt-6-luna", "choices": [{"index": 0, "finish_reason": "tool_calls", "message": {"role": "assistant", "content": null, "tool_calls": [{"id": "call_h1", "type": "function", "function": {"name": "shell", "arguments": "{\"command\": \"sleep 300\"}"}}]}}], "usage": {"prompt_tokens": 500, "completion_tokens": 40, "total_tokens": 540}}' >"$t/hold.jsonl"
  printf '{"prompt":"hold","model":"replay:%s","shell":true,"timeout_seconds":600,"max_cost_micros":40000}\n' \
    "$t/hold.jsonl" >"$t/hold.json"
  curl -sS -X POST "$url/v1/runs" -H "Authorization: Bearer $key" -H "Content-Type: application/json" \
    -H "Idempotency-Key: $(cat /proc/sys/kernel/random/uuid)" -d @"$t/hold.json" >"$work/hold.post" 2>&1
  hold=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["id"])' "$work/hold.post" 2>/dev/null)
  qs=
  for _ in $(seq 1200); do # until the run's command runs (its microVM is up), at most 2 min
    curl -sS "$url/v1/runs/$hold" -H "Authorization: Bearer $key" 2>/dev/null | grep -q '"tool_call"' &&
      qs=$(for k in $(pgrep -P "$daemon_pid"); do pgrep -x -P "$k" qemu-system-x86; done) && [ -n "$qs" ] && break
    sleep 0.1
  done
  # Every QEMU of the daemon (the run's, and one its pool started ahead): its own uid, no
  # capability, non-dumpable; then the run's attacker, with the ids of one of them.
  seen= bad=
  for q in $qs; do
    qu=$(awk '/^Uid:/ { print $2 }' "/proc/$q/status")
    case " $uid $seen " in *" $qu "*) bad="$bad $q:uid$qu" ;; esac
    [ "$qu" -ge 2100000000 ] && [ "$qu" -lt 2100000016 ] || bad="$bad $q:range$qu"
    seen="$seen $qu"
    [ "$(stat -c %u "/proc/$q/environ")" = 0 ] || bad="$bad $q:dumpable"
    grep -Eq '^CapEff:\s+0+$' "/proc/$q/status" || bad="$bad $q:caps"
  done
  q=${qs%%[[:space:]]*}
  as_q() { setpriv --reuid="$(awk '/^Uid:/ { print $2 }' "/proc/$q/status")" \
    --regid="$(awk '/^Gid:/ { print $2 }' "/proc/$q/status")" --clear-groups "$@"; }
  [ -n "$qs" ] && [ -z "$bad" ] && ! as_q cat /var/lib/ephemeral/ledger.sqlite >/dev/null 2>&1 &&
    ! as_q ls /var/lib/ephemeral >/dev/null 2>&1 && ! as_q cat /etc/ephemeral/secrets/up-token >/dev/null 2>&1 &&
    ! as_q kill -0 "$daemon_pid" 2>/dev/null
  ck "under the unit each microVM's QEMU has its own uid (${seen# }; the unit's $uid, the range 2100000000+16), non-dumpable, no capability: from its ids the ledger, the state directory, the unit group's secrets and the daemon are out of reach" ||
    { diag "QEMUs: ${qs:-none} ${bad}"; head -c 600 "$work/hold.post" | sed 's/^/# /'; echo;
      tail -n 10 "$work/daemon.log" | sed 's/^/# /'; }
  curl -sS -X POST "$url/v1/runs/$hold/cancel" -H "Authorization: Bearer $key" >/dev/null 2>&1
  daemon_stop
  sed -i 's/^backend = .*/backend = "backend-jail";/' /etc/ephemeral/ephemeral.conf
else
  skip "$qemu_why" "under the unit's privileges the example runs in a microVM"
  skip "$qemu_why" "and a microVM run granted web and a connection reaches the upstream"
  skip "$qemu_why" "under the unit each microVM's QEMU has its own uid, non-dumpable"
fi
