# Starting the services tests need. Sourced by scripts/test.
# Every service binds to 127.0.0.1; a running one is reused; a missing package is
# installed from Debian's archive. Every wait is bounded.

log() { echo "==> $*"; }

fail() {
  echo "error: $*" >&2
  exit 1
}

as_root() {
  if [ "$(id -u)" -eq 0 ]; then "$@"; else sudo "$@"; fi
}

APT_UPDATED=""
apt_install() {
  if [ -z "$APT_UPDATED" ]; then
    log "apt-get update"
    as_root apt-get update -qq || fail "apt-get update failed"
    APT_UPDATED=1
  fi
  log "apt-get install $*"
  as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "$@" \
    || fail "could not install $*"
}

# tcp_open HOST PORT: is something listening?
tcp_open() { (exec 3<>"/dev/tcp/$1/$2") 2>/dev/null; }

# wait_for SECONDS DESCRIPTION COMMAND...: retry COMMAND every 0.5 s, bounded.
wait_for() {
  local limit=$1 what=$2
  shift 2
  local deadline=$((SECONDS + limit))
  until "$@" >/dev/null 2>&1; do
    [ "$SECONDS" -lt "$deadline" ] || fail "$what did not come up within ${limit}s"
    sleep 0.5
  done
}

ensure_mysql() {
  export DLOCK_MYSQL_URL="${DLOCK_MYSQL_URL:-mysql://root@127.0.0.1:3306/test}"
  if ! tcp_open 127.0.0.1 3306; then
    command -v mariadbd >/dev/null 2>&1 || [ -x /usr/sbin/mariadbd ] || apt_install mariadb-server mariadb-client
    if [ ! -d /var/lib/mysql/mysql ]; then
      log "initialising the MariaDB data directory"
      as_root mariadb-install-db --user=mysql --datadir=/var/lib/mysql >/dev/null || fail "mariadb-install-db failed"
    fi
    as_root mkdir -p /run/mysqld && as_root chown mysql:mysql /run/mysqld 2>/dev/null || true
    log "starting MariaDB on 127.0.0.1:3306"
    as_root start-stop-daemon --start --oknodo --background --exec /usr/sbin/mariadbd -- \
      --user=mysql --bind-address=127.0.0.1 --port=3306
    wait_for 60 "MariaDB" tcp_open 127.0.0.1 3306
  fi
  # The tests log in as root with no password over TCP, into database `test`.
  if ! mariadb -h 127.0.0.1 -P 3306 -uroot -e "SELECT 1" test >/dev/null 2>&1; then
    log "configuring MariaDB: root without password on localhost, database test"
    wait_for 30 "MariaDB socket" as_root mariadb -uroot -e "SELECT 1"
    as_root mariadb -uroot -e "CREATE DATABASE IF NOT EXISTS test;
      ALTER USER 'root'@'localhost' IDENTIFIED VIA unix_socket OR mysql_native_password USING PASSWORD('');
      FLUSH PRIVILEGES;" || fail "could not configure MariaDB for the tests"
  fi
  wait_for 30 "MariaDB login" mariadb -h 127.0.0.1 -P 3306 -uroot -e "SELECT 1" test
  log "MariaDB ready at 127.0.0.1:3306"
}

ensure_postgres() {
  export DLOCK_POSTGRES_URL="${DLOCK_POSTGRES_URL:-postgres://postgres@127.0.0.1:5432/test}"
  if ! tcp_open 127.0.0.1 5432; then
    command -v pg_ctlcluster >/dev/null 2>&1 && ls /etc/postgresql/*/main >/dev/null 2>&1 \
      || apt_install postgresql postgresql-client
    local version
    version=$(ls /etc/postgresql | sort -V | tail -n 1)
    [ -n "$version" ] || fail "no PostgreSQL cluster found under /etc/postgresql"
    log "starting PostgreSQL $version on 127.0.0.1:5432"
    as_root pg_ctlcluster --skip-systemctl-redirect "$version" main start || true
    wait_for 60 "PostgreSQL" tcp_open 127.0.0.1 5432
  fi
  if ! psql "postgresql://postgres@127.0.0.1:5432/postgres" -tAc "SELECT 1" >/dev/null 2>&1; then
    log "configuring PostgreSQL: trust for 127.0.0.1 (test machine only)"
    local hba
    hba=$(as_root runuser -u postgres -- psql -tAc "SHOW hba_file") || fail "cannot reach PostgreSQL as the postgres user"
    as_root sed -i '1i host all all 127.0.0.1/32 trust' "$hba"
    as_root runuser -u postgres -- psql -tAc "SELECT pg_reload_conf()" >/dev/null
    wait_for 15 "PostgreSQL trust login" psql "postgresql://postgres@127.0.0.1:5432/postgres" -tAc "SELECT 1"
  fi
  if [ "$(psql "postgresql://postgres@127.0.0.1:5432/postgres" -tAc "SELECT 1 FROM pg_database WHERE datname = 'test'")" != "1" ]; then
    psql "postgresql://postgres@127.0.0.1:5432/postgres" -c "CREATE DATABASE test" >/dev/null || fail "cannot create database test"
  fi
  log "PostgreSQL ready at 127.0.0.1:5432"
}

# ensure_backend LABEL: make the backend behind a DLOCK_TEST_BACKENDS label usable.
ensure_backend() {
  case "$1" in
    memory | sqlite) ;; # in-process / a file: nothing to start
    mysql) ensure_mysql ;;
    postgres) ensure_postgres ;;
    *) fail "unknown backend '$1' in DLOCK_TEST_BACKENDS (known: $ALL_BACKENDS)" ;;
  esac
}
