#!/usr/bin/env bash
# Prints, after a failed go test run, the end of each failed top-level
# test's output: the assertion that failed comes last, and a long test's
# log (a live move prints hundreds of lines) would otherwise keep it far
# from the end of the run's output, where a CI excerpt looks.
#   hack/failed-tests.sh LOG [LINES]   (LINES per test, default 40)
set -euo pipefail
log=$1
lines=${2:-40}
awk -v keep="$lines" '
	function flush() {
		if (name == "") return
		from = n > keep ? n - keep + 1 : 1
		printf "\n%s\n", name
		if (from > 1) printf "    [... %d earlier lines ...]\n", from - 1
		for (i = from; i <= n; i++) print buf[i]
		name = ""; n = 0
	}
	/^--- FAIL: / { flush(); name = $0; next }
	name != "" && /^[ \t]/ { buf[++n] = $0; next }
	{ flush() }
	END { flush() }
' "$log" | {
	if IFS= read -r first; then
		echo
		echo "==== failed tests, the last $lines lines of each ===="
		echo "$first"
		cat
	fi
}
