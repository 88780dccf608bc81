#!/usr/bin/env bash
# A peer that goes silent without closing its connection (a frozen host, a dropped network), on loopback:
#   bash tests/integration/silent_peer.sh PATH/TO/paged
# Both ends send heartbeats (actors/tls.h): a worker stopped with SIGSTOP mid-generation is lost within a few
# seconds, and the engine ends its requests with the reason (exit 1, no hang); an engine stopped with SIGSTOP stops
# owning its worker, which then serves a second engine.
set -u

NAME=silent_peer
. "$(dirname "$0")/worker_common.bash" "$@"

# A frozen worker: the engine's generation fails within the heartbeat timeout, it does not wait for ever.
start_worker || exit 1
start_long_generation "$TMP/frozen.err"
await_engine "$worker_port" 20 || fail "no engine joined the worker within 20 s"
kill -STOP "$worker_pid"
stopped=$SECONDS
await_exit "$client" 9
lost=$((SECONDS - stopped))
[ "$rc" = 1 ] && grep -q 'the engine stopped' "$TMP/frozen.err" ||
  fail "frozen worker: the engine ended with $rc after $lost s, $(cat "$TMP/frozen.err")"
kill -KILL "$worker_pid"
wait "$worker_pid" 2>/dev/null

# A frozen engine: its worker lets it go and serves the next engine.
start_worker || exit 1
start_server || exit 1
kill -STOP "$serve_pid"
stopped=$SECONDS
timeout -s KILL 20 "$PAGED" generate --model "$MODEL" --workers "127.0.0.1:$worker_port" \
  --prompt "Once upon a time" --max-tokens 8 --temperature 0 >"$TMP/second.out" 2>"$TMP/second.err"
rc=$?
waited=$((SECONDS - stopped))
[ "$rc" = 0 ] && [ "$waited" -le 8 ] ||
  fail "second engine after a frozen one: rc $rc after $waited s, $(cat "$TMP/second.err")"
[ "$failures" = 0 ] && echo "$NAME: a frozen worker was lost after $lost s, a frozen engine let go after $waited s"
kill -KILL "$serve_pid"
wait "$serve_pid" 2>/dev/null

finish
