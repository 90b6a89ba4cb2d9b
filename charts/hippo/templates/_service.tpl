{{/*
One gRPC service: its ConfigMap, Secret, Service(s), workload (a StatefulSet with PVCs when
it owns state, else a Deployment with an HPA) and opt-in PodDisruptionBudget.
Called by <service>.yaml as: include "hippo.grpcService" (dict "root" $ "name" "gateway").
*/}}
{{- define "hippo.grpcService" -}}
{{- $root := .root -}}
{{- $name := .name -}}
{{- $svc := index $root.Values $name -}}
{{- $info := index (fromYaml (include "hippo.catalog" $root)) $name -}}
{{- $fullname := include "hippo.componentName" . -}}
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
{{- if $info.stateful }}
---
# Headless: the StatefulSet's stable per-pod DNS names (<pod>.<this>).
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
{{- end }}
---
apiVersion: apps/v1
kind: {{ ternary "StatefulSet" "Deployment" $info.stateful }}
metadata:
  name: {{ $fullname }}
  labels:
    {{- include "hippo.componentLabels" . | nindent 4 }}
spec:
  {{- if not (and (not $info.stateful) $svc.autoscaling.enabled) }}
  replicas: {{ $svc.replicas }}
  {{- end }}
  {{- if $info.stateful }}
  serviceName: {{ $fullname }}-headless
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
            grpc:
              port: {{ $svc.port }}
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
            grpc:
              port: {{ $svc.port }}
              service: {{ $info.health }}
            periodSeconds: {{ .periodSeconds }}
            timeoutSeconds: {{ .timeoutSeconds }}
            failureThreshold: {{ .failureThreshold }}
          {{- end }}
          {{- end }}
          {{- with $probes.liveness }}
          {{- if .enabled }}
          livenessProbe:
            grpc:
              port: {{ $svc.port }}
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
            {{- if or $info.stateful (eq $name "gateway") }}
            - name: data
              mountPath: /data
            {{- end }}
            {{- if and (eq $name "audit") $svc.witness.enabled }}
            - name: witness
              mountPath: /witness
            {{- end }}
      volumes:
        # The root filesystem is read-only; Python, onnxruntime and torch want a /tmp.
        - name: tmp
          emptyDir:
            sizeLimit: 1Gi
        {{- if eq $name "gateway" }}
        - name: data
          emptyDir:
            sizeLimit: {{ $svc.spoolVolume.sizeLimit }}
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
  {{- if $info.stateful }}
  volumeClaimTemplates:
    {{- include "hippo.pvc" (dict "root" . "claim" "data" "labels" (include "hippo.componentSelectorLabels" .) "size" $svc.persistence.size "storageClass" $svc.persistence.storageClass "accessModes" $svc.persistence.accessModes) | nindent 4 }}
    {{- if and (eq $name "audit") $svc.witness.enabled }}
    {{- include "hippo.pvc" (dict "root" . "claim" "witness" "labels" (include "hippo.componentSelectorLabels" .) "size" $svc.witness.size "storageClass" $svc.witness.storageClass "accessModes" (list "ReadWriteOnce")) | nindent 4 }}
    {{- end }}
  {{- end }}
{{- if and (not $info.stateful) $svc.autoscaling.enabled }}
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
{{- if $root.Values.podDisruptionBudget.enabled }}
---
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
