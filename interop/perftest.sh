#!/usr/bin/env bash
# Runs RabbitMQ PerfTest 2.22.1 with its common flags against a fresh Sluice on a
# free loopback port, 5 s each, and checks each run for errors and sane rates.
#
#   interop/perftest.sh [path/to/sluice]   (default: target/release/sluice, built if missing)
#
# PerfTest's jars are expected in bench/.cache/perf-test-2.22.1/lib (PERFTEST_LIB overrides).
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/.." && pwd)"
lib="${PERFTEST_LIB:-$root/bench/.cache/perf-test-2.22.1/lib}"
[[ -f "$lib/perf-test-2.22.1.jar" ]] || { echo "PerfTest jars not found in $lib" >&2; exit 2; }

if [[ $# -ge 1 ]]; then
    bin="$1"
else
    bin="$root/target/release/sluice"
    [[ -x "$bin" ]] || (cd "$root" && cargo build --release -p sluice)
fi

work="$(mktemp -d "${TMPDIR:-/tmp}/sluice-perftest.XXXXXX")"
broker_pid=""
cleanup() {
    if [[ -n "$broker_pid" ]] && kill -0 "$broker_pid" 2>/dev/null; then
        kill -TERM "$broker_pid" 2>/dev/null || true
        for _ in $(seq 50); do kill -0 "$broker_pid" 2>/dev/null || break; sleep 0.1; done
        kill -KILL "$broker_pid" 2>/dev/null || true
    fi
    rm -rf "$work"
}
trap cleanup EXIT

port="$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')"
"$bin" server --listen "127.0.0.1:$port" --data-dir "$work/data" >"$work/broker.log" 2>&1 &
broker_pid=$!
for _ in $(seq 100); do
    if (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; then break; fi
    kill -0 "$broker_pid" 2>/dev/null || { cat "$work/broker.log" >&2; exit 2; }
    sleep 0.1
done
uri="amqp://guest:guest@127.0.0.1:$port"

# name | PerfTest flags | expected total send rate (msg/s) when --rate caps it, else empty
scenarios=(
    "1 producer, 1 consumer, 1 kB|-x 1 -y 1 -s 1000|"
    "2x2, confirms 100, prefetch 100|-x 2 -y 2 -c 100 -q 100|"
    "multi-ack 10, prefetch 100|-A 10 -q 100|"
    "autoack|-a|"
    "persistent|-f persistent|"
    "10 queues by pattern|--queue-pattern perf-test-%d --queue-pattern-from 1 --queue-pattern-to 10 -x 10 -y 10|"
    "named durable queue q1, persistent|-u q1 -f persistent --auto-delete false|"
    "5 producers at 100 msg/s|-x 5 -y 5 --rate 100|500"
)

passed=0
failed=0
for scenario in "${scenarios[@]}"; do
    IFS='|' read -r name flags capped <<<"$scenario"
    log="$work/perftest.log"
    read -ra args <<<"$flags"
    rc=0
    timeout 40 java -cp "$lib/*" com.rabbitmq.perf.PerfTest -h "$uri" -z 5 "${args[@]}" >"$log" 2>&1 || rc=$?
    sent="$(sed -n 's/.*sending rate avg: \([0-9]*\) msg\/s.*/\1/p' "$log" | tail -n 1)"
    received="$(sed -n 's/.*receiving rate avg: \([0-9]*\) msg\/s.*/\1/p' "$log" | tail -n 1)"
    problem=""
    if [[ $rc -ne 0 ]]; then
        problem="exit $rc"
    elif grep -qiE 'exception|error|warn' "$log"; then
        problem="errors in output: $(grep -iE -m 1 'exception|error|warn' "$log")"
    elif [[ -z "$sent" || -z "$received" ]]; then
        problem="no rate summary"
    elif [[ "$sent" -le 0 || "$received" -lt $((sent / 2)) ]]; then
        problem="rates not sane"
    elif [[ -n "$capped" ]] && { [[ "$sent" -lt $((capped * 8 / 10)) ]] || [[ "$sent" -gt $((capped * 12 / 10)) ]]; }; then
        problem="send rate $sent msg/s, expected about $capped"
    fi
    if [[ -z "$problem" ]]; then
        passed=$((passed + 1))
        printf 'PASS  %-36s sent %7s msg/s, received %7s msg/s   (%s)\n' "$name" "$sent" "$received" "$flags"
    else
        failed=$((failed + 1))
        printf 'FAIL  %-36s %s   (%s)\n' "$name" "$problem" "$flags"
        tail -n 15 "$log" | sed 's/^/      /'
    fi
done

if [[ $failed -gt 0 ]]; then
    echo "----- sluice log (last 20 lines) -----"
    tail -n 20 "$work/broker.log"
fi
echo "$passed passed, $failed failed"
[[ $failed -eq 0 ]]
