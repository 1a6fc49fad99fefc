#!/usr/bin/env bash
# Debian's Chromium for the dashboard's browser test, installed the way postgres.sh installs PostgreSQL.
#
#   scripts/chromium.sh ensure    install the 'chromium' package with apt-get if no chromium binary is found
#   scripts/chromium.sh path      print the binary the tests will use (exit 1 if none)
#
# The tests start it themselves (headless, no sandbox as root, no background networking, a fresh
# profile); GPUFOLD_CHROMIUM names another binary.
set -euo pipefail

PROG="chromium.sh"
log() { printf '%s: %s\n' "$PROG" "$*" >&2; }
die() { printf '%s: error: %s\n' "$PROG" "$*" >&2; exit 1; }

find_chromium() {
    local candidate
    for candidate in "${GPUFOLD_CHROMIUM:-}" /usr/bin/chromium /usr/bin/chromium-browser; do
        if [[ -n "$candidate" && -x "$candidate" ]]; then printf '%s\n' "$candidate"; return 0; fi
    done
    return 1
}

install_chromium() {
    [[ $EUID -eq 0 ]] || die "chromium not found and not root to install it; install Debian's 'chromium' package"
    command -v apt-get >/dev/null 2>&1 || die "chromium not found and no apt-get to install it"
    log "chromium not found; installing Debian's 'chromium' package with apt-get"
    {
        DEBIAN_FRONTEND=noninteractive apt-get update -q &&
        DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends chromium fonts-dejavu-core
    } >&2 || die "apt-get could not install chromium"
}

case "${1:-ensure}" in
    ensure)
        if ! find_chromium >/dev/null; then install_chromium; fi
        find_chromium >/dev/null || die "installed 'chromium' but found no binary"
        log "using $(find_chromium)"
        ;;
    path)
        find_chromium
        ;;
    *)
        die "usage: $PROG ensure|path"
        ;;
esac
