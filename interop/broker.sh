# Helpers shared by the interop scripts (interop/run, interop/ui/check): free loopback
# ports, and a Sluice started in the background and stopped again. Source it:
#
#   free_port                          prints a loopback port that is free now
#   start_sluice BIN LOG PORT ARGS...  runs `BIN server --listen 127.0.0.1:PORT ARGS...` with
#                                      its output in LOG, sets broker_pid, and returns once
#                                      PORT accepts connections (exits 2 if the broker dies or
#                                      does not listen within 10 s)
#   stop_sluice                        SIGTERM, then SIGKILL if still running after 5 s

broker_pid=""

free_port() {
    python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

start_sluice() {
    local bin="$1" log="$2" port="$3"
    shift 3
    "$bin" server --listen "127.0.0.1:$port" "$@" >"$log" 2>&1 &
    broker_pid=$!
    for _ in $(seq 100); do
        if (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; then return 0; fi
        kill -0 "$broker_pid" 2>/dev/null || { cat "$log" >&2; echo "sluice did not start" >&2; exit 2; }
        sleep 0.1
    done
    cat "$log" >&2
    echo "sluice did not listen on 127.0.0.1:$port within 10 s" >&2
    exit 2
}

stop_sluice() {
    if [[ -n "$broker_pid" ]] && kill -0 "$broker_pid" 2>/dev/null; then
        kill -TERM "$broker_pid" 2>/dev/null || true
        for _ in $(seq 50); do kill -0 "$broker_pid" 2>/dev/null || break; sleep 0.1; done
        kill -KILL "$broker_pid" 2>/dev/null || true
    fi
}
