package server

import (
	"bufio"
	"encoding/json"
	"errors"
	"io"
	"strings"
	"testing"

	"github.com/agentvm/agentvm/api"
)

func TestTranslateCodeEvent(t *testing.T) {
	cases := []struct {
		in   string
		want api.CodeEvent
	}{
		{`{"type":"stdout","text":"hi\n","timestamp":"x"}`, api.CodeEvent{Type: api.CodeStdout, Text: "hi\n"}},
		{`{"type":"stderr","text":"e"}`, api.CodeEvent{Type: api.CodeStderr, Text: "e"}},
		{`{"type":"error","name":"ValueError","value":"v","traceback":"tb"}`, api.CodeEvent{Type: api.CodeError, Name: "ValueError", Value: "v", Traceback: "tb"}},
		{`{"type":"error","name":"E","value":"v","traceback":["a","b"]}`, api.CodeEvent{Type: api.CodeError, Name: "E", Value: "v", Traceback: "a\nb"}},
		{`{"type":"number_of_executions","execution_count":7}`, api.CodeEvent{Type: api.CodeCount, ExecutionCount: 7}},
		{`{"type":"end_of_execution"}`, api.CodeEvent{Type: api.CodeEnd}},
		{`{"type":"keepalive"}`, api.CodeEvent{}},
		{`{"type":"error","name":7}`, api.CodeEvent{Type: api.CodeError}}, // wrong types: empty fields, no panic
		{`{}`, api.CodeEvent{}},
	}
	for _, c := range cases {
		got, ok := translateCodeEvent([]byte(c.in))
		if !ok || got.Type != c.want.Type || got.Text != c.want.Text || got.Name != c.want.Name || got.Value != c.want.Value ||
			got.Traceback != c.want.Traceback || got.ExecutionCount != c.want.ExecutionCount {
			t.Errorf("%s: got %+v, %v", c.in, got, ok)
		}
	}
	for _, bad := range []string{`nope`, `[1]`, `"s"`} {
		if _, ok := translateCodeEvent([]byte(bad)); ok {
			t.Errorf("%s accepted", bad)
		}
	}
	r, ok := translateCodeEvent([]byte(`{"type":"result","text":"42","html":"<b>","png":"iVBO","json":{"a":1},"data":{"c":[1]},` +
		`"chart":{"type":"line"},"extra":{"application/x-custom":"x","text/plain":"not this"},"latex":null,"is_main_result":true}`))
	if !ok || r.Type != api.CodeResult || !r.Main || string(r.Chart) != `{"type":"line"}` {
		t.Fatalf("result: %+v", r)
	}
	want := map[string]string{"text/plain": `"42"`, "text/html": `"<b>"`, "image/png": `"iVBO"`, "application/json": `{"a":1}`,
		dataFrameMIME: `{"c":[1]}`, "application/x-custom": `"x"`}
	if len(r.Data) != len(want) {
		t.Fatalf("data: %v", r.Data)
	}
	for k, v := range want {
		if string(r.Data[k]) != v {
			t.Errorf("data[%s] = %s, want %s", k, r.Data[k], v)
		}
	}
	// The translated event is valid JSON again.
	if _, err := json.Marshal(r); err != nil {
		t.Fatal(err)
	}
}

func TestReadLineBounded(t *testing.T) {
	br := bufio.NewReaderSize(strings.NewReader("short\n"+strings.Repeat("x", 100)+"\nlast"), 16)
	if l, err := readLine(br, 50); string(l) != "short\n" || err != nil {
		t.Fatalf("first: %q %v", l, err)
	}
	if _, err := readLine(br, 50); !errors.Is(err, errLineTooLong) {
		t.Fatalf("long line: %v", err)
	}
	br = bufio.NewReaderSize(strings.NewReader("tail without newline"), 16)
	if l, err := readLine(br, 50); string(l) != "tail without newline" || err != io.EOF {
		t.Fatalf("tail: %q %v", l, err)
	}
}

func TestGuestMessage(t *testing.T) {
	for in, want := range map[string]string{
		`Context abc not found`: "Context abc not found",
		`{"message":"m"}`:       "m",
		`{"detail":"d"}`:        "d",
		"":                      "no details",
		"bad \xff utf8":         "bad ? utf8",
	} {
		if got := guestMessage([]byte(in)); got != want {
			t.Errorf("guestMessage(%q) = %q, want %q", in, got, want)
		}
	}
}
