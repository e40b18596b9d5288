{{/* Names and labels shared by every object. */}}
{{- define "te.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "te.fullname" -}}
{{- if contains (include "te.name" .) .Release.Name -}}
{{- .Release.Name | trunc 52 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name (include "te.name" .) | trunc 52 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "te.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
app.kubernetes.io/name: {{ include "te.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end -}}

{{- define "te.selector" -}}
app.kubernetes.io/name: {{ include "te.name" .root }}
app.kubernetes.io/instance: {{ .root.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end -}}

{{- define "te.image" -}}
{{- $tag := default .root.Chart.AppVersion .root.Values.image.tag -}}
{{- printf "%s:%s%s" (required "image.repository is required" .root.Values.image.repository) $tag .suffix -}}
{{- end -}}

{{/* Workload identity: the ServiceAccount annotation; pods carry the `use` label. */}}
{{- define "te.saAnnotations" -}}
{{- with .Values.azureWorkloadIdentity }}
{{- if .clientId }}
annotations:
  azure.workload.identity/client-id: {{ .clientId | quote }}
  {{- if .tenantId }}
  azure.workload.identity/tenant-id: {{ .tenantId | quote }}
  {{- end }}
{{- end }}
{{- end }}
{{- end -}}

{{- define "te.podIdentityLabel" -}}
{{- if .Values.azureWorkloadIdentity.clientId }}
azure.workload.identity/use: "true"
{{- end }}
{{- end -}}

{{- define "te.adxMon" -}}
{{- if .root.Values.adxMon.enabled }}
adx-mon/scrape: "true"
adx-mon/port: {{ .port | quote }}
adx-mon/path: /metrics
{{- end }}
{{- end -}}

{{/* The Secret holding the bearer token (key `token`): the user's, or the one the chart creates. */}}
{{- define "te.tokenSecret" -}}
{{- default (printf "%s-token" (include "te.fullname" .)) .Values.auth.existingSecret -}}
{{- end -}}

{{/* The name each component's certificate carries, and that its clients check. */}}
{{- define "te.serverName" -}}
{{- $c := get .root.Values .component -}}
{{- default (printf "%s-%s.%s.svc" (include "te.fullname" .root) .component .root.Release.Namespace) $c.tls.serverName -}}
{{- end -}}

{{/* Mount points inside the pods. */}}
{{- define "te.tokenPath" -}}/etc/taugrid-evidence/auth/token{{- end -}}
{{- define "te.tlsDir" -}}/etc/taugrid-evidence/tls{{- end -}}
{{- define "te.agentCaPath" -}}/etc/taugrid-evidence/agent-ca/ca.crt{{- end -}}

{{/* The lease the controller holds: the only object it writes (collector/sources/lease.py). */}}
{{- define "te.leaseName" -}}
{{- $ctl := default dict (get (default dict .Values.controller.config) "controller") -}}
{{- default "taugrid-evidence-controller" (get $ctl "lease_name") -}}
{{- end -}}

{{/* How many of `nodes` (a NodeList as `lookup` returns it) carry every label of `selector`:
     the nodes the agent DaemonSet can be scheduled on, affinity and taints aside. */}}
{{- define "te.matchingNodes" -}}
{{- $n := 0 -}}
{{- range $node := (.nodes.items | default list) -}}
{{- $labels := $node.metadata.labels | default dict -}}
{{- $ok := true -}}
{{- range $k, $v := $.selector -}}
{{- if not (and (hasKey $labels $k) (eq (toString (index $labels $k)) (toString $v))) -}}{{- $ok = false -}}{{- end -}}
{{- end -}}
{{- if $ok -}}{{- $n = add1 $n -}}{{- end -}}
{{- end -}}
{{- $n -}}
{{- end -}}
