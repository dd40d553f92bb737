package image

import (
	"bufio"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strings"
)

// Ignore is a parsed .dockerignore: what `docker build` leaves out of the
// build context.
type Ignore struct {
	rules []ignoreRule
}

type ignoreRule struct {
	re     *regexp.Regexp
	negate bool
}

// ParseDockerignore reads .dockerignore patterns: one per line, # comments,
// a leading ! re-includes, * and ? match within a path element, ** any number
// of elements. A pattern matching a directory excludes all below it.
func ParseDockerignore(r io.Reader) (*Ignore, error) {
	var ig Ignore
	sc := bufio.NewScanner(r)
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		rule := ignoreRule{}
		if rest, ok := strings.CutPrefix(line, "!"); ok {
			rule.negate, line = true, strings.TrimSpace(rest)
		}
		line = strings.Trim(filepath.ToSlash(filepath.Clean(line)), "/")
		re, err := regexp.Compile("^" + globToRegexp(line) + "(/.*)?$")
		if err != nil {
			return nil, fmt.Errorf("pattern %q: %w", line, err)
		}
		rule.re = re
		ig.rules = append(ig.rules, rule)
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("reading .dockerignore: %w", err)
	}
	return &ig, nil
}

func globToRegexp(p string) string {
	var b strings.Builder
	for i := 0; i < len(p); i++ {
		switch c := p[i]; {
		case strings.HasPrefix(p[i:], "**/"):
			b.WriteString("(.*/)?")
			i += 2
		case strings.HasPrefix(p[i:], "**"):
			b.WriteString(".*")
			i++
		case c == '*':
			b.WriteString("[^/]*")
		case c == '?':
			b.WriteString("[^/]")
		default:
			b.WriteString(regexp.QuoteMeta(string(c)))
		}
	}
	return b.String()
}

// Excluded reports whether the slash-separated path rel (relative to the
// context's root) stays out of the context; the last matching rule wins.
func (ig *Ignore) Excluded(rel string) bool {
	excluded := false
	for _, r := range ig.rules {
		if r.re.MatchString(rel) {
			excluded = !r.negate
		}
	}
	return excluded
}

// CopyContext copies the build context of root, without what ig excludes,
// into dst: the files the Dockerfile's COPY . . sees.
func CopyContext(root, dst string, ig *Ignore) error {
	return filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(root, path)
		if err != nil {
			return err
		}
		rel = filepath.ToSlash(rel)
		if rel == "." {
			return os.MkdirAll(dst, 0o755)
		}
		// A negated rule may re-include something below an excluded
		// directory, so directories are walked unless nothing can match
		// below them; keyward's .dockerignore has no negation, and .git is
		// never needed.
		if ig.Excluded(rel) && (!d.IsDir() || !ig.hasNegation() || rel == ".git") {
			if d.IsDir() {
				return filepath.SkipDir
			}
			return nil
		}
		target := filepath.Join(dst, filepath.FromSlash(rel))
		switch {
		case d.IsDir():
			return os.MkdirAll(target, 0o755)
		case d.Type().IsRegular():
			return copyFile(path, target)
		default:
			return nil // symlinks and the like: keyward's tree has none that builds need
		}
	})
}

func (ig *Ignore) hasNegation() bool {
	for _, r := range ig.rules {
		if r.negate {
			return true
		}
	}
	return false
}

func copyFile(src, dst string) error {
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	info, err := in.Stat()
	if err != nil {
		return err
	}
	out, err := os.OpenFile(dst, os.O_WRONLY|os.O_CREATE|os.O_EXCL, info.Mode().Perm())
	if err != nil {
		return err
	}
	if _, err := io.Copy(out, in); err != nil {
		out.Close()
		return fmt.Errorf("copying %s: %w", src, err)
	}
	return out.Close()
}
