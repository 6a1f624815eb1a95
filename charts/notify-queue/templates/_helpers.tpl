{{/*
Names, labels and the pieces every pod shares: image, security settings, environment.
*/}}

{{- define "notify-queue.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "notify-queue.fullname" -}}
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

{{/* A component's object name: <fullname>-<component>, within the 63 characters of a label. */}}
{{- define "notify-queue.componentName" -}}
{{- printf "%s-%s" (include "notify-queue.fullname" .root | trunc (int (sub 62 (len .component))) | trimSuffix "-") .component -}}
{{- end -}}

{{- define "notify-queue.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
app.kubernetes.io/name: {{ include "notify-queue.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: notify-queue
{{- end -}}

{{/* Selector labels of one component; `.component` is api, operator, worker or migrate. */}}
{{- define "notify-queue.selectorLabels" -}}
app.kubernetes.io/name: {{ include "notify-queue.name" .root }}
app.kubernetes.io/instance: {{ .root.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end -}}

{{- define "notify-queue.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) -}}
{{- end -}}

{{/* The Secret with database-url, api-token, admin-token, webhook-secret and smtp-password:
existingSecret, or the chart-made one. The API tokens may come from elsewhere: secretNameFor. */}}
{{- define "notify-queue.secretName" -}}
{{- default (include "notify-queue.chartSecretName" .) .Values.existingSecret -}}
{{- end -}}

{{- define "notify-queue.chartSecretName" -}}
{{- include "notify-queue.componentName" (dict "root" . "component" "secrets") -}}
{{- end -}}

{{/* auth.existingSecret, safely: `helm upgrade --reuse-values` from 0.1.0 renders with the old
release's values, which have no `auth` at all. */}}
{{- define "notify-queue.authSecret" -}}
{{- dig "existingSecret" "" (default dict .Values.auth) -}}
{{- end -}}

{{/* The Secret the api-token hook creates when no token is given or named (api-token-job.yaml).
Not part of the release: Helm never renders, changes or deletes it. */}}
{{- define "notify-queue.generatedTokenSecretName" -}}
{{- include "notify-queue.componentName" (dict "root" . "component" "api-token") -}}
{{- end -}}

{{/* Whether the API token is generated at run time by the hook: the API is closed and no token
is given (secrets.apiToken) or named (auth.existingSecret, or existingSecret's api-token key). */}}
{{- define "notify-queue.generatesApiToken" -}}
{{- if and (include "notify-queue.apiClosed" .) (not .Values.secrets.apiToken) (not (include "notify-queue.authSecret" .)) (not .Values.existingSecret) -}}true{{- end -}}
{{- end -}}

{{/* The Secret a secret setting (`.key`) is read from: the API tokens from auth.existingSecret
when it is set; a generated API token from the hook's Secret; anything else from secretName. */}}
{{- define "notify-queue.secretNameFor" -}}
{{- $auth := include "notify-queue.authSecret" .root -}}
{{- if and $auth (has .key (list "api-token" "admin-token")) -}}
{{- $auth -}}
{{- else if and (eq .key "api-token") (include "notify-queue.generatesApiToken" .root) -}}
{{- include "notify-queue.generatedTokenSecretName" .root -}}
{{- else -}}
{{- include "notify-queue.secretName" .root -}}
{{- end -}}
{{- end -}}

{{/* The operator's ServiceAccount (the only one with API permissions). */}}
{{- define "notify-queue.operatorServiceAccount" -}}
{{- include "notify-queue.componentName" (dict "root" . "component" "operator") -}}
{{- end -}}

{{/* The ServiceAccount of the API and the workers: no permissions, no token mounted. */}}
{{- define "notify-queue.workloadServiceAccount" -}}
{{- include "notify-queue.componentName" (dict "root" . "component" "workload") -}}
{{- end -}}

{{/*
Pod Security Standard "restricted", and more: a fixed non-root user, a read-only root
filesystem (with an emptyDir at /tmp), no privilege escalation, every capability dropped and
the runtime's default seccomp profile.
*/}}
{{- define "notify-queue.podSecurityContext" -}}
runAsNonRoot: true
runAsUser: 10001
runAsGroup: 10001
fsGroup: 10001
seccompProfile:
  type: RuntimeDefault
{{- end -}}

{{- define "notify-queue.containerSecurityContext" -}}
runAsNonRoot: true
runAsUser: 10001
runAsGroup: 10001
allowPrivilegeEscalation: false
readOnlyRootFilesystem: true
privileged: false
capabilities:
  drop: [ALL]
seccompProfile:
  type: RuntimeDefault
{{- end -}}

{{/* Labels, annotations and placement every pod shares; `.root`, `.component`, `.extraLabels`,
`.extraAnnotations` (the chart's own, e.g. a checksum; podAnnotations win). */}}
{{- define "notify-queue.podMetadata" -}}
labels:
  {{- include "notify-queue.selectorLabels" . | nindent 2 }}
  app.kubernetes.io/part-of: notify-queue
  {{- with .extraLabels }}
  {{- toYaml . | nindent 2 }}
  {{- end }}
  {{- with .root.Values.podLabels }}
  {{- toYaml . | nindent 2 }}
  {{- end }}
{{- with merge (dict) (default dict .root.Values.podAnnotations) (default dict .extraAnnotations) }}
annotations:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- end -}}

{{- define "notify-queue.placement" -}}
{{- with .Values.imagePullSecrets }}
imagePullSecrets:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .Values.nodeSelector }}
nodeSelector:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .Values.tolerations }}
tolerations:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .Values.affinity }}
affinity:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- end -}}

