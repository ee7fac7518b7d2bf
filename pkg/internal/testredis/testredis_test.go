package testredis

import (
	"context"
	"testing"
)

func TestStartServesCommandsOnLoopback(t *testing.T) {
	srv := Start(t)
	c := srv.NewClient(t)
	ctx := context.Background()
	if err := c.Set(ctx, "k", "v", 0).Err(); err != nil {
		t.Fatalf("SET: %v", err)
	}
	got, err := c.Get(ctx, "k").Result()
	if err != nil || got != "v" {
		t.Fatalf("GET = %q, %v; want v", got, err)
	}
}

func TestStartGivesEachTestItsOwnServer(t *testing.T) {
	a, b := Start(t), Start(t)
	if a.Addr == b.Addr {
		t.Fatalf("both servers on %s", a.Addr)
	}
	ctx := context.Background()
	if err := a.NewClient(t).Set(ctx, "only-in-a", "1", 0).Err(); err != nil {
		t.Fatal(err)
	}
	if n, err := b.NewClient(t).Exists(ctx, "only-in-a").Result(); err != nil || n != 0 {
		t.Fatalf("EXISTS on b = %d, %v; want 0", n, err)
	}
}
