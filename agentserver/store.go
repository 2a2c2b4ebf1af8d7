package agentserver

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/danielgtaylor/huma/v2"
)

// The store's limits (docs/agent-server.md, "The store").
const (
	// MaxStoreLabels is the most labels a namespace has.
	MaxStoreLabels = 16
	// MaxStoreLabelBytes is the longest label of a namespace.
	MaxStoreLabelBytes = 256
	// MaxStoreKeyBytes is the longest key of an item.
	MaxStoreKeyBytes = 1024
	// MaxStoreValueBytes is the largest value of an item, as JSON.
	MaxStoreValueBytes = 256 << 10
	// maxStoreAnswerBytes is the most a search answers: past it the
	// search stops early, and the caller pages on with its offset.
	maxStoreAnswerBytes = 16 << 20
	// reservedStoreLabel is the first label LangGraph keeps for itself.
	reservedStoreLabel = "langgraph"
)

const tagStore = "Agent Server: store"

// StoreItem is an item of the store as LangGraph's API answers it.
type StoreItem struct {
	Namespace []string        `json:"namespace"`
	Key       string          `json:"key"`
	Value     json.RawMessage `json:"value"`
	CreatedAt time.Time       `json:"created_at"`
	UpdatedAt time.Time       `json:"updated_at"`
}

// storeRecord is an item as stored: its namespace and key are its etcd
// key's.
type storeRecord struct {
	Value     json.RawMessage `json:"value"`
	CreatedAt time.Time       `json:"created_at"`
	UpdatedAt time.Time       `json:"updated_at"`
}

type storePutInput struct {
	Body struct {
		Namespace []string        `json:"namespace" doc:"The item's namespace: 1 to 16 labels, each 1 to 256 bytes without '.'; the first not 'langgraph'."`
		Key       string          `json:"key" doc:"The item's key within its namespace: 1 to 1024 bytes."`
		Value     json.RawMessage `json:"value" doc:"The item's value: a JSON object of at most 256 KiB."`
		Index     any             `json:"index,omitempty" doc:"Fields to index for vector search: null or false (vector search is not served; a list is 501)."`
		TTL       *float64        `json:"ttl,omitempty" doc:"A time to live in minutes: not served yet (501 unless null)."`
	}
}

type storeDeleteInput struct {
	Body struct {
		Namespace []string `json:"namespace" doc:"The item's namespace."`
		Key       string   `json:"key" doc:"The item's key."`
	}
}

type storeGetInput struct {
	Namespace  string `query:"namespace" doc:"The item's namespace, its labels joined by '.'."`
	Key        string `query:"key" doc:"The item's key."`
	RefreshTTL string `query:"refresh_ttl" doc:"Refresh the item's time to live: items have none here, so there is nothing to refresh."`
}

type storeSearchInput struct {
	Body struct {
		NamespacePrefix []string       `json:"namespace_prefix,omitempty" doc:"Only items whose namespace starts with these labels (every item for none)."`
		Filter          map[string]any `json:"filter,omitempty" doc:"Only items whose value matches: each key's value contains the filter's (as jsonb @>), or meets its operators ($eq, $ne, $gt, $gte, $lt, $lte, $in, $nin)."`
		Limit           int            `json:"limit,omitempty" minimum:"1" maximum:"1000" default:"10"`
		Offset          int            `json:"offset,omitempty" minimum:"0" maximum:"2147483647"`
		Query           *string        `json:"query,omitempty" doc:"A natural-language query for vector search: not served (501)."`
		RefreshTTL      *bool          `json:"refresh_ttl,omitempty" doc:"Refresh the items' time to live: items have none here."`
	}
}

type storeNamespacesInput struct {
	Body struct {
		Prefix   []string `json:"prefix,omitempty" doc:"Only namespaces that start with these labels ('*' matches any one)."`
		Suffix   []string `json:"suffix,omitempty" doc:"Only namespaces that end with these labels ('*' matches any one)."`
		MaxDepth *int     `json:"max_depth,omitempty" minimum:"1" maximum:"16" doc:"Cut each namespace to this many labels."`
		Limit    int      `json:"limit,omitempty" minimum:"1" maximum:"1000" default:"100"`
		Offset   int      `json:"offset,omitempty" minimum:"0" maximum:"2147483647"`
	}
}

