package cluster

import (
	"context"
	"fmt"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// ownAlarm reports whether the guard's own member has raised the NOSPACE
// alarm.
func (st GuardStatus) ownAlarm() bool {
	for _, a := range st.alarms {
		if a.MemberID == st.member {
			return true
		}
	}
	return false
}

// disarmable splits the raised alarms into those the guard disarms (its
// own member's, and those of members no longer in the cluster) and those
// it leaves to the other members' guards.
func (g *Guard) disarmable(ctx context.Context, st GuardStatus) (disarm, keep []*pb.AlarmMember, err error) {
	for _, a := range st.alarms {
		if a.MemberID == st.member {
			disarm = append(disarm, a)
		} else {
			keep = append(keep, a)
		}
	}
	if len(keep) == 0 {
		return disarm, nil, nil
	}
	lctx, cancel := g.bound(ctx)
	list, err := g.cli.MemberList(lctx, clientv3.WithSerializable())
	cancel()
	if err != nil {
		return nil, nil, fmt.Errorf("cluster: guard: list the members: %w", err)
	}
	present := make(map[uint64]bool, len(list.Members))
	for _, m := range list.Members {
		present[m.ID] = true
	}
	others := keep
	keep = nil
	for _, a := range others {
		if present[a.MemberID] {
			keep = append(keep, a)
		} else {
			disarm = append(disarm, a)
		}
	}
	return disarm, keep, nil
}

// peerAboveLow returns the name (or id) of a member other than self that
// has at least the low-water mark of its quota in use, "" when none has.
// A member that does not answer within the guard's interval is passed
// over: it serves no writes, and its own guard sets the keys again if it
// comes back full. A single member has no peers to ask.
func (g *Guard) peerAboveLow(ctx context.Context, self uint64) (string, error) {
	lctx, cancel := g.bound(ctx)
	list, err := g.cli.MemberList(lctx, clientv3.WithSerializable())
	cancel()
	if err != nil {
		return "", fmt.Errorf("cluster: guard: list the members: %w", err)
	}
	for _, m := range list.Members {
		if m.ID == self {
			continue
		}
		for _, ep := range m.ClientURLs {
			sctx, cancel := context.WithTimeout(ctx, g.cfg.Interval)
			sr, err := g.cli.Status(sctx, ep)
			cancel()
			if err != nil {
				continue
			}
			if sr.DbSizeQuota > 0 && sr.DbSizeInUse >= int64(g.cfg.LowWater*float64(sr.DbSizeQuota)) {
				if m.Name != "" {
					return m.Name, nil
				}
				return fmt.Sprintf("%x", m.ID), nil
			}
			break
		}
	}
	return "", nil
}
