package csr

import (
	"context"
	"strings"
	"testing"

	"github.com/keyward/keyward/internal/kubemsg"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/tools/record"
)

// A Failed CSR whose message is long (it quotes what the requester asked
// for) gets a Warning Event whose note stays within kube-apiserver's 1 KiB.
func TestALongFailureMessageFitsInTheEventNote(t *testing.T) {
	s, _ := unitSigner(t)
	req := unitCSR(t, "long", unitName, true)
	rec := record.NewFakeRecorder(10)
	c, _ := unitController(t, s, rec, req)
	v := violation(ReasonUsagesNotPermitted, "%s", strings.Repeat("a", 5000))
	if _, err := c.fail(context.Background(), c.signers[unitName], req, v); err != nil {
		t.Fatal(err)
	}
	select {
	case e := <-rec.Events:
		note := strings.TrimPrefix(e, corev1.EventTypeWarning+" "+ReasonUsagesNotPermitted+" ")
		if len(note) > kubemsg.MaxEventMessage {
			t.Fatalf("Event note is %d bytes, want at most %d", len(note), kubemsg.MaxEventMessage)
		}
	default:
		t.Fatal("no Event recorded")
	}
}
