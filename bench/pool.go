package main

import (
	"context"
	"fmt"
	"time"

	"github.com/agentvm/agentvm/api"
)

// poolLoop measures creates served by the warm pool: a second server with
// --warm-pool 1 on the same template, each create made once the pool is refilled.
func (b *bench) poolLoop(ctx context.Context) error {
	srv, err := b.startPoolServer(ctx, "pool")
	if err != nil {
		return err
	}
	defer srv.stop() // drains the pool
	c := srv.client
	var total, server []float64
	var ids []string
	defer func() {
		for _, id := range ids {
			c.DeleteVM(context.Background(), id)
		}
	}()
	// The first create of the shape restores (a miss) and starts the refill.
	v, err := c.CreateVM(ctx, vmShape)
	if err != nil {
		return err
	}
	ids = append(ids, v.ID)
	for i := 0; i < b.o.creates; i++ {
		if err := waitPool(ctx, c.Health, fmt.Sprintf("1x%d", vmMemory>>20)); err != nil {
			return err
		}
		t0 := time.Now()
		v, err := c.CreateVM(ctx, vmShape)
		if err != nil {
			return fmt.Errorf("pool create %d: %w", i+1, err)
		}
		ids = append(ids, v.ID)
		if _, err := c.Exec(ctx, v.ID, api.ExecRequest{Cmd: []string{"true"}}); err != nil {
			return err
		}
		total = append(total, msf(time.Since(t0)))
		server = append(server, float64(v.CreateMs))
		c.DeleteVM(ctx, v.ID)
		ids = ids[:len(ids)-1]
	}
	b.r.PoolCreateToFirstExec = summarize(total)
	b.r.PoolCreateServer = summarize(server)
	logf("warm pool: create -> first exec p50 %.0f ms", b.r.PoolCreateToFirstExec.P50)
	return nil
}

func waitPool(ctx context.Context, health func(context.Context) (*api.Health, error), shape string) error {
	deadline := time.Now().Add(2 * time.Minute)
	for {
		h, err := health(ctx)
		if err == nil && h.WarmPool[shape] > 0 {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("warm pool of %s not refilled within 2m (%v)", shape, err)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
	}
}
