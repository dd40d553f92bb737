{{/* Namespace of every namespaced object but the node agent's. */}}
{{- define "keyward.namespace" -}}
{{- default .Release.Namespace .Values.namespaceOverride -}}
{{- end -}}

{{/* The node agent's own namespace (Pod Security privileged). */}}
{{- define "keyward.nodeNamespace" -}}
{{- default (printf "%s-node" (include "keyward.namespace" .)) .Values.nodeAgent.namespace -}}
{{- end -}}

{{/*
Prefix of every cluster-scoped name (ClusterRoles, ClusterRoleBindings,
the admission policy): the release name when it contains "keyward", else
<release>-keyward. A release named keyward keeps the names keyward-signer,
keyward-approver, ... that deploy/rbac and the kustomize base use; a second
release gets its own.
*/}}
{{- define "keyward.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{/* global.commonLabels merged with commonLabels (which wins), as a dict. */}}
{{- define "keyward.commonLabels" -}}
{{- $g := default (dict) .Values.global -}}
{{- toJson (mustMergeOverwrite (dict) (default (dict) $g.commonLabels) (default (dict) .Values.commonLabels)) -}}
{{- end -}}

{{/* The chart's own labels of an object; pass (dict "ctx" $ "component" "signer"). */}}
{{- define "keyward.chartLabels" -}}
app.kubernetes.io/part-of: keyward
app.kubernetes.io/managed-by: {{ .ctx.Release.Service }}
app.kubernetes.io/instance: {{ .ctx.Release.Name }}
app.kubernetes.io/version: {{ .ctx.Chart.AppVersion | quote }}
helm.sh/chart: {{ printf "%s-%s" .ctx.Chart.Name .ctx.Chart.Version }}
{{- with .component }}
app.kubernetes.io/name: keyward-{{ . }}
app.kubernetes.io/component: {{ . }}
{{- end }}
{{- end -}}

{{/*
Labels of every object: commonLabels (and global.commonLabels), then the
chart's own, which win (selectors and the ServiceMonitor rely on them);
pass (dict "ctx" $ "component" "signer"), component optional.
*/}}
{{- define "keyward.labels" -}}
{{- $l := include "keyward.commonLabels" .ctx | fromJson -}}
{{- $l = mustMergeOverwrite $l (include "keyward.chartLabels" . | fromYaml) -}}
{{- toYaml $l -}}
{{- end -}}

{{/*
Labels of a component's pods: the object labels plus podLabels and the
component's own podLabels (which win over podLabels), never over the
chart's; pass (dict "ctx" $ "component" "signer" "values" $s).
*/}}
{{- define "keyward.podLabels" -}}
{{- $l := include "keyward.commonLabels" .ctx | fromJson -}}
{{- $l = mustMergeOverwrite $l (default (dict) .ctx.Values.podLabels) (default (dict) .values.podLabels) -}}
{{- $l = mustMergeOverwrite $l (include "keyward.chartLabels" . | fromYaml) -}}
{{- toYaml $l -}}
{{- end -}}

{{/*
Annotations of a component's pods: podAnnotations, the component's
podAnnotations, then the chart's (the config checksum); pass
(dict "ctx" $ "values" $s "annotations" (dict ...)).
*/}}
{{- define "keyward.podAnnotations" -}}
{{- $a := mustMergeOverwrite (dict) (default (dict) .ctx.Values.podAnnotations) (default (dict) .values.podAnnotations) (default (dict) .annotations) -}}
{{- with $a }}
{{- toYaml . -}}
{{- end -}}
{{- end -}}

{{/*
Pod spec fields every keyward pod shares: imagePullSecrets
(global.imagePullSecrets then imagePullSecrets, each name once) and
priorityClassName (the component's, else priorityClassName, else
global.priorityClassName), and the component's topologySpreadConstraints,
each without a labelSelector getting the component's pod selector; pass
(dict "ctx" $ "component" "signer" "values" $s).
*/}}
{{- define "keyward.podSpec" -}}
{{- $g := default (dict) .ctx.Values.global -}}
{{- $secrets := list -}}
{{- $seen := dict -}}
{{- range concat (default (list) $g.imagePullSecrets) (default (list) .ctx.Values.imagePullSecrets) -}}
{{- if not (hasKey $seen .name) -}}
{{- $_ := set $seen .name true -}}
{{- $secrets = append $secrets (dict "name" .name) -}}
{{- end -}}
{{- end -}}
{{- with $secrets }}
imagePullSecrets:
{{- toYaml . | nindent 0 }}
{{- end }}
{{- with coalesce .values.priorityClassName .ctx.Values.priorityClassName $g.priorityClassName }}
priorityClassName: {{ . }}
{{- end }}
{{- with .values.topologySpreadConstraints }}
topologySpreadConstraints:
{{- range . }}
{{- $c := deepCopy . }}
{{- if not (hasKey $c "labelSelector") }}
{{- $_ := set $c "labelSelector" (dict "matchLabels" (include "keyward.selector" $.component | fromYaml)) }}
{{- end }}
- {{ toYaml $c | nindent 2 | trim }}
{{- end }}
{{- end }}
{{- end -}}

{{/* Selector labels of a component's pods; pass the component. */}}
{{- define "keyward.selector" -}}
app.kubernetes.io/name: keyward-{{ . }}
{{- end -}}

{{/*
The image; pass (dict "ctx" $ "softhsm" bool). The -softhsm variant is
another image: image.digest pins the plain one, image.softhsmDigest the
variant, and a digest never gets a suffix. With image.digest set, a
component on the variant needs image.softhsmDigest (else it would run an
unpinned image, or the plain one by its digest).
*/}}
{{- define "keyward.image" -}}
{{- $v := .ctx.Values.image -}}
{{- $variant := or .softhsm $v.softhsm -}}
{{- if and $v.digest $v.softhsmDigest (eq $v.digest $v.softhsmDigest) -}}
{{- fail "image.softhsmDigest: equals image.digest, but the -softhsm variant is another image with its own digest" -}}
{{- end -}}
{{- if $variant -}}
{{- if and $v.digest (not $v.softhsmDigest) -}}
{{- fail "image.softhsmDigest: required with image.digest when a component runs the -softhsm variant (signer.backend.type softhsm or image.softhsm): image.digest pins the plain image only" -}}
{{- end -}}
{{- if $v.softhsmDigest -}}
{{- printf "%s@%s" $v.repository $v.softhsmDigest -}}
{{- else -}}
{{- printf "%s:%s-softhsm" $v.repository (default .ctx.Chart.AppVersion $v.tag) -}}
{{- end -}}
{{- else if $v.digest -}}
{{- printf "%s@%s" $v.repository $v.digest -}}
{{- else -}}
{{- printf "%s:%s" $v.repository (default .ctx.Chart.AppVersion $v.tag) -}}
{{- end -}}
{{- end -}}

{{- define "keyward.softhsm" -}}
{{- if eq .Values.signer.backend.type "softhsm" }}true{{ end -}}
{{- end -}}

{{/* Pod security context of the non-root components. */}}
{{- define "keyward.podSecurityContext" -}}
runAsNonRoot: true
runAsUser: 65532
runAsGroup: 65532
# Secret files (PIN, TLS key) are root's unless fsGroup is set; with it the
# kubelet makes them group 65532, group-readable (0440).
fsGroup: 65532
seccompProfile:
  type: RuntimeDefault
{{- end -}}

{{- define "keyward.containerSecurityContext" -}}
allowPrivilegeEscalation: false
readOnlyRootFilesystem: true
capabilities:
  drop: ["ALL"]
{{- end -}}

{{/* Probes on the port named health. */}}
{{- define "keyward.probes" -}}
readinessProbe:
  httpGet:
    path: /readyz
    port: health
  periodSeconds: 5
livenessProbe:
  httpGet:
    path: /healthz
    port: health
  periodSeconds: 10
{{- end -}}

{{/* Scheduling fields of a component's values. */}}
{{- define "keyward.scheduling" -}}
{{- with .nodeSelector }}
nodeSelector:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .tolerations }}
tolerations:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .affinity }}
affinity:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- end -}}

