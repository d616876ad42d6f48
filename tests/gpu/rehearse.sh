#!/usr/bin/env bash
# make rehearse-gpu: the device machine's two calls (docs/GPU.md, "The device
# machine"), run here on the CPU under that machine's conditions, so that the
# one run on a GPU is not spent finding out that the build cannot start.
#
#   PYTHON=.../torch-2.11.0/bin/python HIDE_DEBS="..." bash tests/gpu/rehearse.sh
#
# What is the same as there: tests/gpu/run.sh, called twice with the same
# variables (BUILD_ONLY=1, then SKIP_BUILD=1), a fresh results folder each
# call, the torch the device machine has (PYTHON: torch 2.11), the build
# packages only from the bundle (make gpu-bundle), no network, and the
# second call's time budget as it is there.
# What differs: DEVICE=cpu and SPEED_SHAPE=small (no GPU here); JOBS is this
# machine's; the first call's limits are scaled by TIME_SCALE =
# ceil(DEVICE_CORES / the cores this build can count on), as a build on fewer
# cores takes that much longer (docs/GPU.md gives the build's time here and
# what it means there).
#
# It runs in namespaces of its own (as root, or mapped to root in a user
# namespace), made by unshare, so nothing outside changes:
#  - mount: each Debian package of HIDE_DEBS has the folders it owns in the
#    shared places (headers, CMake package files, sources: /usr/include/X,
#    /usr/share/cmake/X, /usr/src/X, the libraries' cmake/X; a folder no
#    other package owns) covered by an empty folder, and its plain files there (a header, a static library)
#    covered by an empty file: find_package and #include can find them
#    nowhere but in the bundle. Symbolic links are left alone (one such as
#    libz.so points at a library the whole system runs on). The Python
#    modules of HIDE_PYTHON_MODULES (not part of torch; the test suite's
#    venv has them) are replaced by one that fails to import, as where
#    python3 holds torch only.
#  - network: only the loopback interface, up.
#
# Variables (defaults): PYTHON (python3), JOBS (nproc), OUT (runs/rehearse-gpu:
# build/ and measure/, one per call), BUILD (build-rehearse), BUNDLE (gpu-bundle),
# DEVICE_CORES (16), HIDE_DEBS (none), HIDE_PYTHON_MODULES (numpy safetensors),
# REHEARSE_TIME_SCALE (computed, below).
# Exit status: the first failing call's (run.sh: 1 a step failed), else 0.
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/../.."
ROOT=$PWD
PYTHON=${PYTHON:-python3}
JOBS=${JOBS:-$(nproc)}
OUT=${OUT:-runs/rehearse-gpu}
BUILD=${BUILD:-build-rehearse}
BUNDLE=${BUNDLE:-gpu-bundle}
DEVICE_CORES=${DEVICE_CORES:-16}
HIDE_DEBS=${HIDE_DEBS:-}
HIDE_PYTHON_MODULES=${HIDE_PYTHON_MODULES:-numpy safetensors}
export PYTHON JOBS OUT BUILD BUNDLE DEVICE_CORES HIDE_DEBS HIDE_PYTHON_MODULES

if [ "${1:-}" != __inside ]; then
  [ -f "$BUNDLE/MANIFEST" ] || { echo "rehearse-gpu: no bundle at $BUNDLE (make gpu-bundle)" >&2; exit 2; }
  # Private mounts: nothing bound inside is seen outside.
  ns=(--mount --propagation private --net)
  [ "$(id -u)" = 0 ] || ns+=(--map-root-user)
  exec unshare "${ns[@]}" bash "$ROOT/tests/gpu/rehearse.sh" __inside
fi

# ---- inside the namespaces ----------------------------------------------------
ip link set lo up
HIDDEN=$(mktemp -d)
mkdir -p "$HIDDEN/empty"
: >"$HIDDEN/empty-file"

# The shared places a package's own entries sit in.
MULTIARCH=$(${CXX:-c++} -dumpmachine)
SHARED=" /usr/include /usr/local/include /usr/share/cmake /usr/src /usr/lib /usr/lib/$MULTIARCH /usr/lib/cmake /usr/lib/$MULTIARCH/cmake "
n_hidden=0
for pkg in $HIDE_DEBS; do
  dpkg-query -W "$pkg" >/dev/null 2>&1 || continue  # not installed: nothing to hide
  while IFS= read -r p; do
    [[ $SHARED == *" $(dirname "$p") "* ]] && [[ $SHARED != *" $p "* ]] || continue
    if [ -L "$p" ] || [ ! -e "$p" ]; then continue
    # A folder other packages own too (pkgconfig/) is not this package's.
    elif [ -d "$p" ] && [ "$(dpkg-query -S "$p" | sed 's/: [^:]*$//' | tr ',' '\n' | grep -c .)" != 1 ]; then continue
    elif [ -d "$p" ]; then mount --bind "$HIDDEN/empty" "$p"
    else mount --bind "$HIDDEN/empty-file" "$p"; fi
    echo "rehearse-gpu: hidden $p ($pkg)"
    n_hidden=$((n_hidden + 1))
  done < <(dpkg-query -L "$pkg")
