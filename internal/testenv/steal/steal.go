// Package steal reads how much CPU time a virtual machine's hypervisor
// gave other guests while this one had work to run: on a shared machine a
// benchmark run with seconds of it measures the neighbours, and its tail
// latencies are not the code's. The benchmarks report it beside their
// figures.
package steal

import (
	"os"
	"strconv"
	"strings"
	"time"
)

// Total is the machine's steal time so far, all CPUs summed (the eighth
// figure of /proc/stat's cpu line, in ticks of 10 ms); zero where the
// system does not tell it.
func Total() time.Duration {
	raw, err := os.ReadFile("/proc/stat")
	if err != nil {
		return 0
	}
	line, _, _ := strings.Cut(string(raw), "\n")
	f := strings.Fields(line)
	if len(f) < 9 || f[0] != "cpu" {
		return 0
	}
	ticks, err := strconv.ParseInt(f[8], 10, 64)
	if err != nil {
		return 0
	}
	return time.Duration(ticks) * 10 * time.Millisecond // USER_HZ is 100 on Linux
}
