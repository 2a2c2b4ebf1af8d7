package lease_test

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"testing"

	"github.com/droverhq/drover/internal/testenv/etcdtest"
	"github.com/droverhq/drover/lease"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// TestTokenTxn checks the token fence against a real etcd: a write under a
// token lower than one that wrote is refused with ErrFenced and nothing of
// it applied, equal and higher tokens pass and raise the key, and the
// caller's own compares still decide between Then and Else.
func TestTokenTxn(t *testing.T) {
	t.Parallel()
	cli := srv.Client(t)
	ctx := context.Background()
	ns := "/" + etcdtest.Namespace(t) + "/"
	fence, data := ns+"fence", ns+"data"
	var lost []error
	write := func(token int64, val string, cmps ...clientv3.Cmp) (*clientv3.TxnResponse, error) {
		t.Helper()
		s := lease.TokenSpec{Name: "test", Key: fence, Token: token, Lost: func(err error) { lost = append(lost, err) }}
		return lease.NewTokenTxn(newTxn(ctx, cli), s).If(cmps...).Then(clientv3.OpPut(data, val)).Else(clientv3.OpGet(data)).Commit()
	}
	read := func(key string) string { return readKey(t, cli, key) }
	for _, tc := range []struct {
		name   string
		token  int64
		cmps   []clientv3.Cmp
		fenced bool
		els    bool   // the caller's Else runs
		want   string // data after the write
	}{
		{"first write creates the fence", 5, nil, false, false, "5"},
		{"same token", 5, nil, false, false, "5"},
		{"higher token", 9, nil, false, false, "9"},
		{"lower token refused", 7, nil, true, false, "9"},
		{"far lower token refused", 1, nil, true, false, "9"},
		{"caller's compare fails", 11, []clientv3.Cmp{clientv3.Compare(clientv3.Value(data), "=", "other")}, false, true, "9"},
		{"caller's compare holds", 10, []clientv3.Cmp{clientv3.Compare(clientv3.Value(data), "=", "9")}, false, false, "10"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			lost = nil
			val := strconv.FormatInt(tc.token, 10)
			resp, err := write(tc.token, val, tc.cmps...)
			if tc.fenced {
				if !errors.Is(err, lease.ErrFenced) || len(lost) != 1 {
					t.Fatalf("err %v, lost %v: want ErrFenced, told once", err, lost)
				}
			} else if err != nil {
				t.Fatal(err)
			}
			if got := read(data); got != tc.want {
				t.Fatalf("data %q, want %q", got, tc.want)
			}
			if tc.fenced {
				return
			}
			if resp.Succeeded == tc.els || len(resp.Responses) != 1 || resp.Header == nil {
				t.Fatalf("response %+v: want Succeeded %t with only the caller's one response", resp, !tc.els)
			}
			if tc.els && string(resp.Responses[0].GetResponseRange().Kvs[0].Value) != tc.want {
				t.Fatalf("Else read %v", resp.Responses[0])
			}
		})
	}
	if got := read(fence); got != lease.PadToken(10) {
		t.Fatalf("fence key %q, want the highest token that wrote", got)
	}
}

// TestTokenTxnRaiseAndCheck: a transaction with nothing in it only raises
// the key, cutting off earlier tokens before the new holder writes; a loss
// known locally refuses a write without sending it.
func TestTokenTxnRaiseAndCheck(t *testing.T) {
	t.Parallel()
	cli := srv.Client(t)
	ctx := context.Background()
	ns := "/" + etcdtest.Namespace(t) + "/"
	fence, data := ns+"fence", ns+"data"
	put := func(token int64, val string) error {
		_, err := lease.NewTokenTxn(newTxn(ctx, cli), lease.TokenSpec{Name: "test", Key: fence, Token: token}).Then(clientv3.OpPut(data, val)).Commit()
		return err
	}
	if err := put(10, "10"); err != nil {
		t.Fatal(err)
	}
	if _, err := lease.NewTokenTxn(newTxn(ctx, cli), lease.TokenSpec{Name: "test", Key: fence, Token: 12}).Commit(); err != nil {
		t.Fatal(err)
	}
	if err := put(10, "stale"); !errors.Is(err, lease.ErrFenced) || readKey(t, cli, data) != "10" || readKey(t, cli, fence) != lease.PadToken(12) {
		t.Fatalf("write of the predecessor after the raise: %v, data %q", err, readKey(t, cli, data))
	}
	gone := errors.New("renewal deadline passed")
	s := lease.TokenSpec{Name: "test", Key: fence, Token: 20, Check: func() error { return gone }}
	if _, err := lease.NewTokenTxn(newTxn(ctx, cli), s).Then(clientv3.OpPut(data, "late")).Commit(); !errors.Is(err, lease.ErrFenced) || !errors.Is(err, gone) {
		t.Fatalf("checked write: %v", err)
	}
	if readKey(t, cli, fence) != lease.PadToken(12) || readKey(t, cli, data) != "10" {
		t.Fatalf("a checked-out write changed something: fence %q, data %q", readKey(t, cli, fence), readKey(t, cli, data))
	}
}

