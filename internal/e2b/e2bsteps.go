package e2b

import (
	"archive/tar"
	"bufio"
	"compress/gzip"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path"
	"slices"
	"strconv"
	"strings"
	"unicode"

	"github.com/google/go-containerregistry/pkg/name"

	"github.com/agentvm/agentvm/api"
	"github.com/agentvm/agentvm/internal/builder"
	"github.com/agentvm/agentvm/internal/image"
)

// buildSpec is the body of POST /v2/templates/{id}/builds/{build}.
type buildSpec struct {
	FromImage         string          `json:"fromImage"`
	FromTemplate      string          `json:"fromTemplate"`
	FromImageRegistry json.RawMessage `json:"fromImageRegistry"`
	Force             bool            `json:"force"`
	Steps             []buildStep     `json:"steps"`
	StartCmd          string          `json:"startCmd"`
	ReadyCmd          string          `json:"readyCmd"`
}

// buildStep is one of the SDK's steps: RUN, COPY, ENV, WORKDIR or USER.
// The JS SDK sends its COPY options too (forceUpload, resolveSymlinks,
// gzip): they are the client's business.
type buildStep struct {
	Type        string   `json:"type"`
	Args        []string `json:"args"`
	Force       bool     `json:"force"`
	FilesHash   string   `json:"filesHash"`
	ForceUpload *bool    `json:"forceUpload,omitempty"`
	Resolve     *bool    `json:"resolveSymlinks,omitempty"`
	Gzip        *bool    `json:"gzip,omitempty"`
}

// translated is an SDK build as the Dockerfile it means, with what the
// build context needs.
type translated struct {
	dockerfile []byte
	lineStep   []string              // per Dockerfile line: "base", the step's 1-based number, or "finalize"
	hashes     []string              // the uploads the context holds, under e2b/<hash>/
	forceLine  int                   // the first line of the first step with force (0: none)
	auth       *builder.RegistryAuth // fromImage's registry login
}

func (t *translated) stepOf(line int) string {
	if line >= 1 && line <= len(t.lineStep) {
		return t.lineStep[line-1]
	}
	return ""
}

// e2bBaseImage is the image E2B's Template() and fromBaseImage() name.
const e2bBaseImage = "e2bdev/base"

