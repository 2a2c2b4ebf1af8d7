package flow

import (
	"encoding/json"
	"fmt"
	"math"
	"strconv"
	"strings"
	"time"

	"github.com/droverhq/drover"
)

// Rate is a rate limit: Events per Per, with bursts of up to Burst.
type Rate struct {
	Events float64       `json:"events"`
	Per    time.Duration `json:"per"`
	// Burst is the most tokens the bucket holds (default: one second's
	// worth, at least 1).
	Burst int64 `json:"burst"`
}

// PerSecond returns the rate in tokens per second.
func (r Rate) PerSecond() float64 { return r.Events / r.Per.Seconds() }

// String returns the rate as ParseRate reads it ("500/m").
func (r Rate) String() string {
	unit := map[time.Duration]string{time.Second: "s", time.Minute: "m", time.Hour: "h"}[r.Per]
	if unit == "" {
		unit = r.Per.String()
	}
	return strconv.FormatFloat(r.Events, 'f', -1, 64) + "/" + unit
}

// MarshalJSON writes the rate as {"rate":"500/m","per_second":8.33,"burst":50}.
func (r Rate) MarshalJSON() ([]byte, error) {
	return json.Marshal(struct {
		Rate      string  `json:"rate"`
		PerSecond float64 `json:"per_second"`
		Burst     int64   `json:"burst"`
	}{r.String(), r.PerSecond(), r.Burst})
}

// UnmarshalJSON reads what MarshalJSON writes.
func (r *Rate) UnmarshalJSON(b []byte) error {
	var v struct {
		Rate  string `json:"rate"`
		Burst int64  `json:"burst"`
	}
	if err := json.Unmarshal(b, &v); err != nil {
		return err
	}
	rr, err := ParseRate("rate", v.Rate)
	if err != nil {
		return err
	}
	if v.Burst > 0 {
		rr.Burst = v.Burst
	}
	*r = rr
	return nil
}

// Limits of a rate.
const (
	MaxEventsPerSecond = 1e9
	MinEventsPerSecond = 1.0 / (24 * 3600)
)

const rateRule = "must be N/s, N/m or N/h (or N/DURATION such as 10/30s) with N > 0, between one a day and 1e9 a second"

// ParseRate reads "500/m", "20/s", "1000/h" or "10/30s". field names the
// input in errors.
func ParseRate(field, s string) (Rate, error) {
	bad := &drover.InputError{Field: field, Value: s, Rule: rateRule}
	num, unit, ok := strings.Cut(strings.TrimSpace(s), "/")
	if !ok {
		return Rate{}, bad
	}
	n, err := strconv.ParseFloat(num, 64)
	if err != nil || n <= 0 || math.IsInf(n, 0) || math.IsNaN(n) {
		return Rate{}, bad
	}
	var per time.Duration
	switch unit {
	case "s", "sec", "second":
		per = time.Second
	case "m", "min", "minute":
		per = time.Minute
	case "h", "hour":
		per = time.Hour
	default:
		per, err = time.ParseDuration(unit)
		if err != nil || per <= 0 {
			return Rate{}, bad
		}
	}
	r := Rate{Events: n, Per: per}
	if ps := r.PerSecond(); ps > MaxEventsPerSecond || ps < MinEventsPerSecond {
		return Rate{}, bad
	}
	r.Burst = max(1, int64(math.Ceil(r.PerSecond())))
	return r, nil
}

// CheckBurst returns an InputError unless 1 <= burst <= 1e9.
func CheckBurst(field string, burst int64) error {
	if burst < 1 || burst > 1e9 {
		return &drover.InputError{Field: field, Value: burst, Rule: "must be between 1 and 1e9"}
	}
	return nil
}

// bucketState is a rate limit's shared token bucket.
type bucketState struct {
	// Tokens in the bucket at At (may be negative: a debt of tasks that
	// used more than they reserved).
	Tokens float64 `json:"tokens"`
	At     int64   `json:"at"` // unix nanoseconds
	// Used counts the tokens taken out and not given back: the limit's
	// recorded usage.
	Used int64 `json:"used"`
}

// refill returns the bucket as it stands at now under r.
func (b bucketState) refill(r Rate, now time.Time) bucketState {
	if b.At == 0 {
		return bucketState{Tokens: float64(r.Burst), At: now.UnixNano(), Used: b.Used}
	}
	elapsed := time.Duration(now.UnixNano() - b.At)
	if elapsed > 0 {
		b.Tokens = math.Min(float64(r.Burst), b.Tokens+elapsed.Seconds()*r.PerSecond())
		b.At = now.UnixNano()
	}
	return b
}

// String describes the limit for errors.
func (b bucketState) String() string { return fmt.Sprintf("%.1f tokens, %d used", b.Tokens, b.Used) }