{{/* One setting as an environment variable value: lists comma-joined, whole numbers without
an exponent (Helm reads every number as a float: 1000000 would print as 1e+06). */}}
{{- define "notify-queue.envValue" -}}
{{- if kindIs "slice" . -}}
{{- join "," . -}}
{{- else if and (kindIs "float64" .) (eq (float64 (int64 .)) .) -}}
{{- int64 . -}}
{{- else -}}
{{- toString . -}}
{{- end -}}
{{- end -}}

{{/*
The environment of one container: NOTIFY_QUEUE_<OPTION> for every entry of the `configs` (later
ones win) and then of `fixed` (the chart's own wiring, which wins over config), in name order; then
the secret settings named in `secrets` from the Secret (the database URL from its key
`databaseUrlKey`), optional unless named in `required` too; then `extraEnv`.
Arguments: .root, .configs (list of maps), .fixed (map), .secrets (list of keys), .required
(list of keys), .databaseUrlKey, .extraEnv.
*/}}
{{- define "notify-queue.env" -}}
{{- $root := .root -}}
{{- $env := dict -}}
{{- range .configs }}
{{- range $option, $value := . }}
{{- $_ := set $env (printf "NOTIFY_QUEUE_%s" ($option | upper | replace "-" "_")) (include "notify-queue.envValue" $value) -}}
{{- end }}
{{- end }}
{{- range $option, $value := .fixed }}
{{- $_ := set $env (printf "NOTIFY_QUEUE_%s" ($option | upper | replace "-" "_")) (include "notify-queue.envValue" $value) -}}
{{- end }}
{{- range $name := keys $env | sortAlpha }}
- name: {{ $name }}
  value: {{ get $env $name | quote }}
{{- end }}
{{- $required := append (default list .required) "database-url" -}}
{{- range $key := .secrets }}
{{- /* A key of a Secret the user manages (or the hook's) may be there: referenced, optional
unless required. The chart-made Secret's keys are known: referenced only when given. */}}
{{- $from := include "notify-queue.secretNameFor" (dict "root" $root "key" $key) }}
{{- if or (ne $from (include "notify-queue.chartSecretName" $root)) (has $key $required) (include "notify-queue.secretValue" (dict "root" $root "key" $key)) }}
- name: NOTIFY_QUEUE_{{ $key | upper | replace "-" "_" }}
  valueFrom:
    secretKeyRef:
      name: {{ $from }}
      key: {{ ternary (default "database-url" $.databaseUrlKey) $key (eq $key "database-url") }}
      {{- if not (has $key $required) }}
      optional: true
      {{- end }}
{{- end }}
{{- end }}
{{- include "notify-queue.databaseEnv" (dict "root" $root "listens" .listens) }}
{{- with .extraEnv }}
{{ toYaml . }}
{{- end }}
{{- end -}}

