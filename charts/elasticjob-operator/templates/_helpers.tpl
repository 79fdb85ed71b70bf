{{- define "elasticjob-operator.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "elasticjob-operator.fullname" -}}
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

{{- define "elasticjob-operator.selectorLabels" -}}
app.kubernetes.io/name: {{ include "elasticjob-operator.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- define "elasticjob-operator.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{ include "elasticjob-operator.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end }}

{{- define "elasticjob-operator.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "elasticjob-operator.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- required "serviceAccount.name is required when serviceAccount.create is false" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{- define "elasticjob-operator.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) }}
{{- with .Values.image.digest }}@{{ . }}{{ end }}
{{- end }}

{{/*
The API version of MutatingAdmissionPolicy this cluster serves, or nothing. `helm install` discovers the
cluster's kinds ("v1/Pod" among them); `helm template` without a cluster knows only its own Kubernetes version,
from which v1 is served (1.36). kueue.suspendOnCreateAPI overrides both.
*/}}
{{- define "elasticjob-operator.mutatingPolicyAPI" -}}
{{- $caps := .Capabilities.APIVersions -}}
{{- $set := .Values.kueue.suspendOnCreateAPI -}}
{{- if $set -}}
{{- if ne $set "none" }}{{ $set }}{{ end -}}
{{- else if $caps.Has "admissionregistration.k8s.io/v1/MutatingAdmissionPolicy" -}}
v1
{{- else if $caps.Has "admissionregistration.k8s.io/v1beta1/MutatingAdmissionPolicy" -}}
v1beta1
{{- else if and (not ($caps.Has "v1/Pod")) (semverCompare ">=1.36.0-0" .Capabilities.KubeVersion.Version) -}}
v1
{{- end -}}
{{- end }}
