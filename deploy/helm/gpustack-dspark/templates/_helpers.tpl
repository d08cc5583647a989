{{/*
Value checks, one line each, naming the field, the value and what is allowed (the same
label syntax as gpustack_dspark/labels.py).
*/}}
{{- define "dspark.labelKeyRe" -}}
^([a-z0-9]([a-z0-9.-]{0,251}[a-z0-9])?/)?[A-Za-z0-9]([A-Za-z0-9_.-]{0,61}[A-Za-z0-9])?$
{{- end -}}
{{- define "dspark.labelValueRe" -}}
^([A-Za-z0-9]([A-Za-z0-9_.-]{0,61}[A-Za-z0-9])?)?$
{{- end -}}
{{- define "dspark.dnsNameRe" -}}
^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$
{{- end -}}

{{- define "dspark.checkLabels" -}}
{{- $field := index . 0 -}}
{{- $labels := index . 1 -}}
{{- if not (kindIs "map" $labels) -}}
{{- fail (printf "%s: %v is not a map of labels (key: value)" $field $labels) -}}
{{- end -}}
{{- range $key, $value := $labels -}}
{{- if not (regexMatch (include "dspark.labelKeyRe" $) $key) -}}
{{- fail (printf "%s: %q is not a valid label key (letters, digits, '-', '_', '.', at most 63 characters, optional DNS prefix/)" $field $key) -}}
{{- end -}}
{{- if not (kindIs "string" $value) -}}
{{- fail (printf "%s.%s: %v is not a string (quote label values, e.g. \"1\")" $field $key $value) -}}
{{- end -}}
{{- if not (regexMatch (include "dspark.labelValueRe" $) $value) -}}
{{- fail (printf "%s.%s: %q is not a valid label value (letters, digits, '-', '_', '.', at most 63 characters)" $field $key $value) -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{- define "dspark.checkValues" -}}
{{- if not (regexMatch (include "dspark.dnsNameRe" .) (toString .Values.gpustack.release)) -}}
{{- fail (printf "gpustack.release: %q is not a release name (lowercase letters, digits, '-', at most 63 characters)" (toString .Values.gpustack.release)) -}}
{{- end -}}
{{- if and .Values.gpustack.namespace (not (regexMatch (include "dspark.dnsNameRe" .) .Values.gpustack.namespace)) -}}
{{- fail (printf "gpustack.namespace: %q is not a namespace name (lowercase letters, digits, '-', at most 63 characters)" .Values.gpustack.namespace) -}}
{{- end -}}
{{- if not (has .Values.prometheusRules.kind (list "ConfigMap" "PrometheusRule")) -}}
{{- fail (printf "prometheusRules.kind: %q is not one of ConfigMap, PrometheusRule" (toString .Values.prometheusRules.kind)) -}}
{{- end -}}
{{- include "dspark.checkLabels" (list "prometheusRules.labels" .Values.prometheusRules.labels) -}}
{{- include "dspark.checkLabels" (list "grafanaDashboard.labels" .Values.grafanaDashboard.labels) -}}
{{- end -}}

{{- define "dspark.labels" -}}
app.kubernetes.io/name: gpustack-dspark
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}
