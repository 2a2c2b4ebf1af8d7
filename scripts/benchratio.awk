# Reads `go test -bench` output whose sub-benchmarks end in /drover and
# /<peer>, and prints, per case, the median of each metric given in METRIC
# (default cycles/s) and the ratio drover / peer.
#   go test ./lock -run '^$' -bench BenchmarkLock -count 5 | awk -f scripts/benchratio.awk
BEGIN { if (METRIC == "") METRIC = "cycles/s" }
/^Benchmark/ {
	name = $1; sub(/-[0-9]+$/, "", name)
	n = split(name, parts, "/"); impl = parts[n]
	kase = name; sub("/" impl "$", "", kase)
	for (i = 2; i < NF; i++) if ($(i+1) == METRIC) { v[kase, impl, ++cnt[kase, impl]] = $i }
	impls[kase, impl] = 1; cases[kase] = 1
	print
}
function median(k, im,    m, i, j, t, a) {
	m = cnt[k, im]
	for (i = 1; i <= m; i++) a[i] = v[k, im, i]
	for (i = 1; i <= m; i++) for (j = i + 1; j <= m; j++) if (a[j] < a[i]) { t = a[i]; a[i] = a[j]; a[j] = t }
	return (m % 2) ? a[(m + 1) / 2] : (a[m / 2] + a[m / 2 + 1]) / 2
}
END {
	printf "\n%-40s %14s %14s %8s\n", "case (median " METRIC ")", "drover", "peer", "ratio"
	for (k in cases) {
		peer = ""
		for (key in impls) { split(key, kp, SUBSEP); if (kp[1] == k && kp[2] != "drover") peer = kp[2] }
		if (peer == "" || !cnt[k, "drover"]) continue
		d = median(k, "drover"); p = median(k, peer)
		printf "%-40s %14.1f %14.1f %7.2fx  (vs %s, %d runs)\n", k, d, p, d / p, peer, cnt[k, "drover"]
	}
}
