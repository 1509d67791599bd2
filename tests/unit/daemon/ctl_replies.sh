#!/usr/bin/env bash
# gradlanectl against a fake admin socket that answers malformed replies: members missing or of
# the wrong type must give an error line (exit 1) or a printout with "-" (exit 0), never an
# abort. Before the replies were read through typed accessors, nlohmann's value()/get<>() threw
# type_error (or a const operator[] asserted) and gradlanectl died with SIGABRT (exit 134).
# Usage: ctl_replies.sh PATH/TO/gradlanectl
set -u
CTL=$(realpath "$1")
DIR=$(mktemp -d /tmp/gl-ctl-replies-XXXXXX)
SERVER=""
cleanup() { [[ -n $SERVER ]] && kill "$SERVER" 2>/dev/null; rm -rf "$DIR"; }
trap cleanup EXIT
fail() { echo "FAIL: $*"; exit 1; }

# One Python process serves the replies in order, one per connection.
cat >"$DIR/replies" <<'REPLIES'
{"ok":"yes"}
{"ok":false,"error":5}
{"ok":false}
{"ok":null}
[1,2]
{"ok":true,"jobs":5}
{"ok":true,"jobs":[5,"x",{"job":3,"rank":[1],"bytes":"many"}]}
{"ok":true,"peers":{"a":1}}
{"ok":true}
{"ok":true,"jobs":[{"classes":7}],"queueing_delay":"no"}
{"ok":true,"jobs":null,"segment_latency":[null]}
{"ok":true,"version":[1],"pid":{"x":1},"client_connections_refused":[1],"tracing":7}
{"ok":true,"backend":"verbs","backend_info":[1],"backend_counters":[5,{"name":3,"value":"x"},{"name":"verbs_eager_sends","value":"many"}]}
{"ok":true,"backend":7,"backend_info":{"device":[2]},"backend_counters":{"a":1}}
{"ok":true,"backend":"verbs","backend_counters":[7,{"name":null,"help":[1]}]}
{"ok":true,"trace":{"traceEvents":3,"otherData":5}}
{"ok":true,"trace":{"otherData":{"first_iteration":"1","iterations":[2],"spans_dropped":"lots"}}}
{"ok":true,"trace":[]}
REPLIES
python3 - "$DIR/admin.sock" "$DIR/replies" <<'PY' &
import socket, sys
path, replies = sys.argv[1], open(sys.argv[2]).read().splitlines()
s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
s.bind(path)
s.listen(4)
for r in replies:
    c, _ = s.accept()
    c.recv(4096)
    c.sendall(r.encode() + b"\n")
    c.close()
PY
SERVER=$!
for _ in $(seq 1 200); do [[ -S $DIR/admin.sock ]] && break; sleep 0.02; done
[[ -S $DIR/admin.sock ]] || fail "fake admin socket did not come up"

ask() {  # expected_rc command...
  local want=$1; shift
  local out rc
  out=$(cd "$DIR" && "$CTL" --socket="$DIR/admin.sock" --timeout=5 "$@" 2>&1)
  rc=$?
  ((rc < 128)) || fail "gradlanectl $* crashed (exit $rc): $out"
  [[ $rc == "$want" ]] || fail "gradlanectl $*: exit $rc, want $want: $out"
  echo "ok: gradlanectl $* → exit $rc: $(head -c 120 <<<"$out" | tr '\n' ' ')"
}
ask 1 status     # "ok" a string
ask 1 status     # error not a string
ask 1 status     # error without a reason
ask 1 status     # "ok" null
ask 1 status     # not an object
ask 0 jobs       # jobs a number
ask 0 jobs       # jobs of the wrong shapes
ask 0 peers      # peers an object
ask 0 jobs       # jobs missing
ask 0 queues     # classes and queueing_delay of the wrong type
ask 0 bandwidth  # jobs null, a null latency row
ask 0 status     # status members of the wrong types
ask 0 status     # a verbs backend whose info and counters are of the wrong shapes
ask 0 status     # backend not a string, counters an object
ask 0 counters   # backend counter rows of the wrong shapes
ask 0 trace j    # traceEvents and otherData of the wrong type
ask 0 trace j    # otherData members of the wrong type
ask 1 trace j    # trace not an object
echo "PASS"
