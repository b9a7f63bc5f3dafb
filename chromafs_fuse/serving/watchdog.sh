#!/bin/sh
# The push watchdog (watchdog.py): started through `setpriv --pdeathsig USR2 sh -c`, so it gets
# USR2 when the daemon's FUSE thread dies, and then aborts the FUSE connection if the mount is
# still there (a page store waiting in the kernel would otherwise hang every reader).
# $1 the daemon's pid, $2 the connection number, $3 the mountpoint as mountinfo writes it,
# $4 where fusectl is mounted. The sleep dies with the shell (its own pdeathsig), so the traps
# need not kill it.
daemon=$1 connection=$2 mountpoint=$3 fusectl=$4
still_mounted() {
    while read -r _id _parent device _root point _rest; do
        [ "$device" = "0:$connection" ] && [ "$point" = "$mountpoint" ] && return 0
    done < /proc/self/mountinfo
    return 1
}
abort_connection() {
    still_mounted || return 0
    [ -d "$fusectl/$connection" ] || mount -t fusectl fusectl "$fusectl" 2>/dev/null
    echo 1 > "$fusectl/$connection/abort"
}
trap 'exit 0' TERM INT HUP
trap 'abort_connection; exit 0' USR2
[ "$PPID" = "$daemon" ] || { abort_connection; exit 0; }
setpriv --pdeathsig KILL sleep infinity &
wait
