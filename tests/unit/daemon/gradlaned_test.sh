#!/usr/bin/env bash
# gradlaned as a process: the ready line, --flagfile, errors on stderr with exit code 1,
# SIGTERM/SIGINT exit 0 with the socket removed. Usage: gradlaned_test.sh PATH/TO/gradlaned
set -u
BIN=$1
DIR=$(mktemp -d /tmp/gradlaned-test-XXXXXX)
PIDS=()
cleanup() { for p in "${PIDS[@]}"; do kill -9 "$p" 2>/dev/null; done; rm -rf "$DIR"; }
trap cleanup EXIT
fail() { echo "FAIL: $*"; exit 1; }

# Starts a daemon in the background (pid in $PID); waits for its ready line (or its exit).
# The bound only ends a daemon that hangs at start-up; a busy machine never reaches it.
start() {  # name args...
  local name=$1; shift
  "$BIN" "$@" >"$DIR/$name.out" 2>"$DIR/$name.err" &
  PID=$!
  local pid=$PID
  PIDS+=("$pid")
  for _ in $(seq 1 3000); do
    grep -q '^gradlaned ready ' "$DIR/$name.out" 2>/dev/null && break
    kill -0 "$pid" 2>/dev/null || break
    sleep 0.02
  done
}

# 1. Ready line with the real port; the socket exists.
start a --socket="$DIR/a.sock" --listen=127.0.0.1:0; P1=$PID
LINE=$(head -n1 "$DIR/a.out")
[[ "$LINE" =~ ^gradlaned\ ready\ socket=$DIR/a.sock\ listen=127\.0\.0\.1:([0-9]+)$ ]] ||
  fail "ready line: '$LINE'"
PORT=${BASH_REMATCH[1]}
[[ "$PORT" != 0 ]] || fail "port 0 reported"
[[ $(wc -l <"$DIR/a.out") == 1 ]] || fail "more than one line on stdout"
[[ -S "$DIR/a.sock" ]] || fail "socket missing"

# 2. A busy peer port: exit 1, one line on stderr, nothing on stdout, no socket left behind.
"$BIN" --socket="$DIR/b.sock" --listen=127.0.0.1:"$PORT" >"$DIR/b.out" 2>"$DIR/b.err"
RC=$?
[[ $RC == 1 ]] || fail "busy port: exit $RC"
[[ $(wc -l <"$DIR/b.err") == 1 ]] || fail "busy port: stderr '$(cat "$DIR/b.err")'"
grep -q 'in use' "$DIR/b.err" || fail "busy port message: $(cat "$DIR/b.err")"
[[ ! -s "$DIR/b.out" ]] || fail "busy port printed on stdout"
[[ ! -e "$DIR/b.sock" ]] || fail "busy port left its socket"

# 2b. A second daemon on the same client socket (its own peer port and admin socket): refused
#     before it touches anything, naming the pid that serves it; the first keeps its socket.
"$BIN" --socket="$DIR/a.sock" --listen=127.0.0.1:0 --admin_socket="$DIR/other.admin.sock" \
  >"$DIR/e.out" 2>"$DIR/e.err"
RC=$?
[[ $RC == 1 ]] || fail "second daemon on a live socket: exit $RC"
grep -q "served by gradlaned pid $P1" "$DIR/e.err" || fail "second daemon: $(cat "$DIR/e.err")"
[[ -S "$DIR/a.sock" ]] || fail "the second daemon removed the first one's socket"
kill -0 "$P1" || fail "the first daemon died"
# The same with the first daemon's peer port too (it used to fail there after unlinking S).
"$BIN" --socket="$DIR/a.sock" --listen=127.0.0.1:"$PORT" >/dev/null 2>"$DIR/e.err"
[[ $? == 1 && -S "$DIR/a.sock" ]] || fail "second daemon, same port: $(cat "$DIR/e.err")"
grep -q "served by gradlaned pid $P1" "$DIR/e.err" || fail "second daemon, same port: $(cat "$DIR/e.err")"

# 3. Bad flag values and unknown flags: exit 1.
for args in "--reduce=max" "--listen=nonsense" "--default_policy=nope" "--peer_timeout=-1s" \
            "--bogus_flag" "--allowed_uids=abc"; do
  "$BIN" --socket="$DIR/c.sock" $args >/dev/null 2>"$DIR/c.err"
  RC=$?
  [[ $RC == 1 ]] || fail "$args: exit $RC"
  [[ -s "$DIR/c.err" ]] || fail "$args: nothing on stderr"
done

# 4. --flagfile.
cat >"$DIR/flags" <<EOT
--socket=$DIR/d.sock
--listen=127.0.0.1:0
--default_policy=prophet
--reduce=mean
--peer_timeout=3s
EOT
start d --flagfile="$DIR/flags"; P2=$PID
grep -q "^gradlaned ready socket=$DIR/d.sock listen=127.0.0.1:" "$DIR/d.out" ||
  fail "flagfile: '$(cat "$DIR/d.out" "$DIR/d.err")'"

# 5. SIGTERM and SIGINT: exit 0, socket removed.
kill -TERM "$P1"; wait "$P1"; RC=$?
[[ $RC == 0 ]] || fail "SIGTERM: exit $RC"
[[ ! -e "$DIR/a.sock" ]] || fail "SIGTERM left the socket"
[[ ! -e "$DIR/a.sock.lock" ]] || fail "SIGTERM left the socket's lock file"
# A daemon killed with -9 leaves both; the next start takes them over.
start f --socket="$DIR/f.sock" --listen=127.0.0.1:0; P3=$PID
kill -9 "$P3"; wait "$P3" 2>/dev/null
[[ -S "$DIR/f.sock" && -e "$DIR/f.sock.lock" ]] || fail "kill -9 should leave the socket behind"
start g --socket="$DIR/f.sock" --listen=127.0.0.1:0; P4=$PID
grep -q "^gradlaned ready socket=$DIR/f.sock " "$DIR/g.out" || fail "stale socket not taken over: $(cat "$DIR/g.err")"
kill -TERM "$P4"; wait "$P4"
kill -INT "$P2"; wait "$P2"; RC=$?
[[ $RC == 0 ]] || fail "SIGINT: exit $RC"
[[ ! -e "$DIR/d.sock" ]] || fail "SIGINT left the socket"
echo "PASS"
