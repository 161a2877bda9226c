{{/*
Names
*/}}
{{- define "foldgate.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "foldgate.fullname" -}}
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

{{- define "foldgate.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Suffixed names stay within 63 characters. */}}
{{- define "foldgate.opsName" -}}
{{- printf "%s-ops" (include "foldgate.fullname" . | trunc 59 | trimSuffix "-") }}
{{- end }}

{{- define "foldgate.migrateName" -}}
{{- printf "%s-migrate" (include "foldgate.fullname" . | trunc 55 | trimSuffix "-") }}
{{- end }}

{{- define "foldgate.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "foldgate.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{/*
Labels
*/}}
{{- define "foldgate.labels" -}}
helm.sh/chart: {{ include "foldgate.chart" . }}
{{ include "foldgate.selectorLabels" . }}
app.kubernetes.io/version: {{ include "foldgate.imageTag" . | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: foldgate
{{- with .Values.commonLabels }}
{{ toYaml . }}
{{- end }}
{{- end }}

{{- define "foldgate.selectorLabels" -}}
app.kubernetes.io/name: {{ include "foldgate.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{/* The gateway pods (not the migration Job's). */}}
{{- define "foldgate.gatewaySelectorLabels" -}}
{{ include "foldgate.selectorLabels" . }}
app.kubernetes.io/component: gateway
{{- end }}

{{/*
Monitoring. The ServiceMonitor names the scrape job after this label of the
ops Service (jobLabel), whose value is serviceMonitor.jobName.
*/}}
{{- define "foldgate.jobLabelKey" -}}
foldgate.io/job
{{- end }}

{{/*
PromQL matchers for this release's series as the ServiceMonitor scrapes
them: its job, and the namespace and Service the Prometheus Operator labels
them with. The shipped rules' `job="foldgate"` is replaced by these.
*/}}
{{- define "foldgate.releaseMatchers" -}}
{{- printf "job=%q, namespace=%q, service=%q" .Values.serviceMonitor.jobName .Release.Namespace (include "foldgate.opsName" .) }}
{{- end }}

{{/* Rules (a list), as JSON, with every `job="foldgate"` in them scoped to this release. */}}
{{- define "foldgate.scopeRules" -}}
{{- $from := `job="foldgate"` | toJson | trimPrefix "\"" | trimSuffix "\"" }}
{{- $to := include "foldgate.releaseMatchers" .context | toJson | trimPrefix "\"" | trimSuffix "\"" }}
{{- toJson .rules | replace $from $to }}
{{- end }}

{{/*
Image
*/}}
{{- define "foldgate.imageTag" -}}
{{- default .Chart.AppVersion .Values.image.tag }}
{{- end }}

{{- define "foldgate.image" -}}
{{- if .Values.image.digest }}
{{- printf "%s@%s" .Values.image.repository .Values.image.digest }}
{{- else }}
{{- printf "%s:%s" .Values.image.repository (include "foldgate.imageTag" .) }}
{{- end }}
{{- end }}

{{/*
Database
*/}}
{{- define "foldgate.usesPostgres" -}}
{{- if or .Values.database.url .Values.database.existingSecret }}true{{ end }}
{{- end }}

{{/* The Secret and key holding the Postgres URL, for the gateway. */}}
{{- define "foldgate.databaseSecretName" -}}
{{- default (include "foldgate.fullname" .) .Values.database.existingSecret }}
{{- end }}

{{- define "foldgate.databaseSecretKey" -}}
{{- if .Values.database.existingSecret }}{{ .Values.database.existingSecretKey }}{{ else }}database-url{{ end }}
{{- end }}

{{/* The SQLite file of the single-replica mode. */}}
{{- define "foldgate.sqliteUrl" -}}
sqlite:///var/lib/foldgate/foldgate.db
{{- end }}

{{/*
Authentication: which key source is configured.
  hs256-secret      auth.jwtSecret (in the chart's Secret)
  hs256-existing    auth.existingSecret
  hs256-generated   nothing configured: the chart generates a secret
  pem               auth.publicKey (in the chart's Secret)
  pem-existing      auth.existingPublicKeySecret
  jwks              config.auth.jwks_url
  discovery         config.auth.discovery (from config.auth.issuer)
  issuers           config.auth.issuers: several trusted issuers, each with
                    its own key source
*/}}
{{- define "foldgate.keySource" -}}
{{- $sources := list }}
{{- if .Values.auth.jwtSecret }}{{ $sources = append $sources "hs256-secret" }}{{ end }}
{{- if .Values.auth.existingSecret }}{{ $sources = append $sources "hs256-existing" }}{{ end }}
{{- if .Values.auth.publicKey }}{{ $sources = append $sources "pem" }}{{ end }}
{{- if .Values.auth.existingPublicKeySecret }}{{ $sources = append $sources "pem-existing" }}{{ end }}
{{- $auth := .Values.config.auth | default dict }}
{{- if $auth.jwks_url }}{{ $sources = append $sources "jwks" }}{{ end }}
{{- if $auth.discovery }}{{ $sources = append $sources "discovery" }}{{ end }}
{{- if $auth.issuers }}{{ $sources = append $sources "issuers" }}{{ end }}
{{- if gt (len $sources) 1 }}
{{- fail (printf "more than one JWT key source is configured (%s): set exactly one of auth.jwtSecret, auth.existingSecret, auth.publicKey, auth.existingPublicKeySecret, config.auth.jwks_url, config.auth.discovery, config.auth.issuers" (join ", " $sources)) }}
{{- end }}
{{- if $sources }}{{ first $sources }}{{ else }}hs256-generated{{ end }}
{{- end }}

{{- define "foldgate.usesHs256" -}}
{{- if has (include "foldgate.keySource" .) (list "hs256-secret" "hs256-existing" "hs256-generated") }}true{{ end }}
{{- end }}

{{- define "foldgate.usesPublicKey" -}}
{{- if has (include "foldgate.keySource" .) (list "pem" "pem-existing") }}true{{ end }}
{{- end }}

{{- define "foldgate.publicKeyPath" -}}
/etc/foldgate/keys/public-key.pem
{{- end }}

{{/*
The HS256 secret the chart stores: the configured one, else the one a
previous release generated (kept across upgrades), else a new one.
*/}}
{{- define "foldgate.jwtSecretValue" -}}
{{- if .Values.auth.jwtSecret }}
{{- .Values.auth.jwtSecret }}
{{- else }}
{{- $existing := lookup "v1" "Secret" .Release.Namespace (include "foldgate.fullname" .) | default dict }}
{{- $previous := dig "data" "jwt-secret" "" $existing }}
{{- if $previous }}{{ $previous | b64dec }}{{ else }}{{ randAlphaNum 64 }}{{ end }}
{{- end }}
{{- end }}

{{/* Whether the chart's own Secret has anything to hold. */}}
{{- define "foldgate.needsSecret" -}}
{{- $source := include "foldgate.keySource" . }}
{{- if or .Values.database.url (has $source (list "hs256-secret" "hs256-generated" "pem")) }}true{{ end }}
{{- end }}

{{/*
URLs and hosts
*/}}
{{- define "foldgate.serviceHost" -}}
{{- printf "%s.%s.svc.%s" (include "foldgate.fullname" .) .Release.Namespace .Values.clusterDomain }}
{{- end }}

{{/* The MCP URL clients use: configured, else the Ingress's, else the Service's. */}}
{{- define "foldgate.publicUrl" -}}
{{- $api := .Values.config.api | default dict }}
{{- if $api.public_url }}
{{- $api.public_url }}
{{- else if and .Values.ingress.enabled .Values.ingress.hosts }}
{{- $host := (first .Values.ingress.hosts).host }}
{{- $tls := false }}
{{- range .Values.ingress.tls }}{{ if has $host (.hosts | default list) }}{{ $tls = true }}{{ end }}{{ end }}
{{- printf "%s://%s/mcp" (ternary "https" "http" $tls) $host }}
{{- else }}
{{- $port := int .Values.service.port }}
{{- if eq $port 80 }}
{{- printf "http://%s/mcp" (include "foldgate.serviceHost" .) }}
{{- else }}
{{- printf "http://%s:%d/mcp" (include "foldgate.serviceHost" .) $port }}
{{- end }}
{{- end }}
{{- end }}

{{/* Host names accepted on /mcp (a list, as JSON). */}}
{{- define "foldgate.allowedHosts" -}}
{{- $api := .Values.config.api | default dict }}
{{- if $api.allowed_hosts }}
{{- toJson $api.allowed_hosts }}
{{- else }}
{{- $fullname := include "foldgate.fullname" . }}
{{- $hosts := list "localhost" "127.0.0.1" "::1" $fullname (printf "%s.%s" $fullname .Release.Namespace) (printf "%s.%s.svc" $fullname .Release.Namespace) (include "foldgate.serviceHost" .) }}
{{- if .Values.ingress.enabled }}
{{- range .Values.ingress.hosts }}{{ $hosts = append $hosts .host }}{{ end }}
{{- end }}
{{- $publicHost := regexReplaceAll "^[a-z]+://([^/:]+).*$" (include "foldgate.publicUrl" .) "${1}" }}
{{- $hosts = append $hosts $publicHost }}
{{- toJson ($hosts | uniq) }}
{{- end }}
{{- end }}

{{/*
The configuration file: .Values.config with what the chart decides merged in.
*/}}
{{- define "foldgate.configTable" -}}
{{- $config := deepCopy .Values.config }}
{{- $_ := set $config "listen" (printf "0.0.0.0:%d" (int .Values.containerPorts.mcp)) }}
{{- $_ = set $config "ops_listen" (printf "0.0.0.0:%d" (int .Values.containerPorts.ops)) }}
{{- if not (include "foldgate.usesPostgres" .) }}
{{- $_ = set $config "database_url" (include "foldgate.sqliteUrl" .) }}
{{- end }}
{{- $api := $config.api | default dict }}
{{- $_ = set $api "public_url" (include "foldgate.publicUrl" .) }}
{{- $_ = set $api "allowed_hosts" (include "foldgate.allowedHosts" . | fromJsonArray) }}
{{- $rateLimit := $api.rate_limit | default dict }}
{{- if not (hasKey $rateLimit "replicas") }}
{{- $replicas := ternary .Values.autoscaling.minReplicas .Values.replicaCount .Values.autoscaling.enabled }}
{{- $_ = set $rateLimit "replicas" (int $replicas) }}
{{- end }}
{{- $_ = set $api "rate_limit" $rateLimit }}
{{- $_ = set $config "api" $api }}
{{- if include "foldgate.usesPublicKey" . }}
{{- $auth := $config.auth | default dict }}
{{- $_ = set $auth "public_key_file" (include "foldgate.publicKeyPath" .) }}
{{- $_ = set $config "auth" $auth }}
{{- end }}
{{- with .Values.identity.existingSigningKeySecret }}
{{- $identity := $config.identity | default dict }}
{{- $_ = set $identity "signing_key_file" "/etc/foldgate/identity/signing-key.pem" }}
{{- if $.Values.identity.previousKeySecretKey }}
{{- $_ = set $identity "previous_key_file" "/etc/foldgate/identity/previous-key.pem" }}
{{- end }}
{{- $_ = set $config "identity" $identity }}
{{- end }}
{{- if .Values.scrubRules }}
{{- $scrub := $config.scrub | default dict }}
{{- $_ = set $scrub "rules_file" "/etc/foldgate/scrub-rules.toml" }}
{{- $_ = set $config "scrub" $scrub }}
{{- end }}
{{- if $config.models }}
{{- $models := list }}
{{- range $config.models }}
{{- $model := omit . "apiKeySecret" }}
{{- if .apiKeySecret }}
{{- $_ = set $model "api_key" (printf "${%s}" (include "foldgate.modelKeyVariable" .name)) }}
{{- end }}
{{- $models = append $models $model }}
{{- end }}
{{- $_ = set $config "models" $models }}
{{- end }}
{{- toJson $config }}
{{- end }}

{{/*
Models: the environment variable that carries a model's key from its
apiKeySecret (the configuration file refers to it as ${…}). Not FOLDGATE_…:
the gateway reads those as settings.
*/}}
{{- define "foldgate.modelKeyVariable" -}}
{{- printf "MODEL_%s_API_KEY" (regexReplaceAll "[^A-Za-z0-9]" . "_" | upper) }}
{{- end }}

{{/*
TOML rendering of a table: its plain keys first, then its sub-tables under
[dotted.name] headers and its arrays of tables under [[dotted.name]]. Null
values are left out (the gateway's default applies). Numbers print as
integers: every numeric setting is one.
*/}}
{{- define "foldgate.toml" -}}
{{- $table := .table }}
{{- $prefix := .prefix }}
{{- range $key, $value := $table }}
{{- if not (or (kindIs "invalid" $value) (kindIs "map" $value) (include "foldgate.isTableArray" $value)) }}
{{ include "foldgate.tomlKey" $key }} = {{ include "foldgate.tomlValue" $value }}
{{- end }}
{{- end }}
{{- range $key, $value := $table }}
{{- $name := include "foldgate.tomlKey" $key }}
{{- if $prefix }}{{ $name = printf "%s.%s" $prefix $name }}{{ end }}
{{- if and (kindIs "map" $value) (include "foldgate.tomlHasValues" $value) }}

[{{ $name }}]
{{- include "foldgate.toml" (dict "table" $value "prefix" $name) }}
{{- else if include "foldgate.isTableArray" $value }}
{{- range $value }}

[[{{ $name }}]]
{{- include "foldgate.toml" (dict "table" . "prefix" $name) }}
{{- end }}
{{- end }}
{{- end }}
{{- end }}

{{/* "true" when a table holds at least one value that is not null. */}}
{{- define "foldgate.tomlHasValues" -}}
{{- range $key, $value := . }}
{{- if kindIs "map" $value }}{{ include "foldgate.tomlHasValues" $value }}
{{- else if not (kindIs "invalid" $value) }}true{{ end }}
{{- end }}
{{- end }}

{{- define "foldgate.isTableArray" -}}
{{- if and (kindIs "slice" .) . }}{{ if kindIs "map" (first .) }}true{{ end }}{{ end }}
{{- end }}

{{/* A bare key, or a quoted one when it has other characters. */}}
{{- define "foldgate.tomlKey" -}}
{{- if regexMatch "^[A-Za-z0-9_-]+$" . }}{{ . }}{{ else }}{{ toJson . }}{{ end }}
{{- end }}

{{- define "foldgate.tomlValue" -}}
{{- if kindIs "bool" . }}
{{- ternary "true" "false" . }}
{{- else if or (kindIs "float64" .) (kindIs "int64" .) (kindIs "int" .) }}
{{- if ne (float64 (int64 .)) (float64 .) }}
{{- fail (printf "configuration value %v must be an integer" .) }}
{{- end }}
{{- int64 . }}
{{- else if kindIs "slice" . }}
{{- $items := list }}
{{- range . }}{{ $items = append $items (include "foldgate.tomlValue" .) }}{{ end }}
{{- printf "[%s]" (join ", " $items) }}
{{- else }}
{{- toJson (toString .) }}
{{- end }}
{{- end }}

{{- define "foldgate.configToml" -}}
# foldgate configuration, rendered by the Helm chart from .Values.config.
# Settings: docs/configuration.md. The environment (DATABASE_URL,
# FOLDGATE_JWT_SECRET) and the command-line flags take precedence.
{{- include "foldgate.toml" (dict "table" (include "foldgate.configTable" . | fromJson) "prefix" "") }}
{{- end }}

{{/*
Cross-field rules the schema cannot state clearly.
*/}}
{{- define "foldgate.validate" -}}
{{- $postgres := include "foldgate.usesPostgres" . }}
{{- if and (not $postgres) (gt (int .Values.replicaCount) 1) }}
{{- fail (printf "replicaCount is %d but no Postgres database is configured: the embedded SQLite database serves one replica only. Set database.url or database.existingSecret." (int .Values.replicaCount)) }}
{{- end }}
{{- if and (not $postgres) .Values.autoscaling.enabled }}
{{- fail "autoscaling.enabled needs a Postgres database: the embedded SQLite database serves one replica only. Set database.url or database.existingSecret." }}
{{- end }}
{{- if and .Values.database.url .Values.database.existingSecret }}
{{- fail "set database.url or database.existingSecret, not both" }}
{{- end }}
{{- if and .Values.autoscaling.enabled (gt (int .Values.autoscaling.minReplicas) (int .Values.autoscaling.maxReplicas)) }}
{{- fail "autoscaling.minReplicas must not exceed autoscaling.maxReplicas" }}
{{- end }}
{{- $pdb := .Values.podDisruptionBudget }}
{{- if and $pdb.enabled (eq (kindIs "invalid" $pdb.minAvailable) (kindIs "invalid" $pdb.maxUnavailable)) }}
{{- fail "podDisruptionBudget: set exactly one of minAvailable and maxUnavailable" }}
{{- end }}
{{- if and .Values.sqlite.persistence.enabled $postgres }}
{{- fail "sqlite.persistence.enabled has no effect with Postgres: disable it" }}
{{- end }}
{{- if eq (int .Values.containerPorts.mcp) (int .Values.containerPorts.ops) }}
{{- fail "containerPorts.mcp and containerPorts.ops must differ" }}
{{- end }}
{{- $keyVariables := dict }}
{{- range $model := (.Values.config.models | default list) }}
{{- if $model.apiKeySecret }}
{{- $variable := include "foldgate.modelKeyVariable" $model.name }}
{{- if hasKey $keyVariables $variable }}
{{- fail (printf "config.models %q and %q would both take their key from the variable %s: rename one" (get $keyVariables $variable) $model.name $variable) }}
{{- end }}
{{- $_ := set $keyVariables $variable $model.name }}
{{- end }}
{{- end }}
{{- $source := include "foldgate.keySource" . }}
{{- $auth := .Values.config.auth | default dict }}
{{- if and $auth.discovery (not $auth.issuer) }}
{{- fail "config.auth.discovery needs config.auth.issuer: the discovery document is found from the issuer" }}
{{- end }}
{{- if $auth.issuers }}
{{- $single := list }}
{{- range $name := list "issuer" "audience" "tenant_claim" "jwks_allow_http" }}
{{- if and (hasKey $auth $name) (not (kindIs "invalid" (index $auth $name))) }}{{ $single = append $single (printf "config.auth.%s" $name) }}{{ end }}
{{- end }}
{{- if $single }}
{{- fail (printf "config.auth.issuers replaces the single-issuer settings, but %s is set too: move it into each entry of config.auth.issuers" (join ", " $single)) }}
{{- end }}
{{- end }}
{{- $console := .Values.config.console | default dict }}
{{- if $console.oidc_client_id }}
{{- if not (or $console.oidc_issuer $auth.issuer $auth.issuers) }}
{{- fail "config.console.oidc_client_id is set but there is no issuer to sign in with: set config.console.oidc_issuer, config.auth.issuer or config.auth.issuers" }}
{{- end }}
{{- if eq $source "hs256-generated" }}
{{- fail "config.console.oidc_client_id is set but the gateway has no key to verify the provider's tokens with: set config.auth.discovery with config.auth.issuer, config.auth.jwks_url (or auth.publicKey), or config.auth.issuers" }}
{{- end }}
{{- end }}
{{- end }}
