package agentserver

import (
	"encoding/json"
	"reflect"
	"testing"
)

// A state as the runtime reports it: a subgraph task carries both its
// checkpoint reference and the subgraph's state.
const reportedState = `{"values":{},"next":["weather_graph"],"tasks":[
 {"id":"t1","name":"weather_graph","checkpoint":{"thread_id":"th","checkpoint_ns":"weather_graph:t1"},
  "state":{"values":{"city":"SF"},"next":["weather_node"],"tasks":[
   {"id":"t2","name":"weather_node","checkpoint":null,"state":null}]}},
 {"id":"t3","name":"plain","checkpoint":null,"state":null}]}`

func TestWithSubgraphsAnswersReferencesOrStates(t *testing.T) {
	var st ThreadState
	if err := json.Unmarshal([]byte(reportedState), &st); err != nil {
		t.Fatal(err)
	}
	before, _ := json.Marshal(st)
	flat := withSubgraphs(st, false)
	t1 := flat.Tasks[0].(map[string]any)
	if t1["state"] != nil || !reflect.DeepEqual(t1["checkpoint"], map[string]any{"thread_id": "th", "checkpoint_ns": "weather_graph:t1"}) {
		t.Fatalf("without subgraphs, task %v: want its reference and no state", t1)
	}
	deep := withSubgraphs(st, true)
	t1 = deep.Tasks[0].(map[string]any)
	nested, _ := t1["state"].(map[string]any)
	if t1["checkpoint"] != nil || nested == nil || nested["next"].([]any)[0] != "weather_node" {
		t.Fatalf("with subgraphs, task %v: want the subgraph's state and no reference", t1)
	}
	if inner := nested["tasks"].([]any)[0].(map[string]any); inner["checkpoint"] != nil || inner["state"] != nil {
		t.Fatalf("a plain node's task inside %v: want neither", inner)
	}
	if plain := deep.Tasks[1].(map[string]any); plain["checkpoint"] != nil || plain["state"] != nil {
		t.Fatalf("plain task %v: want neither", plain)
	}
	if after, _ := json.Marshal(st); string(after) != string(before) {
		t.Fatalf("the stored state changed:\n%s\n%s", before, after)
	}
}

func TestSubgraphsOfRecursesOnlyWhenAsked(t *testing.T) {
	all := map[string]any{"gp_two": 1, "gp_two|p_two": 2, "other": 3}
	keys := func(m map[string]any) map[string]bool {
		out := map[string]bool{}
		for k := range m {
			out[k] = true
		}
		return out
	}
	for _, c := range []struct {
		ns      string
		recurse bool
		want    map[string]bool
	}{
		{"", false, map[string]bool{"gp_two": true, "other": true}},
		{"", true, map[string]bool{"gp_two": true, "gp_two|p_two": true, "other": true}},
		{"gp_two", false, map[string]bool{"gp_two": true}},
		{"gp_two", true, map[string]bool{"gp_two": true, "gp_two|p_two": true}},
		{"none", true, map[string]bool{}},
	} {
		if got := keys(subgraphsOf(all, c.ns, c.recurse)); !reflect.DeepEqual(got, c.want) {
			t.Errorf("subgraphsOf(%q, %v) = %v, want %v", c.ns, c.recurse, got, c.want)
		}
	}
}
