#!/usr/bin/env bash
# make gpu-bundle: the build packages a machine without them needs, in one
# folder that travels with the source tree (docs/GPU.md, "The device machine").
#
#   bash tests/gpu/bundle.sh DIR PACKAGE...
#
# A machine lent for a GPU run has torch, CMake and a compiler, but no
# network and none of the Debian packages the build finds beside torch
# (CMakeLists.txt: nlohmann_json, CLI11, GTest). This takes the Debian
# packages themselves (`apt-get download`, unpacked with `dpkg -x`: nothing
# is installed, the system is left as it is) and keeps what the build reads:
#   DIR/usr/include/...          headers (nlohmann/, CLI/)
#   DIR/usr/share/cmake/...      their CMake package files (relocatable:
#                                they find the headers from their own place)
#   DIR/usr/src/googletest/googletest
#                                GoogleTest's sources, built there with the
#                                tests by that machine's compiler
#                                (FSDP_GTEST_SOURCE_DIR): a prebuilt
#                                libgtest.a would carry this compiler's ABI
#                                and libstdc++ version to a compiler we do not
#                                know
#   DIR/MANIFEST                 package, version, sha256 of each .deb
# tests/gpu/run.sh passes DIR to CMake when the system lacks the packages.
#
# The version of each package is the one installed here when it is (what
# this machine's builds and tests use), else apt's candidate. The folder is
# made aside and renamed into place last: an interrupted run leaves no
# half bundle.
set -euo pipefail

[ $# -ge 2 ] || { echo "usage: $0 DIR PACKAGE..." >&2; exit 2; }
DIR=$1
shift
WORK=$(mktemp -d "${DIR%/}.tmp.XXXXXX")
trap 'rm -rf "$WORK"' EXIT
mkdir -p "$WORK/debs" "$WORK/root"

version_of() {  # the installed version, else the candidate ("" when apt knows none)
  local v
  v=$(dpkg-query -W -f='${Status}\t${Version}\n' "$1" 2>/dev/null | awk -F'\t' '$1 == "install ok installed" { print $2 }')
  [ -n "$v" ] || v=$(apt-cache policy "$1" 2>/dev/null | awk '/Candidate:/ { print $2 }')
  [ "$v" = "(none)" ] && v=""
  echo "$v"
}

updated=0
for pkg in "$@"; do
  ver=$(version_of "$pkg")
  if [ -z "$ver" ] && [ "$updated" = 0 ]; then  # apt's lists may be missing or old
    apt-get update -qq
    updated=1
    ver=$(version_of "$pkg")
  fi
  [ -n "$ver" ] || { echo "gpu-bundle: apt knows no package $pkg" >&2; exit 1; }
  # apt-get download writes into the current folder (as root it warns that
  # it downloads unsandboxed: harmless). A failure with lists not updated
  # yet is retried once after an update.
  if ! (cd "$WORK/debs" && apt-get download -qq "$pkg=$ver"); then
    [ "$updated" = 0 ] || exit 1
    apt-get update -qq
    updated=1
    (cd "$WORK/debs" && apt-get download -qq "$pkg=$ver")
  fi
done

: >"$WORK/root/MANIFEST"
for deb in "$WORK"/debs/*.deb; do
  dpkg -x "$deb" "$WORK/root"
  printf '%s\t%s\t%s\n' "$(dpkg-deb -f "$deb" Package)" "$(dpkg-deb -f "$deb" Version)" \
    "$(sha256sum "$deb" | cut -d' ' -f1)" >>"$WORK/root/MANIFEST"
done

# What the build does not read: documentation, pkg-config files, GoogleMock
# and GoogleTest's own tests and samples.
rm -rf "$WORK/root/usr/share/doc" "$WORK/root/usr/share/pkgconfig" "$WORK/root/usr/lib" \
  "$WORK/root/usr/src/googletest/googlemock" "$WORK/root/usr/src/googletest/googletest/"{test,samples,docs}

rm -rf "$DIR"
mv "$WORK/root" "$DIR"
echo "gpu-bundle: $DIR ($(du -sh "$DIR" | cut -f1)):"
cat "$DIR/MANIFEST"
