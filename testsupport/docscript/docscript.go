// Package docscript reads the shell commands of a guide (docs/*.md) so
// that a test runs them as written: its sh blocks in order, its YAML blocks
// that name their file, and markers on the line before a block for the
// blocks a test skips (<!-- quickstart test: not run (REASON) -->) or runs
// only when following one of the guide's alternatives
// (<!-- quickstart test: helm way only -->). node-tests/install runs
// docs/quickstart.md and the production guides with it.
package docscript

import (
	"bufio"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
)

// notRun marks the fenced block after it as one the quickstart test skips,
// with the reason: <!-- quickstart test: not run (REASON) -->.
var notRun = regexp.MustCompile(`^<!-- quickstart test: not run \(.+\) -->$`)

// onlyWay marks the block after it as one of the alternatives, run only
// when the test follows that way: <!-- quickstart test: helm way only -->.
var onlyWay = regexp.MustCompile(`^<!-- quickstart test: ([a-z]+) way only -->$`)

// fileBlock is a yaml block that names its file in its first line
// ("# demo-pod.yaml"): the reader saves it under that name.
var fileBlock = regexp.MustCompile(`^# ([A-Za-z0-9._-]+\.ya?ml)$`)

// Quickstart reads a quickstart the way a user following way
// ("helm" or "kustomize") does: its sh blocks, in order, are the script
// (each one as written, none skipped but those marked not run or marked
// for the other way); its yaml blocks that name a file are the files the
// script uses.
func Quickstart(path, way string) (string, map[string]string, error) {
	return Read(path, way, "")
}

// Read is Quickstart for any guide: way "" when the guide has
// no alternatives; from, when set, is the heading line where the script
// starts (a later section of a guide).
func Read(path, way, from string) (string, map[string]string, error) {
	f, err := os.Open(path)
	if err != nil {
		return "", nil, err
	}
	defer f.Close()
	var script strings.Builder
	files := map[string]string{}
	var (
		in, skip bool
		lang     string
		block    []string
		prev     string
		blocks   int
		ways     = map[string]bool{}
	)
	started := from == ""
	sc := bufio.NewScanner(f)
	for line := 1; sc.Scan(); line++ {
		text := sc.Text()
		if !started {
			started = strings.HasPrefix(text, from)
			continue
		}
		if t := strings.TrimSpace(text); strings.HasPrefix(t, "```") && !strings.HasPrefix(text, "```") {
			return "", nil, fmt.Errorf("%s:%d: an indented fence: the quickstart test reads only fences at the line's start", path, line)
		}
		if !in && slices.Contains([]string{"```bash", "```shell", "```console", "```sh-session"}, strings.TrimSpace(text)) {
			return "", nil, fmt.Errorf("%s:%d: %s: tag shell commands sh, the quickstart test runs those", path, line, strings.TrimSpace(text))
		}
		switch {
		case !in && strings.HasPrefix(text, "```"):
			in, lang, block = true, strings.TrimPrefix(text, "```"), nil
			p := strings.TrimSpace(prev)
			skip = notRun.MatchString(p)
			if m := onlyWay.FindStringSubmatch(p); m != nil {
				skip = m[1] != way
				ways[m[1]] = true
			}
		case in && text == "```":
			in = false
			switch {
			case skip:
			case lang == "sh":
				blocks++
				fmt.Fprintf(&script, "# %s, block ending on line %d\n%s\n", filepath.Base(path), line, strings.Join(block, "\n"))
			case lang == "yaml" && len(block) > 0 && fileBlock.MatchString(block[0]):
				files[fileBlock.FindStringSubmatch(block[0])[1]] = strings.Join(block, "\n") + "\n"
			}
		case in:
			block = append(block, text)
		}
		if strings.TrimSpace(text) != "" {
			prev = text
		}
	}
	if err := sc.Err(); err != nil {
		return "", nil, err
	}
	if in {
		return "", nil, fmt.Errorf("%s: a fenced block is not closed", path)
	}
	if blocks == 0 {
		return "", nil, fmt.Errorf("%s: no sh block to run", path)
	}
	if !started {
		return "", nil, fmt.Errorf("%s: no heading %q", path, from)
	}
	if way != "" && !ways[way] {
		return "", nil, fmt.Errorf("%s: no block is marked for the %s way (<!-- quickstart test: %s way only -->)", path, way, way)
	}
	return script.String(), files, nil
}
