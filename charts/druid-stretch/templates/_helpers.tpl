{{/*
fullname is the release name, or <release>-druid-stretch when the release
name does not already say druid-stretch; 63 characters at most (DNS label).
*/}}
{{- define "druid-stretch.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{/* selectorLabels pick the controller pods; they never change on upgrade. */}}
{{- define "druid-stretch.selectorLabels" -}}
app.kubernetes.io/name: {{ .Chart.Name }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: controller
{{- end -}}

{{/* labels go on every object the chart creates. */}}
{{- define "druid-stretch.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
app.kubernetes.io/name: {{ .Chart.Name }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: druid-stretch
{{- end -}}

{{- define "druid-stretch.serviceAccountName" -}}
{{- include "druid-stretch.fullname" . -}}
{{- end -}}

{{- define "druid-stretch.webhookServiceName" -}}
{{- printf "%s-webhook" (include "druid-stretch.fullname" .) | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "druid-stretch.metricsServiceName" -}}
{{- printf "%s-metrics" (include "druid-stretch.fullname" .) | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/*
webhookCertSecretName holds tls.crt, tls.key and ca.crt. The two modes use
different names, so that switching modes on upgrade never has Helm and
cert-manager write or delete the same Secret.
*/}}
{{- define "druid-stretch.webhookCertSecretName" -}}
{{- $suffix := ternary "webhook-cert" "webhook-tls" .Values.webhook.certManager.enabled -}}
{{- printf "%s-%s" (include "druid-stretch.fullname" .) $suffix | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "druid-stretch.certificateName" -}}
{{- printf "%s-webhook" (include "druid-stretch.fullname" .) | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/*
image is repository:tag of the controller image: controller.image, field
by field, over image, under global.imageRegistry. A missing repository fails
even when schema validation is skipped.
*/}}
{{- define "druid-stretch.image" -}}
{{- $repo := default (include "druid-stretch.imageRepository" .) .Values.controller.image.repository -}}
{{- $tag := default (default .Chart.AppVersion .Values.image.tag) .Values.controller.image.tag -}}
{{- printf "%s%s:%s" (include "druid-stretch.registryPrefix" .) $repo $tag -}}
{{- end -}}

{{- define "druid-stretch.imagePullPolicy" -}}
{{- default .Values.image.pullPolicy .Values.controller.image.pullPolicy -}}
{{- end -}}

{{/* sidecarImage defaults, field by field, to image (not controller.image). */}}
{{- define "druid-stretch.sidecarImage" -}}
{{- $repo := default (include "druid-stretch.imageRepository" .) .Values.sidecar.image.repository -}}
{{- $tag := default (default .Chart.AppVersion .Values.image.tag) .Values.sidecar.image.tag -}}
{{- printf "%s%s:%s" (include "druid-stretch.registryPrefix" .) $repo $tag -}}
{{- end -}}

{{/* registryPrefix is global.imageRegistry and a slash, or nothing. */}}
{{- define "druid-stretch.registryPrefix" -}}
{{- $global := .Values.global | default dict -}}
{{- with $global.imageRegistry -}}{{ trimSuffix "/" . }}/{{- end -}}
{{- end -}}

{{/*
leaderElectionID is controller.leaderElectionID, else <fullname>-membership
(the binary's default for a release named druid-stretch).
*/}}
{{- define "druid-stretch.leaderElectionID" -}}
{{- default (printf "%s-membership" (include "druid-stretch.fullname" .) | trunc 63 | trimSuffix "-") .Values.controller.leaderElectionID -}}
{{- end -}}

{{- define "druid-stretch.imageRepository" -}}
{{- required "image.repository is required: the druid-stretch image, e.g. --set image.repository=registry.example.com/druid-stretch" .Values.image.repository -}}
{{- end -}}

{{/* webhookPath names the admission endpoints the controller serves. */}}
{{- define "druid-stretch.statefulSetMutatorPath" -}}/mutate-apps-v1-statefulset{{- end -}}
{{- define "druid-stretch.etcdValidatorPath" -}}/validate-druid-gardener-cloud-v1alpha1-etcd{{- end -}}

{{- define "druid-stretch.etcdMembershipValidatorPath" -}}/validate-druid-stretch-druid-gardener-cloud-v1alpha1-etcdmembership{{- end -}}

{{- define "druid-stretch.etcdDeletionValidatorPath" -}}/validate-druid-gardener-cloud-v1alpha1-etcd-delete{{- end -}}

{{- define "druid-stretch.etcdScaleValidatorPath" -}}/validate-druid-gardener-cloud-v1alpha1-etcd-scale{{- end -}}

{{/*
webhookNamespaceSelector joins webhook.namespaceSelector and one webhook's
own (list root own): label sets merged, expressions appended, and the
system namespaces and the release namespace always left out, so that a
webhook outage never blocks them.
*/}}
{{- define "druid-stretch.webhookNamespaceSelector" -}}
{{- $root := index . 0 -}}
{{- $own := index . 1 -}}
{{- $top := $root.Values.webhook.namespaceSelector -}}
{{- $labels := merge (dict) (default (dict) $own.matchLabels) (default (dict) $top.matchLabels) -}}
{{- $exprs := concat (default (list) $top.matchExpressions) (default (list) $own.matchExpressions) -}}
{{- $exprs = append $exprs (dict "key" "kubernetes.io/metadata.name" "operator" "NotIn" "values" (list "kube-system" "kube-public" "kube-node-lease" $root.Release.Namespace)) -}}
{{- if $labels }}
matchLabels:
  {{- toYaml $labels | nindent 2 }}
{{- end }}
matchExpressions:
  {{- toYaml $exprs | nindent 2 }}
{{- end -}}

{{/* webhookObjectSelector joins webhook.objectSelector and one webhook's own (list root own). */}}
{{- define "druid-stretch.webhookObjectSelector" -}}
{{- $root := index . 0 -}}
{{- $own := index . 1 -}}
{{- $top := $root.Values.webhook.objectSelector -}}
{{- $labels := merge (dict) (default (dict) $own.matchLabels) (default (dict) $top.matchLabels) -}}
{{- $exprs := concat (default (list) $top.matchExpressions) (default (list) $own.matchExpressions) -}}
{{- if or $labels $exprs }}
{{- with $labels }}
matchLabels:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with $exprs }}
matchExpressions:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- else -}}
{}
{{- end }}
{{- end -}}
