package image

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"strings"
)

// Instruction is one Dockerfile instruction: its keyword in upper case and
// the rest of its (continued) line.
type Instruction struct {
	Cmd  string
	Args string
	Line int
}

// Stage is a FROM and the instructions up to the next FROM.
type Stage struct {
	Name string // the AS name, "" if none
	Base string // the image, with ARG defaults substituted
	Body []Instruction
}

// Dockerfile is the parsed file: global ARG defaults and the stages in order.
type Dockerfile struct {
	Args   map[string]string
	Stages []Stage
}

// Stage returns the stage called name.
func (d *Dockerfile) Stage(name string) (Stage, bool) {
	for _, s := range d.Stages {
		if s.Name == name {
			return s, true
		}
	}
	return Stage{}, false
}

// ParseDockerfile reads the subset of the Dockerfile syntax that keyward's
// Dockerfile uses: comments, parser directives, backslash continuations,
// global ARGs before the first FROM (substituted into FROM as ${NAME} or
// $NAME), and FROM image [AS name].
func ParseDockerfile(r io.Reader) (*Dockerfile, error) {
	d := &Dockerfile{Args: map[string]string{}}
	sc := bufio.NewScanner(r)
	var cont strings.Builder
	start, n := 0, 0
	for sc.Scan() {
		n++
		line := strings.TrimSpace(sc.Text())
		if cont.Len() == 0 {
			start = n
			if line == "" || strings.HasPrefix(line, "#") {
				continue
			}
		} else if strings.HasPrefix(line, "#") {
			continue // comments inside a continued instruction are dropped
		}
		if strings.HasSuffix(line, `\`) {
			cont.WriteString(strings.TrimSuffix(line, `\`))
			cont.WriteString(" ")
			continue
		}
		cont.WriteString(line)
		if err := d.add(cont.String(), start); err != nil {
			return nil, err
		}
		cont.Reset()
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("reading the Dockerfile: %w", err)
	}
	if cont.Len() > 0 {
		return nil, fmt.Errorf("line %d: continuation at the end of the file", start)
	}
	if len(d.Stages) == 0 {
		return nil, fmt.Errorf("no FROM instruction")
	}
	return d, nil
}

func (d *Dockerfile) add(text string, line int) error {
	cmd, args, _ := strings.Cut(text, " ")
	in := Instruction{Cmd: strings.ToUpper(cmd), Args: strings.TrimSpace(args), Line: line}
	switch {
	case in.Cmd == "FROM":
		f := strings.Fields(in.Args)
		var s Stage
		switch {
		case len(f) == 1:
		case len(f) == 3 && strings.EqualFold(f[1], "AS"):
			s.Name = f[2]
		default:
			return fmt.Errorf("line %d: FROM %s: want image [AS name]", line, in.Args)
		}
		s.Base = d.expand(f[0])
		d.Stages = append(d.Stages, s)
	case len(d.Stages) == 0 && in.Cmd == "ARG":
		name, value, _ := strings.Cut(in.Args, "=")
		d.Args[name] = value
	case len(d.Stages) == 0:
		return fmt.Errorf("line %d: %s before the first FROM", line, in.Cmd)
	default:
		s := &d.Stages[len(d.Stages)-1]
		s.Body = append(s.Body, in)
	}
	return nil
}

func (d *Dockerfile) expand(s string) string {
	for name, value := range d.Args {
		s = strings.ReplaceAll(s, "${"+name+"}", value)
		s = strings.ReplaceAll(s, "$"+name, value)
	}
	return s
}

// ExecForm parses an instruction's arguments as the JSON array of the exec
// form (ENTRYPOINT ["/usr/local/bin/keyward"]); the shell form, which needs
// /bin/sh in the image, is an error.
func ExecForm(in Instruction) ([]string, error) {
	var argv []string
	if err := json.Unmarshal([]byte(in.Args), &argv); err != nil || len(argv) == 0 {
		return nil, fmt.Errorf("line %d: %s %s is not in exec form (a JSON array): it needs a shell", in.Line, in.Cmd, in.Args)
	}
	return argv, nil
}

// StageLabels returns the labels stage name sets (LABEL key="value" ...),
// with the stage's ARGs substituted: buildArgs (docker build --build-arg)
// over their defaults.
func (d *Dockerfile) StageLabels(name string, buildArgs map[string]string) (map[string]string, error) {
	s, ok := d.Stage(name)
	if !ok {
		return nil, fmt.Errorf("no stage %s", name)
	}
	args := map[string]string{}
	labels := map[string]string{}
	for _, in := range s.Body {
		switch in.Cmd {
		case "ARG":
			k, v, _ := strings.Cut(in.Args, "=")
			if b, ok := buildArgs[k]; ok {
				v = b
			}
			args[k] = v
		case "LABEL":
			rest := in.Args
			for rest = strings.TrimSpace(rest); rest != ""; rest = strings.TrimSpace(rest) {
				k, after, ok := strings.Cut(rest, "=")
				if !ok || strings.ContainsAny(k, " \t") {
					return nil, fmt.Errorf("line %d: LABEL %s: want key=\"value\" pairs", in.Line, in.Args)
				}
				var v string
				if strings.HasPrefix(after, `"`) {
					end := strings.Index(after[1:], `"`)
					if end < 0 {
						return nil, fmt.Errorf("line %d: LABEL %s: unterminated quote", in.Line, in.Args)
					}
					v, rest = after[1:1+end], after[2+end:]
				} else {
					v, rest, _ = strings.Cut(after, " ")
				}
				for a, av := range args {
					v = strings.ReplaceAll(v, "${"+a+"}", av)
				}
				labels[k] = v
			}
		}
	}
	return labels, nil
}
