# The session's shell (bash if the container has it, else sh), started detached by ops.sh and
# reparented to the container's PID 1. It reads call ids from the FIFO "in" and sources each
# call's command in this very shell, so that cwd, variables, functions and jobs persist. Names
# that the commands could clash with start with __cklite_.
__cklite_d=$1
shift
exec 9<>"$__cklite_d/in"
echo $$ >"$__cklite_d/pid"
# A command that ends the shell (exit 3) still reports its status.
trap 'echo $? >"$__cklite_d/$__cklite_id.status"' EXIT
while read -r __cklite_id <&9; do
	CKLITE_CALL=$__cklite_id
	export CKLITE_CALL
	{
		. "$__cklite_d/$__cklite_id.cmd"
		echo $? >"$__cklite_d/$__cklite_id.status"
	} </dev/null >"$__cklite_d/$__cklite_id.out" 2>"$__cklite_d/$__cklite_id.err"
	unset CKLITE_CALL
done