func (s *server) storeRoutes(api huma.API) {
	tags := []string{tagStore}
	bad := []int{http.StatusBadRequest, http.StatusServiceUnavailable}
	huma.Register(api, huma.Operation{
		OperationID: "lg-store-put-item", Method: http.MethodPut, Path: "/store/items", Tags: tags,
		Summary:     "Store or replace an item (LangGraph)",
		Description: "Creates the item or replaces its value (created_at kept, updated_at later than before). 413 for a value over 256 KiB.",
		Errors:      append(bad, http.StatusRequestEntityTooLarge, http.StatusNotImplemented, http.StatusInsufficientStorage),
	}, func(ctx context.Context, in *storePutInput) (*struct{}, error) {
		b := in.Body
		if err := checkStoreItem("body", b.Namespace, b.Key, true); err != nil {
			return nil, err
		}
		value, err := checkStoreValue(b.Value)
		if err != nil {
			return nil, err
		}
		if b.Index != nil && b.Index != false {
			return nil, notBuilt("body.index", "indexing fields for vector search")
		}
		if b.TTL != nil {
			return nil, notBuilt("body.ttl", "a time to live of an item")
		}
		return nil, s.putStoreItem(ctx, b.Namespace, b.Key, value)
	})
	huma.Register(api, huma.Operation{
		OperationID: "lg-store-get-item", Method: http.MethodGet, Path: "/store/items", Tags: tags,
		Summary:     "An item (LangGraph)",
		Description: "Answers null when the item does not exist, as LangGraph does.",
		Errors:      bad,
	}, func(ctx context.Context, in *storeGetInput) (*struct{ Body *StoreItem }, error) {
		ns := splitStoreNamespace(in.Namespace)
		if err := checkStoreItem("query", ns, in.Key, false); err != nil {
			return nil, err
		}
		it, err := s.getStoreItem(ctx, ns, in.Key)
		if err != nil {
			return nil, err
		}
		return &struct{ Body *StoreItem }{Body: it}, nil
	})
	huma.Register(api, huma.Operation{
		OperationID: "lg-store-delete-item", Method: http.MethodDelete, Path: "/store/items", Tags: tags,
		Summary: "Delete an item (LangGraph)", Description: "Deleting an item that does not exist is no error.",
		Errors: bad,
	}, func(ctx context.Context, in *storeDeleteInput) (*struct{}, error) {
		if err := checkStoreItem("body", in.Body.Namespace, in.Body.Key, false); err != nil {
			return nil, err
		}
		return nil, s.deleteStoreItem(ctx, in.Body.Namespace, in.Body.Key)
	})
	s.storeSearchRoutes(api, tags, bad)
}

func (s *server) storeSearchRoutes(api huma.API, tags []string, bad []int) {
	huma.Register(api, s.readOnly(huma.Operation{
		OperationID: "lg-store-search-items", Method: http.MethodPost, Path: "/store/items/search", Tags: tags,
		Summary:     "Search items (LangGraph)",
		Description: "Items in the order of their namespace, then key; a search answers at most 16 MiB of items and stops early past it.",
		Errors:      append(bad, http.StatusNotImplemented),
	}), func(ctx context.Context, in *storeSearchInput) (*struct {
		Body struct {
			Items []StoreItem `json:"items"`
		}
	}, error) {
		b := in.Body
		if err := checkStoreLabels("body.namespace_prefix", b.NamespacePrefix, 0); err != nil {
			return nil, err
		}
		if b.Query != nil && *b.Query != "" {
			return nil, notBuilt("body.query", "vector search")
		}
		if err := checkStoreFilter(b.Filter); err != nil {
			return nil, err
		}
		if b.Limit == 0 {
			b.Limit = 10
		}
		items, err := s.searchStore(ctx, b.NamespacePrefix, b.Filter, b.Offset, b.Limit)
		if err != nil {
			return nil, err
		}
		out := &struct {
			Body struct {
				Items []StoreItem `json:"items"`
			}
		}{}
		out.Body.Items = items
		return out, nil
	})
	huma.Register(api, s.readOnly(huma.Operation{
		OperationID: "lg-store-list-namespaces", Method: http.MethodPost, Path: "/store/namespaces", Tags: tags,
		Summary:     "List namespaces (LangGraph)",
		Description: "The namespaces that hold items, each cut to max_depth labels, distinct, in the order of their labels.",
		Errors:      bad,
	}), func(ctx context.Context, in *storeNamespacesInput) (*struct {
		Body struct {
			Namespaces [][]string `json:"namespaces"`
		}
	}, error) {
		b := in.Body
		if err := checkStoreLabels("body.prefix", b.Prefix, 0); err != nil {
			return nil, err
		}
		if err := checkStoreLabels("body.suffix", b.Suffix, 0); err != nil {
			return nil, err
		}
		if b.Limit == 0 {
			b.Limit = 100
		}
		depth := 0
		if b.MaxDepth != nil {
			depth = *b.MaxDepth
		}
		list, err := s.storeNamespaces(ctx, b.Prefix, b.Suffix, depth)
		if err != nil {
			return nil, err
		}
		lo, hi, _, _ := page(len(list), b.Offset, b.Limit)
		out := &struct {
			Body struct {
				Namespaces [][]string `json:"namespaces"`
			}
		}{}
		out.Body.Namespaces = list[lo:hi]
		return out, nil
	})
}

