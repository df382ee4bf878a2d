{{/* Names */}}
{{- define "mathrl.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "mathrl.fullname" -}}
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

{{- define "mathrl.selectorLabels" -}}
app.kubernetes.io/name: {{ include "mathrl.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "mathrl.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{ include "mathrl.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- with .Values.commonLabels }}
{{ toYaml . }}
{{- end }}
{{- end -}}

{{- define "mathrl.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "mathrl.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- required "serviceAccount.name is required when serviceAccount.create=false" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{/* Images: registry/repository:tag or @digest. Call with (list $ "api") */}}
{{- define "mathrl.image" -}}
{{- $root := index . 0 -}}
{{- $img := index $root.Values.image (index . 1) -}}
{{- $repo := $img.repository -}}
{{- if $root.Values.image.registry -}}{{- $repo = printf "%s/%s" $root.Values.image.registry $img.repository -}}{{- end -}}
{{- if $img.digest -}}
{{- printf "%s@%s" $repo $img.digest -}}
{{- else -}}
{{- printf "%s:%s" $repo (default $root.Chart.AppVersion $img.tag) -}}
{{- end -}}
{{- end -}}

{{/* Secrets: name and key of the database URL, the broker URL and the admin token */}}
{{- define "mathrl.dbSecretName" -}}
{{- if .Values.postgresql.enabled -}}
{{- printf "%s-db" (include "mathrl.fullname" .) -}}
{{- else -}}
{{- required "postgresql.enabled=false needs externalDatabase.existingSecret (a Secret with the database URL)" .Values.externalDatabase.existingSecret -}}
{{- end -}}
{{- end -}}
{{- define "mathrl.dbSecretKey" -}}
{{- if .Values.postgresql.enabled -}}url{{- else -}}{{ .Values.externalDatabase.existingSecretKey }}{{- end -}}
{{- end -}}

{{- define "mathrl.brokerSecretName" -}}
{{- if .Values.redis.enabled -}}
{{- printf "%s-broker" (include "mathrl.fullname" .) -}}
{{- else -}}
{{- required "redis.enabled=false needs externalRedis.existingSecret (a Secret with the broker URL)" .Values.externalRedis.existingSecret -}}
{{- end -}}
{{- end -}}
{{- define "mathrl.brokerSecretKey" -}}
{{- if .Values.redis.enabled -}}url{{- else -}}{{ .Values.externalRedis.existingSecretKey }}{{- end -}}
{{- end -}}

{{- define "mathrl.adminSecretName" -}}
{{- if .Values.auth.existingSecret -}}
{{- .Values.auth.existingSecret -}}
{{- else -}}
{{- printf "%s-admin" (include "mathrl.fullname" .) -}}
{{- end -}}
{{- end -}}
{{- define "mathrl.adminSecretKey" -}}
{{- if .Values.auth.existingSecret -}}{{ .Values.auth.existingSecretKey }}{{- else -}}admin-token{{- end -}}
{{- end -}}

{{/* A generated secret value that survives upgrades: the existing Secret's value if the
     cluster has one, else the given value, else a random one. Call with (list $ secretName key given) */}}
{{- define "mathrl.secretValue" -}}
{{- $root := index . 0 -}}
{{- $name := index . 1 -}}
{{- $key := index . 2 -}}
{{- $given := index . 3 -}}
{{- if $given -}}
{{- $given -}}
{{- else -}}
{{- $existing := lookup "v1" "Secret" $root.Release.Namespace $name -}}
{{- if and $existing (hasKey $existing.data $key) -}}
{{- index $existing.data $key | b64dec -}}
{{- else -}}
{{- randAlphaNum 40 -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{/* Environment shared by the API, workers and migrations */}}
{{- define "mathrl.env" -}}
- name: MATHRL_DATABASE__URL
  valueFrom:
    secretKeyRef: {name: {{ include "mathrl.dbSecretName" . }}, key: {{ include "mathrl.dbSecretKey" . }}}
- name: MATHRL_BROKER__URL
  valueFrom:
    secretKeyRef: {name: {{ include "mathrl.brokerSecretName" . }}, key: {{ include "mathrl.brokerSecretKey" . }}}
- name: MATHRL_AUTH__ADMIN_TOKEN
  valueFrom:
    secretKeyRef: {name: {{ include "mathrl.adminSecretName" . }}, key: {{ include "mathrl.adminSecretKey" . }}}
- name: MATHRL_ARTIFACT_DIR
  value: {{ .Values.artifacts.mountPath | quote }}
- name: MATHRL_DATA_DIR
  value: {{ .Values.datasets.mountPath | quote }}
- name: HOME
  value: /home/mathrl
{{- if .Values.grading.enabled }}
- name: MATHRL_GRADERS__POOL_URL
  value: {{ printf "http://%s-grading.%s.svc:%v" (include "mathrl.fullname" .) .Release.Namespace .Values.grading.port | quote }}
- name: MATHRL_GRADERS__POOL_TOKEN
  valueFrom:
    secretKeyRef: {name: {{ include "mathrl.fullname" . }}-grading, key: token}
{{- end }}
{{- include "mathrl.rayEnv" . }}
{{- include "mathrl.memoryEnv" . }}
{{- include "mathrl.poolsEnv" . }}
{{- with .Values.extraEnv }}
{{ toYaml . }}
{{- end }}
{{- end -}}

{{- define "mathrl.envFrom" -}}
- configMapRef:
    name: {{ include "mathrl.fullname" . }}-config
{{- with .Values.artifacts.objectStore.existingSecret }}
- secretRef:
    name: {{ . }}
{{- end }}
{{- end -}}

{{/* The artifact volume: a literal source, an existing claim or the chart's PVC */}}
{{- define "mathrl.artifactsVolume" -}}
- name: artifacts
{{- if .Values.artifacts.volume }}
{{ toYaml .Values.artifacts.volume | indent 2 }}
{{- else }}
  persistentVolumeClaim:
    claimName: {{ default (printf "%s-artifacts" (include "mathrl.fullname" .)) .Values.artifacts.existingClaim }}
{{- end }}
{{- end -}}

{{- define "mathrl.podSecurityContext" -}}
{{ toYaml .Values.podSecurityContext }}
{{- end -}}

{{- define "mathrl.containerSecurityContext" -}}
{{ toYaml .Values.containerSecurityContext }}
{{- end -}}

{{/* Ray settings for the API (checks at submit) and the workers (submit to Ray) */}}
{{- define "mathrl.rayAddress" -}}
{{- if .Values.ray.address -}}{{ .Values.ray.address }}{{- else -}}http://{{ include "mathrl.fullname" . }}-ray-head-svc.{{ .Release.Namespace }}.svc:8265{{- end -}}
{{- end -}}

{{- define "mathrl.rayEnv" -}}
{{- if .Values.ray.enabled }}
- name: MATHRL_RAY__ADDRESS
  value: {{ include "mathrl.rayAddress" . | quote }}
- name: MATHRL_RAY__GPUS_PER_NODE
  value: {{ .Values.ray.gpusPerNode | quote }}
- name: MATHRL_RAY__POOLS
  value: {{ .Values.ray.pools | toJson | quote }}
- name: MATHRL_RAY__CPUS_PER_WORKER
  value: {{ .Values.ray.cpusPerWorker | quote }}
- name: MATHRL_RAY__SERVER_CPUS
  value: {{ .Values.ray.serverCpus | quote }}
- name: MATHRL_RAY__LOST_AFTER_SECONDS
  value: {{ .Values.ray.lostAfterSeconds | quote }}
- name: MATHRL_RAY__PYTHON
  value: /opt/venv/bin/python
{{- end }}
{{- end -}}

{{/* Runs mirrored to MLflow (workers only: the supervisor of each job does it) */}}
{{- define "mathrl.trackingEnv" -}}
{{- with .Values.tracking }}
{{- if .mlflowUri }}
- name: MATHRL_TRACKING__MLFLOW_URI
  value: {{ .mlflowUri | quote }}
{{- with .uiUrl }}
- name: MATHRL_TRACKING__UI_URL
  value: {{ . | quote }}
{{- end }}
{{- with .mathrlUrl }}
- name: MATHRL_TRACKING__MATHRL_URL
  value: {{ . | quote }}
{{- end }}
- name: MATHRL_TRACKING__EXPERIMENT_PREFIX
  value: {{ .experimentPrefix | quote }}
- name: MATHRL_TRACKING__FLUSH_SECONDS
  value: {{ .flushSeconds | quote }}
- name: MATHRL_TRACKING__REQUEST_TIMEOUT_SECONDS
  value: {{ .requestTimeoutSeconds | quote }}
{{- end }}
{{- end }}
{{- end -}}

{{/* The queues the worker pools consume, each with one job slot's GPUs (gpus over concurrency): the API
refuses a resources.pool that is none of them, and counts a job in one as holding at least a slot's GPUs */}}
{{- define "mathrl.poolsEnv" -}}
{{- $pools := dict }}
{{- range .Values.workerPools }}
{{- $gpus := int (ternary .gpus $.Values.workerDefaults.gpus (hasKey . "gpus")) }}
{{- $slots := int (ternary .concurrency $.Values.workerDefaults.concurrency (hasKey . "concurrency")) }}
{{- range .queues }}{{ $_ := set $pools . (div $gpus (max $slots 1)) }}{{ end }}
{{- end }}
- name: MATHRL_WORKER__POOLS
  value: {{ $pools | toJson | quote }}
{{- end -}}

{{/* The GPU memory of each GPU pool's queues (workerPools[].gpuMemoryGiB over workerDefaults), for
the memory plan: the API refuses at submit, the workers before launch */}}
{{- define "mathrl.memoryEnv" -}}
{{- $pools := dict }}
{{- range .Values.workerPools }}
{{- $mem := ternary .gpuMemoryGiB $.Values.workerDefaults.gpuMemoryGiB (hasKey . "gpuMemoryGiB") }}
{{- $gpus := int (ternary .gpus $.Values.workerDefaults.gpus (hasKey . "gpus")) }}
{{- if and $mem (gt $gpus 0) }}
{{- range .queues }}{{ $_ := set $pools . $mem }}{{ end }}
{{- end }}
{{- end }}
{{- if $pools }}
- name: MATHRL_MEMORY__POOLS
  value: {{ $pools | toJson | quote }}
{{- end }}
{{- end -}}

{{/* A Ray pod (head or worker group): the worker image, the database secret only (no broker or
admin secrets), the artifact volume at the workers' path. KubeRay adds the `ray start` command. */}}
{{- define "mathrl.rayPodSpec" -}}
{{- $root := .root -}}
{{- $gpus := int .gpus -}}
serviceAccountName: {{ include "mathrl.serviceAccountName" $root }}
automountServiceAccountToken: false
securityContext:
  {{- include "mathrl.podSecurityContext" $root | nindent 2 }}
{{- with $root.Values.image.pullSecrets }}
imagePullSecrets:
  {{- range . }}
  - name: {{ . }}
  {{- end }}
{{- end }}
containers:
  - name: {{ .name }}
    image: {{ include "mathrl.image" (list $root (ternary "worker" "workerCpu" (gt $gpus 0))) }}
    imagePullPolicy: {{ $root.Values.image.pullPolicy }}
    env:
      - name: MATHRL_DATABASE__URL
        valueFrom:
          secretKeyRef: {name: {{ include "mathrl.dbSecretName" $root }}, key: {{ include "mathrl.dbSecretKey" $root }}}
      - name: MATHRL_ARTIFACT_DIR
        value: {{ $root.Values.artifacts.mountPath | quote }}
      - name: MATHRL_DATA_DIR
        value: {{ $root.Values.datasets.mountPath | quote }}
      - name: HOME
        value: /home/mathrl
      - name: HF_HOME
        value: /var/cache/mathrl/huggingface
    securityContext:
      {{- include "mathrl.containerSecurityContext" $root | nindent 6 }}
    resources:
      {{- with .resources.requests }}
      requests:
        {{- toYaml . | nindent 8 }}
      {{- end }}
      limits:
        {{- with .resources.limits }}
        {{- toYaml . | nindent 8 }}
        {{- end }}
        {{- if gt $gpus 0 }}
        {{ default "nvidia.com/gpu" .gpuResourceName }}: {{ $gpus }}
        {{- end }}
    volumeMounts:
      - {name: tmp, mountPath: /tmp}
      - {name: home, mountPath: /home/mathrl}
      - {name: cache, mountPath: /var/cache/mathrl}
      - {name: shm, mountPath: /dev/shm}
      - {name: artifacts, mountPath: {{ $root.Values.artifacts.mountPath }}}
      {{- if $root.Values.datasets.existingClaim }}
      - {name: datasets, mountPath: {{ $root.Values.datasets.mountPath }}, readOnly: true}
      {{- end }}
volumes:
  - name: tmp
    emptyDir: {sizeLimit: 50Gi}
  - name: home
    emptyDir: {sizeLimit: 1Gi}
  - name: cache
    {{- if $root.Values.modelCache.existingClaim }}
    persistentVolumeClaim: {claimName: {{ $root.Values.modelCache.existingClaim }}}
    {{- else }}
    emptyDir: {sizeLimit: 200Gi}
    {{- end }}
  - name: shm
    emptyDir: {medium: Memory, sizeLimit: {{ .shmSize }}}
  {{- include "mathrl.artifactsVolume" $root | nindent 2 }}
  {{- if $root.Values.datasets.existingClaim }}
  - name: datasets
    persistentVolumeClaim: {claimName: {{ $root.Values.datasets.existingClaim }}, readOnly: true}
  {{- end }}
{{- with .nodeSelector }}
nodeSelector:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .tolerations }}
tolerations:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- end -}}
