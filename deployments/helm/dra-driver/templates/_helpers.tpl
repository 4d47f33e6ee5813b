{{/* Names, labels and the shared pieces of both DaemonSets. */}}

{{- define "dra-driver.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "dra-driver.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- $name := default .Chart.Name .Values.nameOverride -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{- define "dra-driver.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{ include "dra-driver.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end -}}

{{- define "dra-driver.selectorLabels" -}}
app.kubernetes.io/name: {{ include "dra-driver.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "dra-driver.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "dra-driver.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- required "serviceAccount.name is required when serviceAccount.create is false" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{- define "dra-driver.devicePluginServiceAccountName" -}}
{{- printf "%s-device-plugin" (include "dra-driver.serviceAccountName" .) | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* The node-label settings both agents read (NODE_LABELS only to turn them off). */}}
{{- define "dra-driver.nodeLabelsEnv" -}}
{{- if not .Values.nodeLabels.enabled }}
- name: NODE_LABELS
  value: "false"
{{- end }}
- name: NODE_LABELS_RESYNC
  value: {{ .Values.nodeLabels.resyncSeconds | quote }}
{{- end -}}

{{- define "dra-driver.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) -}}
{{- end -}}

{{/* The MPS control daemon Pods' image: kubeletPlugin.mpsDaemons.image, else the agent's. */}}
{{- define "dra-driver.mpsDaemonImage" -}}
{{- .Values.kubeletPlugin.mpsDaemons.image | default (include "dra-driver.image" .) -}}
{{- end -}}

{{/*
The DaemonSets to render for one component, as a YAML list of
{suffix, profile, expressions}: one entry without fake GPUs or with one fake profile for all
nodes; with fakeGPU.nodeLabel one entry per profile (nodes labelled with it) plus, if
fakeGPU.profile is set, a fallback for every other node.
*/}}
{{- define "dra-driver.variants" -}}
{{- $fake := .Values.fakeGPU -}}
{{- if not $fake.nodeLabel }}
- suffix: ""
  profile: {{ $fake.profile | quote }}
  expressions: []
{{- else }}
{{- range $fake.profiles }}
- suffix: {{ printf "-%s" . | quote }}
  profile: {{ . | quote }}
  expressions:
    - key: {{ $fake.nodeLabel | quote }}
      operator: In
      values: [{{ . | quote }}]
{{- end }}
{{- if $fake.profile }}
- suffix: ""
  profile: {{ $fake.profile | quote }}
  expressions:
    - key: {{ $fake.nodeLabel | quote }}
      operator: NotIn
      values: {{ toJson $fake.profiles }}
{{- end }}
{{- end }}
{{- end -}}

{{/*
nodeAffinity of a DaemonSet: the node-mode rule (kubelet plugin: not labelled for the device
plugin; device plugin: labelled for it), the fake-profile rule and the user's expressions, all
in one term (ANDed). Argument: dict root, component, variant.
*/}}
{{- define "dra-driver.affinity" -}}
{{- $root := .root -}}
{{- $mode := $root.Values.nodeModeLabel -}}
{{- $cfg := ternary $root.Values.devicePlugin $root.Values.kubeletPlugin (eq .component "device-plugin") -}}
nodeAffinity:
  requiredDuringSchedulingIgnoredDuringExecution:
    nodeSelectorTerms:
      - matchExpressions:
          - key: {{ $mode.key | quote }}
            operator: {{ ternary "In" "NotIn" (eq .component "device-plugin") }}
            values: [{{ $mode.devicePluginValue | quote }}]
          {{- with .variant.expressions }}
          {{- toYaml . | nindent 10 }}
          {{- end }}
          {{- with $cfg.nodeAffinityExpressions }}
          {{- toYaml . | nindent 10 }}
          {{- end }}
{{- end -}}

{{/* Privileged unless fake GPUs, or as the component's `privileged` value says. */}}
{{- define "dra-driver.privileged" -}}
{{- $cfg := .cfg -}}
{{- if kindIs "bool" $cfg.privileged -}}
{{- $cfg.privileged -}}
{{- else -}}
{{- not .variant.profile -}}
{{- end -}}
{{- end -}}

{{- define "dra-driver.securityContext" -}}
{{- if eq (include "dra-driver.privileged" .) "true" }}
# Real GPUs: NVML opens /dev/nvidia*; root for the root-owned kubelet and CDI directories.
privileged: true
runAsUser: 0
runAsGroup: 0
readOnlyRootFilesystem: true
{{- else }}
# Fake GPUs: root only for the root-owned kubelet and CDI host directories, no capabilities.
privileged: false
allowPrivilegeEscalation: false
runAsUser: 0
runAsGroup: 0
readOnlyRootFilesystem: true
capabilities:
  drop: [ALL]
seccompProfile:
  type: RuntimeDefault
{{- end }}
{{- end -}}

{{- define "dra-driver.commonEnv" -}}
- name: POD_NAMESPACE
  valueFrom:
    fieldRef:
      fieldPath: metadata.namespace
- name: LOG_LEVEL
  value: {{ .Values.logging.level | quote }}
- name: LOG_FORMAT
  value: {{ .Values.logging.format | quote }}
- name: METRICS_PORT
  value: {{ .Values.metrics.port | quote }}
{{- if .Values.python.optimize }}
# Docstrings and asserts out of memory (~2 MiB per agent); the image has the byte-code for it.
- name: PYTHONOPTIMIZE
  value: {{ .Values.python.optimize | quote }}
{{- end }}
# The metrics/health server listens on the pod IP (the probes' target), not on every interface.
- name: POD_IP
  valueFrom:
    fieldRef:
      fieldPath: status.podIP
{{- with .Values.metrics.address }}
- name: METRICS_ADDRESS
  value: {{ . | quote }}
{{- end }}
{{- end -}}

{{- define "dra-driver.probes" -}}
ports:
  - name: metrics
    containerPort: {{ .Values.metrics.port }}
    protocol: TCP
startupProbe:
  httpGet:
    path: /healthz
    port: metrics
  periodSeconds: 2
  failureThreshold: 30
livenessProbe:
  httpGet:
    path: /healthz
    port: metrics
  periodSeconds: 10
  timeoutSeconds: 5
  failureThreshold: 3
readinessProbe:
  httpGet:
    path: /readyz
    port: metrics
  periodSeconds: 5
  timeoutSeconds: 5
  failureThreshold: 2
{{- end -}}

{{- define "dra-driver.podAnnotations" -}}
{{- $cfg := .cfg -}}
{{- $root := .root -}}
{{- $ann := dict -}}
{{- if $root.Values.metrics.scrapeAnnotations -}}
{{- $_ := set $ann "prometheus.io/scrape" "true" -}}
{{- $_ := set $ann "prometheus.io/port" (toString $root.Values.metrics.port) -}}
{{- $_ := set $ann "prometheus.io/path" "/metrics" -}}
{{- end -}}
{{- $ann = merge (deepCopy $cfg.podAnnotations) $ann -}}
{{- with $ann }}
annotations:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- end -}}
