package keyspace

import (
	"net/url"
	"strings"

	"github.com/droverhq/drover"
)

// Budgets are stored in three families of keys, so that listing budgets
// reads configurations and states without their reservations:
//
//	/{ns}/budgets/config/{key}     a budget's limits and tenant shares
//	/{ns}/budgets/state/{key}      the current window's counters
//	/{ns}/budgets/res/{key}/{id}   one reservation, bound to its holder's lease
//
// {key} is the budget key ("openai/gpt-4.1/key-prod") path-escaped into one
// segment ("openai%2Fgpt-4.1%2Fkey-prod").

// BudgetConfigs is the prefix of every budget's configuration.
func (s Space) BudgetConfigs() string { return s.root + "budgets/config/" }

// BudgetStates is the prefix of every budget's state.
func (s Space) BudgetStates() string { return s.root + "budgets/state/" }

// BudgetConfig is the key of budget key's configuration.
func (s Space) BudgetConfig(key string) string { return s.BudgetConfigs() + EscapeBudget(key) }

// BudgetState is the key of budget key's counters.
func (s Space) BudgetState(key string) string { return s.BudgetStates() + EscapeBudget(key) }

// BudgetReservations is the prefix of budget key's reservations, ending in "/".
func (s Space) BudgetReservations(key string) string {
	return s.root + "budgets/res/" + EscapeBudget(key) + "/"
}

// BudgetReservation is the key of reservation id of budget key.
func (s Space) BudgetReservation(key, id string) string { return s.BudgetReservations(key) + id }

// EscapeBudget is the key segment of budget key: path-escaped, so that it
// has no '/'.
func EscapeBudget(key string) string { return url.PathEscape(key) }

// BudgetOf returns the budget key of k, a key under prefix (BudgetConfigs
// or BudgetStates); ok is false for any other key.
func BudgetOf(prefix, k string) (key string, ok bool) {
	seg, found := strings.CutPrefix(k, prefix)
	if !found || strings.Contains(seg, "/") {
		return "", false
	}
	return UnescapeBudget(seg)
}

// UnescapeBudget reads back what EscapeBudget wrote; ok is false for a
// segment EscapeBudget cannot have written.
func UnescapeBudget(seg string) (key string, ok bool) {
	key, err := url.PathUnescape(seg)
	return key, err == nil && key != ""
}

// BudgetKeyRule describes the budget keys that [CheckBudgetKey] accepts.
const BudgetKeyRule = "must be 1 to 256 characters: segments of letters, digits, '.', '_', '-' or ':' separated by '/' (such as openai/gpt-4.1/key-prod)"

// CheckBudgetKey returns a [drover.InputError] naming field unless key is
// a usable budget key.
func CheckBudgetKey(field, key string) error {
	bad := &drover.InputError{Field: field, Value: key, Rule: BudgetKeyRule}
	if len(key) == 0 || len(key) > 256 {
		return bad
	}
	for _, seg := range strings.Split(key, "/") {
		if !validName(seg) {
			return bad
		}
	}
	return nil
}
