{{/*
The non-secret settings of one service, as a YAML map of HIPPO_<SVC>_<FIELD> -> value:
dict "root" $ "name" "gateway". The chart sets what wiring needs (bind address, ports,
peers, data dir, grace); the service block's `env` adds the rest and may redirect a peer
or the OTLP endpoint (not what the manifests themselves are built from: see $owned).
*/}}
{{- define "hippo.env" -}}
{{- $root := .root -}}
{{- $name := .name -}}
{{- $svc := index $root.Values $name -}}
{{- $info := index (fromYaml (include "hippo.catalog" $root)) $name -}}
{{- $env := dict
  "HOST" "0.0.0.0"
  "PORT" (toString $svc.port)
  "METRICS_PORT" (toString $svc.metricsPort)
  "GRACE_SECONDS" (toString $svc.graceSeconds)
  "OTLP_ENDPOINT" $root.Values.otlpEndpoint
-}}
{{- if $info.stateful }}
{{- $_ := set $env "DATA_DIR" "/data" }}
{{- end }}
{{- if eq $name "gateway" }}
{{- $_ := set $env "DATA_DIR" "/data" }}
{{- $_ := set $env "EMBEDDING_ADDR" (include "hippo.addr" (dict "root" $root "name" "embedding")) }}
{{- $_ := set $env "RETRIEVAL_ADDR" (include "hippo.addr" (dict "root" $root "name" "retrieval")) }}
{{- $_ := set $env "SUMMARISER_ADDR" (include "hippo.addr" (dict "root" $root "name" "summariser")) }}
{{- $_ := set $env "INJECTION_ADDR" (include "hippo.addr" (dict "root" $root "name" "injection")) }}
{{- $_ := set $env "AUDIT_ADDR" (include "hippo.addr" (dict "root" $root "name" "audit")) }}
{{- $_ := set $env "LLM_URL" (default (include "hippo.injectionHttpUrl" $root) $svc.llmUrl) }}
{{- else if eq $name "retrieval" }}
{{- $_ := set $env "QDRANT_URL" (include "hippo.qdrantUrl" $root) }}
{{- $_ := set $env "LEXICAL_INDEX" $svc.lexicalIndex }}
{{- if and (eq $svc.fusion "server") (or (ne $svc.lexicalIndex "qdrant") (not (include "hippo.qdrantUrl" $root))) }}
{{- fail "retrieval.fusion server needs retrieval.lexicalIndex qdrant and a Qdrant server (qdrant.enabled or qdrant.url): the server fuses what one of its collections holds" }}
{{- end }}
{{- $_ := set $env "FUSION" $svc.fusion }}
{{- $_ := set $env "QDRANT_SHARD_NUMBER" (toString $svc.qdrantCollections.shardNumber) }}
{{- $_ := set $env "QDRANT_REPLICATION_FACTOR" (toString $svc.qdrantCollections.replicationFactor) }}
{{- /* Asked for vectors of the index's model where a turn or query came with another's
       (an online model switch: docs/recall.md), and by a reindex with a new model. */}}
{{- $_ := set $env "EMBEDDING_ADDR" (include "hippo.addr" (dict "root" $root "name" "embedding")) }}
{{- else if eq $name "summariser" }}
{{- $_ := set $env "DRAIN_SECONDS" (toString $svc.drainSeconds) }}
{{- $_ := set $env "INJECTION_ADDR" (include "hippo.addr" (dict "root" $root "name" "injection")) }}
{{- $_ := set $env "AUDIT_ADDR" (include "hippo.addr" (dict "root" $root "name" "audit")) }}
{{- $_ := set $env "LLM_URL" (default (include "hippo.injectionHttpUrl" $root) $svc.llmUrl) }}
{{- else if eq $name "injection" }}
{{- $_ := set $env "EMBEDDING_ADDR" (include "hippo.addr" (dict "root" $root "name" "embedding")) }}
{{- $_ := set $env "HTTP_PORT" (toString $svc.httpPort) }}
{{- $_ := set $env "MODEL_DIR" "/data/model" }}
{{- if $svc.gpu.enabled }}
{{- $_ := set $env "DEVICE" "cuda" }}
{{- end }}
{{- else if eq $name "audit" }}
{{- /* Cluster mode: checkpoints live in PostgreSQL beside the log (docs/audit.md). */}}
{{- if and $svc.witness.enabled (include "hippo.stateful" (dict "root" $root "name" "audit")) }}
{{- $_ := set $env "WITNESS_PATH" "/witness/witness.log" }}
{{- end }}
{{- end }}
{{- if has $name (list "gateway" "summariser") }}
{{- /* The LLM client (docs/operations.md#bring-your-own-llm); the key: hippo.grpcService. */}}
{{- $_ := set $env "LLM_BACKEND" $svc.llm.backend }}
{{- $_ := set $env "LLM_API_STYLE" $svc.llm.apiStyle }}
{{- if $svc.llm.model }}
{{- $_ := set $env "LLM_MODEL" $svc.llm.model }}
{{- end }}
{{- end }}
{{- if $root.Values.tls.enabled }}
{{- /* The pod's certificate (hippo.tlsSecret), mounted at hippo.tlsDir. */}}
{{- $dir := include "hippo.tlsDir" $root }}
{{- $_ := set $env "TLS__CA_FILE" (printf "%s/ca.crt" $dir) }}
{{- $_ := set $env "TLS__CERT_FILE" (printf "%s/tls.crt" $dir) }}
{{- $_ := set $env "TLS__KEY_FILE" (printf "%s/tls.key" $dir) }}
{{- if and (eq $name "gateway") $root.Values.tls.gatewayRequireClientCert }}
{{- $_ := set $env "TLS__REQUIRE_CLIENT_CERT" "true" }}
{{- end }}
{{- end }}
{{- /* Values the probes, Services, volumes and grace periods are rendered from: set
       through the block's own keys, or the pod and its manifests would disagree. */}}
{{- $owned := list "HOST" "PORT" "METRICS_PORT" "HTTP_PORT" "GRACE_SECONDS" "DRAIN_SECONDS" "DATA_DIR" "MODEL_DIR" "API_KEYS" "AUDIT_FINGERPRINT_KEY" "SIGNING_KEY" "QDRANT_API_KEY" "LLM_API_KEY" "DATABASE__URL" "DATABASE__POOL_MAX_SIZE" "LEXICAL_INDEX" "FUSION" "QDRANT_SHARD_NUMBER" "QDRANT_REPLICATION_FACTOR" "TLS__CA_FILE" "TLS__CERT_FILE" "TLS__KEY_FILE" }}
{{- range $k, $v := $svc.env }}
{{- if has (upper $k) $owned }}
{{- fail (printf "%s.env.%s: the chart sets HIPPO_%s_%s from the %s block's own values (ports, graceSeconds, secrets); set it there" $name $k (upper $name) (upper $k) $name) }}
{{- end }}
{{- $_ := set $env (upper $k) (toString $v) }}
{{- end }}
{{- range $k := keys $env | sortAlpha }}
{{ printf "%s%s" $info.prefix $k }}: {{ index $env $k | quote }}
{{- end }}
{{- end }}

