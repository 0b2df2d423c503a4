#!/usr/bin/env bash
# Prometheus rules: installs Debian's `prometheus` package (promtool, and the
# server the end-to-end test in tests/integration/prometheus_e2e.rs starts)
# if it is missing, then checks the shipped rules and runs their unit tests.
set -euo pipefail
cd "$(dirname "$0")/../.."

if ! command -v promtool >/dev/null || ! command -v prometheus >/dev/null; then
  echo "ci: installing Debian package prometheus"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends prometheus >/dev/null
  # The package enables a system service; CI only needs the binaries. Stop
  # it if an init system started it, so it does not hold port 9090.
  if command -v systemctl >/dev/null && systemctl is-active --quiet prometheus 2>/dev/null; then
    systemctl stop prometheus || true
  fi
fi

promtool --version | head -1
promtool check rules deploy/prometheus/palisade-rules.yml
promtool test rules deploy/prometheus/palisade-rules.test.yml
