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
(its proto service name), whether it owns state in the embedded mode (StatefulSet + PVC)
or scales out (Deployment + HPA), whether it keeps local projections in cluster mode too
(see hippo.stateful), and its settings' environment prefix.
*/}}
{{- define "hippo.catalog" -}}
gateway: {health: hippo.memory.v1.MemoryService, stateful: false, projections: false, prefix: HIPPO_GATEWAY_}
embedding: {health: hippo.embedding.v1.EmbeddingService, stateful: false, projections: false, prefix: HIPPO_EMBEDDING_}
retrieval: {health: hippo.retrieval.v1.RetrievalService, stateful: true, projections: true, prefix: HIPPO_RETRIEVAL_}
summariser: {health: hippo.summariser.v1.SummariserService, stateful: true, projections: false, prefix: HIPPO_SUMMARISER_}
injection: {health: hippo.injection.v1.InjectionService, stateful: true, projections: true, prefix: HIPPO_INJECTION_}
audit: {health: hippo.audit.v1.AuditService, stateful: true, projections: false, prefix: HIPPO_AUDIT_}
{{- end }}

{{/*
Where peers reach a service's gRPC API: its headless Service through gRPC's DNS resolver,
which returns every ready pod's address, so the caller's channel balances round robin
over all replicas (a ClusterIP would pin each long-lived HTTP/2 connection to one pod).
dict "root" $ "name" "embedding".
*/}}
{{- define "hippo.addr" -}}
{{- $svc := index .root.Values .name -}}
{{- printf "dns:///%s-headless:%v" (include "hippo.componentName" .) $svc.port }}
{{- end }}

{{/* host:port of a service's ClusterIP Service (for callers outside the release). */}}
{{- define "hippo.serviceAddr" -}}
{{- $svc := index .root.Values .name -}}
{{- printf "%s:%v" (include "hippo.componentName" .) $svc.port }}
{{- end }}

{{/* "true" in cluster mode (database.enabled: the state of record in PostgreSQL). */}}
{{- define "hippo.cluster" -}}
{{- if .Values.database.enabled }}
{{- if not (or .Values.database.existingSecret .Values.database.url) }}
{{- fail "database.enabled needs database.existingSecret (a Secret holding the PostgreSQL URL) or database.url" }}
{{- end }}
{{- true }}
{{- end }}
{{- end }}

{{/*
"true" when a service keeps state on a volume of its own (a StatefulSet with a PVC):
retrieval (its search projections) and injection (the converted model, the memtok key
projection) always; the summariser and audit only in the embedded mode, where their
SQLite files are the state of record. In cluster mode those two hold nothing locally and
run as Deployments. dict "root" $ "name" "audit".
*/}}
{{- define "hippo.stateful" -}}
{{- $info := index (fromYaml (include "hippo.catalog" .root)) .name -}}
{{- if and $info.stateful (or $info.projections (not (include "hippo.cluster" .root))) (not (include "hippo.statelessRetrieval" .)) }}
{{- true }}
{{- end }}
{{- end }}

{{/*
"true" for retrieval when it keeps nothing on its disk: cluster mode, a Qdrant server and
BM25 on it (lexicalIndex qdrant): both indexes are collections every replica shares.
*/}}
{{- define "hippo.statelessRetrieval" -}}
{{- if and (eq .name "retrieval") (include "hippo.cluster" .root) (include "hippo.qdrantUrl" .root) (eq .root.Values.retrieval.lexicalIndex "qdrant") }}
{{- true }}
{{- end }}
{{- end }}

{{/* Does a service keep its state of record in PostgreSQL in cluster mode? */}}
{{- define "hippo.usesDatabase" -}}
{{- if and (include "hippo.cluster" .root) (ne .name "embedding") }}
{{- true }}
{{- end }}
{{- end }}

{{/* Name of the Secret holding the PostgreSQL URL, and its key. */}}
{{- define "hippo.databaseSecret" -}}
{{- default (printf "%s-database" (include "hippo.fullname" .)) .Values.database.existingSecret }}
{{- end }}
{{- define "hippo.databaseSecretKey" -}}
{{- ternary .Values.database.existingSecretKey "url" (not (empty .Values.database.existingSecret)) }}
{{- end }}

{{/* The injection service's TGI-compatible HTTP API. */}}
{{- define "hippo.injectionHttpUrl" -}}
{{- /* Under TLS: HTTPS, with a client certificate required (docs/security.md). */}}
{{- printf "%s://%s:%v" (ternary "https" "http" .Values.tls.enabled) (include "hippo.componentName" (dict "root" . "name" "injection")) .Values.injection.httpPort }}
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

{{/* tls.enabled: the Secret with a service's (or "operator"'s) certificate. dict "root" $ "name" "audit". */}}
{{- define "hippo.tlsSecret" -}}
{{- default (printf "%s-%s-tls" (include "hippo.fullname" .root) .name) (index .root.Values.tls.existingSecrets .name) }}
{{- end }}

{{/* Where every pod mounts its certificate Secret (tls.crt, tls.key, ca.crt). */}}
{{- define "hippo.tlsDir" -}}/tls{{- end }}

{{/* The probe command under TLS: the pod's own certificate, checked for "localhost". */}}
{{- define "hippo.tlsProbe" -}}
exec:
  command:
    - python
    - -m
    - hippo_core.healthcheck
    - {{ .target | quote }}
    - --tls-ca={{ include "hippo.tlsDir" . }}/ca.crt
    - --tls-cert={{ include "hippo.tlsDir" . }}/tls.crt
    - --tls-key={{ include "hippo.tlsDir" . }}/tls.key
    - --tls-server-name=localhost
{{- end }}
