package server

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"time"

	"github.com/agentvm/agentvm/api"
	"github.com/agentvm/agentvm/internal/record"
)

// Recordings hold every user's sessions, the admin's too: only the admin
// reads them (docs/security.md).
func (s *Server) recordingRoutes(mux patternMux) {
	mux.HandleFunc("GET /v1/vms/{id}/recordings", admin(s.listRecordings))
	mux.HandleFunc("GET /v1/vms/{id}/recordings/export", admin(s.exportRecordings))
	mux.HandleFunc("GET /v1/vms/{id}/recordings/{rec}", admin(s.getRecording))
	mux.HandleFunc("POST /v1/vms/{id}/recordings/settings", admin(s.setRecording))
}

// startRecordings keeps the recordings of forks as their parents' (off
// stays off) and prunes those past their retention every hour.
func (s *Server) startRecordings() {
	s.svc.OnFork(func(parent, child string) {
		if !s.rec.Enabled(parent) {
			s.rec.SetEnabled(child, false)
		}
	})
	s.stopPrune = make(chan struct{})
	go func() {
		t := time.NewTicker(time.Hour)
		defer t.Stop()
		for {
			s.rec.Prune(time.Now())
			select {
			case <-t.C:
			case <-s.stopPrune:
				return
			}
		}
	}()
}

func (s *Server) listRecordings(w http.ResponseWriter, r *http.Request) {
	v, err := s.svc.Get(r.Context(), r.PathValue("id"))
	if err != nil {
		writeErr(w, err)
		return
	}
	list, err := s.rec.List(v.ID)
	if err != nil {
		writeErr(w, err)
		return
	}
	out := api.ListRecordingsResponse{Enabled: s.rec.Enabled(v.ID), Recordings: []api.Recording{}}
	for _, in := range list {
		out.Recordings = append(out.Recordings, api.Recording(in))
	}
	writeJSON(w, http.StatusOK, out)
}

func (s *Server) getRecording(w http.ResponseWriter, r *http.Request) {
	v, err := s.svc.Get(r.Context(), r.PathValue("id"))
	if err != nil {
		writeErr(w, err)
		return
	}
	rc, kind, err := s.rec.Open(v.ID, r.PathValue("rec"))
	if err != nil {
		if errors.Is(err, record.ErrNotFound) {
			writeError(w, http.StatusNotFound, api.CodeNotFound, err.Error())
			return
		}
		writeErr(w, err)
		return
	}
	defer rc.Close()
	w.Header().Set("Content-Type", "application/x-asciicast")
	if kind == "exec" {
		w.Header().Set("Content-Type", "application/json")
	}
	io.Copy(w, rc)
}

// exportRecordings writes the VM's recordings and events as a .tar.gz.
func (s *Server) exportRecordings(w http.ResponseWriter, r *http.Request) {
	v, err := s.svc.Get(r.Context(), r.PathValue("id"))
	if err != nil {
		writeErr(w, err)
		return
	}
	var events []byte
	after := int64(0)
	for {
		evs, err := s.svc.Events(r.Context(), v.ID, after, 5000)
		if err != nil {
			writeErr(w, err)
			return
		}
		for _, e := range evs {
			b, _ := json.Marshal(eventToAPI(e))
			events = append(append(events, b...), '\n')
			after = e.Seq
		}
		if len(evs) < 5000 {
			break
		}
	}
	w.Header().Set("Content-Type", "application/gzip")
	w.Header().Set("Content-Disposition", fmt.Sprintf("attachment; filename=%q", v.Name+"-recordings.tar.gz"))
	if err := s.rec.Export(v.ID, w, events); err != nil {
		s.log.Warn("export recordings", "vm", v.ID, "err", err)
	}
}

func (s *Server) setRecording(w http.ResponseWriter, r *http.Request) {
	var req api.RecordingSettings
	if !decodeJSON(w, r, &req) {
		return
	}
	v, err := s.svc.Get(r.Context(), r.PathValue("id"))
	if err != nil {
		writeErr(w, err)
		return
	}
	if err := s.rec.SetEnabled(v.ID, req.Enabled); err != nil {
		writeErr(w, err)
		return
	}
	state := "off"
	if req.Enabled {
		state = "on"
	}
	s.svc.Event(v.ID, "policy", actor(r), "recording turned %s", state)
	writeJSON(w, http.StatusOK, req)
}