{{/* Signer names by kind of request (the RBAC follows them). */}}
{{- define "keyward.pcrSigners" -}}
{{- $out := list -}}
{{- range .Values.signer.signers -}}
{{- if has .profile (list "podIdentity" "spiffe" "server") -}}
{{- $out = append $out .name -}}
{{- end -}}
{{- end -}}
{{- toJson $out -}}
{{- end -}}

{{- define "keyward.csrSigners" -}}
{{- $out := list -}}
{{- range .Values.signer.signers -}}
{{- if not (has .profile (list "podIdentity" "spiffe" "server")) -}}
{{- $out = append $out .name -}}
{{- end -}}
{{- end -}}
{{- toJson $out -}}
{{- end -}}

{{/* The SignerConfiguration (signer and approver read it). */}}
{{- define "keyward.signerConfig" -}}
{{- $s := .Values.signer -}}
{{- $cfg := deepCopy $s.config -}}
{{- $le := mustMergeOverwrite (dict) (default (dict) $cfg.leaderElection) (dict "namespace" (include "keyward.namespace" .) "leaseName" "keyward-signer") -}}
{{- $_ := set $cfg "leaderElection" $le -}}
{{- $_ = set $cfg "metricsAddress" ":9090" -}}
{{- $_ = set $cfg "healthAddress" ":9091" -}}
{{- $_ = set $cfg "trustPublisher" (dict "enabled" $s.trustPublisher "kubeletSyncFrequency" .Values.kubeletSyncFrequency) -}}
{{- if and (eq $s.backend.type "pkcs11") $s.backend.pkcs11Library.path -}}
{{- $b := default (dict) $cfg.backends -}}
{{- $p := default (dict) $b.pkcs11 -}}
{{- $_ = set $p "allowedModules" (list $s.backend.pkcs11Library.path) -}}
{{- $_ = set $b "pkcs11" $p -}}
{{- $_ = set $cfg "backends" $b -}}
{{- end -}}
{{- $_ = set $cfg "signers" $s.signers -}}
apiVersion: keyward.dev/v1alpha1
kind: SignerConfiguration
{{ toYaml $cfg }}
{{- end -}}

