# The operations on sessions, each run by one exec in the container:
#   ops.sh run BASE NAME ID LOOP COMMAND   run COMMAND in session NAME (started if need be);
#                                          exits with its status, 125 if the session failed
#   ops.sh kill BASE NAME ID                kill call ID's processes until the call ends
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
	mkdir -p "$d" && mkfifo "$d/in" || fail "cannot make $d"
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
}

run() {
	id=$1
	alive "$name" || start "$2"
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
	# The shell holds "in" open for reading: this write does not wait for a reader.
	echo "$id" >"$d/in"
	wait $o
	wait $e
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
		# The shell itself may be what runs (a loop of builtins): nothing to kill.
		[ $n -lt 100 ] || fail "session $name's shell does not end call $4 (a loop in the shell itself?)"
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