// translate turns the SDK's steps into a Dockerfile: the user (default
// "user", in /home/user, as E2B's builds) and its changes, RUN through
// bash, COPY of the uploaded files, the start and ready commands.
func translate(sp *buildSpec, baseUser func(template string) string) (*translated, error) {
	t := &translated{}
	add := func(step, line string) {
		t.dockerfile = append(t.dockerfile, line+"\n"...)
		t.lineStep = append(t.lineStep, step)
	}
	from := sp.FromTemplate
	oci := false
	switch {
	case from != "" && sp.FromImage != "":
		return nil, fmt.Errorf("fromTemplate and fromImage are exclusive")
	case from == "" && (sp.FromImage == e2bBaseImage || sp.FromImage == e2bBaseImage+":latest" || sp.FromImage == ""):
		from = "base"
	case from == "":
		if strings.ContainsFunc(sp.FromImage, unicode.IsSpace) {
			return nil, fmt.Errorf("fromImage %q is not an image reference", sp.FromImage)
		}
		ref, err := name.ParseReference(sp.FromImage)
		if err != nil {
			return nil, fmt.Errorf("fromImage %q: %v", sp.FromImage, err)
		}
		from, oci = ref.Name(), true // in full (index.docker.io/library/python:3.12): never a template's name
	}
	if len(sp.FromImageRegistry) > 0 && string(sp.FromImageRegistry) != "null" {
		var reg struct {
			Type     string `json:"type"`
			Username string `json:"username"`
			Password string `json:"password"`
		}
		if err := json.Unmarshal(sp.FromImageRegistry, &reg); err != nil || !oci {
			return nil, fmt.Errorf("fromImageRegistry goes with fromImage, as {type, username, password}")
		}
		if reg.Type != "registry" || reg.Username == "" {
			return nil, fmt.Errorf("fromImageRegistry of type %q: agentvm logs in to registries with a username and password (fromImage(image, {username, password})); fromAWSRegistry and fromGCPRegistry are not supported", reg.Type)
		}
		t.auth = &builder.RegistryAuth{Username: reg.Username, Password: reg.Password}
	}
	if _, _, err := builder.SplitRef(from); err != nil && !oci {
		return nil, fmt.Errorf("fromTemplate %q is not a template name", from)
	}
	add("base", "FROM "+from)
	user := baseUser(from) // a template's user ("" for root)
	switch _, err := image.Resolve(from); {
	case err == nil: // an image: E2B's builds start as user in its home
		user = "user"
		add("base", "USER user")
		add("base", "WORKDIR /home/user")
	case oci: // and so on an OCI image, as E2B's, with that user made; E2B never starts an image's own command
		user = "user"
		add("base", "ENTRYPOINT []")
		add("base", "CMD []")
		add("base", "HEALTHCHECK NONE")
		add("base", "USER root")
		add("base", "RUN id -u user >/dev/null 2>&1 || useradd -m -s /bin/bash user")
		add("base", "USER user")
		add("base", "WORKDIR /home/user")
	}
	asRoot := func(step string, cmd []string) {
		if user != "root" && user != "" {
			add(step, "USER root")
		}
		add(step, "RUN "+builder.ExecForm(cmd...))
		if user != "root" && user != "" {
			add(step, "USER "+user)
		}
	}
	known := map[string]bool{"root": true, "user": true}
	for i, st := range sp.Steps {
		step := strconv.Itoa(i + 1)
		if st.Force && t.forceLine == 0 {
			t.forceLine = len(t.lineStep) + 1
		}
		for j, a := range st.Args {
			if strings.ContainsFunc(a, unicode.IsControl) && !(st.Type == "RUN" && j == 0) { // a RUN's command goes in JSON
				return nil, fmt.Errorf("step %s (%s): a control character in an argument", step, st.Type)
			}
		}
		switch st.Type {
		case "RUN":
			if len(st.Args) < 1 || len(st.Args) > 2 || st.Args[0] == "" {
				return nil, fmt.Errorf("step %s: RUN takes a command and an optional user", step)
			}
			as := user
			if len(st.Args) == 2 && st.Args[1] != "" {
				as = st.Args[1]
				if !builder.ValidUser(as) {
					return nil, fmt.Errorf("step %s: RUN as %q: not a user name", step, as)
				}
			}
			if as != user && as != "" {
				add(step, "USER "+builder.QuoteWord(as))
			}
			add(step, "RUN "+builder.ExecForm("/bin/bash", "-c", st.Args[0]))
			if as != user && as != "" {
				add(step, "USER "+builder.QuoteWord(orRoot(user)))
			}
		case "COPY":
			if len(st.Args) < 2 || len(st.Args) > 4 || !hashRe.MatchString(st.FilesHash) {
				return nil, fmt.Errorf("step %s: COPY takes a source, a destination, an optional user and mode, and a filesHash", step)
			}
			owner := orRoot(user)
			if len(st.Args) > 2 && st.Args[2] != "" {
				owner = st.Args[2]
			}
			if !strings.Contains(owner, ":") {
				owner += ":" + owner
			}
			if !builder.ValidOwner(owner) {
				return nil, fmt.Errorf("step %s: COPY owner %q: a user, user:group or ids", step, owner)
			}
			flags := " --chown=" + owner
			if len(st.Args) > 3 && st.Args[3] != "" && strings.Trim(st.Args[3], "0") != "" {
				if _, err := strconv.ParseUint(st.Args[3], 8, 32); err != nil {
					return nil, fmt.Errorf("step %s: COPY mode %q is not octal", step, st.Args[3])
				}
				flags += " --chmod=" + st.Args[3]
			}
			src := strings.TrimPrefix(path.Clean("/"+st.Args[0]), "/")
			if src == "" {
				src = "."
			}
			add(step, "COPY"+flags+" "+builder.ExecForm(builder.EscapeDollar("e2b/"+st.FilesHash+"/"+src), builder.EscapeDollar(st.Args[1])))
			if !slices.Contains(t.hashes, st.FilesHash) {
				t.hashes = append(t.hashes, st.FilesHash)
			}
		case "ENV":
			if len(st.Args) == 0 || len(st.Args)%2 != 0 {
				return nil, fmt.Errorf("step %s: ENV takes name, value pairs", step)
			}
			for j := 0; j < len(st.Args); j += 2 {
				if !builder.ValidEnvName(st.Args[j]) {
					return nil, fmt.Errorf("step %s: ENV %q is not a variable name", step, st.Args[j])
				}
				add(step, "ENV "+st.Args[j]+"="+builder.QuoteWord(st.Args[j+1]))
			}
		case "WORKDIR":
			if len(st.Args) != 1 || st.Args[0] == "" {
				return nil, fmt.Errorf("step %s: WORKDIR takes a path", step)
			}
			add(step, "WORKDIR "+builder.QuoteWord(st.Args[0]))
			if user != "root" && user != "" { // E2B's WORKDIR belongs to the user
				asRoot(step, []string{"/bin/sh", "-c", `chown "$1" .`, "sh", user + ":" + user})
			}
		case "USER":
			if len(st.Args) != 1 || st.Args[0] == "" {
				return nil, fmt.Errorf("step %s: USER takes a name", step)
			}
			u := st.Args[0]
			if !builder.ValidUser(u) {
				return nil, fmt.Errorf("step %s: USER %q: not a user name", step, u)
			}
			if !known[u] { // E2B makes the user when it does not exist
				asRoot(step, []string{"/bin/sh", "-c", `id -u "$1" >/dev/null 2>&1 || useradd --create-home --shell /bin/bash "$1"`, "sh", u})
				known[u] = true
			}
			user = u
			add(step, "USER "+builder.QuoteWord(u))
		default:
			return nil, fmt.Errorf("step %s: unknown step type %q (RUN, COPY, ENV, WORKDIR, USER)", step, st.Type)
		}
	}
	if sp.ReadyCmd != "" && sp.StartCmd == "" {
		return nil, fmt.Errorf("a ready command without a start command: agentvm waits for what a start command serves")
	}
	if sp.StartCmd != "" {
		if sp.ReadyCmd != "" {
			add("finalize", "HEALTHCHECK CMD "+builder.ExecForm("/bin/bash", "-c", sp.ReadyCmd))
		}
		add("finalize", "CMD "+builder.ExecForm("/bin/bash", "-c", sp.StartCmd))
	}
	return t, nil
}