done
# What must now be found nowhere (run.sh's own check reads the first three).
for f in /usr/include/nlohmann/json.hpp /usr/include/CLI/CLI.hpp /usr/include/gtest/gtest.h \
         /usr/src/googletest/googletest/CMakeLists.txt; do
  if [ -e "$f" ] && [ -s "$f" ]; then echo "rehearse-gpu: $f is still there" >&2; exit 2; fi
done

# A Python module that fails to import, over each of HIDE_PYTHON_MODULES.
site=$("$PYTHON" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
mkdir -p "$HIDDEN/pymod"
# ModuleNotFoundError, as for a module that is not there (torch catches that
# one where numpy is optional).
echo 'raise ModuleNotFoundError("hidden by make rehearse-gpu: python3 there may hold torch only", name=__name__)' \
  >"$HIDDEN/pymod/__init__.py"
for m in $HIDE_PYTHON_MODULES; do
  [ -d "$site/$m" ] || continue
  mount --bind "$HIDDEN/pymod" "$site/$m"
  echo "rehearse-gpu: hidden the Python module $m"
done
"$PYTHON" -c 'import torch; print("rehearse-gpu: torch", torch.__version__, "at", torch.__file__)'

# The first call's limits, scaled to the cores this build can count on:
# JOBS of its own among what already loads the machine (other builds on a
# shared machine: the one-minute load average), at most JOBS; SCALE =
# ceil(DEVICE_CORES / those cores). REHEARSE_TIME_SCALE overrides it.
load1=$(cut -d' ' -f1 /proc/loadavg)
SCALE=${REHEARSE_TIME_SCALE:-$(awk -v n="$(nproc)" -v j="$JOBS" -v l="$load1" -v d="$DEVICE_CORES" \
  'BEGIN { share = n * j / (l + j); if (share > j) share = j; s = d / share; print (s == int(s)) ? s : int(s) + 1 }')}
echo "rehearse-gpu: $n_hidden entries of $(wc -w <<<"$HIDE_DEBS") Debian packages hidden; network: loopback only;" \
  "JOBS=$JOBS, load average $load1: the build call's limits x $SCALE ($DEVICE_CORES cores there)"
rm -rf "$OUT/build" "$OUT/measure"
summary=$OUT/rehearse-gpu.md
mkdir -p "$OUT"
{ echo "# make rehearse-gpu"
  echo
  echo "$(date -u '+%Y-%m-%d %H:%M UTC'), $(nproc) cores, JOBS=$JOBS, torch $("$PYTHON" -c 'import torch; print(torch.__version__)')"
  echo
  echo "| call | exit | seconds | user+sys s | load average before, after |"
  echo "|---|---:|---:|---:|---|"; } >"$summary"

# call NAME VAR=VALUE...: run.sh as the device machine runs it, timed.
rc_all=0
call() {
  local name=$1 rc=0 t0 t1 c0 c1 l0 l1
  shift
  l0=$(cut -d' ' -f1-3 /proc/loadavg)
  t0=$(date +%s.%N)
  c0=$(awk '{ print $14 + $15 + $16 + $17 }' /proc/$$/stat)  # this shell's and its waited-for children's CPU ticks
  env "$@" DEVICE=cpu SPEED_SHAPE=small PYTHON="$PYTHON" JOBS="$JOBS" BUILD="$BUILD" BUNDLE="$BUNDLE" \
    OUT="$OUT/$name" bash "$ROOT/tests/gpu/run.sh" || rc=$?
  t1=$(date +%s.%N)
  c1=$(awk '{ print $14 + $15 + $16 + $17 }' /proc/$$/stat)
  l1=$(cut -d' ' -f1-3 /proc/loadavg)
  printf '| %s (%s) | %s | %.0f | %.0f | %s; %s |\n' "$name" "$*" "$rc" "$(awk -v a="$t0" -v b="$t1" 'BEGIN { print b - a }')" \
    "$(( (c1 - c0) / $(getconf CLK_TCK) ))" "$l0" "$l1" >>"$summary"
  [ "$rc" = 0 ] || [ "$rc_all" != 0 ] || rc_all=$rc
}
call build BUILD_ONLY=1 TIME_SCALE="$SCALE"
call measure SKIP_BUILD=1
echo >>"$summary"
for name in build measure; do
  echo "## $name: $OUT/$name/test-gpu.md" >>"$summary"
  echo >>"$summary"
  sed -n '/^| step /,/^$/p' "$OUT/$name/test-gpu.md" >>"$summary" 2>/dev/null || true
done
cat "$summary"
rm -rf "$HIDDEN"
exit "$rc_all"
