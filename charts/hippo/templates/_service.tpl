{{/*
One gRPC service: its ConfigMap, Secret, Services (a ClusterIP one, and a headless one whose
DNS name resolves to every ready pod: what peers' round-robin channels use), workload (a
StatefulSet with PVCs when it keeps state on a volume, else a Deployment with an HPA) and
PodDisruptionBudget (opt-in; on in cluster mode, where every service has replicas).
Called by <service>.yaml as: include "hippo.grpcService" (dict "root" $ "name" "gateway").
*/}}
{{- define "hippo.grpcService" -}}
{{- $root := .root -}}
{{- $name := .name -}}
{{- $svc := index $root.Values $name -}}
{{- $info := index (fromYaml (include "hippo.catalog" $root)) $name -}}
{{- $fullname := include "hippo.componentName" . -}}
{{- $stateful := include "hippo.stateful" . -}}
{{- $cluster := include "hippo.cluster" $root -}}
{{- $stop := include "hippo.stopSeconds" . | int -}}
{{- if le (int $svc.terminationGracePeriodSeconds) $stop }}
{{- fail (printf "%s.terminationGracePeriodSeconds (%v) must exceed preStopSleepSeconds + graceSeconds%s (%d): the kubelet would kill calls still in their grace" $name $svc.terminationGracePeriodSeconds (ternary " + drainSeconds" "" (hasKey $svc "drainSeconds")) $stop) }}
{{- end }}
{{- $config := include "hippo.env" . -}}
{{- $secret := include "hippo.secretEnv" . | trim -}}
{{- $secretName := include "hippo.secretName" . -}}
{{- $probes := mergeOverwrite (deepCopy $root.Values.probes) (deepCopy (default dict $svc.probes)) -}}
apiVersion: v1
kind: ConfigMap
metadata:
  name: {{ $fullname }}
  labels:
    {{- include "hippo.componentLabels" . | nindent 4 }}
data:
  {{- $config | trim | nindent 2 }}
{{- if and $secret (not $svc.existingSecret) }}
---
apiVersion: v1
kind: Secret
metadata:
  name: {{ $fullname }}-secret
  labels:
    {{- include "hippo.componentLabels" . | nindent 4 }}
type: Opaque
stringData:
  {{- $secret | nindent 2 }}
{{- end }}
---
apiVersion: v1
kind: Service
metadata:
  name: {{ $fullname }}
  labels:
    {{- include "hippo.componentLabels" . | nindent 4 }}
spec:
  type: ClusterIP
  selector:
    {{- include "hippo.componentSelectorLabels" . | nindent 4 }}
  ports:
    {{- include "hippo.servicePorts" . | nindent 4 }}
---
# Headless: resolves to every ready pod (peers balance over them: hippo.addr); for a
# StatefulSet also its stable per-pod names (<pod>.<this>).
apiVersion: v1
kind: Service
metadata:
  name: {{ $fullname }}-headless
  labels:
    {{- include "hippo.componentLabels" . | nindent 4 }}
    # The ServiceMonitor skips this Service, or each pod would be scraped twice.
    hippo/headless: "true"
spec:
  clusterIP: None
  publishNotReadyAddresses: false
  selector:
    {{- include "hippo.componentSelectorLabels" . | nindent 4 }}
  ports:
    {{- include "hippo.servicePorts" . | nindent 4 }}
---
apiVersion: apps/v1
kind: {{ ternary "StatefulSet" "Deployment" (not (empty $stateful)) }}
metadata:
  name: {{ $fullname }}
  labels:
    {{- include "hippo.componentLabels" . | nindent 4 }}
