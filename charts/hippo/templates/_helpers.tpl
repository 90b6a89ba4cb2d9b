{{/* Names, labels and the per-service facts every template shares. */}}

{{- define "hippo.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "hippo.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{- define "hippo.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Labels on every object. */}}
{{- define "hippo.labels" -}}
helm.sh/chart: {{ include "hippo.chart" . }}
{{ include "hippo.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: hippo
{{- end }}

{{- define "hippo.selectorLabels" -}}
app.kubernetes.io/name: {{ include "hippo.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{/* Labels of one service's objects: dict "root" $ "name" "gateway". */}}
{{- define "hippo.componentLabels" -}}
{{ include "hippo.labels" .root }}
app.kubernetes.io/component: {{ .name }}
{{- end }}

{{/* Selector of one service's pods; never change it on an existing release (immutable). */}}
{{- define "hippo.componentSelectorLabels" -}}
{{ include "hippo.selectorLabels" .root }}
app.kubernetes.io/component: {{ .name }}
{{- end }}

{{/* Object name of one service: dict "root" $ "name" "gateway". */}}
{{- define "hippo.componentName" -}}
{{- printf "%s-%s" (include "hippo.fullname" .root) .name | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/*
What the chart knows about each service and users do not configure: the readiness key
(its proto service name), whether it owns state (StatefulSet + PVC) or scales out
(Deployment + HPA), and its settings' environment prefix.
*/}}
{{- define "hippo.catalog" -}}
gateway: {health: hippo.memory.v1.MemoryService, stateful: false, prefix: HIPPO_GATEWAY_}
embedding: {health: hippo.embedding.v1.EmbeddingService, stateful: false, prefix: HIPPO_EMBEDDING_}
retrieval: {health: hippo.retrieval.v1.RetrievalService, stateful: true, prefix: HIPPO_RETRIEVAL_}
summariser: {health: hippo.summariser.v1.SummariserService, stateful: true, prefix: HIPPO_SUMMARISER_}
injection: {health: hippo.injection.v1.InjectionService, stateful: true, prefix: HIPPO_INJECTION_}
audit: {health: hippo.audit.v1.AuditService, stateful: true, prefix: HIPPO_AUDIT_}
{{- end }}

{{/* host:port where a peer's gRPC API answers inside the cluster: dict "root" $ "name" "embedding". */}}
{{- define "hippo.addr" -}}
{{- $svc := index .root.Values .name -}}
{{- printf "%s:%v" (include "hippo.componentName" .) $svc.port }}
{{- end }}

{{/* The injection service's TGI-compatible HTTP API. */}}
{{- define "hippo.injectionHttpUrl" -}}
{{- printf "http://%s:%v" (include "hippo.componentName" (dict "root" . "name" "injection")) .Values.injection.httpPort }}
{{- end }}

{{- define "hippo.qdrantUrl" -}}
{{- if .Values.qdrant.enabled }}
{{- /* The qdrant chart names its Service <release>-qdrant (its own fullname rule). */}}
{{- if contains "qdrant" .Release.Name }}
{{- printf "http://%s:6333" (.Release.Name | trunc 63 | trimSuffix "-") }}
{{- else }}
{{- printf "http://%s-qdrant:6333" .Release.Name }}
{{- end }}
{{- else }}
{{- .Values.externalQdrant.url }}
{{- end }}
{{- end }}

{{/* image reference of one service: dict "root" $ "name" "gateway". */}}
{{- define "hippo.image" -}}
{{- $img := .root.Values.image -}}
{{- $svc := index .root.Values .name -}}
{{- $tag := default .root.Chart.AppVersion $img.tag -}}
{{- if and (eq .name "injection") $svc.gpu.enabled }}
{{- $tag = printf "%s%s" $tag $svc.gpu.imageTagSuffix }}
{{- end }}
{{- printf "%s/%s%s:%s" $img.registry $img.prefix .name $tag }}
{{- end }}

{{/* Seconds a pod needs to stop cleanly; terminationGracePeriodSeconds must exceed it. */}}
{{- define "hippo.stopSeconds" -}}
{{- $svc := index .root.Values .name -}}
{{- add .root.Values.preStopSleepSeconds (ceil $svc.graceSeconds) (ceil (default 0 $svc.drainSeconds)) }}
{{- end }}
