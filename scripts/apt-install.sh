#!/usr/bin/env bash
# Install those of the given Debian packages that are missing (idempotent), as root.
# Usage: scripts/apt-install.sh LABEL PACKAGE... (LABEL prefixes the one progress line)
set -euo pipefail
label=$1
shift
missing=()
for pkg in "$@"; do
    dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" || missing+=("$pkg")
done
if [ ${#missing[@]} -gt 0 ]; then
    echo "$label: installing apt packages: ${missing[*]}"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
