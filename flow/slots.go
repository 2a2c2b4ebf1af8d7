package flow

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"time"

	"github.com/droverhq/drover"
	"github.com/droverhq/drover/keyspace"
	"github.com/droverhq/drover/metrics"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// ErrNoSlot is returned by ReleaseSlot when the lease holds no slot of the
// quota's subject.
var ErrNoSlot = errors.New("flow: no quota slot held")

// SlotResult is what AcquireSlot or ReleaseSlot did.
type SlotResult struct {
	// Granted says whether AcquireSlot took a slot.
	Granted bool
	// Subject is the tenant or task type counted ("-" for a named
	// resource).
	Subject string
	// Limit is the subject's limit (0: none).
	Limit int
	// InUse is how many slots the whole fleet holds for the subject.
	InUse int
	// Held is how many slots the lease holds for the subject.
	Held int
	// Revision is the etcd revision the grants were read at.
	Revision int64
}

// SlotSubject checks the subject a caller names for quota name and returns
// its form in keys: for the quotas "tenant" and "type" it is required (a
// tenant, a task type); for any other quota (one shared resource) it must
// be empty.
func SlotSubject(name, subject string) (string, error) {
	switch name {
	case PerTenant:
		if subject == "" || len(subject) > keyspace.MaxNameLen {
			return "", &drover.InputError{Field: "subject", Value: subject, Rule: "must name the tenant (1 to 128 characters) for quota tenant"}
		}
		return keyspace.EscapeSubject(subject), nil
	case PerType:
		if err := keyspace.CheckName("subject", subject); err != nil {
			return "", &drover.InputError{Field: "subject", Value: subject, Rule: "must name the task type for quota type: " + keyspace.NameRule}
		}
		return subject, nil
	}
	if subject != "" && subject != "-" {
		return "", &drover.InputError{Field: "subject", Value: subject, Rule: "applies only to the quotas tenant and type; quota " + name + " is one shared resource: omit it"}
	}
	return "-", nil
}

// AcquireSlot takes one slot of quota name for subject (see SlotSubject),
// bound to lease: the slot is freed by ReleaseSlot or when the lease ends.
// It is the worker's grant growth with a batch of one: the grants of the
// subject and its ledger are read, and the lease's grant grows only if the
// ledger is unchanged since, so the fleet's grants never sum to more than the
// limit. A subject without a limit is granted a slot all the same (so that
// it shows, and is released alike). Not granted when the slots are all
// held; ErrNoQuota when the quota has no configuration.
func AcquireSlot(ctx context.Context, cli *clientv3.Client, ns, name, subject string, lease clientv3.LeaseID) (SlotResult, error) {
	keys, sub, err := slotKeys(ns, name, subject)
	if err != nil {
		return SlotResult{}, err
	}
	ledger := keys.QuotaLedger(name, sub)
	mine := keys.QuotaGrant(name, sub, int64(lease))
	for {
		began := time.Now()
		res, ledgerRev, _, err := slotState(ctx, cli, keys, name, subject, sub, mine)
		if err != nil {
			return SlotResult{}, err
		}
		if res.Limit > 0 && res.InUse >= res.Limit {
			metrics.ObserveTxn("quota", began)
			metrics.QuotaWaits.WithLabelValues(name).Inc()
			return res, nil
		}
		tr, err := cli.Txn(ctx).If(clientv3.Compare(clientv3.ModRevision(ledger), "=", ledgerRev)).
			Then(clientv3.OpPut(ledger, ""), clientv3.OpPut(mine, strconv.Itoa(res.Held+1), clientv3.WithLease(lease))).Commit()
		metrics.ObserveTxn("quota", began)
		if err != nil {
			return SlotResult{}, fmt.Errorf("flow: quota %s: take a slot: %w", name, err)
		}
		if tr.Succeeded {
			res.Granted, res.Held, res.InUse, res.Revision = true, res.Held+1, res.InUse+1, tr.Header.Revision
			return res, nil
		}
	}
}