{{/*
The Secret of one service, as a YAML map of env name -> value, or nothing when the service
has no secret settings or uses an existing Secret: dict "root" $ "name" "gateway".
*/}}
{{- define "hippo.secretEnv" -}}
{{- $root := .root -}}
{{- $svc := index $root.Values .name -}}
{{- if eq .name "gateway" }}
{{- if not $svc.existingSecret }}
{{- if not $svc.apiKeys }}
{{- fail "gateway.apiKeys is required (API key -> tenant; a key may be \"sha256:<hex>\"), or name a Secret in gateway.existingSecret: the gateway does not start without keys" }}
{{- end }}
{{- $key := $svc.auditFingerprintKey }}
{{- if not $key }}
{{- /* Keep the key of the installed release: fingerprints must not change on upgrade. */}}
{{- $name := printf "%s-secret" (include "hippo.componentName" .) }}
{{- $old := lookup "v1" "Secret" $root.Release.Namespace $name }}
{{- if and $old $old.data (hasKey $old.data "HIPPO_GATEWAY_AUDIT_FINGERPRINT_KEY") }}
{{- $key = index $old.data "HIPPO_GATEWAY_AUDIT_FINGERPRINT_KEY" | b64dec }}
{{- else }}
{{- $key = randBytes 32 }}
{{- end }}
{{- end }}
HIPPO_GATEWAY_API_KEYS: {{ toJson $svc.apiKeys | quote }}
HIPPO_GATEWAY_AUDIT_FINGERPRINT_KEY: {{ $key | quote }}
{{- end }}
{{- else if eq .name "audit" }}
{{- if not $svc.existingSecret }}
{{- $key := $svc.signingKey }}
{{- if and (not $key) (include "hippo.cluster" $root) }}
{{- /* Cluster mode: every replica signs checkpoints with one key, so the chart makes it
       (kept on upgrade, as the gateway's fingerprint key) instead of each pod. */}}
{{- $name := printf "%s-secret" (include "hippo.componentName" .) }}
{{- $old := lookup "v1" "Secret" $root.Release.Namespace $name }}
{{- if and $old $old.data (hasKey $old.data "HIPPO_AUDIT_SIGNING_KEY") }}
{{- $key = index $old.data "HIPPO_AUDIT_SIGNING_KEY" | b64dec }}
{{- else }}
{{- $key = randBytes 32 }}
{{- end }}
{{- end }}
{{- if $key }}
HIPPO_AUDIT_SIGNING_KEY: {{ $key | quote }}
{{- end }}
{{- end }}
{{- else if eq .name "retrieval" }}
{{- if and (not $root.Values.externalQdrant.existingSecret) $root.Values.externalQdrant.apiKey }}
HIPPO_RETRIEVAL_QDRANT_API_KEY: {{ $root.Values.externalQdrant.apiKey | quote }}
{{- end }}
{{- end }}
{{- end }}

{{/* Name of the Secret a service reads, or "" for none. */}}
{{- define "hippo.secretName" -}}
{{- $root := .root -}}
{{- $svc := index $root.Values .name -}}
{{- if and (eq .name "retrieval") $root.Values.externalQdrant.existingSecret }}
{{- $root.Values.externalQdrant.existingSecret }}
{{- else if and (hasKey $svc "existingSecret") $svc.existingSecret }}
{{- $svc.existingSecret }}
{{- else if include "hippo.secretEnv" . | trim }}
{{- printf "%s-secret" (include "hippo.componentName" .) }}
{{- end }}
{{- end }}
