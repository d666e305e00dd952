# The operations on sessions, each run by one exec in the container:
#   ops.sh run BASE NAME ID LOOP COMMAND   run COMMAND in session NAME (started if need be);
#                                          exits with its status, 125 if the session failed
#   ops.sh kill BASE NAME ID ROUNDS         kill call ID's processes until the call ends; after
#                                          ROUNDS rounds, the session's shell (exit 3)
#   ops.sh list BASE                        NAME PID CREATED SHELL of each live session
#   ops.sh close BASE NAME                  end the session and every process it started
op=$1 base=$2 name=$3
d=$base/$name

fail() {
	echo "cklite-session: $*" >&2
	exit 125
}

# alive: whether session $1's shell runs (a zombie has an empty cmdline).
alive() {
	[ -s "$base/$1/pid" ] && read -r pid <"$base/$1/pid" && [ -d "/proc/$pid" ] &&
		grep -q cklite-session "/proc/$pid/cmdline" 2>/dev/null
}

# killmarked: SIGKILL every process whose environment holds $1.
killmarked() {
	for e in /proc/[0-9]*/environ; do
		p=${e#/proc/}
		p=${p%/environ}
		if { tr '\0' '\n' <"$e"; } 2>/dev/null | grep -qxF "$1"; then
			kill -KILL "$p" 2>/dev/null
		fi
	done
}

start() {
	rm -rf "$d"
	mkdir -p "$d" && mkfifo "$d/in" || return 1
	sh=sh
	command -v bash >/dev/null 2>&1 && sh=bash
	echo "$sh" >"$d/shell"
	date -u +%Y-%m-%dT%H:%M:%SZ >"$d/created"
	# Its own session and process group, stdio on /dev/null (not the exec's pipes): the exec ends
	# and the shell lives on under PID 1, inside the tree a checkpoint dumps.
	if command -v setsid >/dev/null 2>&1; then
		CKLITE_SESSION=$name setsid "$sh" -c "$1" cklite-session "$d" </dev/null >/dev/null 2>&1 &
	else
		(CKLITE_SESSION=$name "$sh" -c "$1" cklite-session "$d" </dev/null >/dev/null 2>&1 &)
	fi
	# Up once it has written its pid, with "in" open: then another call sees it alive.
	n=0
	until alive "$name"; do
		n=$((n + 1))
		[ $n -lt 500 ] || return 1
		sleep 0.01
	done
}

# ensure: start session $name unless it runs. Concurrent first calls start one shell: the
# first to make the lock directory starts it, the others wait for the lock to go (after 10 s it
# is taken for the lock of a starter that was killed, and removed).
ensure() {
	alive "$name" && return
	lock=$base/.$name.lock
	mkdir -p "$base" || fail "cannot make $base"
	n=0
	until mkdir "$lock" 2>/dev/null; do
		n=$((n + 1))
		[ $n -lt 200 ] || { rmdir "$lock"; fail "session $name: a stale start lock removed, try again"; }
		sleep 0.05
	done
	alive "$name" || start "$1" || { rmdir "$lock"; fail "session $name did not start in $d"; }
	rmdir "$lock"
}

# settled waits until call $1 has its status, or the shell that ran it is gone: a command that
# ends the shell (exit N) reports its status from the shell's EXIT trap, which dash runs after
# letting go of the call's output FIFOs, so the FIFOs' end does not mean the status is written.
# Bounded (5 s): a shell killed without its trap leaves no status, and may stay a zombie.
settled() {
	read -r spid <"$d/pid" 2>/dev/null || return 0
	n=0
	while [ ! -s "$d/$1.status" ] && [ $n -lt 500 ] && [ -r "/proc/$spid/stat" ]; do
		read -r _ _ state _ <"/proc/$spid/stat" 2>/dev/null || return 0
		[ "$state" != Z ] || return 0
		n=$((n + 1))
		sleep 0.01
	done
}

run() {
	id=$1
	ensure "$2"
	printf '%s\n' "$3" >"$d/$id.cmd" || fail "cannot write $d/$id.cmd"
	read -r sh <"$d/shell"
	# A syntax error in a sourced file ends a POSIX shell: refused here, as sh -c would.
	if ! "$sh" -n "$d/$id.cmd"; then
		rm -f "$d/$id.cmd"
		exit 2
	fi
	mkfifo "$d/$id.out" "$d/$id.err" || fail "cannot make the output FIFOs"
	cat "$d/$id.out" &
	o=$!
	cat "$d/$id.err" >&2 &
	e=$!
	# The shell holds "in" open (ensure waited for it): this write does not wait for a reader.
	echo "$id" >"$d/in"
	wait $o
	wait $e
	settled "$id"
	st=
	[ -s "$d/$id.status" ] && read -r st <"$d/$id.status"
	rm -f "$d/$id.cmd" "$d/$id.out" "$d/$id.err" "$d/$id.status"
	[ -n "$st" ] || fail "session $name ended without the command's status"
	exit "$st"
}

case $op in
run) run "$4" "$5" "$6" ;;
kill)
	n=0
	# Until the shell wrote the status (and run, which removes the call's files, may have read it).
	while [ -e "$d/$4.cmd" ] && [ ! -e "$d/$4.status" ]; do
		killmarked "CKLITE_CALL=$4"
		n=$((n + 1))
		# The shell itself may be what runs (a loop of builtins): nothing else to kill, and a shell
		# that never reads the next call is no session. Its end ends the call (run: status 125).
		if [ $n -ge "$5" ]; then
			alive "$name" && kill -KILL "$pid"
			echo "cklite-session: call $4 ran in session $name's shell itself, not in a process: the session is ended" >&2
			exit 3
		fi
		sleep 0.05
	done
	;;
list)
	for f in "$base"/*/pid; do
		[ -e "$f" ] || continue
		n=${f%/pid}
		n=${n##*/}
		alive "$n" || continue
		read -r created <"$base/$n/created"
		read -r sh <"$base/$n/shell"
		printf '%s\t%s\t%s\t%s\n' "$n" "$pid" "$created" "$sh"
	done
	;;
close)
	alive "$name" || {
		echo "cklite-session: no session $name" >&2
		exit 3
	}
	killmarked "CKLITE_SESSION=$name"
	kill -KILL "$pid" 2>/dev/null
	rm -rf "$d"
	;;
*) fail "unknown operation $op" ;;
esac
