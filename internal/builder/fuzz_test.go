package builder

import (
	"errors"
	"testing"
)

// FuzzPlan feeds any text to the Dockerfile planner: it answers with a plan
// or an invalid-argument error, never panics, and never plans a COPY
// outside the context or a RUN without a command.
func FuzzPlan(f *testing.F) {
	for _, s := range []string{appSeed, "FROM default\nRUN true\n", "ARG A=default\nFROM $A\nCOPY . /x/\n", "FROM web\nENTRYPOINT [\"/a\"]\nCMD b\n",
		"FROM default\nENV A=1 B=\"2 3\"\nWORKDIR $A/../x\nCOPY *.txt ./\nHEALTHCHECK CMD [\"true\"]\n", "FROM default\nCOPY [\"a b\", \"/c/\"]\n"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, df string) {
		c := ctxOf(t, map[string]string{"a.txt": "a", "dir/b.txt": "b", "a b": "c", "run.sh": "#!/bin/sh"})
		p, err := parsePlan([]byte(df), c, nil, images)
		if err != nil {
			if !errors.Is(err, ErrInvalid) {
				t.Fatalf("%q: an error that is not an invalid argument: %v", df, err)
			}
			return
		}
		for _, s := range p.steps {
			if s.copy == nil && len(s.argv) == 0 {
				t.Fatalf("%q: a RUN without a command", df)
			}
			if s.copy != nil {
				for _, it := range s.copy.items {
					if !c.has(it.src) {
						t.Fatalf("%q: COPY of %q, not in the context", df, it.src)
					}
				}
			}
		}
	})
}

const appSeed = `ARG BASE=default
FROM ${BASE}
ENV APP_HOME=/opt/app PORT=8000
WORKDIR $APP_HOME
COPY --chown=user:user dir/ ./
ADD --chmod=755 run.sh /usr/local/bin/
USER user
RUN ["/bin/sh", "-c", "id"]
SHELL ["/bin/bash", "-c"]
EXPOSE 8000
CMD ["run.sh"]
`
