#!/bin/bash
# fsdp-cpp: fails when a layer's archive uses a symbol that only a layer it
# does not depend on defines (cmake/layers.cmake runs it after each build).
#   check_layers.sh <target>=<archive>=<dep,dep,...> ...
# Only strong definitions of fsdp:: symbols count (T D B R): inline functions
# and templates are weak copies in every archive that uses them.
set -euo pipefail
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
declare -A archive deps
for arg in "$@"; do
  IFS='=' read -r name file dep_list <<<"$arg"
  archive[$name]=$file
  deps[$name]=$dep_list
  nm -g --defined-only "$file" 2>/dev/null | awk 'NF == 3 && $2 ~ /^[TDBR]$/ && $3 ~ /4fsdp/ {print $3}' | sort -u >"$tmp/$name.def"
  nm -g --undefined-only "$file" 2>/dev/null | awk '$1 == "U" {print $2}' | sort -u >"$tmp/$name.undef"
done
status=0
for name in "${!archive[@]}"; do
  allowed=",$name,${deps[$name]},"
  for other in "${!archive[@]}"; do
    [[ $allowed == *",$other,"* ]] && continue
    bad=$(comm -12 "$tmp/$name.undef" "$tmp/$other.def")
    if [[ -n $bad ]]; then
      echo "layering error: $name uses symbols of $other, a layer it does not depend on:" >&2
      c++filt <<<"$bad" | head -20 | sed 's/^/  /' >&2
      echo "  (move the code down a layer, or add $other to the DEPS of $name in CMakeLists.txt)" >&2
      status=1
    fi
  done
done
exit $status
