package strictyaml

import (
	"encoding/json"
	"errors"
	"slices"
	"strings"
	"testing"

	utilerrors "k8s.io/apimachinery/pkg/util/errors"
	"k8s.io/apimachinery/pkg/util/validation/field"
	kjson "sigs.k8s.io/json"
)

type inner struct {
	Port int `json:"port"`
}

type doc struct {
	APIVersion string  `json:"apiVersion"`
	Kind       string  `json:"kind"`
	Name       string  `json:"name,omitempty"`
	Items      []inner `json:"items,omitempty"`
}

func TestDecodeAcceptsOneDocument(t *testing.T) {
	cases := []struct {
		name string
		data string
		want doc
	}{
		{"a plain document is decoded", "apiVersion: v\nkind: K\nname: a\nitems: [{port: 1}]\n", doc{APIVersion: "v", Kind: "K", Name: "a", Items: []inner{{Port: 1}}}},
		{"a leading document marker is fine", "---\nkind: K\n", doc{Kind: "K"}},
		{"a trailing document marker is fine", "kind: K\n---\n", doc{Kind: "K"}},
		{"a comment-only document after the first is fine", "kind: K\n---\n# nothing here\n", doc{Kind: "K"}},
		{"a comment before the first marker is fine", "# header\n---\nkind: K\n", doc{Kind: "K"}},
		{"an empty document decodes to nothing", "", doc{}},
		{"a comment-only document decodes to nothing", "# nothing\n", doc{}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			var got doc
			if err := Decode([]byte(tc.data), &got); err != nil {
				t.Fatalf("Decode: %v", err)
			}
			if got.APIVersion != tc.want.APIVersion || got.Kind != tc.want.Kind || got.Name != tc.want.Name || !slices.Equal(got.Items, tc.want.Items) {
				t.Errorf("decoded %+v, want %+v", got, tc.want)
			}
		})
	}
}

// The strict errors are sigs.k8s.io/json's; what this package promises about
// them is that they name the field's path, so these cases read the text.
func TestDecodeNamesTheFieldOfAStrictError(t *testing.T) {
	cases := []struct {
		name string
		data string
		want string
	}{
		{"an unknown top-level field", "kind: K\nnmae: a\n", `unknown field "nmae"`},
		{"an unknown nested field", "items: [{port: 1}, {port: 2, host: h}]\n", `unknown field "items[1].host"`},
		{"a field in the wrong case", "kind: K\nName: a\n", `unknown field "Name"`},
		{"a field given twice", "kind: K\nname: a\nname: b\n", `"name" already set`},
		{"a nested field given twice", "items: [{port: 1, port: 2}]\n", `"port" already set`},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			var got doc
			err := Decode([]byte(tc.data), &got)
			if err == nil {
				t.Fatal("accepted")
			}
			if !strings.HasPrefix(err.Error(), "decoding: ") || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("error %q, want \"decoding: …%s…\"", err, tc.want)
			}
		})
	}
}

// notYAML: the error is the YAML parser's, neither a decoding nor a
// document-count one.
func notYAML(err error) bool {
	var te *json.UnmarshalTypeError
	var fe kjson.FieldError
	return !errors.As(err, &te) && !errors.As(err, &fe) && !errors.Is(err, errExtraDocument)
}

func TestDecodeRefusesWhatIsNotOneObject(t *testing.T) {
	cases := []struct {
		name string
		data string
		is   func(error) bool
	}{
		{"text that is not YAML", "kind: [K\n", notYAML},
		{"a tab where YAML wants spaces", "items:\n\t- port: 1\n", notYAML},
		{"a list where an object belongs", "- kind: K\n", func(err error) bool { var te *json.UnmarshalTypeError; return errors.As(err, &te) }},
		{"a string where a number belongs", "items: [{port: eighty}]\n", func(err error) bool { var te *json.UnmarshalTypeError; return errors.As(err, &te) }},
		{"a second document with content", "kind: K\n---\nkind: L\n", func(err error) bool { return errors.Is(err, errExtraDocument) }},
		{"a document after an empty first one", "---\n---\nkind: K\n", func(err error) bool { return errors.Is(err, errExtraDocument) }},
		{"a second document that is not YAML", "kind: K\n---\nkind: [L\n", func(err error) bool { return errors.Is(err, errExtraDocument) }},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			var got doc
			err := Decode([]byte(tc.data), &got)
			if err == nil {
				t.Fatalf("accepted, decoded %+v", got)
			}
			if !tc.is(err) {
				t.Errorf("error %v is not the one expected", err)
			}
		})
	}
}

