package kustomize_test

import (
	"bufio"
	"bytes"
	"context"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"io"
	"net/url"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	certv1 "k8s.io/api/certificates/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/serializer/json"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/scheme"
	"sigs.k8s.io/yaml"

	"github.com/keyward/keyward/deploy"
	"github.com/keyward/keyward/nodehelper"
	"github.com/keyward/keyward/nodehelper/agent"
	"github.com/keyward/keyward/signer/approver"
	"github.com/keyward/keyward/signer/config"
	csrsigner "github.com/keyward/keyward/signer/csr"
	"github.com/keyward/keyward/testsupport/controlplane"
)

// manifests are the base's node agent objects as a user applies them:
// the DaemonSet, the ConfigMap kustomize generates from
// node-agent-config.yaml (under its plain name), and the generated RBAC
// (holding the agent's ServiceAccount).
func manifests(t *testing.T) map[string][]byte {
	t.Helper()
	out := map[string][]byte{}
	for name, file := range map[string]string{"daemonset.yaml": "node-agent.yaml", "rbac.yaml": "rbac.yaml"} {
		data, err := deploy.Base.ReadFile("kustomize/base/" + file)
		if err != nil {
			t.Fatal(err)
		}
		out[name] = data
	}
	conf, err := deploy.Base.ReadFile("kustomize/base/node-agent-config.yaml")
	if err != nil {
		t.Fatal(err)
	}
	cm := corev1.ConfigMap{
		TypeMeta:   metav1.TypeMeta{APIVersion: "v1", Kind: "ConfigMap"},
		ObjectMeta: metav1.ObjectMeta{Name: "keyward-node-agent-config", Namespace: "keyward-node"},
		Data:       map[string]string{"agent.yaml": string(conf)},
	}
	if out["config.yaml"], err = yaml.Marshal(cm); err != nil {
		t.Fatal(err)
	}
	return out
}

// objects decodes every document of every manifest strictly (unknown or
// duplicate fields are errors) into client-go's types.
func objects(t *testing.T) []runtime.Object {
	t.Helper()
	dec := json.NewSerializerWithOptions(json.DefaultMetaFactory, scheme.Scheme, scheme.Scheme, json.SerializerOptions{Yaml: true, Strict: true})
	var objs []runtime.Object
	for name, data := range manifests(t) {
		r := utilyaml.NewYAMLReader(bufio.NewReader(bytes.NewReader(data)))
		for {
			doc, err := r.Read()
			if errors.Is(err, io.EOF) {
				break
			}
			if err != nil {
				t.Fatalf("%s: %v", name, err)
			}
			if len(bytes.TrimSpace(stripComments(doc))) == 0 {
				continue
			}
			obj, _, err := dec.Decode(doc, nil, nil)
			if err != nil {
				t.Fatalf("%s: %v", name, err)
			}
			objs = append(objs, obj)
		}
	}
	return objs
}

func stripComments(doc []byte) []byte {
	var b bytes.Buffer
	for _, l := range strings.Split(string(doc), "\n") {
		if !strings.HasPrefix(strings.TrimSpace(l), "#") {
			b.WriteString(l + "\n")
		}
	}
	return b.Bytes()
}

