package kv_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"testing"

	"github.com/droverhq/drover/internal/testenv/etcdtest"
	"github.com/droverhq/drover/kv"
	clientv3 "go.etcd.io/etcd/client/v3"
)

func mustGet(t *testing.T, cli *clientv3.Client, key string) (value string, lease int64, modRev int64) {
	t.Helper()
	g, err := cli.Get(context.Background(), key)
	if err != nil || len(g.Kvs) != 1 {
		t.Fatalf("get %s: %v (%d keys)", key, err, len(g.Kvs))
	}
	return string(g.Kvs[0].Value), g.Kvs[0].Lease, g.Kvs[0].ModRevision
}

func TestCreate(t *testing.T) {
	t.Parallel()
	cli := srv.Client(t)
	ctx := context.Background()
	key := "/" + etcdtest.Namespace(t) + "/k"
	lr, err := cli.Grant(ctx, 30)
	if err != nil {
		t.Fatal(err)
	}
	rev, err := kv.Create(ctx, cli, key, []byte("one"), lr.ID)
	if err != nil {
		t.Fatalf("first create: %v", err)
	}
	v, l, mod := mustGet(t, cli, key)
	if v != "one" || l != int64(lr.ID) || mod != rev {
		t.Fatalf("stored %q lease %x rev %d; want one, %x, %d", v, l, mod, int64(lr.ID), rev)
	}
	// A second create, even with the same value, is refused and writes nothing.
	_, err = kv.Create(ctx, cli, key, []byte("one"), lr.ID)
	var ee *kv.ExistsError
	if !errors.Is(err, kv.ErrExists) || !errors.As(err, &ee) {
		t.Fatalf("second create: %v, want ErrExists", err)
	}
	if string(ee.Value) != "one" || ee.Lease != lr.ID || ee.CreateRevision != rev {
		t.Fatalf("ExistsError %+v does not describe the stored key", ee)
	}
	if _, _, mod2 := mustGet(t, cli, key); mod2 != rev {
		t.Fatalf("refused create rewrote the key: mod revision %d, was %d", mod2, rev)
	}
}

func TestCreateOrValidate(t *testing.T) {
	t.Parallel()
	cli := srv.Client(t)
	ctx := context.Background()
	key := "/" + etcdtest.Namespace(t) + "/k"
	l1, err := cli.Grant(ctx, 30)
	if err != nil {
		t.Fatal(err)
	}
	l2, err := cli.Grant(ctx, 30)
	if err != nil {
		t.Fatal(err)
	}
	rev, created, err := kv.CreateOrValidate(ctx, cli, key, []byte(`{"a":1}`), l1.ID)
	if err != nil || !created {
		t.Fatalf("first: created=%v err=%v", created, err)
	}
	// Same value, same lease: accepted, nothing written.
	rev2, created, err := kv.CreateOrValidate(ctx, cli, key, []byte(`{"a":1}`), l1.ID)
	if err != nil || created || rev2 != rev {
		t.Fatalf("same value and lease: created=%v rev=%d (want %d) err=%v", created, rev2, rev, err)
	}
	for _, tc := range []struct {
		name  string
		value string
		lease clientv3.LeaseID
	}{
		{"other value", `{"a":2}`, l1.ID},
		{"other lease", `{"a":1}`, l2.ID},
		{"no lease", `{"a":1}`, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, _, err := kv.CreateOrValidate(ctx, cli, key, []byte(tc.value), tc.lease)
			if !errors.Is(err, kv.ErrExists) {
				t.Fatalf("err %v, want ErrExists", err)
			}
			v, l, mod := mustGet(t, cli, key)
			if v != `{"a":1}` || l != int64(l1.ID) || mod != rev {
				t.Fatalf("key changed: %q lease %x rev %d", v, l, mod)
			}
		})
	}
}

// Create registers a key only once; the loser learns who holds it.
func ExampleCreate() {
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{srv.ClientURL()}})
	if err != nil {
		fmt.Println(err)
		return
	}
	defer cli.Close()
	ctx := context.Background()
	key := "/example-kv/components/router/endpoints/r1"
	_, _ = cli.Delete(ctx, key)
	if _, err := kv.Create(ctx, cli, key, []byte(`{"id":"r1"}`), 0); err != nil {
		fmt.Println(err)
		return
	}
	_, err = kv.Create(ctx, cli, key, []byte(`{"id":"r1"}`), 0)
	fmt.Println(errors.Is(err, kv.ErrExists))
	// Output: true
}

// Update: five writers each add 40 entries of their own to one JSON value
// at the same time; no entry is lost to another writer's stale copy. An
// error from the change writes nothing.
func TestUpdateConcurrent(t *testing.T) {
	t.Parallel()
	key := etcdtest.Namespace(t) + "/counts"
	errs := make(chan error, 5)
	for w := range 5 {
		go func() {
			cli := srv.Client(t)
			for i := range 40 {
				err := kv.Update(context.Background(), cli, key, func(old []byte) ([]byte, error) {
					m := map[string]int{}
					if old != nil {
						if err := json.Unmarshal(old, &m); err != nil {
							return nil, err
						}
					}
					m[fmt.Sprintf("w%d-%d", w, i)] = 1
					return json.Marshal(m)
				})
				if err != nil {
					errs <- err
					return
				}
			}
			errs <- nil
		}()
	}
	for range 5 {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
	v, _, mod := mustGet(t, srv.Client(t), key)
	m := map[string]int{}
	if err := json.Unmarshal([]byte(v), &m); err != nil || len(m) != 200 {
		t.Fatalf("%d entries, want 200 (%v)", len(m), err)
	}
	refused := errors.New("refused")
	if err := kv.Update(context.Background(), srv.Client(t), key, func([]byte) ([]byte, error) { return nil, refused }); !errors.Is(err, refused) {
		t.Fatalf("change error: %v", err)
	}
	if _, _, after := mustGet(t, srv.Client(t), key); after != mod {
		t.Fatalf("a refused change wrote (mod revision %d, was %d)", after, mod)
	}
}
