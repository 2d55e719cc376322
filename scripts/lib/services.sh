# Starting the services tests need. Sourced by scripts/test.
# Every service binds to 127.0.0.1; a running one is reused; a missing package is
# installed from Debian's archive.

log() { echo "==> $*"; }

fail() {
  echo "error: $*" >&2
  exit 1
}

# ensure_backend LABEL: make the backend behind a DLOCK_TEST_BACKENDS label usable.
ensure_backend() {
  case "$1" in
    memory) ;; # in-process, nothing to start
    *) fail "unknown backend '$1' in DLOCK_TEST_BACKENDS (known: $ALL_BACKENDS)" ;;
  esac
}
