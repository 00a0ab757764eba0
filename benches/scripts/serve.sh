# Sourced by the bench scripts that study one `overhead` server's threads: starts the
# server and reads its threads' CPU from /proc.
#
#   . benches/scripts/serve.sh; start_server baseline; echo "$URL"; thread_cpu spanprof-collec
EXE=${EXE:-target/release/overhead}

# Starts `overhead serve --mode MODE`; sets SRV_PID and URL. It exits when this
# script does (its control pipe closes).
start_server() {
    coproc SRV { exec "$EXE" serve --mode "$1" --sink http://127.0.0.1:9 2>/dev/null; }
    local line
    read -r line <&"${SRV[0]}"
    URL=http://127.0.0.1:${line#port }
}

# The thread ids of the server's threads named NAME.
thread_ids() {
    local t
    for t in /proc/"$SRV_PID"/task/*; do
        if [ "$(cat "$t"/comm)" = "$1" ]; then basename "$t"; fi
    done
}

# On-CPU nanoseconds of the server's threads named NAME, summed (schedstat).
thread_cpu() {
    local t s=0
    for t in $(thread_ids "$1"); do
        s=$((s + $(cut -d' ' -f1 /proc/"$SRV_PID"/task/"$t"/schedstat)))
    done
    echo "$s"
}
