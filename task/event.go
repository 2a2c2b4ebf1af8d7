package task

import "time"

// EventType names what happened in a run.
type EventType string

// Events a Runner reports to RunnerConfig.OnEvent, in order.
const (
	EventWaiting          EventType = "waiting"           // another worker holds the task
	EventAcquired         EventType = "acquired"          // this worker holds the task (Token set)
	EventResumed          EventType = "resumed"           // Step is the first step this run will do
	EventStepStarted      EventType = "step_started"      // Step, Name
	EventStepCheckpointed EventType = "step_checkpointed" // Step, Name: the checkpoint is written
	EventSleeping         EventType = "sleeping"          // Step ended with a sleep until Until: the task is let go
	EventAwaitingSignal   EventType = "awaiting_signal"   // Step ended with a wait for the signals Signals: the task is let go
	EventSignalReceived   EventType = "signal_received"   // Step is resumed with the signal Name (Err "timed out": none came)
	EventWaitingChildren  EventType = "waiting_children"  // Step spawned children the task waits for: the task is let go
	EventCompleted        EventType = "completed"         // the last step is checkpointed
	EventAlreadyCompleted EventType = "already_completed" // nothing left to do
	EventLost             EventType = "lost"              // the lock was lost; Err says why
)

// Event is one thing that happened in a run, for timelines and logs.
type Event struct {
	Type   EventType `json:"type"`
	TaskID string    `json:"task_id"`
	Worker string    `json:"worker"`
	Step   int       `json:"step,omitempty"`
	Name   string    `json:"name,omitempty"`
	Token  int64     `json:"token,omitempty"`
	At     time.Time `json:"at"`
	Err    string    `json:"error,omitempty"`
	// Until is when the sleep of a "sleeping" event ends.
	Until time.Time `json:"until,omitzero"`
	// Signals are what an "awaiting_signal" event waits for.
	Signals []string `json:"signals,omitempty"`
}
