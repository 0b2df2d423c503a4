#!/usr/bin/env bash
# The web UI's browser test (tests/integration/browser.rs) drives Debian's
# headless Chromium; in CI a missing browser fails that test, so install it.
set -euo pipefail
if command -v chromium >/dev/null 2>&1; then
  echo "chromium: $(chromium --version 2>/dev/null || echo installed)"
  exit 0
fi
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq chromium
chromium --version