// The example's objects decode strictly; the DaemonSet runs `keyward node
// agent --config` on the ConfigMap's file, with NODE_NAME from the
// downward API, its probes on the health address the configuration sets,
// and every path the configuration names on a hostPath volume.
func TestNodeAgentIsConsistent(t *testing.T) {
	var ds *appsv1.DaemonSet
	var cm *corev1.ConfigMap
	for _, o := range objects(t) {
		switch o := o.(type) {
		case *appsv1.DaemonSet:
			ds = o
		case *corev1.ConfigMap:
			cm = o
		}
	}
	if ds == nil || cm == nil {
		t.Fatalf("want a DaemonSet and a ConfigMap, got %v and %v", ds, cm)
	}
	// Decoded strictly, defaulted and validated as the agent loads it: as
	// shipped (no credential: no example identity is issued on a real
	// cluster) and with the commented example credential put in.
	t.Setenv("NODE_NAME", "node-a")
	shipped, err := agent.Parse([]byte(cm.Data["agent.yaml"]))
	if err != nil {
		t.Fatalf("agent.yaml: %v", err)
	}
	if len(shipped.Credentials) != 0 {
		t.Errorf("the shipped configuration issues %d credentials, want none (the example stays a comment)", len(shipped.Credentials))
	}
	cfg, err := agent.Parse(withExampleCredential(t, cm.Data["agent.yaml"]))
	if err != nil {
		t.Fatalf("agent.yaml with its example credential: %v", err)
	}
	if m := cfg.Credentials[0].Output.Mode; m == nil || *m != 0o600 {
		t.Errorf("the credential's mode is %v, want 0600 (YAML octal)", m)
	}

	spec := ds.Spec.Template.Spec
	c := spec.Containers[0]
	if got := strings.Join(c.Args, " "); got != "node agent --config /etc/keyward/agent.yaml" {
		t.Errorf("args %q", got)
	}
	if i := slices.IndexFunc(c.Env, func(e corev1.EnvVar) bool { return e.Name == "NODE_NAME" }); i < 0 ||
		c.Env[i].ValueFrom == nil || c.Env[i].ValueFrom.FieldRef == nil || c.Env[i].ValueFrom.FieldRef.FieldPath != "spec.nodeName" {
		t.Error("NODE_NAME does not come from spec.nodeName")
	}
	if !spec.HostNetwork {
		t.Error("the probes ask 127.0.0.1 on the host: the pod must use the host's network")
	}
	if p := c.ReadinessProbe; p == nil || p.HTTPGet == nil || p.HTTPGet.Path != "/healthz" ||
		p.HTTPGet.Host+":"+p.HTTPGet.Port.String() != cfg.HealthAddress {
		t.Errorf("the readiness probe does not ask /healthz on %s: %+v", cfg.HealthAddress, p)
	}
	if p := c.LivenessProbe; p == nil || p.TCPSocket == nil || p.TCPSocket.Host+":"+p.TCPSocket.Port.String() != cfg.HealthAddress {
		t.Errorf("the liveness probe does not check %s: %+v", cfg.HealthAddress, p)
	}
	// Every path the agent opens is inside a mount.
	mounted := func(path string) bool {
		return slices.ContainsFunc(c.VolumeMounts, func(m corev1.VolumeMount) bool {
			return path == m.MountPath || strings.HasPrefix(path, m.MountPath+"/")
		})
	}
	paths := []string{"/etc/keyward/agent.yaml", cfg.StateDir, cfg.Kubeconfig, "/var/lib/kubelet/pki/kubelet-client-current.pem"}
	for _, cr := range cfg.Credentials {
		paths = append(paths, cr.Output.Dir)
	}
	for _, tr := range cfg.Trust {
		paths = append(paths, tr.Dir)
	}
	for _, p := range paths {
		if !mounted(p) {
			t.Errorf("%s is on no volume mount", p)
		}
	}
	for _, m := range c.VolumeMounts {
		i := slices.IndexFunc(spec.Volumes, func(v corev1.Volume) bool { return v.Name == m.Name })
		if i < 0 {
			t.Errorf("mount %s has no volume", m.Name)
			continue
		}
		if v := spec.Volumes[i]; v.HostPath != nil && v.HostPath.Path != m.MountPath {
			t.Errorf("hostPath %s is mounted at %s: the configuration's paths are the host's", v.HostPath.Path, m.MountPath)
		}
	}
}

