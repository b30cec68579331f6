package guest

import (
	"io"
	"strings"
	"testing"
)

func TestNDJSONLines(t *testing.T) {
	long := strings.Repeat("x", 100<<10) // several reads of the small buffer
	in := `{"type":"stdout","data":"aGk="}` + "\n" + `{"type":"stderr","error":"` + long + `"}` + "\n" + `{"type":"end","exit_code":3}` + "\n" + `{"type":"cut`
	s := &ProcStream{newNDJSON(io.NopCloser(strings.NewReader(in)))}
	for i, want := range []string{"stdout", "stderr", "end"} {
		ev, err := s.Next()
		if err != nil || ev.Type != want {
			t.Fatalf("line %d: %+v %v", i, ev, err)
		}
		if i == 1 && ev.Error != long {
			t.Fatal("the long line was cut")
		}
		if i == 2 && ev.ExitCode != 3 {
			t.Fatalf("end line: %+v", ev)
		}
	}
	// a cut line (no newline: the agent always ends its lines) is no event
	if ev, err := s.Next(); err == nil {
		t.Fatalf("a cut line decoded: %+v", ev)
	}
	huge := `{"type":"stdout","error":"` + strings.Repeat("y", maxProcEventLine) + `"}` + "\n"
	s = &ProcStream{newNDJSON(io.NopCloser(strings.NewReader(huge)))}
	if _, err := s.Next(); err == nil || !strings.Contains(err.Error(), "longer than") {
		t.Fatalf("a line past the bound: %v", err)
	}
}