{{/*
The database variables beyond the URL: PGPASSWORD from database.passwordFrom (libpq reads it for
a URL without a password), and for a role that LISTENs (`.listens`: workers, the operator)
NOTIFY_QUEUE_LISTEN_DATABASE_URL, the direct URL, from the first source that applies:
database.listenUrlFrom, existingSecret's listen-database-url key (optional), database.listenUrl
(the chart-made Secret). Arguments: .root, .listens.
*/}}
{{- define "notify-queue.databaseEnv" -}}
{{- $root := .root -}}
{{- $db := default dict $root.Values.database -}}
{{- $password := default dict $db.passwordFrom -}}
{{- if $password.secretName }}
- name: PGPASSWORD
  valueFrom:
    secretKeyRef:
      name: {{ $password.secretName }}
      key: {{ default "password" $password.key }}
{{- end }}
{{- if .listens }}
{{- with include "notify-queue.listenUrlRef" $root | fromYaml }}
- name: NOTIFY_QUEUE_LISTEN_DATABASE_URL
  valueFrom:
    secretKeyRef:
      {{- toYaml . | nindent 6 }}
{{- end }}
{{- end }}
{{- end -}}

{{/* Where the direct (listen) URL is read from, as a secretKeyRef; empty when none is set. */}}
{{- define "notify-queue.listenUrlRef" -}}
{{- $db := default dict .Values.database -}}
{{- $from := default dict $db.listenUrlFrom -}}
{{- if $from.secretName -}}
name: {{ $from.secretName }}
key: {{ default "uri" $from.key }}
{{- else if .Values.existingSecret -}}
name: {{ .Values.existingSecret }}
key: listen-database-url
optional: true
{{- else if $db.listenUrl -}}
name: {{ include "notify-queue.chartSecretName" . }}
key: listen-database-url
{{- end -}}
{{- end -}}

{{/* The chart-made Secret's value for `.key` (empty when unset): only what the values give.
Nothing random and no `lookup`: the same values render the same bytes, with or without a
cluster (helm template, Argo CD). A token nobody gives is made at run time (api-token-job.yaml). */}}
{{- define "notify-queue.secretValue" -}}
{{- $v := .root.Values -}}
{{- $values := dict "database-url" $v.database.url "listen-database-url" (dig "listenUrl" "" (default dict $v.database)) "api-token" $v.secrets.apiToken "admin-token" $v.secrets.adminToken "webhook-secret" $v.secrets.webhookSecret "smtp-password" $v.secrets.smtpPassword -}}
{{- get $values .key -}}
{{- end -}}

{{/* Whether the API requires a bearer token (api.auth: token, the default). */}}
{{- define "notify-queue.apiClosed" -}}
{{- if and .Values.api.enabled (eq (default "token" .Values.api.auth) "token") -}}true{{- end -}}
{{- end -}}

{{/* The keys of the chart-made Secret, in a fixed order. */}}
{{- define "notify-queue.secretKeys" -}}
database-url listen-database-url api-token admin-token webhook-secret smtp-password
{{- end -}}

