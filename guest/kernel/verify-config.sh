#!/usr/bin/env bash
# Checks that every option in a config fragment ended up in the final .config
# with the value the fragment asked for. Kconfig silently drops options whose
# dependencies are unmet (or that were renamed between kernel versions); this
# turns that into a loud failure naming each offending option.
#
# usage: verify-config.sh FRAGMENT DOTCONFIG
set -euo pipefail
fragment=${1:?usage: verify-config.sh FRAGMENT DOTCONFIG}
dotconfig=${2:?usage: verify-config.sh FRAGMENT DOTCONFIG}

bad=0
checked=0
while IFS= read -r line; do
  if [[ $line =~ ^(CONFIG_[A-Za-z0-9_]+)=(.*)$ ]]; then
    name=${BASH_REMATCH[1]} want=${BASH_REMATCH[2]}
    got=$(grep -E "^${name}=" "$dotconfig" | head -n1 | cut -d= -f2- || true)
    checked=$((checked + 1))
    if [[ "$got" != "$want" ]]; then
      echo "verify-config: ${name}: wanted ${want}, got ${got:-<not set>}" >&2
      bad=$((bad + 1))
    fi
  elif [[ $line =~ ^#\ (CONFIG_[A-Za-z0-9_]+)\ is\ not\ set$ ]]; then
    name=${BASH_REMATCH[1]}
    checked=$((checked + 1))
    if grep -qE "^${name}=" "$dotconfig"; then
      echo "verify-config: ${name}: wanted not set, got $(grep -E "^${name}=" "$dotconfig")" >&2
      bad=$((bad + 1))
    fi
  fi
done < "$fragment"

if (( bad > 0 )); then
  echo "verify-config: ${bad} of ${checked} requested options did not survive; fix ${fragment}" >&2
  exit 1
fi
echo "verify-config: all ${checked} requested options set"
