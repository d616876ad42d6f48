#!/usr/bin/env bash
# Render a report in headless Chromium, as tests/test_report.cpp does:
#   tests/browser/render.sh report.html [out.png]   -> out.png (+ out.png.dom.html)
# Needs Debian's chromium (apt-get install chromium). Nothing is fetched: the
# flags below switch off every background request Chromium would make.
set -euo pipefail
html=$(readlink -f "$1")
png=${2:-${1%.html}.png}
profile=$(mktemp -d)
trap 'rm -rf "$profile"' EXIT
flags=(--headless --no-sandbox --disable-gpu --disable-quic --no-first-run
       --disable-background-networking --disable-component-update --disable-sync
       --user-data-dir="$profile" --window-size=1400,1000 --hide-scrollbars)
chromium "${flags[@]}" --screenshot="$png" "file://$html" 2>/dev/null
chromium "${flags[@]}" --dump-dom "file://$html" 2>/dev/null > "$png.dom.html"
python3 "$(dirname "$0")/png_stats.py" "$png"
grep -q 'data-rendered="ok"' "$png.dom.html" && echo "rendered: ok" || { echo "rendered: NOT ok (see #fsdp-errors in $png.dom.html)"; exit 1; }