{{/* The TokenServiceConfiguration. */}}
{{- define "keyward.tokenServiceConfig" -}}
{{- $cfg := deepCopy .Values.tokenService.config -}}
{{- $le := mustMergeOverwrite (dict) (default (dict) $cfg.leaderElection) (dict "namespace" (include "keyward.namespace" .) "leaseName" "keyward-token-service") -}}
{{- $_ := set $cfg "leaderElection" $le -}}
{{- $_ = set $cfg "metricsAddress" ":9092" -}}
{{- $_ = set $cfg "healthAddress" ":9093" -}}
{{- $_ = set $cfg "listen" (dict "address" ":8443" "tlsCertFile" "/etc/keyward/tls/tls.crt" "tlsKeyFile" "/etc/keyward/tls/tls.key") -}}
{{- $_ = set $cfg "trustPublisher" (dict "enabled" .Values.tokenService.trustPublisher "kubeletSyncFrequency" .Values.kubeletSyncFrequency) -}}
apiVersion: keyward.dev/v1alpha1
kind: TokenServiceConfiguration
{{ toYaml $cfg }}
{{- end -}}

{{/* The NodeAgentConfiguration. */}}
{{- define "keyward.nodeAgentConfig" -}}
{{- $cfg := deepCopy .Values.nodeAgent.config -}}
{{- if not $cfg.stateDir }}{{ $_ := set $cfg "stateDir" .Values.nodeAgent.hostPaths.state }}{{ end -}}
{{- if not $cfg.kubeconfig }}{{ $_ := set $cfg "kubeconfig" .Values.nodeAgent.hostPaths.kubeconfig }}{{ end -}}
{{- $_ := set $cfg "metricsAddress" (ternary ":9465" "127.0.0.1:9465" .Values.nodeAgent.exposeMetrics) -}}
{{- $_ = set $cfg "healthAddress" "127.0.0.1:9466" -}}
apiVersion: keyward.dev/v1alpha1
kind: NodeAgentConfiguration
{{ toYaml $cfg }}
{{- end -}}

{{/* Names the approver decides: kubelet client, and kubelet serving and
csr names with an approval section (signer/approver). */}}
{{- define "keyward.approverSigners" -}}
{{- $out := list -}}
{{- range .Values.signer.signers -}}
{{- if or (eq .profile "kubeAPIServerClientKubelet") (and (has .profile (list "kubeletServing" "csr")) .approval) -}}
{{- $out = append $out .name -}}
{{- end -}}
{{- end -}}
{{- toJson $out -}}
{{- end -}}

