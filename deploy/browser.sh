#!/usr/bin/env bash
# Install Debian's chromium for the live-page browser test, if it is missing.
# Playwright drives this browser (TURNLOG_CHROMIUM, default /usr/bin/chromium);
# it never downloads a browser of its own.
set -euo pipefail
SERVICE=browser
HOST=127.0.0.1
LOG_FILE=/dev/null
# shellcheck source=deploy/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

chromium="${TURNLOG_CHROMIUM:-/usr/bin/chromium}"
if [[ -x $chromium ]]; then
    log "chromium present: $("$chromium" --version 2>/dev/null || echo "$chromium")"
    exit 0
fi
if [[ $EUID -ne 0 ]]; then
    die "$chromium not found. Install it as root, then re-run:  sudo apt-get update && sudo apt-get install -y chromium"
fi
command -v apt-get >/dev/null 2>&1 || die "$chromium not found and apt-get is unavailable; install Chromium and set TURNLOG_CHROMIUM"
log "installing Debian's chromium package"
export DEBIAN_FRONTEND=noninteractive
apt-get install -y -q --no-install-recommends chromium >/dev/null 2>&1 || {
    apt-get update -q || die "apt-get update failed"
    apt-get install -y -q --no-install-recommends chromium || die "apt-get install chromium failed"
}
log "chromium installed: $("$chromium" --version 2>/dev/null || echo "$chromium")"