func TestDecodeRunsBeforeChecksOnTheJSONAheadOfStrictDecoding(t *testing.T) {
	errCheck := errors.New("refused by the check")
	var saw []string
	check := func(js []byte) error {
		saw = append(saw, string(js))
		return errCheck
	}
	var got doc
	// The unknown field would fail strict decoding: the check's error
	// comes first, unwrapped.
	err := Decode([]byte("kind: K\nextra: 1\n"), &got, check)
	if err != errCheck {
		t.Fatalf("Decode = %v, want the check's error as it is", err)
	}
	if want := []string{`{"extra":1,"kind":"K"}`}; !slices.Equal(saw, want) {
		t.Errorf("check saw %q, want %q", saw, want)
	}

	saw = nil
	if err := Decode([]byte("kind: [K\n"), &got, check); err == nil || errors.Is(err, errCheck) {
		t.Errorf("Decode of text that is not YAML = %v, want the YAML error", err)
	}
	if len(saw) != 0 {
		t.Errorf("check ran on text that is not YAML: %q", saw)
	}

	pass := func([]byte) error { return nil }
	if err := Decode([]byte("kind: K\n"), &got, pass, pass); err != nil || got.Kind != "K" {
		t.Errorf("Decode with passing checks = %v, %+v", err, got)
	}
}

// The strict decoding errors stay sigs.k8s.io/json's, for callers that
// branch on them.
func TestDecodeWrapsTheStrictErrors(t *testing.T) {
	var got doc
	err := Decode([]byte("kind: K\nnmae: a\n"), &got)
	var fe kjson.FieldError
	if !errors.As(err, &fe) || fe.FieldPath() != "nmae" {
		t.Errorf("Decode = %v, want a kjson.FieldError for nmae", err)
	}
}

func TestCheckTypeMeta(t *testing.T) {
	cases := []struct {
		name             string
		apiVersion, kind string
		wantFields       []string
	}{
		{"the wanted apiVersion and kind pass", "keyward.dev/v1alpha1", "K", nil},
		{"a wrong apiVersion is named", "v1", "K", []string{"apiVersion"}},
		{"a wrong kind is named", "keyward.dev/v1alpha1", "L", []string{"kind"}},
		{"both missing are both named", "", "", []string{"apiVersion", "kind"}},
		{"a kind in the wrong case is wrong", "keyward.dev/v1alpha1", "k", []string{"kind"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			errs := CheckTypeMeta(tc.apiVersion, tc.kind, "keyward.dev/v1alpha1", "K")
			var got []string
			var agg utilerrors.Aggregate
			if errors.As(errs.ToAggregate(), &agg) {
				for _, e := range agg.Errors() {
					var fe *field.Error
					if errors.As(e, &fe) && fe.Type == field.ErrorTypeInvalid {
						got = append(got, fe.Field)
					}
				}
			}
			if !slices.Equal(got, tc.wantFields) {
				t.Errorf("invalid fields %v, want %v (%v)", got, tc.wantFields, errs)
			}
		})
	}
}

// RoundTrip passes a parser that gives back what it was given and fails
// one that loses a field or refuses its own output.
func TestRoundTrip(t *testing.T) {
	type conf struct {
		Name  string `json:"name"`
		Count int    `json:"count,omitempty"`
	}
	keeps := func(data []byte) (conf, error) {
		var c conf
		return c, Decode(data, &c)
	}
	if err := RoundTrip(conf{Name: "a", Count: 2}, keeps); err != nil {
		t.Fatalf("a faithful parser: %v", err)
	}
	drops := func(data []byte) (conf, error) {
		c, err := keeps(data)
		c.Count = 0
		return c, err
	}
	if err := RoundTrip(conf{Name: "a", Count: 2}, drops); err == nil || !strings.Contains(err.Error(), "changed") {
		t.Fatalf("a parser that loses count: %v", err)
	}
	refuses := func([]byte) (conf, error) { return conf{}, errors.New("no") }
	if err := RoundTrip(conf{Name: "a"}, refuses); err == nil || !strings.Contains(err.Error(), "re-parsing") {
		t.Fatalf("a parser that refuses its output: %v", err)
	}
}
