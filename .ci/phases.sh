# Sourced by .ci/run and .ci/test: each step of a CI run is a timed phase. A phase's seconds go
# to $SPARKFORM_CI_DIR/phases.tsv (name, milliseconds, exit status), which bench/suite-time
# prints at the end of .ci/run, sorted, with the slowest tests.
: "${SPARKFORM_CI_DIR:=$(mktemp -d /tmp/sparkform-ci.XXXXXX)}"
export SPARKFORM_CI_DIR
mkdir -p "$SPARKFORM_CI_DIR"

# phase NAME CMD...: run one command as the phase NAME; its exit status is the phase's. One
# command, not a function of several: bash ignores `set -e` inside a command whose status is
# tested, so a compound step is a script or a chain of &&.
phase() {
  local name=$1 t0 rc=0
  shift
  t0=${EPOCHREALTIME/./}
  echo "ci: phase $name" >&2
  "$@" || rc=$?
  printf '%s\t%s\t%s\n' "$name" "$(( (${EPOCHREALTIME/./} - t0) / 1000 ))" "$rc" >> "$SPARKFORM_CI_DIR/phases.tsv"
  return "$rc"
}
