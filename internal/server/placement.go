package server

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"

	"github.com/agentvm/agentvm/api"
	"github.com/agentvm/agentvm/internal/auth"
	"github.com/agentvm/agentvm/internal/store"
)

// Placement of new VMs in a cluster. The node a create reaches chooses
// where the VM goes: a create from a snapshot goes to the node that keeps
// the snapshot's files (or, for a snapshot in the object store whose node
// is lost, full or silent, to a compatible node: placeFrom); any other goes to the live node with the most
// memory not held by its VMs (spread), this one included, preferring the
// nodes where no VM shares the value of its anti-affinity label. The choice is
// advisory: the chosen node's create reserves the memory in one
// transaction with that node's row locked (store.CreateVM), so concurrent
// creates never put more on a node than it has; a node that turns out
// full (507) or does not answer passes the create to the next roomiest.

// placeCreate serves a create that belongs on another node and reports
// whether it did; a create for this node (or one it cannot place) is left
// to the local handler, which then answers for it.
func (s *Server) placeCreate(w http.ResponseWriter, r *http.Request, req *api.CreateVMRequest, key string, body []byte) bool {
	if s.peers == nil || forwarded(r) {
		return false
	}
	ctx := r.Context()
	if req.From != "" {
		return s.placeFrom(w, r, req, body)
	}
	if key != "" {
		if _, err := s.store.GetVMByIdempotencyKey(ctx, key); err == nil {
			return false // a replay: the local handler returns the VM
		}
	}
	opts := createOptions(req, key)
	if opts.Validate() != nil {
		return false // the local handler says what is wrong
	}
	var avoid store.Avoid
	if req.AntiAffinity != "" {
		avoid = store.Avoid{Key: req.AntiAffinity, Value: req.Labels[req.AntiAffinity]}
	}
	rooms, err := s.store.Rooms(ctx, opts.MemoryMiB, avoid)
	if err != nil {
		return false
	}
	if len(rooms) == 0 {
		writeError(w, http.StatusInsufficientStorage, api.CodeInsufficient,
			fmt.Sprintf("no node of the cluster has %d MiB of memory its VMs do not hold", opts.MemoryMiB))
		return true
	}
	return s.placeIn(w, r, body, rooms, nil)
}

// placeFrom places a create from a snapshot: on the node that keeps its
// files; or, once it is in the object store, when that node is lost, full
// or does not answer, on the roomiest node that runs the QEMU, machine,
// CPU model and accelerator it was saved with (the node fetches it).
func (s *Server) placeFrom(w http.ResponseWriter, r *http.Request, req *api.CreateVMRequest, body []byte) bool {
	ctx, self := r.Context(), s.member.Node().ID
	sn, err := s.store.GetSnapshot(ctx, req.From)
	if err != nil {
		return false // the local handler says what is wrong
	}
	stored := !sn.StoredAt.IsZero() && sn.SavedBy != nil
	var tried []string
	if n := s.otherLiveNode(sn.Node); n != nil {
		resp, err := s.peers.send(ctx, n, r, body, principal(r))
		switch {
		case err == nil && (resp.StatusCode != http.StatusInsufficientStorage || !stored):
			relay(w, resp)
			return true
		case err == nil:
			tried = append(tried, fmt.Sprintf("%s, which keeps it, is full (%s)", n.Name, peerAnswer(resp, 64<<10)))
		case !stored || !notSent(err):
			// Not stored, or the node may have made the VM: no other may.
			writeError(w, http.StatusServiceUnavailable, api.CodeUnavailable, fmt.Sprintf("snapshot %s is kept on node %s, which did not answer: %v", sn.Name, n.Name, err))
			return true
		default:
			tried = append(tried, fmt.Sprintf("%s, which keeps it, could not be reached (%v)", n.Name, err))
		}
	} else if sn.Node == self || !stored {
		return false // this node's snapshot, or its node is lost (the handler says which)
	}
	nodes, err := s.store.ListNodes(ctx)
	if err != nil {
		return false
	}
	can := map[string]bool{}
	for _, n := range nodes {
		can[n.ID] = n.ID != sn.Node && restores(n, *sn.SavedBy)
	}
	rooms, err := s.store.Rooms(ctx, sn.MemoryMiB, store.Avoid{})
	if err != nil {
		return false
	}
	return s.placeIn(w, r, body, rooms, func(id string) bool { return can[id] }, tried...)
}

