#!/usr/bin/env bash
# API fuzzing (docs/security.md, "API fuzzing"): schemathesis, a pinned
# version from PyPI in a venv under target/, against the server's own
# OpenAPI document (/v1/openapi.json), once on a fresh SQLite file and once
# on a fresh PostgreSQL database. Fails on any 5xx and on any response whose
# status, content type, headers or body the document does not describe.
#
# Knobs: FUZZ_EXAMPLES (most generated cases per operation, default 200),
# FUZZ_SEED (replay a run: schemathesis prints its seed), FUZZ_BACKENDS
# (default "sqlite postgres").
set -euo pipefail
cd "$(dirname "$0")/../.."
ROOT=$(pwd)

SCHEMATHESIS_VERSION=4.32.5
VENV="$ROOT/target/schemathesis/venv"
EXAMPLES="${FUZZ_EXAMPLES:-200}"
BACKENDS="${FUZZ_BACKENDS:-sqlite postgres}"
ADMIN_TOKEN="fuzz-admin-$RANDOM$RANDOM"

installed=$("$VENV/bin/python" -c 'import importlib.metadata as m; print(m.version("schemathesis"))' 2>/dev/null || true)
if [ "$installed" != "$SCHEMATHESIS_VERSION" ]; then
  echo "ci: installing schemathesis $SCHEMATHESIS_VERSION from PyPI into $VENV"
  rm -rf "$VENV"
  python3 -m venv "$VENV"
  "$VENV/bin/pip" install --quiet --disable-pip-version-check "schemathesis==$SCHEMATHESIS_VERSION"
fi
"$VENV/bin/st" --version

cargo build --quiet
BIN="$ROOT/target/debug/palisade"

WORK=$(mktemp -d)
SERVER_PID=""
PG_ADMIN_URL=""
PG_DB=""

stop_server() {
  if [ -n "$SERVER_PID" ]; then
    kill "$SERVER_PID" 2>/dev/null || true
    wait "$SERVER_PID" 2>/dev/null || true
    SERVER_PID=""
  fi
}

drop_pg_db() {
  if [ -n "$PG_DB" ]; then
    psql "$PG_ADMIN_URL" -qc "DROP DATABASE IF EXISTS \"$PG_DB\" WITH (FORCE)" || true
    PG_DB=""
  fi
}

cleanup() {
  stop_server
  drop_pg_db
  rm -rf "$WORK"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# Starts the server on DATABASE_URL on a free loopback port (port 0: the
# server picks one and logs it), waits until /readyz answers 200, and sets
# BASE_URL.
start_server() {
  local database_url=$1 log=$2
  # A short maximum TTL bounds every waiting acquire: whatever lock the
  # fuzzer leaves held expires within 2 s (wait_ms may be up to 60 s).
  PALISADE_ADMIN_TOKEN="$ADMIN_TOKEN" "$BIN" serve \
    --listen 127.0.0.1:0 \
    --database-url "$database_url" \
    --max-ttl-ms 2000 \
    >"$log" 2>&1 &
  SERVER_PID=$!
  local addr=""
  for _ in $(seq 1 300); do
    addr=$(sed 's/\x1b\[[0-9;]*m//g' "$log" | grep -o 'palisade listening addr=[0-9.:]*' | head -1 | sed 's/.*addr=//' || true)
    [ -n "$addr" ] && break
    if ! kill -0 "$SERVER_PID" 2>/dev/null; then
      echo "ci: palisade serve exited before listening:" >&2
      cat "$log" >&2
      return 1
    fi
    sleep 0.1
  done
  if [ -z "$addr" ]; then
    echo "ci: palisade serve did not log its address in 30 s:" >&2
    cat "$log" >&2
    return 1
  fi
  BASE_URL="http://$addr"
  for _ in $(seq 1 300); do
    if [ "$(curl -s -o /dev/null -w '%{http_code}' "$BASE_URL/readyz")" = 200 ]; then
      return 0
    fi
    sleep 0.1
  done
  echo "ci: $BASE_URL/readyz did not answer 200 in 30 s:" >&2
  cat "$log" >&2
  return 1
}

# Runs schemathesis against the running server; on failure shows the
# server's warnings and errors (5xx are logged there with their cause).
fuzz() {
  local backend=$1 log=$2
  local seed_args=()
  [ -n "${FUZZ_SEED:-}" ] && seed_args=(--seed "$FUZZ_SEED")
  echo "ci: schemathesis against $BASE_URL ($backend, $EXAMPLES examples per operation)"
  # Run from the scratch directory: schemathesis writes nothing into the
  # checkout. The request timeout is above the longest legitimate answer
  # (an acquire waiting at most 60 s).
  if ! (cd "$WORK" && SCHEMATHESIS_HOOKS="$ROOT/.ci/schemathesis_hooks.py" timeout 600 "$VENV/bin/st" --config-file "$ROOT/.ci/schemathesis.toml" run "$BASE_URL/v1/openapi.json" \
    --checks not_a_server_error,status_code_conformance,content_type_conformance,response_headers_conformance,response_schema_conformance \
    --header "Authorization: Bearer $ADMIN_TOKEN" \
    --max-examples "$EXAMPLES" \
    --generation-database none \
    --request-timeout 65 \
    --workers 1 \
    --no-color \
    --output-sanitize false \
    "${seed_args[@]}"); then
    echo "ci: schemathesis failed on $backend; server warnings and errors:" >&2
    sed 's/\x1b\[[0-9;]*m//g' "$log" | grep -E ' (WARN|ERROR) ' | tail -50 >&2 || true
    return 1
  fi
}

FUZZED=()
for backend in $BACKENDS; do
  case "$backend" in
    sqlite)
      start_server "sqlite://$WORK/fuzz.db" "$WORK/sqlite.log"
      ;;
    postgres)
      if [ -z "${PALISADE_TEST_POSTGRES_URL:-}" ]; then
        if [ "${CI:-}" = true ]; then
          echo "ci: PALISADE_TEST_POSTGRES_URL is not set; cannot fuzz on PostgreSQL" >&2
          exit 1
        fi
        echo "ci: PALISADE_TEST_POSTGRES_URL is not set; PostgreSQL fuzzing SKIPPED"
        continue
      fi
      PG_ADMIN_URL="$PALISADE_TEST_POSTGRES_URL"
      # The palisade_t_ prefix lets .ci/run drop it if this run is killed.
      PG_DB="palisade_t_fuzz_$$"
      psql "$PG_ADMIN_URL" -qc "CREATE DATABASE \"$PG_DB\""
      # Same server, user and options; only the database name differs.
      pg_base="${PG_ADMIN_URL%%\?*}"
      pg_query=""
      [ "$pg_base" != "$PG_ADMIN_URL" ] && pg_query="?${PG_ADMIN_URL#*\?}"
      start_server "${pg_base%/*}/$PG_DB$pg_query" "$WORK/postgres.log"
      ;;
    *)
      echo "ci: unknown backend $backend" >&2
      exit 1
      ;;
  esac
  fuzz "$backend" "$WORK/$backend.log"
  FUZZED+=("$backend")
  stop_server
  drop_pg_db
done
echo "ci: schemathesis found nothing on: ${FUZZED[*]}"
