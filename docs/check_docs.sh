#!/usr/bin/env bash
# The API reference of include/fsdp, built as docs/Doxyfile says, into OUT_DIR
# (`make docs`: build/docs; the test Docs.EveryPublicNameHasABrief: a
# directory of its own in the build tree). Fails on any Doxygen warning (an
# undocumented public name is one: WARN_IF_UNDOCUMENTED) and on any name
# docs/check_briefs.pl finds without a brief.
#   bash docs/check_docs.sh OUT_DIR
set -euo pipefail
[ $# -eq 1 ] || { echo "usage: docs/check_docs.sh OUT_DIR" >&2; exit 2; }
out=$(realpath -m "$1")
cd "$(dirname "${BASH_SOURCE[0]}")/.."   # docs/Doxyfile's paths are the repository's

if ! command -v doxygen >/dev/null 2>&1; then
  echo "doxygen is not installed: \`make deps\` installs it (it is in the Makefile's TEST_DEBS)" >&2
  exit 1
fi

rm -rf "$out"
mkdir -p "$out"
log="$out/doxygen.log"
rc=0
{ cat docs/Doxyfile; echo "OUTPUT_DIRECTORY = \"$out\""; echo "WARN_LOGFILE ="; } |
  doxygen - >"$log" 2>&1 || rc=$?
if [ "$rc" -ne 0 ] || [ -s "$log" ]; then
  cat "$log" >&2
  echo "doxygen docs/Doxyfile: exit $rc, $(grep -c . "$log") lines of warnings above; each one fails" \
       "(an undocumented public name of include/fsdp: give it a // comment right above it)" >&2
  exit 1
fi
perl docs/check_briefs.pl "$out/xml"
echo "API reference: $out/html/index.html"
