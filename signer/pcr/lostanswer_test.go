package pcr

import (
	"bytes"
	"context"
	"errors"
	"strings"
	"testing"

	certv1 "k8s.io/api/certificates/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
	"k8s.io/klog/v2"
	"k8s.io/klog/v2/textlogger"
)

// A status write stored by kube-apiserver whose answer never arrived (an
// apiserver or etcd restart cut the connection): when the informer shows
// the request terminal, the signer reads what was stored and, finding its
// own certificate, writes the Issued audit line then, once. Finding
// another writer's status instead, it says its serial was never stored.
func TestLostWriteAnswerIsLoggedOnceWhenFoundStored(t *testing.T) {
	for _, tc := range []struct {
		name string
		// other replaces what the lost write stored with another
		// writer's status.
		other bool
		// forbidden: RBAC grants no get on podcertificaterequests.
		forbidden bool
		want      string
	}{
		{"our certificate was stored", false, false, `"Issued"`},
		{"another writer's status was stored", true, false, `"Signed certificate was not stored`},
		{"the stored status may not be read", false, true, `"Cannot read the stored status`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s, counting := testSigner(t)
			p := testPCR(t, s.Name)
			client := fake.NewClientset(p)
			gvr := certv1.SchemeGroupVersion.WithResource("podcertificaterequests")
			var stored *certv1.PodCertificateRequest
			if tc.forbidden {
				client.PrependReactor("get", "podcertificaterequests", func(a k8stesting.Action) (bool, runtime.Object, error) {
					return true, nil, apierrors.NewForbidden(gvr.GroupResource(), p.Name, errors.New("RBAC: get not granted"))
				})
			}
			client.PrependReactor("update", "podcertificaterequests", func(a k8stesting.Action) (bool, runtime.Object, error) {
				if a.GetSubresource() != "status" || stored != nil {
					return false, nil, nil
				}
				stored = a.(k8stesting.UpdateAction).GetObject().(*certv1.PodCertificateRequest).DeepCopy()
				if tc.other {
					stored.Status.CertificateChain = "-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n"
				}
				if err := client.Tracker().Update(gvr, stored, stored.Namespace, metav1.UpdateOptions{}); err != nil {
					t.Fatal(err)
				}
				return true, nil, errors.New("http2: client connection lost")
			})
			c := unitController(t, client, s, p)
			var logged bytes.Buffer
			ctx := klog.NewContext(context.Background(), textlogger.NewLogger(textlogger.NewConfig(textlogger.Output(&logged))))
			key, _ := c.queue.Get()
			c.queue.Done(key)

			if _, err := c.sync(ctx, key); err == nil {
				t.Fatal("first sync: the lost answer was not returned for a retry")
			}
			if strings.Contains(logged.String(), `"Issued"`) {
				t.Fatalf("Issued logged before anything said the write was stored:\n%s", logged.String())
			}
			// The informer shows the stored, terminal status.
			if err := c.informers.Get(s.Name).GetIndexer().Update(stored); err != nil {
				t.Fatal(err)
			}
			c.enqueue(s.Name, stored)
			if c.queue.Len() != 1 {
				t.Fatalf("the terminal request was not queued to be settled (queue length %d)", c.queue.Len())
			}
			if _, err := c.sync(ctx, key); err != nil {
				t.Fatalf("settling: %v", err)
			}
			// A retry still queued finds nothing more to do.
			if _, err := c.sync(ctx, key); err != nil {
				t.Fatalf("a later pass: %v", err)
			}
			out := logged.String()
			if n := strings.Count(out, tc.want); n != 1 {
				t.Errorf("%s logged %d times, want once:\n%s", tc.want, n, out)
			}
			if !tc.other && !tc.forbidden && !strings.Contains(out, "answerLost=true") {
				t.Errorf("the Issued line does not say its answer was lost:\n%s", out)
			}
			if (tc.other || tc.forbidden) && strings.Contains(out, `"Issued"`) {
				t.Errorf("Issued logged for a status another writer stored:\n%s", out)
			}
			if _, ok := c.records.lookup(p.UID); ok {
				t.Error("the request's record is kept after it was settled")
			}
			if n := counting.Signatures(); n != 1 {
				t.Errorf("the CA key signed %d times, want once", n)
			}
		})
	}
}
