{{/* The chart's name. */}}
{{- define "salus.name" -}}
{{- .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* The objects' base name: the release's name, with the chart's unless it holds it. */}}
{{- define "salus.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{/* Labels the DaemonSet selects its pods by, and the Service its endpoints by. */}}
{{- define "salus.selectorLabels" -}}
app.kubernetes.io/name: {{ include "salus.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{/* Labels of every object. No Helm-only labels: deploy/kubernetes is this chart rendered,
and is applied with kubectl as well. */}}
{{- define "salus.labels" -}}
{{ include "salus.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
{{- end -}}

{{/* The daemon's image: image.repository, else the image docker/ builds for the device
(docker/cuda.Dockerfile: salus-server-cuda; docker/Dockerfile: salus-server). */}}
{{- define "salus.serverImage" -}}
{{- $built := ternary "salus-server-cuda" "salus-server" (eq .Values.device "cuda") -}}
{{ .Values.image.repository | default $built }}:{{ .Values.image.tag | default .Chart.AppVersion }}
{{- end -}}

{{- define "salus.pluginImage" -}}
{{ .Values.devicePlugin.image.repository }}:{{ .Values.devicePlugin.image.tag | default .Chart.AppVersion }}
{{- end -}}

{{/* salus-server's --device: cpu, cuda:0 (the one GPU the container sees), or cuda:all. */}}
{{- define "salus.device" -}}
{{- if eq .Values.device "cpu" -}}
cpu
{{- else if eq .Values.device "cuda" -}}
{{- if gt (int .Values.gpusPerNode) 1 -}}
cuda:all
{{- else -}}
cuda:0
{{- end -}}
{{- else -}}
{{- fail (printf "device must be cuda or cpu, not %q" .Values.device) -}}
{{- end -}}
{{- end -}}