{{/* A namespaced Role + RoleBinding for a component's Lease; pass
(dict "ctx" $ "component" "signer"). create cannot be narrowed by name. */}}
{{- define "keyward.leaseRole" -}}
apiVersion: rbac.authorization.k8s.io/v1
kind: Role
metadata:
  name: keyward-{{ .component }}-leader-election
  namespace: {{ include "keyward.namespace" .ctx }}
  labels:
    {{- include "keyward.labels" . | nindent 4 }}
rules:
# Leader election: create a Lease (create cannot be narrowed by name) ...
- apiGroups: ["coordination.k8s.io"]
  resources: ["leases"]
  verbs: ["create"]
# ... and read and renew only its own, keyward-{{ .component }}.
- apiGroups: ["coordination.k8s.io"]
  resources: ["leases"]
  resourceNames: ["keyward-{{ .component }}"]
  verbs: ["get", "update"]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: RoleBinding
metadata:
  name: keyward-{{ .component }}-leader-election
  namespace: {{ include "keyward.namespace" .ctx }}
  labels:
    {{- include "keyward.labels" . | nindent 4 }}
roleRef:
  apiGroup: rbac.authorization.k8s.io
  kind: Role
  name: keyward-{{ .component }}-leader-election
subjects:
- kind: ServiceAccount
  name: keyward-{{ .component }}
  namespace: {{ include "keyward.namespace" .ctx }}
{{- end -}}

{{- define "keyward.clusterRoleBinding" -}}
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata:
  name: {{ include "keyward.fullname" .ctx }}-{{ .component }}
  labels:
    {{- include "keyward.labels" . | nindent 4 }}
roleRef:
  apiGroup: rbac.authorization.k8s.io
  kind: ClusterRole
  name: {{ include "keyward.fullname" .ctx }}-{{ .component }}
subjects:
- kind: ServiceAccount
  name: keyward-{{ .component }}
  namespace: {{ include "keyward.namespace" .ctx }}
{{- end -}}

{{- /*
The Authority names of a JSON list of signer names, as JSON: the name
`keyward ca init` derives (example.com/x → example.com.x;
deploy/rbac.AuthorityName). RBAC grants writes on exactly these.
*/ -}}
{{- define "keyward.authorityNames" -}}
{{- $out := list -}}
{{- range (. | fromJsonArray) -}}
{{- $n := lower (replace "/" "." .) -}}
{{- $n = regexReplaceAll "[^a-z0-9.-]+" $n "-" -}}
{{- $n = regexReplaceAll "\\.[-.]*" $n "." -}}
{{- $out = append $out (trimAll ".-" $n) -}}
{{- end -}}
{{- toJson ($out | uniq | sortAlpha) -}}
{{- end -}}

{{- /*
The canary and live ClusterTrustBundle names of a JSON list of signer
names, as JSON: the signer name with / as :, then :canary or :live.
*/ -}}
{{- define "keyward.bundleNames" -}}
{{- $out := list -}}
{{- range (. | fromJsonArray) -}}
{{- $b := replace "/" ":" . -}}
{{- $out = concat $out (list (printf "%s:canary" $b) (printf "%s:live" $b)) -}}
{{- end -}}
{{- toJson ($out | uniq | sortAlpha) -}}
{{- end -}}

{{- /*
The signer entry helm test asks a pod certificate of, as JSON ({} when
there is none): tests.signerName, which must be a podIdentity, spiffe or
server name of signer.signers, else the first podIdentity or spiffe name
(a server certificate needs the DNS names its policy allows).
*/ -}}
{{- define "keyward.testSigner" -}}
{{- $want := .Values.tests.signerName -}}
{{- $out := dict -}}
{{- range .Values.signer.signers -}}
{{- if and (not $out) (or (and $want (eq .name $want) (has .profile (list "podIdentity" "spiffe" "server"))) (and (not $want) (has .profile (list "podIdentity" "spiffe")))) -}}
{{- $out = . -}}
{{- end -}}
{{- end -}}
{{- if and $want (not $out) -}}
{{- fail (printf "tests.signerName: %s is not a podIdentity, spiffe or server name of signer.signers (helm test asks a pod certificate of it)" $want) -}}
{{- end -}}
{{- toJson $out -}}
{{- end -}}