// Against a real apiserver (Node,RBAC authorization, NodeRestriction): the
// example applies as it is, and a node identity with no RBAC binding at all
// can do everything the agent does: create a CSR for keyward.dev/node-daemons
// and read and watch it, list and watch a signer's ClusterTrustBundles,
// read and watch its own Node.
func TestNodeAgentAppliesAndTheNodeNeedsNoMoreRBAC(t *testing.T) {
	if testing.Short() {
		t.Skip("starts kube-apiserver")
	}
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	cp, err := controlplane.Start(ctx, controlplane.Options{})
	if err != nil {
		t.Fatalf("starting the control plane: %v", err)
	}
	t.Cleanup(cp.Stop)
	admin := cp.AdminClient()
	for _, ns := range []string{"keyward", "keyward-node"} {
		if err := controlplane.EnsureNamespace(ctx, admin, ns); err != nil {
			t.Fatal(err)
		}
	}
	for _, n := range []string{"rbac.yaml", "config.yaml", "daemonset.yaml"} {
		if err := controlplane.ApplyManifest(ctx, cp.AdminConfig(), manifests(t)[n]); err != nil {
			t.Fatalf("applying %s: %v", n, err)
		}
	}
	if _, err := admin.AppsV1().DaemonSets("keyward-node").Get(ctx, "keyward-node-agent", metav1.GetOptions{}); err != nil {
		t.Fatal(err)
	}

	const node = "agent-node"
	if _, err := controlplane.EnsureNode(ctx, admin, node); err != nil {
		t.Fatal(err)
	}
	cfg, err := cp.NodeConfig(node)
	if err != nil {
		t.Fatal(err)
	}
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	key, err := nodehelper.GenerateKey(nodehelper.KeyTypeECDSAP256)
	if err != nil {
		t.Fatal(err)
	}
	der, err := x509.CreateCertificateRequest(nil, exampleRequest(t, node), key)
	if err != nil {
		t.Fatal(err)
	}
	csrs := cs.CertificatesV1().CertificateSigningRequests()
	csr, err := csrs.Create(ctx, &certv1.CertificateSigningRequest{
		ObjectMeta: metav1.ObjectMeta{GenerateName: "keyward-node-daemon-"},
		Spec: certv1.CertificateSigningRequestSpec{
			SignerName: "keyward.dev/node-daemons",
			Usages:     []certv1.KeyUsage{certv1.UsageDigitalSignature, certv1.UsageClientAuth},
			Request:    pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE REQUEST", Bytes: der}),
		},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("the node creating a CSR: %v", err)
	}
	if csr.Spec.Username != "system:node:"+node {
		t.Errorf("the CSR was made by %q", csr.Spec.Username)
	}
	byName := metav1.ListOptions{FieldSelector: fields.OneTermEqualSelector("metadata.name", csr.Name).String()}
	bySigner := metav1.ListOptions{FieldSelector: fields.OneTermEqualSelector("spec.signerName", "keyward.dev/pod-identity").String(),
		LabelSelector: "keyward.dev/cluster-trust-bundle-version=live"}
	ownNode := metav1.ListOptions{FieldSelector: fields.OneTermEqualSelector("metadata.name", node).String()}
	ctbs := cs.CertificatesV1().ClusterTrustBundles()
	nodes := cs.CoreV1().Nodes()
	for _, step := range []struct {
		what string
		do   func() error
	}{
		{"get its CSR", func() error { _, err := csrs.Get(ctx, csr.Name, metav1.GetOptions{}); return err }},
		{"list its CSR by name", func() error { _, err := csrs.List(ctx, byName); return err }},
		{"watch its CSR by name", func() error { return stopped(csrs.Watch(ctx, byName)) }},
		{"list a signer's ClusterTrustBundles", func() error { _, err := ctbs.List(ctx, bySigner); return err }},
		{"watch a signer's ClusterTrustBundles", func() error { return stopped(ctbs.Watch(ctx, bySigner)) }},
		{"get its Node", func() error { _, err := nodes.Get(ctx, node, metav1.GetOptions{}); return err }},
		{"list its Node by name", func() error { _, err := nodes.List(ctx, ownNode); return err }},
		{"watch its Node by name", func() error { return stopped(nodes.Watch(ctx, ownNode)) }},
	} {
		if err := step.do(); err != nil {
			t.Errorf("the node may not %s: %v", step.what, err)
		}
	}
}

// withExampleCredential is agent.yaml with its commented example
// credential (the "# - name:" block above `credentials: []`) put in.
func withExampleCredential(t *testing.T, agentYAML string) []byte {
	t.Helper()
	lines := strings.Split(agentYAML, "\n")
	start := slices.IndexFunc(lines, func(l string) bool { return strings.HasPrefix(l, "# - name: ") })
	end := slices.Index(lines, "credentials: []")
	if start < 0 || end < start {
		t.Fatal("agent.yaml has no commented example credential above `credentials: []`")
	}
	var example []string
	for _, l := range lines[start:end] {
		if l == "#" {
			continue
		}
		example = append(example, strings.TrimPrefix(strings.TrimPrefix(l, "#"), " "))
	}
	out := slices.Concat(lines[:end], []string{"credentials:"}, example, lines[end+1:])
	return []byte(strings.Join(out, "\n"))
}

// exampleRequest is the request the example's credential (the commented
// one in agent.yaml) makes on node: its names with ${NODE_NAME} replaced.
func exampleRequest(t *testing.T, node string) *x509.CertificateRequest {
	t.Helper()
	var cm *corev1.ConfigMap
	for _, o := range objects(t) {
		if o, ok := o.(*corev1.ConfigMap); ok {
			cm = o
		}
	}
	if cm == nil {
		t.Fatal("the example has no ConfigMap")
	}
	t.Setenv("NODE_NAME", node)
	cfg, err := agent.Parse(withExampleCredential(t, cm.Data["agent.yaml"]))
	if err != nil {
		t.Fatalf("agent.yaml: %v", err)
	}
	cr := cfg.Credentials[0]
	fill := func(s string) string { return strings.ReplaceAll(s, "${NODE_NAME}", node) }
	req := &x509.CertificateRequest{Subject: pkix.Name{CommonName: fill(cr.CommonName), Organization: cr.Organizations}}
	for _, d := range cr.DNSNames {
		req.DNSNames = append(req.DNSNames, fill(d))
	}
	for _, s := range cr.URIs {
		u, err := url.Parse(fill(s))
		if err != nil {
			t.Fatal(err)
		}
		req.URIs = append(req.URIs, u)
	}
	if len(cr.IPAddresses) > 0 {
		t.Fatal("exampleRequest does not fill in IP addresses")
	}
	return req
}

// nodeDaemonsSigner is the signer entry docs/node-helper.md ("DaemonSet")
// adds to the signer's configuration for the example's credential
// (TestDocumentedSignerEntryAdmitsTheExample checks the doc still says it).
const nodeDaemonsSigner = `- name: keyward.dev/node-daemons
  profile: csr
  csr:
    trustDistribution: ClusterTrustBundle keyward.dev:node-daemons:live
    uris: ["spiffe://cluster.local/node/*"]
    keyUsages: ["digital signature", "client auth"]
  approval:
    groups: ["system:nodes"]
    nodeBound: true
`

// The documented signer entry is the base's (deploy/kustomize/base/signer-config.yaml),
// validates; its rules admit the request the example's credential makes,
// and keyward approver lets nodes ask.
func TestDocumentedSignerEntryAdmitsTheNodeAgent(t *testing.T) {
	doc, err := os.ReadFile("../../docs/node-helper.md")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(doc), nodeDaemonsSigner) {
		t.Errorf("docs/node-helper.md no longer holds the signer entry this test checks:\n%s", nodeDaemonsSigner)
	}
	data, err := deploy.Base.ReadFile("kustomize/base/signer-config.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(data), nodeDaemonsSigner) {
		t.Errorf("deploy/kustomize/base/signer-config.yaml does not hold the documented entry:\n%s", nodeDaemonsSigner)
	}
	cfg, err := config.Parse(data)
	if err != nil {
		t.Fatalf("the shipped configuration: %v", err)
	}
	i := slices.IndexFunc(cfg.Signers, func(s config.Signer) bool { return s.Name == "keyward.dev/node-daemons" })
	s := cfg.Signers[i]
	if !approver.Approves(s) || !slices.Contains(s.Approval.Groups, "system:nodes") {
		t.Error("keyward approver does not approve CSRs of system:nodes for the name")
	}
	if !s.Approval.NodeBound {
		t.Error("the documented entry lets any node ask for another node's name (approval.nodeBound is off)")
	}
	p, err := csrsigner.NewPolicy(s)
	if err != nil {
		t.Fatal(err)
	}
	key, err := nodehelper.GenerateKey(nodehelper.KeyTypeECDSAP256)
	if err != nil {
		t.Fatal(err)
	}
	der, err := x509.CreateCertificateRequest(nil, exampleRequest(t, "ip-10-0-0-1.ec2.internal"), key)
	if err != nil {
		t.Fatal(err)
	}
	req, err := x509.ParseCertificateRequest(der)
	if err != nil {
		t.Fatal(err)
	}
	if v := p.Check(req, []certv1.KeyUsage{certv1.UsageDigitalSignature, certv1.UsageClientAuth}); v != nil {
		t.Errorf("the rules refuse the example's request: %s: %s", v.Reason, v.Message)
	}
}

func stopped(w interface{ Stop() }, err error) error {
	if err == nil {
		w.Stop()
	}
	return err
}
