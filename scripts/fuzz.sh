#!/usr/bin/env bash
# Runs every Go fuzz target of the module (each func FuzzXxx(f *testing.F)
# in a _test.go file; new ones are picked up by themselves) for FUZZTIME
# each (default 6s), one at a time, and stops at the first failure. Each
# package's test binary is built once, instrumented for fuzzing, and runs
# each of its targets in turn: what
#   go test -run '^$' -fuzz '^FuzzXxx$' -fuzztime $FUZZTIME ./pkg
# does, without linking the binary again for every target. Inputs that
# widen coverage are kept in go's cache, as go test keeps them. A failing
# input is written to the package's testdata/fuzz/FuzzXxx/: commit it with
# the fix, and every go test runs it from then on.
#
# Usage: scripts/fuzz.sh [REGEXP]   REGEXP selects targets by name (all by
# default); FUZZTIME=1m scripts/fuzz.sh runs each for longer.
set -euo pipefail
cd "$(dirname "$0")/.."

FUZZTIME="${FUZZTIME:-6s}"
only="${1:-.}"
root=$PWD
module=$(go list -m)
cache="$(go env GOCACHE)/fuzz"
bin=$(mktemp -d)
trap 'rm -rf "$bin"' EXIT

# The packages of this module (bench/ and deploy/ are modules of their
# own) and their fuzz targets, as "dir name" lines, dir relative to root.
targets=()
while IFS= read -r dir; do
  for file in "$dir"/*_test.go; do
    [ -e "$file" ] || continue
    while IFS= read -r name; do
      if [[ $name =~ $only ]]; then targets+=("${dir#"$root"} $name"); fi
    done < <(sed -n 's/^func \(Fuzz[A-Za-z0-9_]*\)([A-Za-z_]* \*testing\.F).*/\1/p' "$file")
  done
done < <(go list -e -f '{{.Dir}}' ./... 2>/dev/null)
if [ "${#targets[@]}" -eq 0 ]; then
  echo "fuzz: no fuzz target matches $only" >&2
  exit 1
fi

# files counts the files in dir (0 when it does not exist).
files() { if [ -d "$1" ]; then find "$1" -type f | wc -l; else echo 0; fi; }

start=$SECONDS
built=""
i=0
for t in "${targets[@]}"; do
  i=$((i + 1))
  dir="${t%% *}" name="${t#* }"
  pkg=.
  [ -z "$dir" ] || pkg=".$dir"
  test="$bin/$(echo "pkg$dir" | tr / _).test"
  if [ "$built" != "$pkg" ]; then
    printf '== build %s (%ds so far)\n' "$pkg" $((SECONDS - start))
    go test -c -fuzz=. -o "$test" "$pkg"
    built=$pkg
  fi
  printf '== [%d/%d] %s %s for %s (%ds so far)\n' "$i" "${#targets[@]}" "$pkg" "$name" "$FUZZTIME" $((SECONDS - start))
  for try in 1 2; do
    corpus="$root$dir/testdata/fuzz/$name"
    before=$(files "$corpus")
    out="$bin/$name.out"
    if (cd "$root$dir" && "$test" -test.run '^$' -test.fuzz "^${name}\$" -test.fuzztime "$FUZZTIME" \
      -test.fuzzcachedir "$cache/$module$dir") >"$out" 2>&1; then
      cat "$out"
      break
    fi
    cat "$out"
    # Go's fuzzing engine can end a run with "context deadline exceeded"
    # when the fuzz time runs out under a worker in the middle of an
    # input, and then writes no failing input: not a finding. Run it once
    # more; anything else, or the same twice, is a failure.
    # It can also fail while it gathers its baseline coverage with "open
    # testdata/fuzz/FuzzXxx/<hash>: no such file or directory", naming an
    # input it never wrote (seen once in CI; the same binary and cache
    # passed when run again). The same rule applies.
    after=$(files "$corpus")
    if [ "$try" = 1 ] && [ "$before" = "$after" ] && ! grep -q 'Failing input written' "$out" &&
      { grep -q 'context deadline exceeded' "$out" || grep -q "open testdata/fuzz/$name/[0-9a-f]*: no such file or directory" "$out"; }; then
      printf 'fuzz: %s ended with an error of the fuzzing engine and no failing input: running it once more\n' "$name"
      continue
    fi
    printf 'fuzz: %s in %s FAILED: the failing input is in %s/testdata/fuzz/%s/\n' "$name" "$pkg" "$pkg" "$name" >&2
    exit 1
  done
done
printf '== fuzz: %d targets passed, %s each, in %ds\n' "${#targets[@]}" "$FUZZTIME" $((SECONDS - start))