{{/* Fail with a clear message when the values cannot work, beyond what the schema can say. */}}
{{- define "notify-queue.validate" -}}
{{- $served := dict -}}
{{- $relayed := false -}}
{{- range $name, $pool := .Values.workers.pools }}
{{- if dig "enabled" true $pool }}
{{- $dispatch := dig "webhook-dispatch" (dig "webhook-dispatch" (dig "webhook-dispatch" "on" $.Values.config) $.Values.workers.config) (default dict $pool.config) }}
{{- if ne (toString $dispatch) "off" }}{{ $relayed = true }}{{ end }}
{{- if gt (int $pool.minReplicas) (int $pool.maxReplicas) }}
{{- fail (printf "workers.pools.%s: minReplicas (%d) must not exceed maxReplicas (%d)" $name (int $pool.minReplicas) (int $pool.maxReplicas)) }}
{{- end }}
{{- range $pool.priorities }}{{ $_ := set $served . true }}{{ end }}
{{- end }}
{{- end }}
{{- range list "HIGH" "NORMAL" "LOW" }}
{{- if not (hasKey $served .) }}
{{- fail (printf "workers.pools: no enabled pool serves the %s lane, so %s notifications would never be sent; add %s to a pool's priorities" . . .) }}
{{- end }}
{{- end }}
{{- if not $relayed }}
{{- fail "workers.pools: every enabled pool has webhook-dispatch off, so no webhook event would ever be POSTed; let one pool relay" }}
{{- end }}
{{- if not .Values.existingSecret }}
{{- range $component := list "api" "workers" "operator" "migration" }}
{{- $key := dig "databaseUrlKey" "database-url" (get $.Values $component) }}
{{- if ne $key "database-url" }}
{{- fail (printf "%s.databaseUrlKey (%s) needs existingSecret: the chart-made Secret has only database-url" $component $key) }}
{{- end }}
{{- end }}
{{- end }}
{{- if and (eq (default "token" .Values.api.auth) "open") .Values.secrets.apiToken }}
{{- fail "api.auth is open but secrets.apiToken is set: choose one (api.auth: token uses the token)" }}
{{- end }}
{{- with include "notify-queue.authSecret" . }}
{{- if or $.Values.secrets.apiToken $.Values.secrets.adminToken }}
{{- fail (printf "auth.existingSecret (%s) holds the API tokens, but secrets.apiToken or secrets.adminToken is set too: choose one" .) }}
{{- end }}
{{- end }}
{{- include "notify-queue.validateProviders" . }}
{{- if and (not .Values.existingSecret) (not .Values.database.url) }}
{{- fail "database.url is empty: set it (postgresql://user:password@host:5432/db) or name a Secret with a database-url key in existingSecret" }}
{{- end }}
{{- end -}}

{{/* Each enabled pool can deliver every channel it serves, with what its provider needs; with a
providers file, some provider of the file lists the channel (else its workers refuse to start). */}}
{{- define "notify-queue.validateProviders" -}}
{{- $root := . -}}
{{- $listed := list }}
{{- range (dig "providers" list (default dict .Values.providersFile.content)) }}
{{- $listed = concat $listed (default list .channels) }}
{{- end }}
{{- range $name, $pool := .Values.workers.pools }}
{{- if dig "enabled" true $pool }}
{{- $config := merge (dict) (default dict $pool.config) (default dict $root.Values.workers.config) (default dict $root.Values.config) }}
{{- /* Without a list the pool serves every channel (the worker's default), voice included. */}}
{{- range $channel := default (list "email" "sms" "push" "voice") $pool.channels }}
{{- $own := has $channel (list "email" "sms" "push") }}
{{- if and $root.Values.providersFile.content (not (has $channel $listed)) }}
{{- fail (printf "workers.pools.%s serves %s, which no provider of providersFile.content lists: add it to a provider's channels or list the pool's channels without it" $name $channel) }}
{{- end }}
{{- $kind := default $root.Values.provider.type (get $root.Values.provider $channel) }}
{{- if and (eq $kind "smtp") (ne $channel "email") }}
{{- $fix := ternary (printf "provider.%s" $channel) "provider.type" $own }}
{{- $pick := ternary (printf "leave %s out of the pool's channels" $channel) "list the pool's channels without it" (not (empty $pool.channels)) }}
{{- fail (printf "workers.pools.%s serves %s, which the smtp provider cannot deliver: set %s (http) or %s" $name $channel $fix $pick) }}
{{- end }}
{{- if and (eq $kind "http") (not (get $config "provider-url")) }}
{{- fail (printf "workers.pools.%s delivers %s with the http provider, which needs config.provider-url" $name $channel) }}
{{- end }}
{{- if and (eq $kind "smtp") (not (get $config "smtp-host")) }}
{{- fail (printf "workers.pools.%s delivers %s with the smtp provider, which needs config.smtp-host" $name $channel) }}
{{- end }}
{{- end }}
{{- end }}
{{- end }}
{{- end -}}

