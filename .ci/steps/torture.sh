#!/usr/bin/env bash
# The torture test (docs/reliability.md): both profiles, bounded in time.
# Exits non-zero on any violation the checker finds.
set -euo pipefail
cd "$(dirname "$0")/../.."
cargo build --quiet
./target/debug/palisade torture --profile postgres --duration-secs "${TORTURE_PG_SECS:-60}"
./target/debug/palisade torture --profile sqlite --duration-secs "${TORTURE_SQLITE_SECS:-30}"
