package keyspace

import "fmt"

// Schedules is the prefix of every schedule's record, ending in "/":
// [Space.Schedule] of each name is under it.
func (s Space) Schedules() string { return s.root + "schedules/specs/" }

// Schedule is the key of schedule name's record: its spec and the state
// its fires keep (the due item it waits on, its last task, its history
// count).
func (s Space) Schedule(name string) string { return s.Schedules() + name }

// ScheduleDue is the prefix of the schedules' due index (package
// internal/due), ending in "/": one item per schedule that is not paused,
// due at its next fire.
func (s Space) ScheduleDue() string { return s.root + "schedules/due/" }

// ScheduleHistory is the prefix of schedule name's history, ending in "/".
func (s Space) ScheduleHistory(name string) string { return s.root + "schedules/history/" + name + "/" }

// ScheduleHistorySlot is the key of slot n of schedule name's history: a
// ring of slots, each fire writing the next.
func (s Space) ScheduleHistorySlot(name string, n int) string {
	return fmt.Sprintf("%s%04d", s.ScheduleHistory(name), n)
}

// systemRoot is the root of the keys that belong to no namespace: '~'
// is no namespace's character, so no namespace's keys are under it.
const systemRoot = "/~drover/"

// ScheduleNamespaces is the prefix, ending in "/", of the namespaces that
// have (or had) a schedule: [ScheduleNamespace] of each, which every
// server watches to fire the schedules of every namespace.
func ScheduleNamespaces() string { return systemRoot + "schedule-namespaces/" }

// ScheduleNamespace is namespace ns's key under [ScheduleNamespaces].
func ScheduleNamespace(ns string) string { return ScheduleNamespaces() + ns }