func orRoot(u string) string {
	if u == "" {
		return "root"
	}
	return u
}

// writeContext writes the build context: each upload's entries under
// e2b/<hash>/ (their names are relative to the SDK's context directory),
// and the Dockerfile.
func (t *translated) writeContext(w io.Writer, file func(hash string) string) error {
	tw := tar.NewWriter(w)
	for _, h := range t.hashes {
		if err := copyUpload(tw, file(h), "e2b/"+h+"/"); err != nil {
			return fmt.Errorf("the files of hash %s: %w", h, err)
		}
	}
	if err := tw.WriteHeader(&tar.Header{Name: api.HiddenDockerfile, Mode: 0o644, Size: int64(len(t.dockerfile)), Typeflag: tar.TypeReg}); err != nil {
		return err
	}
	if _, err := tw.Write(t.dockerfile); err != nil {
		return err
	}
	return tw.Close()
}

// copyUpload copies an uploaded tar (gzip or not) into tw under prefix.
func copyUpload(tw *tar.Writer, file, prefix string) error {
	f, err := os.Open(file)
	if err != nil {
		return err
	}
	defer f.Close()
	br := bufio.NewReader(f)
	var r io.Reader = br
	if magic, _ := br.Peek(2); len(magic) == 2 && magic[0] == 0x1f && magic[1] == 0x8b {
		zr, err := gzip.NewReader(br)
		if err != nil {
			return err
		}
		defer zr.Close()
		r = zr
	}
	tr := tar.NewReader(r)
	for {
		hdr, err := tr.Next()
		if err == io.EOF {
			return nil
		}
		if err != nil {
			return fmt.Errorf("not a tar archive: %v", err)
		}
		switch hdr.Typeflag {
		case tar.TypeReg, tar.TypeDir, tar.TypeSymlink:
		default:
			continue
		}
		name := path.Clean(strings.TrimPrefix(hdr.Name, "./"))
		if name == "." || strings.HasPrefix(name, "/") || name == ".." || strings.HasPrefix(name, "../") {
			continue // the context's root, or what would leave it (refused again when unpacked)
		}
		out := &tar.Header{Name: prefix + name, Mode: hdr.Mode, Typeflag: hdr.Typeflag, Linkname: hdr.Linkname, Size: hdr.Size, ModTime: hdr.ModTime}
		if hdr.Typeflag == tar.TypeDir {
			out.Name += "/"
		}
		if err := tw.WriteHeader(out); err != nil {
			return err
		}
		if hdr.Typeflag == tar.TypeReg {
			if _, err := io.CopyN(tw, tr, hdr.Size); err != nil {
				return err
			}
		}
	}
}
