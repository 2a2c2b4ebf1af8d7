package chaos

import "testing"

// threeMembers starts a three-member cluster of drover servers, or skips
// the test: in the default (CI) run, whose time budget the single-member
// suites take, and when `drover server` lacks a flag to form a cluster
// (see clusterOfThree).
func threeMembers(t *testing.T) *etcdSet {
	t.Helper()
	if !long() {
		t.Skip("three-member variant: DROVER_CHAOS=long runs it")
	}
	return clusterOfThree(t)
}

// TestQueueChaosThreeMembers is TestQueueChaos on a three-member cluster,
// where the server killed (and restarted on its data dir after TTL + 0.5 s)
// is the leader. The report adds the time the two others took to elect a
// new leader.
//
//	go test -race -run TestQueueChaosThreeMembers -v ./chaos/
func TestQueueChaosThreeMembers(t *testing.T) {
	runQueueChaos(t, threeMembers(t))
}

// TestLockLinearizableEtcdThreeMembers is TestLockLinearizableEtcd on a
// three-member cluster, where the server killed and restarted at once is
// the leader.
//
//	go test -race -run TestLockLinearizableEtcdThreeMembers -v ./chaos/
func TestLockLinearizableEtcdThreeMembers(t *testing.T) {
	set := threeMembers(t)
	runEtcdLocks(t, set, func() outage {
		l, err := set.leader()
		if err != nil {
			t.Fatal(err)
		}
		o := set.killAndRestart(l, 0)
		t.Logf("leader %s killed: new leader in %s, %s back in %s", o.member, round(o.elected.Sub(o.killed)), o.member, round(o.ready.Sub(o.killed)))
		return o
	})
}
