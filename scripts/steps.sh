# Sourced by the set-up scripts: `step "what" cmd args...` runs a step with its output (pip's
# progress and warnings) in a log file, prints one line when it is done, and on failure the
# end of that log and where the whole of it is. Log: .mathrl/logs/setup.log (appended).
SETUP_LOG=${SETUP_LOG:-.mathrl/logs/setup.log}
mkdir -p "$(dirname "$SETUP_LOG")"

step() {
  local what=$1 t0 rc
  shift
  t0=$(date +%s)
  printf '%s\n' "==> $what: $*" >>"$SETUP_LOG"
  if "$@" >>"$SETUP_LOG" 2>&1; then
    echo "==> $what ($(( $(date +%s) - t0 ))s)" >&2
  else
    rc=$?
    echo "==> $what FAILED (exit $rc); the end of $SETUP_LOG:" >&2
    tail -n 40 "$SETUP_LOG" >&2
    return "$rc"
  fi
}
