#!/usr/bin/env bash
# Headless Chromium for the CLI report test (tests/cli/test_report.py).
#
#   scripts/install-chromium.sh            install if no headless browser is present
#   scripts/install-chromium.sh --dry-run  say what would be installed (apt-get -s), change nothing
#
# Idempotent: does nothing when a browser the test can use is already installed
# (chromium-headless-shell, else chromium). Otherwise installs the lightest one
# the distribution has, without recommended packages: Debian's
# chromium-headless-shell (bookworm and later: about 105 packages on a bare
# system, no systemd or udev) rather than chromium + chromium-driver (about 290).
# Needs root (or sudo) to install. apt's output goes to
# .test-services/install-chromium.log; one line is printed, and the log's end
# only on failure.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
LOG=${CTXGUARD_CHROMIUM_LOG:-$ROOT/.test-services/install-chromium.log}
# Lightest first; the test looks for the same binaries (tests/cli/test_report.py).
PACKAGES=(chromium-headless-shell chromium)
BINARIES=(/usr/bin/chromium-headless-shell /usr/bin/chromium)
DRY_RUN=0

say() { printf 'install-chromium: %s\n' "$*"; }
MIDLINE=0
fail() {
  ((MIDLINE)) && printf '\n' >&2
  say "$*" >&2
  if [[ -s $LOG ]]; then
    printf -- '--- last lines of %s ---\n' "$LOG" >&2
    tail -n 40 "$LOG" >&2
  fi
  exit 1
}

case ${1:-} in
  --dry-run) DRY_RUN=1 ;;
  "") ;;
  *) say "usage: install-chromium.sh [--dry-run]" >&2; exit 2 ;;
esac

installed() {
  local binary
  for binary in "${BINARIES[@]}"; do
    if [[ -x $binary ]]; then
      echo "$binary"
      return 0
    fi
  done
  return 1
}

if ((!DRY_RUN)) && found=$(installed); then
  say "using $found"
  exit 0
fi

command -v apt-get >/dev/null 2>&1 || fail "no apt-get here: install Chromium (headless) yourself"

SUDO=()
if ((!DRY_RUN)) && [[ $(id -u) -ne 0 ]]; then
  command -v sudo >/dev/null 2>&1 || fail "need root or sudo to install a browser"
  SUDO=(sudo)
fi
export DEBIAN_FRONTEND=noninteractive
mkdir -p "$(dirname "$LOG")"
: >"$LOG"

# candidate PACKAGE: true when apt knows a version of PACKAGE to install.
candidate() {
  local version
  version=$(apt-cache policy "$1" 2>>"$LOG" | awk '/Candidate:/ {print $2}')
  [[ -n $version && $version != "(none)" ]]
}

pick() {
  local package
  for package in "${PACKAGES[@]}"; do
    if candidate "$package"; then
      echo "$package"
      return 0
    fi
  done
  return 1
}

if ((DRY_RUN)); then
  package=$(pick) || fail "apt knows none of: ${PACKAGES[*]} (run apt-get update first)"
  plan=$(apt-get -s install --no-install-recommends "$package" 2>>"$LOG") || fail "apt-get -s failed"
  count=$(grep -c '^Inst ' <<<"$plan" || true)
  say "would install $package: $count package(s) (--no-install-recommends)"
  exit 0
fi

"${SUDO[@]}" apt-get update -qq >>"$LOG" 2>&1 || fail "apt-get update failed"
package=$(pick) || fail "apt knows none of: ${PACKAGES[*]}"
printf 'install-chromium: installing %s (log: %s) ... ' "$package" "$LOG"
MIDLINE=1
"${SUDO[@]}" apt-get install -y -q --no-install-recommends "$package" >>"$LOG" 2>&1 ||
  fail "apt-get install $package failed"
count=$(grep -c '^Setting up ' "$LOG" || true)
found=$(installed) || fail "$package is installed but none of ${BINARIES[*]} exists"
printf 'done, %s package(s); using %s\n' "$count" "$found"
