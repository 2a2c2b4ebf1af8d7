package agentserver

import (
	"encoding/json"
	"fmt"
	"reflect"
	"sort"
	"strconv"
	"time"
)

// listed is an item of a listing with its key's revisions, which order
// items stored within one millisecond as they were written.
type listed[T any] struct {
	v                 T
	createRev, modRev int64
}

// sorted returns the items ordered by key, ascending for order "asc",
// else descending.
func sorted[T any](items []listed[T], order string, key func(listed[T]) string) []T {
	keys := make([]string, len(items))
	for i, it := range items {
		keys[i] = key(it)
	}
	idx := make([]int, len(items))
	for i := range idx {
		idx[i] = i
	}
	sort.SliceStable(idx, func(a, b int) bool {
		if order == "asc" {
			return keys[idx[a]] < keys[idx[b]]
		}
		return keys[idx[a]] > keys[idx[b]]
	})
	out := make([]T, len(items))
	for i, j := range idx {
		out[i] = items[j].v
	}
	return out
}

// revKey is an etcd revision as a string that sorts as it does.
func revKey(rev int64) string { return fmt.Sprintf("%020d", rev) }

// sortTime is t as a string that sorts as t does.
func sortTime(t time.Time) string { return t.UTC().Format("2006-01-02T15:04:05.000000000") }

// contains reports whether a contains b as PostgreSQL's jsonb @> does, the
// filter LangGraph's searches use: an object contains each key of b with
// a value that contains b's, an array contains each element of b in some
// element of its own, and any other value only itself.
func contains(a, b any) bool {
	switch bv := b.(type) {
	case map[string]any:
		av, ok := a.(map[string]any)
		if !ok {
			return false
		}
		for k, v := range bv {
			x, ok := av[k]
			if !ok || !contains(x, v) {
				return false
			}
		}
		return true
	case []any:
		av, ok := a.([]any)
		if !ok {
			return false
		}
		for _, v := range bv {
			found := false
			for _, x := range av {
				if contains(x, v) {
					found = true
					break
				}
			}
			if !found {
				return false
			}
		}
		return true
	default:
		return reflect.DeepEqual(normal(a), normal(b))
	}
}

// normal makes numbers comparable whatever type decoded them.
func normal(v any) any {
	switch n := v.(type) {
	case int:
		return float64(n)
	case int64:
		return float64(n)
	case json.Number:
		f, _ := n.Float64()
		return f
	}
	return v
}

// page is the slice [offset, offset+limit) of n items, and the pagination
// headers LangGraph sends: the total, and the next offset when more are
// left.
func page(n, offset, limit int) (lo, hi int, total, next string) {
	lo = min(max(offset, 0), n)
	hi = lo + min(max(limit, 0), n-lo) // never offset+limit: it may overflow

	total = strconv.Itoa(n)
	if hi < n {
		next = strconv.Itoa(hi)
	}
	return lo, hi, total, next
}

// selectFields keeps only the fields of v named in fields; none keeps all.
func selectFields(v any, fields []string) (any, error) {
	if len(fields) == 0 {
		return v, nil
	}
	raw, err := json.Marshal(v)
	if err != nil {
		return nil, err
	}
	var m map[string]any
	if err := json.Unmarshal(raw, &m); err != nil {
		return nil, err
	}
	out := make(map[string]any, len(fields))
	for _, f := range fields {
		if x, ok := m[f]; ok {
			out[f] = x
		}
	}
	return out, nil
}

func itoa(i int) string { return strconv.Itoa(i) }
