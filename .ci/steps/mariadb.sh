#!/usr/bin/env bash
# The MariaDB token-enforcement recipe test (tests/integration/recipes.rs)
# needs MariaDB on 127.0.0.1:3306 (root, no password, database `test`); with
# CI=true a missing MariaDB fails that test. Starts it if it is installed but
# not running; does nothing when it already answers.
set -euo pipefail

ping() { mariadb-admin --protocol=tcp -h 127.0.0.1 -P 3306 -u root ping >/dev/null 2>&1; }

if ping; then
  echo "mariadb: running"
else
  echo "mariadb: not answering on 127.0.0.1:3306; starting it"
  if [ -x /etc/init.d/mariadb ]; then
    /etc/init.d/mariadb start || true
  fi
  for _ in $(seq 1 30); do
    ping && break
    sleep 1
  done
fi
if ! ping; then
  echo "mariadb: not available on 127.0.0.1:3306; the MariaDB recipe test will fail" >&2
  exit 1
fi
mariadb --protocol=tcp -h 127.0.0.1 -P 3306 -u root -e 'CREATE DATABASE IF NOT EXISTS test'
# Databases of earlier, interrupted test runs.
for db in $(mariadb --protocol=tcp -h 127.0.0.1 -P 3306 -u root -N -e "SHOW DATABASES LIKE 'palisade\_recipe\_%'"); do
  mariadb --protocol=tcp -h 127.0.0.1 -P 3306 -u root -e "DROP DATABASE IF EXISTS \`$db\`" || true
done