{{/* The worker's provider options from `provider` (only the overrides that are set). */}}
{{- define "notify-queue.providerEnv" -}}
{{- $env := dict "provider" .Values.provider.type -}}
{{- range $channel := list "email" "sms" "push" }}
{{- with get $.Values.provider $channel }}{{ $_ := set $env (printf "%s-provider" $channel) . }}{{ end }}
{{- end }}
{{- with .Values.outboundAllow }}{{ $_ := set $env "outbound-allow" . }}{{ end }}
{{- toYaml $env -}}
{{- end -}}

{{/*
The OTEL_* variables of tracing.env (docs/operations.md, "Traces"), in name order; nothing when
tracing is off. Argument: the root context.
*/}}
{{- define "notify-queue.tracingEnv" -}}
{{- $env := .Values.tracing.env -}}
{{- range $name := keys $env | sortAlpha }}
- name: {{ $name }}
  value: {{ get $env $name | toString | quote }}
{{- end }}
{{- end -}}

{{/*
What the API and the workers both read of the providers (docs/receipts.md): the variables of
providersFile.env and the unsubscribe secrets (unsubscribe.secretName; the previous one is
optional, present only while a rotation lasts). Argument: the root context.
*/}}
{{- define "notify-queue.receiptsEnv" -}}
{{- range .Values.providersFile.env }}
- name: {{ .name }}
  valueFrom:
    secretKeyRef: {name: {{ .secretName | quote }}, key: {{ .key | quote }}}
{{- end }}
{{- with .Values.unsubscribe }}
{{- if .secretName }}
- name: NOTIFY_QUEUE_UNSUBSCRIBE_SECRET
  valueFrom:
    secretKeyRef: {name: {{ .secretName | quote }}, key: {{ .key | quote }}}
- name: NOTIFY_QUEUE_UNSUBSCRIBE_PREVIOUS_SECRET
  valueFrom:
    secretKeyRef: {name: {{ .secretName | quote }}, key: {{ .previousKey | quote }}, optional: true}
{{- end }}
{{- end }}
{{- end -}}

{{/*
The providers file's ConfigMap (when providersFile.content is set) and providersFile.secretMounts:
`.mounts` true for the container's volumeMounts, else the pod's volumes. Argument: .root, .mounts.
*/}}
{{- define "notify-queue.providersVolumes" -}}
{{- $root := .root -}}
{{- if $root.Values.providersFile.content }}
{{- if .mounts }}
- {name: providers, mountPath: /etc/notify-queue/providers, readOnly: true}
{{- else }}
- name: providers
  configMap:
    name: {{ include "notify-queue.componentName" (dict "root" $root "component" "providers") }}
{{- end }}
{{- end }}
{{- range $i, $m := $root.Values.providersFile.secretMounts }}
{{- if $.mounts }}
- {name: provider-secret-{{ $i }}, mountPath: {{ $m.mountPath | quote }}, readOnly: true}
{{- else }}
- name: provider-secret-{{ $i }}
  secret: {secretName: {{ $m.secretName | quote }}}
{{- end }}
{{- end }}
{{- end -}}
