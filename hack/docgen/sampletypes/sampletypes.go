// Package sampletypes holds the types docgen's own test documents.
package sampletypes

// Sample is a documented root.
type Sample struct {
	// Name is documented.
	Name string `json:"name"`
	Bare int    `json:"bare,omitempty"`
	// Inner is a nested struct.
	Inner *Inner `json:"inner,omitempty"`
	// Items are listed.
	Items []Inner `json:"items,omitempty"`
}

// Inner is nested in Sample.
type Inner struct {
	Mode *int32 `json:"mode,omitempty"` // file mode
	// +kubebuilder:default="5m0s"
	// Wait is a marker default.
	Wait string `json:"wait,omitempty"`
}
