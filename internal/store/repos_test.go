package store

import (
	"context"
	"errors"
	"reflect"
	"testing"
	"time"
)

// A repository's record and webhooks survive a write and a read; attaching
// a VM replaces its repository; deleting the repository takes its VMs'
// attachments and its tokens with it, and nothing else.
func TestRepos(t *testing.T) {
	eachStore(t, func(t *testing.T, s *Store) {
		ctx := context.Background()
		at := time.Date(2026, 12, 6, 1, 2, 3, 456789000, time.UTC)
		r := &Repo{Name: "app", CreatedAt: at, Hooks: []RepoHook{{ID: "hook_1", URL: "http://127.0.0.1:9/x", Secret: "s", AllowPrivate: true, CreatedAt: at}}}
		if err := s.CreateRepo(ctx, r); err != nil {
			t.Fatal(err)
		}
		if err := s.CreateRepo(ctx, &Repo{Name: "app", CreatedAt: at}); !errors.Is(err, ErrConflict) {
			t.Fatalf("second create: %v, want ErrConflict", err)
		}
		if err := s.CreateRepo(ctx, &Repo{Name: "other", CreatedAt: at}); err != nil {
			t.Fatal(err)
		}
		if got, err := s.GetRepo(ctx, "app"); err != nil || !reflect.DeepEqual(got, r) {
			t.Fatalf("read back:\n got %+v (%v)\nwant %+v", got, err, r)
		}
		r.Hooks = nil
		if err := s.UpdateRepo(ctx, r); err != nil {
			t.Fatal(err)
		}
		if got, _ := s.GetRepo(ctx, "app"); len(got.Hooks) != 0 {
			t.Fatalf("hooks after update: %+v", got.Hooks)
		}
		if err := s.UpdateRepo(ctx, &Repo{Name: "nope"}); !errors.Is(err, ErrNotFound) {
			t.Fatalf("update of an unknown repo: %v", err)
		}
		for _, a := range [][2]string{{"vm1", "other"}, {"vm1", "app"}, {"vm2", "other"}} {
			if err := s.AttachRepo(ctx, a[0], a[1]); err != nil {
				t.Fatal(err)
			}
		}
		if got, _ := s.VMRepo(ctx, "vm1"); got != "app" {
			t.Fatalf("vm1's repo %q, want app (the second attach)", got)
		}
		for _, tk := range []*Token{{ID: "t1", Hash: "h1", Repo: "app"}, {ID: "t2", Hash: "h2", Repo: "other"}, {ID: "t3", Hash: "h3", VMID: "vm1"}} {
			tk.ExpiresAt = at.Add(time.Hour)
			if err := s.CreateToken(ctx, tk); err != nil {
				t.Fatal(err)
			}
		}
		if ids, err := s.RepoTokens(ctx, "app"); err != nil || !reflect.DeepEqual(ids, []string{"t1"}) {
			t.Fatalf("app's tokens %v %v", ids, err)
		}
		if vt, _ := s.ListVMTokens(ctx, "vm1", at); len(vt) != 1 || vt[0].ID != "t3" {
			t.Fatalf("a VM's tokens list a repository's: %+v", vt)
		}
		if err := s.DeleteRepo(ctx, "app"); err != nil {
			t.Fatal(err)
		}
		if err := s.DeleteRepo(ctx, "app"); !errors.Is(err, ErrNotFound) {
			t.Fatalf("second delete: %v", err)
		}
		if got, _ := s.VMRepo(ctx, "vm1"); got != "" {
			t.Fatalf("vm1 still attached to %q", got)
		}
		if got, _ := s.VMRepo(ctx, "vm2"); got != "other" {
			t.Fatalf("vm2's repo %q, want other", got)
		}
		for id, want := range map[string]bool{"t1": false, "t2": true, "t3": true} {
			if _, err := s.TokenByID(ctx, id, at); (err == nil) != want {
				t.Fatalf("token %s after the delete: %v (want kept %v)", id, err, want)
			}
		}
		if list, _ := s.ListRepos(ctx); len(list) != 1 || list[0].Name != "other" {
			t.Fatalf("list %+v", list)
		}
	})
}
