{{/* Names and checks shared by the templates. */}}

{{/* Labels every object of the release carries (besides its own), as Helm charts conventionally do. */}}
{{- define "cloudnet.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{/* upstream's namespace, Lease and Secret live here in openshift mode. */}}
{{- define "cloudnet.upstreamNamespace" -}}
openshift-cloud-network-config-controller
{{- end }}

{{- define "cloudnet.reconcilerNamespace" -}}
{{- if .Values.reconciler.namespace -}}
{{ .Values.reconciler.namespace }}
{{- else if .Values.openshift.enabled -}}
{{ include "cloudnet.upstreamNamespace" . }}
{{- else -}}
cloudnet-system
{{- end }}
{{- end }}

{{- define "cloudnet.webhookNamespace" -}}
{{ .Values.webhook.namespace }}
{{- end }}

{{/* repository:tag of a component's image values (.image), the tag defaulting to appVersion. */}}
{{- define "cloudnet.image" -}}
{{ printf "%s:%s" .image.repository (.image.tag | default .root.Chart.AppVersion) }}
{{- end }}

{{- define "cloudnet.checkCloud" -}}
{{- if not (has .Values.cloud (list "AWS" "Azure" "GCP" "OpenStack")) -}}
{{- fail (printf "cloud must be AWS, Azure, GCP or OpenStack, not %q" .Values.cloud) -}}
{{- end -}}
{{- if and (eq .Values.cloud "AWS") (not .Values.platform.region) -}}
{{- fail "platform.region is required on AWS" -}}
{{- end -}}
{{- if not (has .Values.logFormat (list "json" "text")) -}}
{{- fail (printf "logFormat must be json or text, not %q" .Values.logFormat) -}}
{{- end -}}
{{- end }}

{{/* The CA injector's annotation on the webhook configurations, with cert-manager. */}}
{{- define "cloudnet.injectCA" -}}
{{- if .Values.webhook.certManager.enabled -}}
annotations:
  cert-manager.io/inject-ca-from: {{ include "cloudnet.webhookNamespace" . }}/cloudnet-webhook-ca
{{- end -}}
{{- end }}