// TestTokenTxnCarriesOperationsOnce: a fenced write of a value near
// etcd's request limit (1.5 MiB) is sent, both when it creates the fence
// key and once the key exists, which it could not be if the request
// carried the value twice; a lower token's is refused and applies
// nothing.
func TestTokenTxnCarriesOperationsOnce(t *testing.T) {
	t.Parallel()
	cli := srv.Client(t)
	ctx := context.Background()
	ns := "/" + etcdtest.Namespace(t) + "/"
	fence, data := ns+"fence", ns+"data"
	big := func(c string) string { return strings.Repeat(c, 1<<20) }
	put := func(token int64, val string) error {
		_, err := lease.NewTokenTxn(newTxn(ctx, cli), lease.TokenSpec{Name: "test", Key: fence, Token: token}).Then(clientv3.OpPut(data, val)).Commit()
		return err
	}
	if err := put(5, big("a")); err != nil {
		t.Fatalf("the first write, creating the fence key: %v", err)
	}
	if err := put(7, big("b")); err != nil {
		t.Fatalf("a write under a higher token: %v", err)
	}
	if err := put(6, big("c")); !errors.Is(err, lease.ErrFenced) {
		t.Fatalf("a write under a lower token: %v, want ErrFenced", err)
	}
	if readKey(t, cli, data) != big("b") || readKey(t, cli, fence) != lease.PadToken(7) {
		t.Fatalf("after the refused write: fence %q, data not the higher token's", readKey(t, cli, fence))
	}
}

// TestTokenTxnAbsentKeyElseOnce: with the fence key absent and the
// caller's compare failing, the caller's Else runs once (a put there is
// applied once), its Then never; the key is created at the token, as the
// holder's raise would create it.
func TestTokenTxnAbsentKeyElseOnce(t *testing.T) {
	t.Parallel()
	cli := srv.Client(t)
	ctx := context.Background()
	ns := "/" + etcdtest.Namespace(t) + "/"
	fence, data, marks := ns+"fence", ns+"data", ns+"marks"
	resp, err := lease.NewTokenTxn(newTxn(ctx, cli), lease.TokenSpec{Name: "test", Key: fence, Token: 3}).
		If(clientv3.Compare(clientv3.Version(data), ">", 0)).Then(clientv3.OpPut(data, "x")).
		Else(clientv3.OpPut(marks, "else"), clientv3.OpGet(data)).Commit()
	if err != nil {
		t.Fatal(err)
	}
	if resp.Succeeded || len(resp.Responses) != 2 || resp.Responses[1].GetResponseRange() == nil {
		t.Fatalf("response %+v: want the caller's Else, its two responses only", resp)
	}
	g, err := cli.Get(ctx, marks)
	if err != nil {
		t.Fatal(err)
	}
	if len(g.Kvs) != 1 || g.Kvs[0].Version != 1 {
		t.Fatalf("the Else's put: %v, want it applied once", g.Kvs)
	}
	if readKey(t, cli, data) != "" || readKey(t, cli, fence) != lease.PadToken(3) {
		t.Fatalf("data %q, fence %q: want no data, the fence at the token", readKey(t, cli, data), readKey(t, cli, fence))
	}
}

// TestTokenTxnManyCompares: a fenced write of many compares (a task's
// commit compares one key a plan chunk) fits etcd's operations a
// transaction as an unfenced one does: its compares count once, under a
// key absent and under one that exists.
func TestTokenTxnManyCompares(t *testing.T) {
	t.Parallel()
	cli := srv.Client(t)
	ctx := context.Background()
	ns := "/" + etcdtest.Namespace(t) + "/"
	cmps := make([]clientv3.Cmp, 100)
	for i := range cmps {
		cmps[i] = clientv3.Compare(clientv3.Version(fmt.Sprintf("%sk%d", ns, i)), "=", 0)
	}
	for try := range 2 {
		resp, err := lease.NewTokenTxn(newTxn(ctx, cli), lease.TokenSpec{Name: "test", Key: ns + "fence", Token: 4}).
			If(cmps...).Then(clientv3.OpPut(ns+"data", fmt.Sprint(try))).Commit()
		if err != nil || !resp.Succeeded {
			t.Fatalf("send %d of a write of %d compares: %v, %+v", try+1, len(cmps), err, resp)
		}
	}
	if readKey(t, cli, ns+"data") != "1" {
		t.Fatalf("data %q, want the second write's", readKey(t, cli, ns+"data"))
	}
}

// newTxn returns the transactions of cli under ctx, as NewTokenTxn takes
// them.
func newTxn(ctx context.Context, cli *clientv3.Client) func() clientv3.Txn {
	return func() clientv3.Txn { return cli.Txn(ctx) }
}

// readKey returns key's value, "" when it is absent.
func readKey(t *testing.T, cli *clientv3.Client, key string) string {
	t.Helper()
	g, err := cli.Get(context.Background(), key)
	if err != nil {
		t.Fatal(err)
	}
	if len(g.Kvs) == 0 {
		return ""
	}
	return string(g.Kvs[0].Value)
}
