package fsdiff

import (
	"fmt"
	"strings"
)

// maxEditDistance bounds the line diff's work: two texts further apart
// than this are shown as one hunk replacing the whole file.
const maxEditDistance = 1000

type edit struct {
	op   byte // ' ', '-', '+'
	line string
}

// lineEdits is Myers' shortest edit script between two line lists, or nil
// when it is longer than maxEditDistance.
func lineEdits(a, b []string) []edit {
	n, m := len(a), len(b)
	max := n + m
	if max == 0 {
		return []edit{}
	}
	limit := min(max, maxEditDistance)
	off := limit + 1
	v := make([]int, 2*limit+3)
	// trace[d] keeps v[-d..d] as the step d began (what backtracking reads
	// of it): O(D²) ints in all, not O(D·(N+M)).
	var trace [][]int
	for d := 0; d <= limit; d++ {
		trace = append(trace, append([]int(nil), v[off-d:off+d+1]...))
		for k := -d; k <= d; k += 2 {
			var x int
			if k == -d || (k != d && v[off+k-1] < v[off+k+1]) {
				x = v[off+k+1]
			} else {
				x = v[off+k-1] + 1
			}
			y := x - k
			for x < n && y < m && a[x] == b[y] {
				x++
				y++
			}
			v[off+k] = x
			if x >= n && y >= m {
				return backtrack(trace, a, b, d)
			}
		}
	}
	return nil
}

func backtrack(trace [][]int, a, b []string, d int) []edit {
	x, y := len(a), len(b)
	var out []edit
	for ; d > 0; d-- {
		v := trace[d] // v[-d..d] at index 0..2d
		at := func(k int) int { return v[k+d] }
		k := x - y
		var pk int
		if k == -d || (k != d && at(k-1) < at(k+1)) {
			pk = k + 1
		} else {
			pk = k - 1
		}
		px := at(pk)
		py := px - pk
		for x > px && y > py {
			x--
			y--
			out = append(out, edit{' ', a[x]})
		}
		if x == px {
			y--
			out = append(out, edit{'+', b[y]})
		} else {
			x--
			out = append(out, edit{'-', a[x]})
		}
	}
	for x > 0 && y > 0 {
		x--
		y--
		out = append(out, edit{' ', a[x]})
	}
	for i, j := 0, len(out)-1; i < j; i, j = i+1, j-1 {
		out[i], out[j] = out[j], out[i]
	}
	return out
}

func splitLines(s string) []string {
	if s == "" {
		return nil
	}
	lines := strings.SplitAfter(s, "\n")
	if lines[len(lines)-1] == "" {
		lines = lines[:len(lines)-1]
	}
	return lines
}

// Unified is the unified diff (3 lines of context) of old and new text,
// labelled with the two names.
func Unified(oldName, newName, old, new string) string {
	a, b := splitLines(old), splitLines(new)
	edits := lineEdits(a, b)
	if edits == nil { // too far apart: replace the whole file
		edits = make([]edit, 0, len(a)+len(b))
		for _, l := range a {
			edits = append(edits, edit{'-', l})
		}
		for _, l := range b {
			edits = append(edits, edit{'+', l})
		}
	}
	var sb strings.Builder
	fmt.Fprintf(&sb, "--- %s\n+++ %s\n", oldName, newName)
	const ctx = 3
	// Hunks: runs of changes with up to 2*ctx equal lines between them.
	i := 0
	ai, bi := 0, 0 // line numbers (0-based) at edits[i]
	for i < len(edits) {
		if edits[i].op == ' ' {
			i, ai, bi = i+1, ai+1, bi+1
			continue
		}
		start := max(i-ctx, 0)
		for j := i; j > start; j-- {
			ai, bi = ai-1, bi-1
		}
		end := i
		for end < len(edits) {
			if edits[end].op != ' ' {
				end++
				continue
			}
			run := end
			for run < len(edits) && edits[run].op == ' ' {
				run++
			}
			if run == len(edits) || run-end > 2*ctx {
				end = min(end+ctx, len(edits))
				break
			}
			end = run
		}
		na, nb := 0, 0
		for _, e := range edits[start:end] {
			if e.op != '+' {
				na++
			}
			if e.op != '-' {
				nb++
			}
		}
		fmt.Fprintf(&sb, "@@ -%s +%s @@\n", hunkRange(ai, na), hunkRange(bi, nb))
		for _, e := range edits[start:end] {
			sb.WriteByte(e.op)
			sb.WriteString(e.line)
			if !strings.HasSuffix(e.line, "\n") {
				sb.WriteString("\n\\ No newline at end of file\n")
			}
			if e.op != '+' {
				ai++
			}
			if e.op != '-' {
				bi++
			}
		}
		i = end
	}
	return sb.String()
}

func hunkRange(start, n int) string {
	if n == 0 {
		return fmt.Sprintf("%d,0", start)
	}
	if n == 1 {
		return fmt.Sprintf("%d", start+1)
	}
	return fmt.Sprintf("%d,%d", start+1, n)
}
