package approver

import (
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/client-go/kubernetes/fake"
)

// /readyz: ready on standby, or when leading with synced caches; not
// before leader election has decided.
func TestReadiness(t *testing.T) {
	m, err := NewMetrics(prometheus.NewRegistry())
	if err != nil {
		t.Fatal(err)
	}
	synced, err := New(Options{Client: fake.NewClientset(), Metrics: m})
	if err != nil {
		t.Fatal(err)
	}
	synced.synced.Store(true)
	unsynced, err := New(Options{Client: fake.NewClientset(), Metrics: m})
	if err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		name       string
		leading    bool
		standby    bool
		controller *Controller
		ready      bool
	}{
		{"a replica before the election decided is not ready", false, false, nil, false},
		{"a standby replica is ready", false, true, nil, true},
		{"a leader without a controller yet is not ready", true, false, nil, false},
		{"a leader whose caches have not synced is not ready", true, false, unsynced, false},
		{"a leader with synced caches is ready", true, false, synced, true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			var st runState
			st.leading.Store(tc.leading)
			st.standby.Store(tc.standby)
			if tc.controller != nil {
				st.controller.Store(tc.controller)
			}
			if err := st.ready(); (err == nil) != tc.ready {
				t.Fatalf("ready() = %v, want ready %v", err, tc.ready)
			}
		})
	}
}