// placeIn sends the create to the first of rooms (those ok allows, when
// ok is not nil) that takes it, or leaves it to this node when it comes
// first; tried says why earlier nodes did not take it.
func (s *Server) placeIn(w http.ResponseWriter, r *http.Request, body []byte, rooms []store.Room, ok func(node string) bool, tried ...string) bool {
	ctx, self := r.Context(), s.member.Node().ID
	for _, room := range rooms {
		if ok != nil && !ok(room.Node) {
			continue
		}
		if room.Node == self {
			return false
		}
		n := s.otherLiveNode(room.Node)
		if n == nil {
			continue
		}
		resp, err := s.peers.send(ctx, n, r, body, principal(r))
		if err != nil && !notSent(err) {
			// The node may have made the VM: another node must not.
			writeError(w, http.StatusServiceUnavailable, api.CodeUnavailable, fmt.Sprintf("node %s took the create but did not answer: %v; list the VMs before you retry, or retry with an idempotency key", n.Name, err))
			return true
		}
		if err != nil {
			tried = append(tried, fmt.Sprintf("%s could not be reached (%v)", n.Name, err))
			continue
		}
		// A node that cannot restore a stored snapshot after all (it has
		// no object store, or another) says so with 421: the next may.
		if resp.StatusCode == http.StatusInsufficientStorage || (ok != nil && resp.StatusCode == http.StatusMisdirectedRequest) {
			tried = append(tried, fmt.Sprintf("%s did not take it (%d: %s)", n.Name, resp.StatusCode, peerAnswer(resp, 64<<10)))
			continue
		}
		relay(w, resp)
		return true
	}
	writeError(w, http.StatusInsufficientStorage, api.CodeInsufficient, "no node could take the VM: "+strings.Join(tried, "; "))
	return true
}

// restores reports whether node n runs the QEMU, machine, CPU model and
// accelerator that saved a state: the ones it can restore.
func restores(n *store.Node, saved store.SavedBy) bool {
	return n.QEMUVersion == saved.QEMU && n.MachineType == saved.Machine && n.CPUModel == saved.CPUModel && n.Accel == saved.Accel
}

// peerAnswer reads (at most max bytes of) and closes the body of a node's
// answer that is not relayed, for a message.
func peerAnswer(resp *http.Response, max int64) string {
	defer resp.Body.Close()
	b, _ := io.ReadAll(io.LimitReader(resp.Body, max))
	return strings.TrimSpace(string(b))
}

// notSent reports whether a forward failed before its request could reach
// the node (the connection was not made), so the node did nothing.
func notSent(err error) bool {
	var op *net.OpError
	return errors.As(err, &op) && op.Op == "dial"
}

// send sends r (with body) to node n's peer listener as p and returns the
// answer.
func (pp *peers) send(ctx context.Context, n *store.Node, r *http.Request, body []byte, p *auth.Principal) (*http.Response, error) {
	out, err := http.NewRequestWithContext(ctx, r.Method, "https://"+n.PeerAddress+r.URL.RequestURI(), bytes.NewReader(body))
	if err != nil {
		return nil, err
	}
	for k, vs := range r.Header {
		switch http.CanonicalHeaderKey(k) {
		case "Authorization", "Cookie", previewHeader, "Connection", "Upgrade", "Te", "Trailer", "Transfer-Encoding", "Keep-Alive", "Proxy-Connection":
			continue
		}
		out.Header[k] = vs
	}
	out.Header.Set(principalHeader, p.Claim())
	return (&http.Client{Transport: pp.transport(n)}).Do(out)
}

// relay copies a node's answer to the client.
func relay(w http.ResponseWriter, resp *http.Response) {
	defer resp.Body.Close()
	for k, vs := range resp.Header {
		w.Header()[k] = vs
	}
	w.WriteHeader(resp.StatusCode)
	io.Copy(w, resp.Body)
}
