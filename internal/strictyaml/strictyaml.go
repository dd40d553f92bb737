// Package strictyaml decodes keyward's versioned YAML configuration files
// strictly: a key given twice, a field the target type does not have and a
// second YAML document are errors, so that a typo never passes as "unset".
package strictyaml

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"

	"k8s.io/apimachinery/pkg/util/validation/field"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	kjson "sigs.k8s.io/json"
	"sigs.k8s.io/yaml"
)

// errExtraDocument is returned when a document after the first has content:
// YAML-to-JSON conversion reads only the first and would drop it silently.
var errExtraDocument = errors.New("a configuration file holds one YAML document")

// Decode converts data from YAML to JSON and decodes it into into (a
// pointer). A key given twice, a field into does not have (named by its
// path, e.g. "signers[0].lifetime"; names are case-sensitive), a type
// mismatch and a second document with content are errors that read
// "decoding: …". An empty document decodes to nothing and is no error:
// the caller's validation reports what is missing. Each before check runs,
// in order, on the JSON form ahead of strict decoding; its error is
// returned as it is.
func Decode(data []byte, into any, before ...func(json []byte) error) error {
	js, err := yaml.YAMLToJSONStrict(data)
	if err != nil {
		return fmt.Errorf("decoding: %w", err)
	}
	if err := onlyOneDocument(data, js); err != nil {
		return fmt.Errorf("decoding: %w", err)
	}
	for _, check := range before {
		if err := check(js); err != nil {
			return err
		}
	}
	strict, err := kjson.UnmarshalStrict(js, into)
	if err != nil {
		return fmt.Errorf("decoding: %w", err)
	}
	if len(strict) > 0 {
		return fmt.Errorf("decoding: %w", errors.Join(strict...))
	}
	return nil
}

// onlyOneDocument refuses data in which a document other than the one
// read into js has content (an empty or comment-only document, as after a
// trailing "---", is fine).
func onlyOneDocument(data, js []byte) error {
	// seen: the document read is behind us. An empty one was read when js
	// is null, so then every document with content is one too many.
	seen := isNull(js)
	r := utilyaml.NewYAMLReader(bufio.NewReader(bytes.NewReader(data)))
	for n := 1; ; n++ {
		doc, err := r.Read()
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return fmt.Errorf("splitting YAML documents: %w", err)
		}
		if djs, err := yaml.YAMLToJSON(doc); err == nil && isNull(djs) {
			continue
		}
		if seen {
			return fmt.Errorf("document %d: %w; only the first is read", n, errExtraDocument)
		}
		seen = true // n is the document read
	}
}

func isNull(js []byte) bool { return bytes.Equal(bytes.TrimSpace(js), []byte("null")) }

// CheckTypeMeta reports an apiVersion or kind that is not the one wanted,
// as field errors on "apiVersion" and "kind".
func CheckTypeMeta(apiVersion, kind, wantAPIVersion, wantKind string) field.ErrorList {
	var errs field.ErrorList
	if apiVersion != wantAPIVersion {
		errs = append(errs, field.Invalid(field.NewPath("apiVersion"), apiVersion, "must be "+wantAPIVersion))
	}
	if kind != wantKind {
		errs = append(errs, field.Invalid(field.NewPath("kind"), kind, "must be "+wantKind))
	}
	return errs
}

// LoadFile reads the file at path and hands its content to parse. A read
// error reads "reading <what> configuration: …"; parse's error is prefixed
// with the path.
func LoadFile[T any](path, what string, parse func([]byte) (T, error)) (T, error) {
	var zero T
	data, err := os.ReadFile(path)
	if err != nil {
		return zero, fmt.Errorf("reading %s configuration: %w", what, err)
	}
	cfg, err := parse(data)
	if err != nil {
		return zero, fmt.Errorf("%s: %w", path, err)
	}
	return cfg, nil
}

// RoundTrip marshals cfg, a configuration parse accepted, to YAML, parses
// that again and marshals the result: a decoder whose defaulting is
// idempotent and that loses no field gives the same YAML twice. The fuzz
// targets of each configuration file check their parser with it. YAML,
// not the values, is compared: an empty list or map and an absent one are
// the same configuration.
func RoundTrip[T any](cfg T, parse func([]byte) (T, error)) error {
	out, err := yaml.Marshal(cfg)
	if err != nil {
		return fmt.Errorf("marshalling: %w", err)
	}
	again, err := parse(out)
	if err != nil {
		return fmt.Errorf("re-parsing %s: %w", out, err)
	}
	out2, err := yaml.Marshal(again)
	if err != nil {
		return fmt.Errorf("marshalling again: %w", err)
	}
	if !bytes.Equal(out, out2) {
		return fmt.Errorf("round trip changed the configuration:\n%s\n%s", out, out2)
	}
	return nil
}