// splitStoreNamespace is the namespace of a query: its labels joined by
// '.' (none for "").
func splitStoreNamespace(q string) []string {
	if q == "" {
		return nil
	}
	return strings.Split(q, ".")
}

// checkStoreItem checks an item's namespace and key, in location (body or
// query); put says whether it is being written (the reserved label is
// refused only then: reading it finds nothing).
func checkStoreItem(location string, ns []string, key string, put bool) error {
	if err := checkStoreLabels(location+".namespace", ns, 1); err != nil {
		return err
	}
	if put && ns[0] == reservedStoreLabel {
		return badInput(location+".namespace[0]", ns[0], fmt.Sprintf("must not be %q: LangGraph reserves that first label", reservedStoreLabel))
	}
	switch {
	case key == "":
		return badInput(location+".key", key, "must not be empty")
	case len(key) > MaxStoreKeyBytes:
		return badInput(location+".key", len(key), fmt.Sprintf("must be at most %d bytes", MaxStoreKeyBytes))
	case !utf8.ValidString(key):
		return badInput(location+".key", key, "must be UTF-8")
	}
	return nil
}

// checkStoreLabels checks a namespace (or a prefix, suffix) of at least
// least labels: each label is 1 to MaxStoreLabelBytes of UTF-8 without
// '.', and there are at most MaxStoreLabels.
func checkStoreLabels(field string, ns []string, least int) error {
	if len(ns) < least {
		return badInput(field, ns, fmt.Sprintf("must have at least %d label", least))
	}
	if len(ns) > MaxStoreLabels {
		return badInput(field, len(ns), fmt.Sprintf("must have at most %d labels", MaxStoreLabels))
	}
	for i, l := range ns {
		at := fmt.Sprintf("%s[%d]", field, i)
		switch {
		case l == "":
			return badInput(at, l, "must not be empty")
		case strings.Contains(l, "."):
			return badInput(at, l, "must not contain '.'")
		case len(l) > MaxStoreLabelBytes:
			return badInput(at, len(l), fmt.Sprintf("must be at most %d bytes", MaxStoreLabelBytes))
		case !utf8.ValidString(l):
			return badInput(at, l, "must be UTF-8")
		}
	}
	return nil
}

// checkStoreValue checks that raw is a JSON object of at most
// MaxStoreValueBytes, and answers it compacted.
func checkStoreValue(raw json.RawMessage) (json.RawMessage, error) {
	var b bytes.Buffer
	if err := json.Compact(&b, raw); err != nil || b.Len() == 0 || b.Bytes()[0] != '{' {
		return nil, badInput("body.value", nil, "must be a JSON object")
	}
	if b.Len() > MaxStoreValueBytes {
		return nil, huma.NewError(http.StatusRequestEntityTooLarge, fmt.Sprintf("body.value must be at most %d bytes of JSON", MaxStoreValueBytes),
			&huma.ErrorDetail{Location: "body.value", Value: b.Len(), Message: fmt.Sprintf("must be at most %d bytes of JSON", MaxStoreValueBytes)})
	}
	return b.Bytes(), nil
}

// storeOps are the operators a filter's value may be made of.
var storeOps = map[string]bool{"$eq": true, "$ne": true, "$gt": true, "$gte": true, "$lt": true, "$lte": true, "$in": true, "$nin": true}

// checkStoreFilter refuses an operator a filter names that is not one of
// storeOps, and an $in or $nin that is not a list.
func checkStoreFilter(filter map[string]any) error {
	for k, v := range filter {
		m, ok := v.(map[string]any)
		if !ok || !isOperators(m) {
			continue
		}
		for op, x := range m {
			if !storeOps[op] {
				return badInput("body.filter."+k+"."+op, op, "must be one of $eq, $ne, $gt, $gte, $lt, $lte, $in, $nin")
			}
			if _, list := x.([]any); (op == "$in" || op == "$nin") && !list {
				return badInput("body.filter."+k+"."+op, x, "must be a list")
			}
		}
	}
	return nil
}

// isOperators says whether a filter's value is operators: an object whose
// keys all start with '$'.
func isOperators(m map[string]any) bool {
	if len(m) == 0 {
		return false
	}
	for k := range m {
		if !strings.HasPrefix(k, "$") {
			return false
		}
	}
	return true
}