// ReleaseSlot gives back one slot of quota name for subject held under
// lease; ErrNoSlot when the lease holds none (released already, or the
// lease ended and took its slots with it).
func ReleaseSlot(ctx context.Context, cli *clientv3.Client, ns, name, subject string, lease clientv3.LeaseID) (SlotResult, error) {
	keys, sub, err := slotKeys(ns, name, subject)
	if err != nil {
		return SlotResult{}, err
	}
	mine := keys.QuotaGrant(name, sub, int64(lease))
	for {
		res, _, resp, err := slotState(ctx, cli, keys, name, subject, sub, mine)
		if err != nil {
			return SlotResult{}, err
		}
		if res.Held == 0 {
			return res, fmt.Errorf("%w: quota %s, subject %s, session %x", ErrNoSlot, name, res.Subject, int64(lease))
		}
		var mineRev int64
		for _, kv := range resp.Responses[1].GetResponseRange().Kvs {
			if string(kv.Key) == mine {
				mineRev = kv.ModRevision
			}
		}
		op := clientv3.OpDelete(mine)
		if res.Held > 1 {
			op = clientv3.OpPut(mine, strconv.Itoa(res.Held-1), clientv3.WithLease(lease))
		}
		tr, err := cli.Txn(ctx).If(clientv3.Compare(clientv3.ModRevision(mine), "=", mineRev)).Then(op).Commit()
		if err != nil {
			return SlotResult{}, fmt.Errorf("flow: quota %s: give a slot back: %w", name, err)
		}
		if tr.Succeeded {
			res.Held, res.InUse, res.Revision = res.Held-1, res.InUse-1, tr.Header.Revision
			return res, nil
		}
	}
}

// slotState reads, in one transaction, quota name's configuration, the
// grants of subject (in keys: sub) and its ledger, and returns what they
// say with mine (this lease's grant key), the ledger's revision and the
// response.
func slotState(ctx context.Context, cli *clientv3.Client, keys keyspace.Space, name, subject, sub, mine string) (SlotResult, int64, *clientv3.TxnResponse, error) {
	resp, err := cli.Txn(ctx).Then(clientv3.OpGet(keys.QuotaConfig(name)), clientv3.OpGet(keys.QuotaGrants(name, sub), clientv3.WithPrefix()),
		clientv3.OpGet(keys.QuotaLedger(name, sub))).Commit()
	if err != nil {
		return SlotResult{}, 0, nil, fmt.Errorf("flow: quota %s: %w", name, err)
	}
	res, ledgerRev, err := readSlots(name, subject, mine, resp)
	return res, ledgerRev, resp, err
}

// slotKeys checks ns, name and subject and returns the key space and the
// subject's form in keys.
func slotKeys(ns, name, subject string) (keyspace.Space, string, error) {
	keys, err := keyspace.New(ns)
	if err != nil {
		return keyspace.Space{}, "", err
	}
	if err := keyspace.CheckName("quota name", name); err != nil {
		return keyspace.Space{}, "", err
	}
	sub, err := SlotSubject(name, subject)
	return keys, sub, err
}

// readSlots reads an AcquireSlot transaction's reads: the quota's
// configuration, the subject's grants (mine is the lease's) and its ledger;
// it returns the slots and the ledger's mod revision.
func readSlots(name, subject, mine string, resp *clientv3.TxnResponse) (SlotResult, int64, error) {
	cfgKVs := resp.Responses[0].GetResponseRange().Kvs
	if len(cfgKVs) == 0 {
		return SlotResult{}, 0, fmt.Errorf("%w: %s (set it with `drover quotas set %s K`)", ErrNoQuota, name, name)
	}
	var cfg QuotaConfig
	if err := json.Unmarshal(cfgKVs[0].Value, &cfg); err != nil {
		return SlotResult{}, 0, fmt.Errorf("flow: quota %s has an unreadable configuration: %w", name, err)
	}
	if subject == "" {
		subject = "-"
	}
	res := SlotResult{Subject: subject, Limit: cfg.For(subject), Revision: resp.Header.Revision}
	for _, kv := range resp.Responses[1].GetResponseRange().Kvs {
		n, _ := strconv.Atoi(string(kv.Value))
		res.InUse += n
		if string(kv.Key) == mine {
			res.Held = n
		}
	}
	var ledgerRev int64
	if kvs := resp.Responses[2].GetResponseRange().Kvs; len(kvs) == 1 {
		ledgerRev = kvs[0].ModRevision
	}
	return res, ledgerRev, nil
}

// QuotaOf reads quota name's configuration and held slots; ErrNoQuota when
// it has no configuration.
func QuotaOf(ctx context.Context, cli *clientv3.Client, ns, name string) (QuotaUsage, error) {
	if err := keyspace.CheckName("quota name", name); err != nil {
		return QuotaUsage{}, err
	}
	if _, _, err := GetQuota(ctx, cli, ns, name); err != nil {
		return QuotaUsage{}, err
	}
	all, err := Quotas(ctx, cli, ns)
	if err != nil {
		return QuotaUsage{}, err
	}
	i := slices.IndexFunc(all, func(q QuotaUsage) bool { return q.Name == name })
	if i < 0 { // deleted between the two reads
		return QuotaUsage{}, fmt.Errorf("%w: %s (set it with `drover quotas set %s K`)", ErrNoQuota, name, name)
	}
	return all[i], nil
}