spec:
  {{- if not (and (not $stateful) $svc.autoscaling.enabled) }}
  replicas: {{ $svc.replicas }}
  {{- end }}
  {{- if $stateful }}
  serviceName: {{ $fullname }}-headless
  {{- if $cluster }}
  # Replicas are interchangeable (state of record in PostgreSQL): start and stop them
  # side by side, not one after another.
  podManagementPolicy: Parallel
  {{- end }}
  {{- end }}
  selector:
    matchLabels:
      {{- include "hippo.componentSelectorLabels" . | nindent 6 }}
  template:
    metadata:
      labels:
        {{- include "hippo.componentLabels" . | nindent 8 }}
      annotations:
        # A settings change must restart the pods: env is read once, at start.
        checksum/config: {{ printf "%s\n%s" $config $secret | sha256sum }}
        {{- with $svc.podAnnotations }}
        {{- toYaml . | nindent 8 }}
        {{- end }}
    spec:
      {{- with $root.Values.imagePullSecrets }}
      imagePullSecrets:
        {{- toYaml . | nindent 8 }}
      {{- end }}
      # Services talk gRPC to each other; no Kubernetes API access is needed.
      automountServiceAccountToken: false
      enableServiceLinks: false
      terminationGracePeriodSeconds: {{ $svc.terminationGracePeriodSeconds }}
      securityContext:
        {{- toYaml $root.Values.podSecurityContext | nindent 8 }}
      containers:
        - name: {{ $name }}
          image: {{ include "hippo.image" . | quote }}
          imagePullPolicy: {{ $root.Values.image.pullPolicy }}
          securityContext:
            {{- toYaml $root.Values.securityContext | nindent 12 }}
          envFrom:
            - configMapRef:
                name: {{ $fullname }}
            {{- if $secretName }}
            - secretRef:
                name: {{ $secretName }}
            {{- end }}
          {{- $llmKey := and (hasKey $svc "llm") $svc.llm.apiKeySecret }}
          {{- if or (include "hippo.usesDatabase" .) $llmKey }}
          env:
            {{- if include "hippo.usesDatabase" . }}
            # Cluster mode: the state of record. A secret: never in the ConfigMap.
            - name: {{ $info.prefix }}DATABASE__URL
              valueFrom:
                secretKeyRef:
                  name: {{ include "hippo.databaseSecret" $root }}
                  key: {{ include "hippo.databaseSecretKey" $root }}
            - name: {{ $info.prefix }}DATABASE__POOL_MAX_SIZE
              value: {{ $root.Values.database.poolMaxSize | quote }}
            {{- end }}
            {{- if $llmKey }}
            # The OpenAI-compatible LLM's API key, from the operator's Secret.
            - name: {{ $info.prefix }}LLM_API_KEY
              valueFrom:
                secretKeyRef:
                  name: {{ $svc.llm.apiKeySecret }}
                  key: {{ $svc.llm.apiKeySecretKey }}
            {{- end }}
          {{- end }}
          ports:
            - name: grpc
              containerPort: {{ $svc.port }}
              protocol: TCP
            - name: metrics
              containerPort: {{ $svc.metricsPort }}
              protocol: TCP
            {{- if eq $name "injection" }}
            - name: http
              containerPort: {{ $svc.httpPort }}
              protocol: TCP
            {{- end }}
          {{- with $probes.startup }}
          {{- if .enabled }}
          # Liveness key "": SERVING once warm-up is done.
          startupProbe:
            {{- if $root.Values.tls.enabled }}
            {{- include "hippo.tlsProbe" (dict "target" (printf "127.0.0.1:%v" $svc.port)) | nindent 12 }}
            {{- else }}
            grpc:
              port: {{ $svc.port }}
            {{- end }}
            periodSeconds: {{ .periodSeconds }}
            timeoutSeconds: {{ .timeoutSeconds }}
            failureThreshold: {{ .failureThreshold }}
          {{- end }}
          {{- end }}
          {{- with $probes.readiness }}
          {{- if .enabled }}
          # The service's own name: NOT_SERVING during warm-up and from the first moment
          # of a drain, so the Service stops routing to this pod.
          readinessProbe:
            {{- if $root.Values.tls.enabled }}
            {{- include "hippo.tlsProbe" (dict "target" (printf "127.0.0.1:%v/%s" $svc.port $info.health)) | nindent 12 }}
            {{- else }}
            grpc:
              port: {{ $svc.port }}
              service: {{ $info.health }}
            {{- end }}
            periodSeconds: {{ .periodSeconds }}
            timeoutSeconds: {{ .timeoutSeconds }}
            failureThreshold: {{ .failureThreshold }}
          {{- end }}
          {{- end }}
          {{- with $probes.liveness }}
          {{- if .enabled }}
          livenessProbe:
            {{- if $root.Values.tls.enabled }}
            {{- include "hippo.tlsProbe" (dict "target" (printf "127.0.0.1:%v" $svc.port)) | nindent 12 }}
            {{- else }}
            grpc:
              port: {{ $svc.port }}
            {{- end }}
            periodSeconds: {{ .periodSeconds }}
            timeoutSeconds: {{ .timeoutSeconds }}
            failureThreshold: {{ .failureThreshold }}
          {{- end }}
          {{- end }}
          lifecycle:
            preStop:
              exec:
                command: ["sleep", "{{ $root.Values.preStopSleepSeconds }}"]
          resources:
            {{- $resources := deepCopy (default dict $svc.resources) }}
            {{- if and (eq $name "injection") $svc.gpu.enabled }}
            {{- $limits := default dict $resources.limits }}
            {{- $_ := set $limits $svc.gpu.resourceName $svc.gpu.count }}
            {{- $_ := set $resources "limits" $limits }}
            {{- end }}
            {{- toYaml $resources | nindent 12 }}
          volumeMounts:
            - name: tmp
              mountPath: /tmp
            {{- if $root.Values.tls.enabled }}
            # A Secret volume (not subPath): a renewed certificate appears in place, and
            # the server serves it from the next connection on.
            - name: tls
              mountPath: {{ include "hippo.tlsDir" $root }}
              readOnly: true
            {{- end }}
            {{- if or $info.stateful (eq $name "gateway") }}
            - name: data
              mountPath: /data
            {{- end }}
            {{- if and (eq $name "audit") $svc.witness.enabled $stateful }}
            - name: witness
              mountPath: /witness
            {{- end }}
            {{- with $svc.extraVolumeMounts }}
            {{- toYaml . | nindent 12 }}
            {{- end }}
      volumes:
        # The root filesystem is read-only; Python, onnxruntime and torch want a /tmp.
        - name: tmp
          emptyDir:
            sizeLimit: 1Gi
        {{- if $root.Values.tls.enabled }}
        - name: tls
          secret:
            secretName: {{ include "hippo.tlsSecret" . }}
            defaultMode: 0400
        {{- end }}
        {{- if or (eq $name "gateway") (and $info.stateful (not $stateful)) }}
        # Nothing durable here: the gateway's spool (embedded mode; in cluster mode it is
        # an outbox table in PostgreSQL) or, in cluster mode, scratch space of a service
        # whose state of record moved to PostgreSQL.
        - name: data
          emptyDir:
            sizeLimit: {{ if eq $name "gateway" }}{{ $svc.spoolVolume.sizeLimit }}{{ else }}1Gi{{ end }}
        {{- end }}
        {{- with $svc.extraVolumes }}
        {{- toYaml . | nindent 8 }}
        {{- end }}
      {{- with $svc.nodeSelector }}
      nodeSelector:
        {{- toYaml . | nindent 8 }}
      {{- end }}
      {{- with $svc.tolerations }}
      tolerations:
        {{- toYaml . | nindent 8 }}
      {{- end }}
      {{- with $svc.affinity }}
      affinity:
        {{- toYaml . | nindent 8 }}
      {{- end }}
  {{- if $stateful }}
  volumeClaimTemplates:
    {{- include "hippo.pvc" (dict "root" . "claim" "data" "labels" (include "hippo.componentSelectorLabels" .) "size" $svc.persistence.size "storageClass" $svc.persistence.storageClass "accessModes" $svc.persistence.accessModes) | nindent 4 }}
    {{- if and (eq $name "audit") $svc.witness.enabled }}
    {{- include "hippo.pvc" (dict "root" . "claim" "witness" "labels" (include "hippo.componentSelectorLabels" .) "size" $svc.witness.size "storageClass" $svc.witness.storageClass "accessModes" (list "ReadWriteOnce")) | nindent 4 }}
    {{- end }}
  {{- end }}
{{- if and (not $stateful) $svc.autoscaling.enabled }}
---
apiVersion: autoscaling/v2
kind: HorizontalPodAutoscaler
metadata:
  name: {{ $fullname }}
  labels:
    {{- include "hippo.componentLabels" . | nindent 4 }}
