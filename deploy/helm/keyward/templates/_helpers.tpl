{{/* Namespace of every namespaced object but the node agent's. */}}
{{- define "keyward.namespace" -}}
{{- default .Release.Namespace .Values.namespaceOverride -}}
{{- end -}}

{{/* The node agent's own namespace (Pod Security privileged). */}}
{{- define "keyward.nodeNamespace" -}}
{{- default (printf "%s-node" (include "keyward.namespace" .)) .Values.nodeAgent.namespace -}}
{{- end -}}

{{/* Labels of every object; pass (dict "ctx" $ "component" "signer"). */}}
{{- define "keyward.labels" -}}
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

{{/* Selector labels of a component's pods; pass the component. */}}
{{- define "keyward.selector" -}}
app.kubernetes.io/name: keyward-{{ . }}
{{- end -}}

{{/* The image; pass (dict "ctx" $ "softhsm" bool). */}}
{{- define "keyward.image" -}}
{{- $v := .ctx.Values.image -}}
{{- $tag := default .ctx.Chart.AppVersion $v.tag -}}
{{- if or .softhsm $v.softhsm -}}
{{- $tag = printf "%s-softhsm" $tag -}}
{{- end -}}
{{- printf "%s:%s" $v.repository $tag -}}
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
  name: keyward-{{ .component }}
  labels:
    {{- include "keyward.labels" . | nindent 4 }}
roleRef:
  apiGroup: rbac.authorization.k8s.io
  kind: ClusterRole
  name: keyward-{{ .component }}
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
