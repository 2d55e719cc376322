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

# ensure_protoc: protoc and the well-known .proto files it imports (google/protobuf/
# descriptor.proto: libprotobuf-dev, only recommended by protobuf-compiler, which
# apt_install does not install): dlock-etcd's etcd-client compiles etcd's protocol
# at build time.
ensure_protoc() {
  command -v protoc >/dev/null 2>&1 && [ -f /usr/include/google/protobuf/descriptor.proto ] \
    || apt_install protobuf-compiler libprotobuf-dev
}

# ensure_nextest: cargo-nextest, the test runner scripts/test uses (every test in a
# process of its own, many at once, JUnit results for the summary). This machine
# kind has it; elsewhere it is built from crates.io.
ensure_nextest() {
  cargo nextest --version >/dev/null 2>&1 && return
  log "cargo install cargo-nextest"
  cargo install --locked cargo-nextest || fail "could not install cargo-nextest"
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

# start_mysql: starts MariaDB on 127.0.0.1:3306 (its data directory initialised), up
# when this returns.
start_mysql() {
  as_root mkdir -p /run/mysqld && as_root chown mysql:mysql /run/mysqld 2>/dev/null || true
  # Matched by its pid file too: the TLS MariaDB on 3307 runs the same executable.
  as_root start-stop-daemon --start --oknodo --background --pidfile /run/mysqld/mysqld.pid \
    --exec /usr/sbin/mariadbd -- --user=mysql --bind-address=127.0.0.1 --port=3306
  wait_for 60 "MariaDB" tcp_open 127.0.0.1 3306
}

# stop_mysql: stops the MariaDB on 127.0.0.1:3306 (a clean shutdown: committed rows
# stay), bounded; returns once its process has exited. It closes its port at once
# but writes its buffer pool out first (seconds after many writes): a start_mysql
# before it exits would find it running (start-stop-daemon --oknodo) and start
# nothing.
stop_mysql() {
  local pid
  pid=$(as_root cat /run/mysqld/mysqld.pid 2>/dev/null) || pid=""
  mariadb-admin -h 127.0.0.1 -P 3306 -uroot shutdown >/dev/null 2>&1 \
    || as_root mariadb-admin -uroot shutdown >/dev/null 2>&1 || fail "cannot shut MariaDB down"
  wait_for 60 "MariaDB to stop" sh -c "! (exec 3<>/dev/tcp/127.0.0.1/3306) 2>/dev/null"
  if [ -n "$pid" ]; then
    wait_for 60 "MariaDB (pid $pid) to exit" sh -c "[ ! -d /proc/$pid ]"
  fi
}

ensure_mysql() {
  export DLOCK_MYSQL_URL="${DLOCK_MYSQL_URL:-mysql://root@127.0.0.1:3306/test}"
  if ! tcp_open 127.0.0.1 3306; then
    command -v mariadbd >/dev/null 2>&1 || [ -x /usr/sbin/mariadbd ] || apt_install mariadb-server mariadb-client
    if [ ! -d /var/lib/mysql/mysql ]; then
      log "initialising the MariaDB data directory"
      as_root mariadb-install-db --user=mysql --datadir=/var/lib/mysql >/dev/null || fail "mariadb-install-db failed"
    fi
    log "starting MariaDB on 127.0.0.1:3306"
    start_mysql
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

# postgres_ctl start|stop: pg_ctlcluster on the newest PostgreSQL cluster `main`
# (stop: fast shutdown, committed rows stay).
postgres_ctl() {
  local version
  version=$(ls /etc/postgresql 2>/dev/null | sort -V | tail -n 1)
  [ -n "$version" ] || fail "no PostgreSQL cluster found under /etc/postgresql"
  if [ "$1" = stop ]; then
    as_root pg_ctlcluster --skip-systemctl-redirect "$version" main stop -m fast
  else
    as_root pg_ctlcluster --skip-systemctl-redirect "$version" main "$1"
  fi
}

ensure_postgres() {
  export DLOCK_POSTGRES_URL="${DLOCK_POSTGRES_URL:-postgres://postgres@127.0.0.1:5432/test}"
  if ! tcp_open 127.0.0.1 5432; then
    command -v pg_ctlcluster >/dev/null 2>&1 && ls /etc/postgresql/*/main >/dev/null 2>&1 \
      || apt_install postgresql postgresql-client
    log "starting PostgreSQL on 127.0.0.1:5432"
    postgres_ctl start || true
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

# PgBouncer in transaction pooling (the default of most managed poolers) on
# 127.0.0.1:6432 in front of the test PostgreSQL, from Debian's package: the
# row mode runs through it (postgres-pgbouncer), the session mode must refuse it.
# A second one on 127.0.0.1:6433 as PgBouncer ships (no
# `ignore_startup_parameters`): it refuses sqlx's startup, and dlock must say it is
# the pooler's configuration. A third on 127.0.0.1:6434 for the clients that
# misuse a pooler on purpose (the row mode without `dlock_pooler`, which LISTENs):
# a server session left listening would hand its notifications to the next client
# of 6432, which sqlx refuses ("unexpected message: NotificationResponse"). Run as the postgres user (PgBouncer will not run as
# root), their files in PGBOUNCER_DIR-PORT.
PGBOUNCER_DIR="${TMPDIR:-/tmp}/dlock-pgbouncer"

# start_pgbouncer PORT IGNORED: a PgBouncer on 127.0.0.1:PORT (reused if it
# answers) with `ignore_startup_parameters = IGNORED` (none if empty).
# `server_login_retry = 1`: after PostgreSQL restarts (scripts/server-fault), a
# PgBouncer whose login failed while it was down refuses every client ("server
# login has been failing, try again later") for server_login_retry — 15 s by
# default, longer than a checker run's leak check waits (seen failing in CI:
# refusals for 12 s after PostgreSQL was back). A PgBouncer already answering on
# PORT is reused only if it runs this configuration; otherwise it is stopped first.
start_pgbouncer() {
  local port=$1 ignored=$2 dir="$PGBOUNCER_DIR-$1" ini
  ini=$(pgbouncer_ini "$port" "$ignored" "$dir")
  if psql "postgresql://postgres@127.0.0.1:$port/test" -tAc "SELECT 1" >/dev/null 2>&1; then
    if [ "$(cat "$dir/pgbouncer.ini" 2>/dev/null)" = "$ini" ]; then
      return 0
    fi
    log "PgBouncer on 127.0.0.1:$port runs another configuration: stopping it"
    as_root kill "$(cat "$dir/pgbouncer.pid")" 2>/dev/null || true
    wait_for 30 "PgBouncer on port $port to stop" sh -c "! psql 'postgresql://postgres@127.0.0.1:$port/test' -tAc 'SELECT 1' >/dev/null 2>&1"
  fi
  command -v pgbouncer >/dev/null 2>&1 || apt_install pgbouncer
  mkdir -p "$dir"
  printf '%s\n' "$ini" >"$dir/pgbouncer.ini"
  echo '"postgres" ""' >"$dir/users.txt"
  as_root chown -R postgres "$dir"
  log "starting PgBouncer (transaction pooling) on 127.0.0.1:$port"
  as_root runuser -u postgres -- pgbouncer -d "$dir/pgbouncer.ini" \
    || fail "cannot start PgBouncer (log: $dir/pgbouncer.log)"
  # (psql sends no extra_float_digits: the strict one answers it too.)
  wait_for 30 "PgBouncer on port $port" psql "postgresql://postgres@127.0.0.1:$port/test" -tAc "SELECT 1"
  log "PgBouncer ready at 127.0.0.1:$port"
}

# pgbouncer_ini PORT IGNORED DIR: the configuration of start_pgbouncer's PgBouncer.
pgbouncer_ini() {
  local port=$1 ignored=$2 dir=$3
  {
    cat <<INI
[databases]
test = host=127.0.0.1 port=5432 dbname=test
[pgbouncer]
listen_addr = 127.0.0.1
listen_port = $port
auth_type = trust
auth_file = $dir/users.txt
pool_mode = transaction
max_client_conn = 500
default_pool_size = 20
server_login_retry = 1
logfile = $dir/pgbouncer.log
pidfile = $dir/pgbouncer.pid
INI
    if [ -n "$ignored" ]; then echo "ignore_startup_parameters = $ignored"; fi
  }
}

ensure_pgbouncer() {
  export DLOCK_PGBOUNCER_URL="postgres://postgres@127.0.0.1:6432/test"
  export DLOCK_PGBOUNCER_STRICT_URL="postgres://postgres@127.0.0.1:6433/test"
  export DLOCK_PGBOUNCER_SCRATCH_URL="postgres://postgres@127.0.0.1:6434/test"
  start_pgbouncer 6432 extra_float_digits
  start_pgbouncer 6433 ""
  start_pgbouncer 6434 extra_float_digits
}

# A second MariaDB on 127.0.0.1:3307 that takes TLS connections only
# (require_secure_transport), its certificate signed by a throwaway CA (DIR/ca.crt);
# DIR/other-ca.crt is a CA that did not sign it. Data in DIR/data, owned by mysql.
MYSQL_TLS_DIR="${TMPDIR:-/tmp}/dlock-mysql-tls"

mysql_tls_ok() {
  mariadb --protocol=tcp -h 127.0.0.1 -P 3307 -u root --ssl --ssl-ca="$MYSQL_TLS_DIR/ca.crt" \
    --ssl-verify-server-cert -e "SELECT 1" >/dev/null 2>&1
}

ensure_mysql_tls() {
  export DLOCK_MYSQL_TLS_DIR="$MYSQL_TLS_DIR"
  if [ -f "$MYSQL_TLS_DIR/ca.crt" ] && mysql_tls_ok; then
    log "MariaDB with TLS already running on 127.0.0.1:3307"
    return
  fi
  if [ -f "$MYSQL_TLS_DIR/data/mariadb.pid" ]; then
    as_root kill "$(cat "$MYSQL_TLS_DIR/data/mariadb.pid")" 2>/dev/null || true
    sleep 2
  fi
  tcp_open 127.0.0.1 3307 && fail "port 3307 is taken by something else; the TLS MariaDB needs it"
  make_server_tls_dir "$MYSQL_TLS_DIR" mysql
  as_root mariadb-install-db --no-defaults --user=mysql --datadir="$MYSQL_TLS_DIR/data" \
    --auth-root-authentication-method=normal >"$MYSQL_TLS_DIR/install.log" 2>&1 \
    || fail "mariadb-install-db for the TLS MariaDB (see $MYSQL_TLS_DIR/install.log)"
  log "starting MariaDB with TLS only on 127.0.0.1:3307"
  as_root runuser -u mysql -- setsid mariadbd --no-defaults --datadir="$MYSQL_TLS_DIR/data" \
    --port=3307 --bind-address=127.0.0.1 --socket="$MYSQL_TLS_DIR/data/mariadb.sock" \
    --pid-file="$MYSQL_TLS_DIR/data/mariadb.pid" --log-error="$MYSQL_TLS_DIR/data/error.log" \
    --ssl-ca="$MYSQL_TLS_DIR/ca.crt" --ssl-cert="$MYSQL_TLS_DIR/server.crt" \
    --ssl-key="$MYSQL_TLS_DIR/server.key" --require-secure-transport=ON \
    </dev/null >/dev/null 2>&1 &
  wait_for 60 "MariaDB with TLS" mysql_tls_ok
  mariadb --protocol=tcp -h 127.0.0.1 -P 3307 -u root --ssl --ssl-ca="$MYSQL_TLS_DIR/ca.crt" \
    -e "CREATE DATABASE IF NOT EXISTS test" || fail "cannot create database test on the TLS MariaDB"
}

# A second PostgreSQL on 127.0.0.1:5433 that takes TLS connections only (hostssl),
# its server certificate signed by a throwaway CA (DIR/ca.crt); DIR/other-ca.crt is a
# CA that did not sign it, for the wrong-CA test. Data in DIR/data, owned by postgres.
PG_TLS_DIR="${TMPDIR:-/tmp}/dlock-pg-tls"

pg_tls_ok() {
  psql "postgresql://postgres@127.0.0.1:5433/postgres?sslmode=verify-full&sslrootcert=$PG_TLS_DIR/ca.crt" \
    -tAc "SELECT 1" >/dev/null 2>&1
}

ensure_postgres_tls() {
  export DLOCK_POSTGRES_TLS_DIR="$PG_TLS_DIR"
  if [ -f "$PG_TLS_DIR/ca.crt" ] && pg_tls_ok; then
    log "PostgreSQL with TLS already running on 127.0.0.1:5433"
    return
  fi
  local bin
  bin=$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -n 1)
  [ -n "$bin" ] || fail "no PostgreSQL binaries under /usr/lib/postgresql"
  if [ -d "$PG_TLS_DIR/data" ]; then
    as_root runuser -u postgres -- "$bin/pg_ctl" -D "$PG_TLS_DIR/data" stop -m fast >/dev/null 2>&1 || true
  fi
  tcp_open 127.0.0.1 5433 && fail "port 5433 is taken by something else; the TLS PostgreSQL needs it"
  make_server_tls_dir "$PG_TLS_DIR" postgres
  as_root runuser -u postgres -- "$bin/initdb" -D "$PG_TLS_DIR/data" -A trust -U postgres >/dev/null \
    || fail "initdb for the TLS PostgreSQL"
  printf 'hostssl all all 127.0.0.1/32 trust\n' | as_root tee "$PG_TLS_DIR/data/pg_hba.conf" >/dev/null
  log "starting PostgreSQL with TLS only on 127.0.0.1:5433"
  as_root runuser -u postgres -- "$bin/pg_ctl" -D "$PG_TLS_DIR/data" -l "$PG_TLS_DIR/data/log" \
    -o "-c port=5433 -c listen_addresses=127.0.0.1 -c unix_socket_directories=$PG_TLS_DIR/data -c ssl=on -c ssl_cert_file=$PG_TLS_DIR/server.crt -c ssl_key_file=$PG_TLS_DIR/server.key" \
    start >/dev/null || fail "pg_ctl start (see $PG_TLS_DIR/data/log)"
  wait_for 30 "PostgreSQL with TLS" pg_tls_ok
}

ensure_redis_server_binary() {
  command -v redis-server >/dev/null 2>&1 && command -v redis-cli >/dev/null 2>&1 || apt_install redis-server redis-tools
}

# launch_redis PORT ARGS…: a throwaway redis-server (daemon) for PORT on 127.0.0.1, no
# persistence, working in $TMPDIR/dlock-redis-PORT. The command is kept in
# DIR/start.sh, so a restart (scripts/server-fault) starts the same server again in
# the same directory (a Cluster node keeps its nodes.conf there).
launch_redis() {
  local port=$1
  shift
  local dir="${TMPDIR:-/tmp}/dlock-redis-$port"
  rm -rf "$dir" && mkdir -p "$dir"
  {
    echo "#!/bin/sh"
    echo "# Starts this Redis server (written by scripts/lib/services.sh)."
    printf 'exec redis-server --daemonize yes --bind 127.0.0.1 --dir %q --save "" --appendonly no --logfile %q --pidfile %q' \
      "$dir" "$dir/redis.log" "$dir/redis.pid"
    printf ' %q' "$@"
    echo
  } >"$dir/start.sh"
  sh "$dir/start.sh" || fail "redis-server on port $port did not start (see $dir/redis.log)"
}

# start_redis PORT [ARGS…]: a plain server on PORT, up when this returns.
start_redis() {
  local port=$1
  shift
  launch_redis "$port" --port "$port" "$@"
  wait_for 30 "Redis on port $port" redis-cli -h 127.0.0.1 -p "$port" ping
}

# stop_pid PIDFILE NAME WHAT: stops the process PIDFILE names if it is still NAME
# (its command line says so: the pid may have been reused), bounded.
stop_pid() {
  local pid
  pid=$(cat "$1" 2>/dev/null) || return 0
  if grep -qa "$2" "/proc/$pid/cmdline" 2>/dev/null; then
    kill "$pid" 2>/dev/null || true
    wait_for 30 "$3 (pid $pid) to stop" sh -c "! kill -0 $pid 2>/dev/null"
  fi
}

# stop_redis_at PORT: stops the server on PORT: a plain one by SHUTDOWN, one this
# script started also by its pid file (a TLS-only server does not answer a plain
# redis-cli, and after the certificates were remade not a TLS one either).
stop_redis_at() {
  redis-cli -h 127.0.0.1 -p "$1" shutdown nosave >/dev/null 2>&1 || true
  stop_pid "${TMPDIR:-/tmp}/dlock-redis-$1/redis.pid" redis-server "Redis on port $1"
}

# cluster_ok CLI PORT: the cluster the node on PORT belongs to is serving.
cluster_ok() {
  "$1" -h 127.0.0.1 -p "$2" cluster info 2>/dev/null | grep -q 'cluster_state:ok'
}

# form_cluster CLI START PORT…: (re)starts one node per PORT with START (start_redis
# or start_redis_tls) and joins them into a cluster of masters with CLI.
form_cluster() {
  local cli=$1 start=$2 port nodes=()
  shift 2
  for port in "$@"; do stop_redis_at "$port"; done
  for port in "$@"; do
    "$start" "$port" --cluster-enabled yes --cluster-config-file nodes.conf --cluster-node-timeout 2000
    nodes+=("127.0.0.1:$port")
  done
  "$cli" --cluster create "${nodes[@]}" --cluster-replicas 0 --cluster-yes >/dev/null \
    || fail "redis-cli --cluster create failed for ${nodes[*]}"
  wait_for 30 "the Redis Cluster on ${nodes[*]}" cluster_ok "$cli" "$1"
}

ensure_redis() {
  export DLOCK_REDIS_URL="${DLOCK_REDIS_URL:-redis://127.0.0.1:6379}"
  ensure_redis_server_binary
  if ! redis-cli -h 127.0.0.1 -p 6379 ping >/dev/null 2>&1; then
    log "starting Redis on 127.0.0.1:6379"
    start_redis 6379
  fi
  # One replica, for the replica-acknowledgement (WAIT) test.
  export DLOCK_REDIS_REPLICA_PORT=6380
  if ! redis-cli -h 127.0.0.1 -p 6380 ping >/dev/null 2>&1; then
    log "starting a Redis replica on 127.0.0.1:6380"
    start_redis 6380 --replicaof 127.0.0.1 6379
  fi
  wait_for 30 "the Redis replica link" sh -c "redis-cli -h 127.0.0.1 -p 6379 info replication | grep -q 'connected_slaves:[1-9]'"
  log "Redis ready at 127.0.0.1:6379 (replica at 6380)"
}

# A TLS-only Redis on 127.0.0.1:6390 that also demands a client certificate, with a
# throwaway CA, server and client certificate made by openssl (valid for 127.0.0.1).
REDIS_TLS_DIR="${TMPDIR:-/tmp}/dlock-redis-tls"

# redis_tls_cli ARGS…: redis-cli with the test CA and client certificate.
redis_tls_cli() {
  redis-cli --tls --cacert "$REDIS_TLS_DIR/ca.crt" --cert "$REDIS_TLS_DIR/client.crt" \
    --key "$REDIS_TLS_DIR/client.key" "$@"
}

# start_redis_tls PORT [ARGS…]: a TLS-only server on PORT (cluster bus and replication
# over TLS too) that demands a client certificate, up when this returns.
start_redis_tls() {
  local port=$1
  shift
  launch_redis "$port" --port 0 --tls-port "$port" \
    --tls-cert-file "$REDIS_TLS_DIR/server.crt" --tls-key-file "$REDIS_TLS_DIR/server.key" \
    --tls-ca-cert-file "$REDIS_TLS_DIR/ca.crt" --tls-auth-clients yes \
    --tls-cluster yes --tls-replication yes "$@"
  wait_for 30 "Redis with TLS on port $port" redis_tls_cli -h 127.0.0.1 -p "$port" ping
}

make_redis_tls_certs() { make_tls_certs "$REDIS_TLS_DIR"; }

# make_server_tls_dir DIR OWNER: make_tls_certs DIR, plus DIR/other-ca.crt (a CA that
# did not sign the server's certificate), the server's key and certificate readable by
# OWNER only, and DIR/data for OWNER's server.
make_server_tls_dir() {
  local d=$1 owner=$2
  make_tls_certs "$d"
  make_tls_certs "$d/other" && cp "$d/other/ca.crt" "$d/other-ca.crt"
  chmod 755 "$d" && chmod 600 "$d/server.key"
  as_root chown "$owner" "$d/server.key" "$d/server.crt"
  as_root install -d -o "$owner" "$d/data"
}

# make_tls_certs DIR: a throwaway CA and, signed by it, a server and a client
# certificate valid for 127.0.0.1 (DIR/ca.crt, DIR/server.{crt,key}, DIR/client.{crt,key}).
make_tls_certs() {
  command -v openssl >/dev/null 2>&1 || apt_install openssl
  local d=$1
  rm -rf "$d" && mkdir -p "$d"
  openssl req -x509 -newkey rsa:2048 -nodes -days 30 -subj "/CN=dlock test CA" \
    -keyout "$d/ca.key" -out "$d/ca.crt" 2>/dev/null || fail "openssl: CA"
  for who in server client; do
    openssl req -newkey rsa:2048 -nodes -subj "/CN=dlock test $who" \
      -keyout "$d/$who.key" -out "$d/$who.csr" 2>/dev/null || fail "openssl: $who key"
    printf 'subjectAltName=IP:127.0.0.1,DNS:localhost\n' >"$d/$who.ext"
    openssl x509 -req -in "$d/$who.csr" -CA "$d/ca.crt" -CAkey "$d/ca.key" -CAcreateserial \
      -days 30 -extfile "$d/$who.ext" -out "$d/$who.crt" 2>/dev/null || fail "openssl: $who certificate"
  done
  chmod 644 "$d"/*.key
}

ensure_redis_tls() {
  export DLOCK_REDIS_TLS_DIR="$REDIS_TLS_DIR"
  ensure_redis_server_binary
  if [ -f "$REDIS_TLS_DIR/ca.crt" ] && redis_tls_cli -h 127.0.0.1 -p 6390 ping >/dev/null 2>&1; then
    log "Redis with TLS already running on 127.0.0.1:6390"
    return
  fi
  stop_redis_at 6390
  make_redis_tls_certs
  log "starting Redis with TLS (client certificates required) on 127.0.0.1:6390"
  start_redis_tls 6390
}

# A TLS-only 3-master Redis Cluster on 127.0.0.1:7100-7102 on the same certificates.
ensure_redis_cluster_tls() {
  ensure_redis_tls # the certificates
  if cluster_ok redis_tls_cli 7100; then
    log "Redis Cluster with TLS already running on 127.0.0.1:7100-7102"
    return
  fi
  log "starting a 3-master Redis Cluster with TLS on 127.0.0.1:7100-7102"
  form_cluster redis_tls_cli start_redis_tls 7100 7101 7102
  log "Redis Cluster with TLS ready"
}

ensure_redis_cluster() {
  export DLOCK_REDIS_CLUSTER_URL="${DLOCK_REDIS_CLUSTER_URL:-redis+cluster://127.0.0.1:7000,127.0.0.1:7001,127.0.0.1:7002}"
  ensure_redis_server_binary
  if cluster_ok redis-cli 7000; then
    log "Redis Cluster already running on 127.0.0.1:7000-7002"
    return
  fi
  log "starting a 3-master Redis Cluster on 127.0.0.1:7000-7002"
  form_cluster redis-cli start_redis 7000 7001 7002
  log "Redis Cluster ready"
}

# ZooKeeper from Debian's package, run straight from its jars (no init system): a
# single server on 127.0.0.1:2181 and a 3-node ensemble on 127.0.0.1:2191-2193.
# tickTime is short (250 ms) so session-expiry tests are fast: sessions may last
# 0.5 s to 5 s. The admin HTTP server is off (it would take port 8080).
ZK_RUN_DIR="${TMPDIR:-/tmp}/dlock-zookeeper"
ZK_JARS="zookeeper zookeeper-jute slf4j-api slf4j-simple commons-cli commons-io metrics-core netty-handler netty-transport netty-buffer netty-common netty-codec netty-resolver netty-transport-native-epoll netty-transport-native-unix-common"

ensure_zookeeper_package() {
  [ -f /usr/share/java/zookeeper.jar ] && [ -f /usr/share/java/curator-recipes.jar ] && command -v javac >/dev/null 2>&1 \
    || apt_install zookeeper libcurator-recipes-java default-jdk-headless
  local cp="" jar
  for jar in $ZK_JARS; do cp="$cp${cp:+:}/usr/share/java/$jar.jar"; done
  export DLOCK_ZK_CLASSPATH="$cp"
}


# zk_serving PORT: the server answers requests (in an ensemble: has joined a quorum).
# Each probe is bounded: ZooKeeper 3.8, sent `srvr` while it is still starting
# (before its database is loaded), fails to close the socket (a NullPointerException
# in its log) and never answers; an unbounded read waited on it for ever, past
# wait_for's bound (a restart in the lock-history checker's run took 180 s so).
zk_serving() {
  timeout 2 bash -c 'exec 3<>"/dev/tcp/127.0.0.1/$1" && printf srvr >&3 && grep -q "^Mode: " <&3' _ "$1" 2>/dev/null
}

# start_zk DIR: starts the server whose configuration is DIR/zoo.cfg, pid in DIR/pid.
# The command is kept in DIR/start.sh, so tests that stop a server can start it again.
start_zk() {
  local dir=$1
  cat >"$dir/start.sh" <<EOF
#!/bin/sh
# Starts this ZooKeeper server in the background (written by scripts/lib/services.sh).
nohup java -Xmx256m -Dzookeeper.admin.enableServer=false -cp "$DLOCK_ZK_CLASSPATH" \\
  org.apache.zookeeper.server.quorum.QuorumPeerMain "$dir/zoo.cfg" >"$dir/server.log" 2>&1 &
echo \$! >"$dir/pid"
EOF
  sh "$dir/start.sh"
}

# stop_zk DIR: stops the server started from DIR, if its pid is still that server.
stop_zk() { stop_pid "$1/pid" QuorumPeerMain ZooKeeper; }

# write_zk_cfg DIR CLIENT_PORT [SERVER LINES…] (CLIENT_PORT empty: no plain client
# port, e.g. a TLS-only server whose lines name its secureClientPort)
write_zk_cfg() {
  local dir=$1 port=$2
  shift 2
  rm -rf "$dir" && mkdir -p "$dir/data"
  {
    echo "tickTime=250"
    echo "initLimit=20"
    echo "syncLimit=8"
    echo "dataDir=$dir/data"
    if [ -n "$port" ]; then
      echo "clientPort=$port"
      echo "clientPortAddress=127.0.0.1"
    fi
    echo "maxClientCnxns=0"
    echo "4lw.commands.whitelist=ruok,srvr,stat,cons"
    echo "admin.enableServer=false"
    echo "standaloneEnabled=true"
    for line in "$@"; do echo "$line"; done
  } >"$dir/zoo.cfg"
}

ensure_zookeeper() {
  export DLOCK_ZK_URL="${DLOCK_ZK_URL:-zk://127.0.0.1:2181/dlock-test}"
  ensure_zookeeper_package
  if ! zk_serving 2181; then
    log "starting ZooKeeper on 127.0.0.1:2181"
    stop_zk "$ZK_RUN_DIR/single"
    write_zk_cfg "$ZK_RUN_DIR/single" 2181
    start_zk "$ZK_RUN_DIR/single"
    wait_for 60 "ZooKeeper on 127.0.0.1:2181" zk_serving 2181
  fi
  log "ZooKeeper ready at 127.0.0.1:2181"
}

# ZooKeeper over TLS on 127.0.0.1:2281 (its only client port): Netty, PEM key and
# trust stores, client certificates required (ssl.clientAuth=need). Certificates
# as make_server_tls_dir's: DIR/ca.crt, DIR/client.{crt,key}, DIR/other-ca.crt (a
# CA that did not sign the server's certificate).
ZK_TLS_DIR="${TMPDIR:-/tmp}/dlock-zookeeper-tls"

# zk_tls_serving: the TLS server answers `srvr` through a verified TLS connection.
zk_tls_serving() {
  local d=$ZK_TLS_DIR/certs
  printf srvr | timeout 3 openssl s_client -quiet -connect 127.0.0.1:2281 -verify_return_error \
    -CAfile "$d/ca.crt" -cert "$d/client.crt" -key "$d/client.key" 2>/dev/null | grep "^Mode: " >/dev/null
}

ensure_zookeeper_tls() {
  local d=$ZK_TLS_DIR/certs dir=$ZK_TLS_DIR/server
  export DLOCK_ZK_TLS_DIR="$d"
  export DLOCK_ZK_TLS_URL="${DLOCK_ZK_TLS_URL:-zks://127.0.0.1:2281/dlock-test?tls_ca=$d/ca.crt&tls_cert=$d/client.crt&tls_key=$d/client.key}"
  ensure_zookeeper_package
  if [ -f "$d/ca.crt" ] && zk_tls_serving; then
    log "ZooKeeper with TLS already running on 127.0.0.1:2281"
    return
  fi
  log "starting ZooKeeper with TLS (client certificates required) on 127.0.0.1:2281"
  stop_zk "$dir"
  make_server_tls_dir "$d" "$(id -un)"
  cat "$d/server.key" "$d/server.crt" >"$d/server.pem"
  write_zk_cfg "$dir" "" "secureClientPort=2281" "secureClientPortAddress=127.0.0.1" \
    "serverCnxnFactory=org.apache.zookeeper.server.NettyServerCnxnFactory" \
    "ssl.keyStore.location=$d/server.pem" "ssl.keyStore.type=PEM" \
    "ssl.trustStore.location=$d/ca.crt" "ssl.trustStore.type=PEM" "ssl.clientAuth=need"
  start_zk "$dir"
  wait_for 60 "ZooKeeper with TLS on 127.0.0.1:2281" zk_tls_serving
  log "ZooKeeper with TLS ready at 127.0.0.1:2281"
}

ensure_zookeeper_ensemble() {
  export DLOCK_ZK_ENSEMBLE_URL="${DLOCK_ZK_ENSEMBLE_URL:-zk://127.0.0.1:2191,127.0.0.1:2192,127.0.0.1:2193/dlock-test}"
  export DLOCK_ZK_ENSEMBLE_DIR="$ZK_RUN_DIR/ensemble"
  ensure_zookeeper_package
  if zk_serving 2191 && zk_serving 2192 && zk_serving 2193; then
    log "ZooKeeper ensemble already running on 127.0.0.1:2191-2193"
    return
  fi
  log "starting a 3-node ZooKeeper ensemble on 127.0.0.1:2191-2193"
  local i servers=()
  for i in 1 2 3; do
    stop_zk "$DLOCK_ZK_ENSEMBLE_DIR/$i"
    servers+=("server.$i=127.0.0.1:$((2890 + i)):$((3890 + i))")
  done
  for i in 1 2 3; do
    write_zk_cfg "$DLOCK_ZK_ENSEMBLE_DIR/$i" $((2190 + i)) "${servers[@]}"
    echo "$i" >"$DLOCK_ZK_ENSEMBLE_DIR/$i/data/myid"
  done
  for i in 1 2 3; do start_zk "$DLOCK_ZK_ENSEMBLE_DIR/$i"; done
  for i in 1 2 3; do wait_for 90 "ZooKeeper ensemble node $i" zk_serving $((2190 + i)); done
  log "ZooKeeper ensemble ready"
}

ETCD_RUN_DIR="${TMPDIR:-/tmp}/dlock-etcd"

# etcd_serving PORT: does the member on PORT answer as part of a healthy cluster?
etcd_serving() {
  ETCDCTL_API=3 etcdctl --endpoints="http://127.0.0.1:$1" --command-timeout=2s endpoint health >/dev/null 2>&1
}

# etcd_port MEMBER (0, 1, 2): the member's client port.
etcd_port() { echo $((2379 + 10000 * $1)); }

# etcd_leader: prints the member (0, 1, 2) that leads the cluster now.
etcd_leader() {
  local i
  for i in 0 1 2; do
    if ETCDCTL_API=3 etcdctl --endpoints="http://127.0.0.1:$(etcd_port "$i")" --command-timeout=2s \
      endpoint status -w simple 2>/dev/null | awk -F', ' '{ exit !($5 == "true") }'; then
      echo "$i"
      return 0
    fi
  done
  return 1
}

# stop_etcd MEMBER: stops the member, bounded.
stop_etcd() { stop_pid "$ETCD_RUN_DIR/$1/etcd.pid" etcd "etcd member $1"; }

# ensure_etcd: a 3-member etcd cluster (Debian's etcd-server) on 127.0.0.1, client
# ports 2379, 12379, 22379 (peers one above), each member started from its own
# start.sh so scripts/server-fault can restart it with its data.
ensure_etcd() {
  export DLOCK_ETCD_URL="${DLOCK_ETCD_URL:-etcd://127.0.0.1:2379,127.0.0.1:12379,127.0.0.1:22379/dlock-test}"
  ensure_protoc
  command -v etcd >/dev/null 2>&1 || apt_install etcd-server
  command -v etcdctl >/dev/null 2>&1 || apt_install etcd-client
  if etcd_serving 2379 && etcd_serving 12379 && etcd_serving 22379; then
    log "etcd cluster already running on 127.0.0.1:2379,12379,22379"
    return
  fi
  log "starting a 3-member etcd cluster on 127.0.0.1:2379,12379,22379"
  local i cluster=""
  for i in 0 1 2; do
    stop_etcd "$i"
    cluster+="${cluster:+,}e$i=http://127.0.0.1:$(($(etcd_port $i) + 1))"
  done
  for i in 0 1 2; do
    local dir="$ETCD_RUN_DIR/$i" port
    port=$(etcd_port $i)
    rm -rf "$dir" && mkdir -p "$dir"
    cat >"$dir/start.sh" <<START
#!/bin/sh
cd "$dir"
setsid etcd --name e$i --data-dir "$dir/data" \\
  --listen-client-urls http://127.0.0.1:$port --advertise-client-urls http://127.0.0.1:$port \\
  --listen-peer-urls http://127.0.0.1:$((port + 1)) --initial-advertise-peer-urls http://127.0.0.1:$((port + 1)) \\
  --initial-cluster $cluster --initial-cluster-state new --initial-cluster-token dlock-test \\
  --heartbeat-interval 50 --election-timeout 500 >>"$dir/etcd.log" 2>&1 </dev/null &
echo \$! >"$dir/etcd.pid"
START
    sh "$dir/start.sh"
  done
  for i in 0 1 2; do wait_for 60 "etcd member $i" etcd_serving "$(etcd_port $i)"; done
  log "etcd cluster ready"
}

# An etcd member that takes TLS connections only, with client certificates and
# password authentication (etcd's auth enabled), on 127.0.0.1:2479 (peer 2480): its
# certificates from a throwaway CA (DIR/ca.crt, DIR/client.{crt,key};
# DIR/other-ca.crt did not sign it). Users: root (ETCD_TLS_ROOT_PASSWORD) and dlock
# (ETCD_TLS_DLOCK_PASSWORD), whose role may read and write the dlock-test prefix only.
# Sign-in tokens lapse after 3 s unused (--auth-token-ttl), so clients renew them.
ETCD_TLS_DIR="${TMPDIR:-/tmp}/dlock-etcd-tls"
ETCD_TLS_ROOT_PASSWORD=dlock-etcd-root
ETCD_TLS_DLOCK_PASSWORD=dlock-etcd-pass

# etcd_tls_ctl ARGS…: etcdctl towards the TLS member, as root.
etcd_tls_ctl() {
  ETCDCTL_API=3 etcdctl --endpoints=https://127.0.0.1:2479 --command-timeout=3s \
    --cacert="$ETCD_TLS_DIR/ca.crt" --cert="$ETCD_TLS_DIR/client.crt" --key="$ETCD_TLS_DIR/client.key" "$@"
}

# etcd_tls_ok: the TLS member answers the dlock user, and (authentication on) not a
# client without credentials.
etcd_tls_ok() {
  etcd_tls_ctl --user "dlock:$ETCD_TLS_DLOCK_PASSWORD" get --prefix dlock-test --keys-only --limit 1 >/dev/null 2>&1 \
    && ! etcd_tls_ctl get --prefix dlock-test --keys-only --limit 1 >/dev/null 2>&1
}

ensure_etcd_tls() {
  export DLOCK_ETCD_TLS_DIR="$ETCD_TLS_DIR"
  ensure_protoc
  command -v etcd >/dev/null 2>&1 || apt_install etcd-server
  command -v etcdctl >/dev/null 2>&1 || apt_install etcd-client
  if [ -f "$ETCD_TLS_DIR/ca.crt" ] && etcd_tls_ok; then
    log "etcd with TLS and authentication already running on 127.0.0.1:2479"
    return
  fi
  stop_pid "$ETCD_TLS_DIR/etcd.pid" etcd "the TLS etcd member"
  make_tls_certs "$ETCD_TLS_DIR"
  make_tls_certs "$ETCD_TLS_DIR/other" && cp "$ETCD_TLS_DIR/other/ca.crt" "$ETCD_TLS_DIR/other-ca.crt"
  chmod 600 "$ETCD_TLS_DIR/server.key"
  log "starting etcd with TLS, client certificates and authentication on 127.0.0.1:2479"
  # From a start.sh of its own, so scripts/server-fault can restart it with its data.
  cat >"$ETCD_TLS_DIR/start.sh" <<START
#!/bin/sh
setsid etcd --name tls --data-dir "$ETCD_TLS_DIR/data" \\
  --listen-client-urls https://127.0.0.1:2479 --advertise-client-urls https://127.0.0.1:2479 \\
  --listen-peer-urls http://127.0.0.1:2480 --initial-advertise-peer-urls http://127.0.0.1:2480 \\
  --initial-cluster tls=http://127.0.0.1:2480 --initial-cluster-state new \\
  --initial-cluster-token dlock-test-tls \\
  --cert-file "$ETCD_TLS_DIR/server.crt" --key-file "$ETCD_TLS_DIR/server.key" \\
  --trusted-ca-file "$ETCD_TLS_DIR/ca.crt" --client-cert-auth --auth-token-ttl 3 \\
  --heartbeat-interval 50 --election-timeout 500 >>"$ETCD_TLS_DIR/etcd.log" 2>&1 </dev/null &
echo \$! >"$ETCD_TLS_DIR/etcd.pid"
START
  sh "$ETCD_TLS_DIR/start.sh"
  wait_for 60 "the TLS etcd member" etcd_tls_ctl endpoint health
  etcd_tls_ctl user add "root:$ETCD_TLS_ROOT_PASSWORD" >/dev/null || fail "etcd: user root"
  etcd_tls_ctl role add root >/dev/null && etcd_tls_ctl user grant-role root root >/dev/null \
    || fail "etcd: the root role"
  etcd_tls_ctl user add "dlock:$ETCD_TLS_DLOCK_PASSWORD" >/dev/null || fail "etcd: user dlock"
  etcd_tls_ctl role add dlock >/dev/null || fail "etcd: role dlock"
  etcd_tls_ctl role grant-permission dlock --prefix=true readwrite dlock-test >/dev/null \
    || fail "etcd: the dlock role's permission"
  etcd_tls_ctl user grant-role dlock dlock >/dev/null || fail "etcd: the dlock user's role"
  etcd_tls_ctl auth enable >/dev/null || fail "etcd: auth enable"
  wait_for 30 "the TLS etcd member with authentication" etcd_tls_ok
  log "etcd with TLS and authentication ready"
}

# A Redis Sentinel deployment on 127.0.0.1: a master and two replicas on 6400–6402
# and three sentinels on 26400–26402 (Debian's redis-sentinel) monitoring it as
# dlock-master, quorum 2, a master down after 1 s. Each server runs from a config
# file of its own that Sentinel rewrites (CONFIG REWRITE), so a restarted node comes
# back in the role the last failover gave it, as a deployed one does. No persistence.
SENTINEL_RUN_DIR="${TMPDIR:-/tmp}/dlock-sentinel"

# use_sentinel_variant plain|tls: which deployment the sentinel_* functions act on:
# the plain one (above), or one like it where every connection — clients,
# replication, sentinels — is TLS with the redis-tls certificates (client
# certificate required): master dlock-tls-master, servers on 6500–6502, sentinels on
# 26500–26502.
use_sentinel_variant() {
  case "$1" in
    plain)
      SENTINEL_TLS="" SENTINEL_MASTER_NAME=dlock-master
      SENTINEL_DATA_PORTS="6400 6401 6402" SENTINEL_PORTS="26400 26401 26402"
      SENTINEL_CLI=redis-cli
      ;;
    tls)
      SENTINEL_TLS=1 SENTINEL_MASTER_NAME=dlock-tls-master
      SENTINEL_DATA_PORTS="6500 6501 6502" SENTINEL_PORTS="26500 26501 26502"
      SENTINEL_CLI=redis_tls_cli
      ;;
    *) fail "unknown Sentinel deployment '$1' (plain or tls)" ;;
  esac
}
use_sentinel_variant plain

# sentinel_variant_of LABEL: the deployment behind a Sentinel label.
sentinel_variant_of() {
  case "$1" in
    redis-sentinel | redis-sentinel-ack) echo plain ;;
    redis-sentinel-tls) echo tls ;;
    *) fail "'$1' is not a Sentinel label (redis-sentinel, redis-sentinel-ack, redis-sentinel-tls)" ;;
  esac
}

# sentinel_master_port: the port of the master the first answering sentinel names.
sentinel_master_port() {
  local p
  for p in $SENTINEL_PORTS; do
    if "$SENTINEL_CLI" -h 127.0.0.1 -p "$p" sentinel get-master-addr-by-name "$SENTINEL_MASTER_NAME" 2>/dev/null \
      | sed -n 2p | grep -E '^[0-9]+$'; then
      return 0
    fi
  done
  return 1
}

# sentinel_ok: every sentinel sees the master, its 2 replicas and the 2 other
# sentinels, and the master they name is master with 2 replicas linked — a failover
# can happen now.
sentinel_ok() {
  local master p
  master=$(sentinel_master_port) || return 1
  "$SENTINEL_CLI" -h 127.0.0.1 -p "$master" info replication 2>/dev/null | tr -d '\r' \
    | grep -qx 'connected_slaves:2' || return 1
  "$SENTINEL_CLI" -h 127.0.0.1 -p "$master" role 2>/dev/null | head -1 | grep -qx master || return 1
  for p in $SENTINEL_PORTS; do
    local info
    info=$("$SENTINEL_CLI" -h 127.0.0.1 -p "$p" sentinel master "$SENTINEL_MASTER_NAME" 2>/dev/null | tr -d '\r' | paste -sd' ')
    [[ " $info " == *" port $master "* ]] || return 1
    [[ " $info " == *" num-slaves 2 "* ]] || return 1
    [[ " $info " == *" num-other-sentinels 2 "* ]] || return 1
    [[ " $info " == *" flags master "* ]] || return 1
  done
}

# sentinel_dir PORT: the directory of the deployment's server on PORT.
sentinel_dir() { echo "$SENTINEL_RUN_DIR/$1"; }

# stop_sentinel_node PORT: stops the server or sentinel on PORT (bounded).
stop_sentinel_node() {
  local dir
  dir=$(sentinel_dir "$1")
  "$SENTINEL_CLI" -h 127.0.0.1 -p "$1" shutdown nosave >/dev/null 2>&1 || true
  stop_pid "$dir/redis.pid" redis "Redis on port $1"
}

# write_sentinel_node PORT KIND [MASTER_PORT]: the config and start.sh of a data node
# (KIND server) or a sentinel (KIND sentinel).
write_sentinel_node() {
  local port=$1 kind=$2 master=${3:-} dir
  dir=$(sentinel_dir "$port")
  rm -rf "$dir" && mkdir -p "$dir"
  {
    if [ -n "$SENTINEL_TLS" ]; then
      echo "port 0"
      echo "tls-port $port"
      echo "tls-cert-file $REDIS_TLS_DIR/server.crt"
      echo "tls-key-file $REDIS_TLS_DIR/server.key"
      echo "tls-ca-cert-file $REDIS_TLS_DIR/ca.crt"
      echo "tls-auth-clients yes"
      echo "tls-replication yes"
    else
      echo "port $port"
    fi
    echo "bind 127.0.0.1"
    echo "daemonize yes"
    echo "dir $dir"
    echo "pidfile $dir/redis.pid"
    echo "logfile $dir/redis.log"
    if [ "$kind" = sentinel ]; then
      echo "sentinel monitor $SENTINEL_MASTER_NAME 127.0.0.1 $master 2"
      echo "sentinel down-after-milliseconds $SENTINEL_MASTER_NAME 1000"
      echo "sentinel failover-timeout $SENTINEL_MASTER_NAME 10000"
      echo "sentinel parallel-syncs $SENTINEL_MASTER_NAME 2"
    else
      echo 'save ""'
      echo "appendonly no"
      # A replica that must resync in full (the old master after a failover) gets
      # the data at once, not after the default 5 s wait for more replicas.
      echo "repl-diskless-sync-delay 0"
      [ -n "$master" ] && echo "replicaof 127.0.0.1 $master"
    fi
  } >"$dir/$kind.conf"
  {
    echo "#!/bin/sh"
    echo "# Starts this node of the Sentinel deployment (written by scripts/lib/services.sh)."
    if [ "$kind" = sentinel ]; then
      echo "exec redis-sentinel $dir/sentinel.conf"
    else
      echo "exec redis-server $dir/server.conf"
    fi
  } >"$dir/start.sh"
}

# ensure_redis_sentinel_tls: the TLS deployment (use_sentinel_variant tls).
ensure_redis_sentinel_tls() {
  ensure_redis_tls
  use_sentinel_variant tls
  start_sentinel_deployment
  use_sentinel_variant plain
}

ensure_redis_sentinel() {
  use_sentinel_variant plain
  export DLOCK_REDIS_SENTINEL_URL="${DLOCK_REDIS_SENTINEL_URL:-redis+sentinel://127.0.0.1:26400,127.0.0.1:26401,127.0.0.1:26402/$SENTINEL_MASTER_NAME}"
  export DLOCK_REDIS_SENTINEL_ACK_URL="${DLOCK_REDIS_SENTINEL_ACK_URL:-$DLOCK_REDIS_SENTINEL_URL}"
  ensure_redis_server_binary
  start_sentinel_deployment
}

# start_sentinel_deployment: the deployment use_sentinel_variant chose, reused if it
# serves, else started afresh.
start_sentinel_deployment() {
  ensure_redis_server_binary
  command -v redis-sentinel >/dev/null 2>&1 || apt_install redis-sentinel
  if sentinel_ok; then
    log "Redis Sentinel deployment already running (master on $(sentinel_master_port))"
    return
  fi
  log "starting Redis Sentinel${SENTINEL_TLS:+ over TLS}: servers $SENTINEL_DATA_PORTS, sentinels $SENTINEL_PORTS on 127.0.0.1"
  local p first=""
  for p in $SENTINEL_PORTS $SENTINEL_DATA_PORTS; do stop_sentinel_node "$p"; done
  for p in $SENTINEL_DATA_PORTS; do
    if [ -z "$first" ]; then
      first=$p
      write_sentinel_node "$p" server
    else
      write_sentinel_node "$p" server "$first"
    fi
    sh "$(sentinel_dir "$p")/start.sh" || fail "Redis on port $p did not start (see $(sentinel_dir "$p")/redis.log)"
  done
  for p in $SENTINEL_PORTS; do
    write_sentinel_node "$p" sentinel "$first"
    sh "$(sentinel_dir "$p")/start.sh" || fail "the sentinel on port $p did not start (see $(sentinel_dir "$p")/redis.log)"
  done
  wait_for 60 "the Sentinel deployment (master, 2 replicas, 3 sentinels agreeing)" sentinel_ok
  log "Redis Sentinel ready (master $SENTINEL_MASTER_NAME on 127.0.0.1:$first)"
}

# ensure_redlock: three independent Redis masters on 127.0.0.1:6410–6412 for Redlock
# (no replication between them), each from its own start.sh (scripts/server-fault
# restarts or freezes one).
ensure_redlock() {
  export DLOCK_REDLOCK_URL="${DLOCK_REDLOCK_URL:-redlock://127.0.0.1:6410,127.0.0.1:6411,127.0.0.1:6412}"
  ensure_redis_server_binary
  ensure_redlock_nodes "" redis-cli start_redis 6410 6411 6412
}

# ensure_redlock_nodes WHAT CLI START PORT…: a Redis node on each PORT that CLI can
# ping, each started with START when it does not answer (WHAT: " with TLS" or "").
ensure_redlock_nodes() {
  local what=$1 cli=$2 start=$3 p
  shift 3
  for p in "$@"; do
    if ! "$cli" -h 127.0.0.1 -p "$p" ping >/dev/null 2>&1; then
      log "starting a Redlock node$what on 127.0.0.1:$p"
      stop_redis_at "$p"
      "$start" "$p"
    fi
  done
  log "Redlock nodes$what ready at 127.0.0.1:$(echo "$@" | sed 's/ /, /g')"
}

# ensure_redlock_tls: three independent TLS-only Redis masters on 127.0.0.1:6420–6422
# (client certificates required, the redis-tls certificates) for Redlock over TLS
# (`redlocks://`).
ensure_redlock_tls() {
  ensure_redis_tls # the certificates
  ensure_redlock_nodes " with TLS" redis_tls_cli start_redis_tls 6420 6421 6422
}

# ensure_backend LABEL: make the backend behind a DLOCK_TEST_BACKENDS label usable.
# nats_jetstream PORT: a NATS server on 127.0.0.1:PORT answers with JetStream on
# (its INFO line says so).
nats_jetstream() {
  timeout 3 bash -c "exec 3<>/dev/tcp/127.0.0.1/$1 && head -n 1 <&3" 2>/dev/null | grep -q '"jetstream":true'
}

# nats_js_ready PORT: JetStream on 127.0.0.1:PORT answers its API (after a restart
# it recovers its streams first).
nats_js_ready() {
  timeout 5 bash -c "exec 3<>/dev/tcp/127.0.0.1/$1 && printf 'CONNECT {\"verbose\":false}\r\nSUB _dlock_ready 1\r\nPUB \$JS.API.INFO _dlock_ready 0\r\n\r\n' >&3 &&
    while IFS= read -r -t 3 line <&3; do case \$line in *'\"streams\"'*) exit 0 ;; esac; done; exit 1" 2>/dev/null
}

# NATS_OWN_PORT: where the project's own NATS server listens, when the machine's
# on 4222 does not answer with JetStream.
NATS_OWN_PORT=4322

# ensure_nats: a NATS server with JetStream for the `nats` label — the machine's on
# 127.0.0.1:4222 when it answers with JetStream on, else the project's own
# (Debian's nats-server) on 127.0.0.1:$NATS_OWN_PORT with its store under $TMPDIR,
# started from its own start.sh (scripts/server-fault restarts it with its store).
ensure_nats() {
  if nats_jetstream 4222; then
    export DLOCK_NATS_URL="${DLOCK_NATS_URL:-nats://127.0.0.1:4222}"
    log "NATS with JetStream ready at 127.0.0.1:4222"
    return
  fi
  local port=$NATS_OWN_PORT dir="${TMPDIR:-/tmp}/dlock-nats-$NATS_OWN_PORT"
  if ! nats_jetstream "$port"; then
    command -v nats-server >/dev/null 2>&1 || apt_install nats-server
    mkdir -p "$dir/store"
    cat >"$dir/start.sh" <<EOF
#!/bin/sh
setsid nats-server -a 127.0.0.1 -p $port -js -sd "$dir/store" -l "$dir/nats.log" -P "$dir/nats.pid" </dev/null >/dev/null 2>&1 &
EOF
    log "starting NATS with JetStream on 127.0.0.1:$port"
    sh "$dir/start.sh"
    wait_for 30 "NATS with JetStream on port $port" nats_jetstream "$port"
  fi
  export DLOCK_NATS_URL="nats://127.0.0.1:$port"
  log "NATS with JetStream ready at 127.0.0.1:$port"
}

ensure_backend() {
  case "$1" in
    memory | sqlite) ;; # in-process / a file: nothing to start
    mysql) ensure_mysql && ensure_mysql_tls ;;
    postgres) ensure_postgres && ensure_postgres_tls ;;
    mysql-tls) ensure_mysql && ensure_mysql_tls ;;
    postgres-tls) ensure_postgres && ensure_postgres_tls ;;
    postgres-session | postgres-pgbouncer) ensure_postgres && ensure_pgbouncer ;;
    mysql-session) ensure_mysql ;;

    redis | redis-polling) ensure_redis ;;
    redis-cluster) ensure_redis_cluster ;;
    redis-tls) ensure_redis_tls ;;
    redis-cluster-tls) ensure_redis_cluster_tls ;;
    zk) ensure_zookeeper ;;
    zk-ensemble) ensure_zookeeper_ensemble ;;
    zk-tls) ensure_zookeeper_tls ;;
    etcd) ensure_etcd ;;
    etcd-tls) ensure_etcd_tls ;;
    nats) ensure_nats ;;
    redis-sentinel | redis-sentinel-ack) ensure_redis_sentinel ;;
    redis-sentinel-tls) ensure_redis_sentinel_tls ;;
    redlock) ensure_redlock ;;
    redlock-tls) ensure_redlock_tls ;;
    *) fail "unknown backend '$1' in DLOCK_TEST_BACKENDS (known: $ALL_BACKENDS)" ;;
  esac
}
