package server

import (
	"slices"
	"testing"

	"github.com/agentvm/agentvm/api"
	"github.com/agentvm/agentvm/internal/store"
)

// The recorded states and the API's are two types with the same values:
// toAPI converts one into the other, so a state added to one only must fail
// here, not reach clients as a value the API does not declare.
func TestStoreAndAPIStatesMatch(t *testing.T) {
	var got []api.State
	for _, st := range store.States {
		got = append(got, api.State(st))
	}
	if !slices.Equal(got, api.States) {
		t.Fatalf("store.States %v, api.States %v", store.States, api.States)
	}
}