spec:
  scaleTargetRef:
    apiVersion: apps/v1
    kind: Deployment
    name: {{ $fullname }}
  minReplicas: {{ $svc.autoscaling.minReplicas }}
  maxReplicas: {{ $svc.autoscaling.maxReplicas }}
  metrics:
    - type: Resource
      resource:
        name: cpu
        target:
          type: Utilization
          averageUtilization: {{ $svc.autoscaling.targetCPUUtilizationPercentage }}
{{- end }}
{{- if or $root.Values.podDisruptionBudget.enabled $cluster }}
---
# At most maxUnavailable pods of this service down at once for voluntary disruptions
# (node drains, upgrades): with two or more replicas the service stays up throughout.
apiVersion: policy/v1
kind: PodDisruptionBudget
metadata:
  name: {{ $fullname }}
  labels:
    {{- include "hippo.componentLabels" . | nindent 4 }}
spec:
  maxUnavailable: {{ $root.Values.podDisruptionBudget.maxUnavailable }}
  selector:
    matchLabels:
      {{- include "hippo.componentSelectorLabels" . | nindent 6 }}
{{- end }}
{{- end }}

{{- define "hippo.servicePorts" -}}
{{- $svc := index .root.Values .name -}}
- name: grpc
  port: {{ $svc.port }}
  targetPort: grpc
  protocol: TCP
  appProtocol: grpc
- name: metrics
  port: {{ $svc.metricsPort }}
  targetPort: metrics
  protocol: TCP
  appProtocol: http
{{- if eq .name "injection" }}
- name: http
  port: {{ $svc.httpPort }}
  targetPort: http
  protocol: TCP
  appProtocol: http
{{- end }}
{{- end }}

{{- define "hippo.pvc" -}}
- metadata:
    name: {{ .claim }}
    labels:
      {{- .labels | nindent 6 }}
  spec:
    accessModes:
      {{- toYaml .accessModes | nindent 6 }}
    {{- if .storageClass }}
    storageClassName: {{ .storageClass | quote }}
    {{- end }}
    resources:
      requests:
        storage: {{ .size }}
{{- end }}
