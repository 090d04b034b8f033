#!/usr/bin/env bash
# Headless Chromium for the CLI report test (tests/cli/test_report.py).
# Idempotent: installs the Debian packages chromium and chromium-driver with
# apt-get only when /usr/bin/chromium is missing. Needs root (or sudo) then.
set -euo pipefail

if [[ -x /usr/bin/chromium ]]; then
  exit 0
fi
SUDO=""
if [[ $(id -u) -ne 0 ]]; then
  command -v sudo >/dev/null 2>&1 || { echo "install-chromium: need root or sudo" >&2; exit 1; }
  SUDO=sudo
fi
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq >&2
$SUDO apt-get install -y -qq chromium chromium-driver >&2
[[ -x /usr/bin/chromium ]] || { echo "install-chromium: /usr/bin/chromium still missing" >&2; exit 1; }
