{{/*
The adapters, in the order NOTES.txt lists them (and deploy/kubernetes/istiod-meshconfig.yaml).
*/}}
{{- define "mcp-adapters.names" -}}
file consul zookeeper eureka nacos kube
{{- end -}}

{{/*
The registry's own name (R::NAME): the default --source-name, hence the Lease mcp-adapter-<name>.
adapter-kube's is "kubernetes".
*/}}
{{- define "mcp-adapters.registry" -}}
{{- if eq . "kube" -}}kubernetes{{- else -}}{{ . }}{{- end -}}
{{- end -}}

{{/*
Deep merge of .src into .dst, in place: maps merge key by key, anything else (lists, scalars,
null) replaces. Not sprig's mergeOverwrite, which skips false, 0 and "" in the source (so
`stateFile.enabled: false` could not turn a default off).
*/}}
{{- define "mcp-adapters.merge" -}}
{{- $dst := .dst -}}
{{- range $k, $v := .src -}}
{{- $cur := index $dst $k -}}
{{- if and (kindIs "map" $v) (kindIs "map" $cur) -}}
{{- include "mcp-adapters.merge" (dict "dst" $cur "src" $v) -}}
{{- else -}}
{{- $_ := set $dst $k $v -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{/*
One adapter's settings: `defaults` merged with `adapters.<name>`, checked, plus derived fields
(name, fullname, registry, source, shards as integers, mcp and kube switches). As YAML:
  {{- $a := include "mcp-adapters.config" (dict "root" $ "name" "consul") | fromYaml }}
*/}}
{{- define "mcp-adapters.config" -}}
{{- $root := .root -}}
{{- $name := .name -}}
{{- $a := deepCopy $root.Values.defaults -}}
{{- include "mcp-adapters.merge" (dict "dst" $a "src" (deepCopy (index $root.Values.adapters $name))) -}}
{{- $full := printf "adapter-%s" $name -}}
{{- $_ := set $a "name" $name -}}
{{- $_ := set $a "fullname" $full -}}
{{- $_ := set $a "registry" (include "mcp-adapters.registry" $name) -}}
{{- $_ := set $a "source" (default $a.registry $a.sourceName) -}}
{{- $shards := int $a.shards -}}
{{- if or (lt $shards 1) (gt $shards 64) -}}
{{- fail (printf "%s: shards must be 1 to 64 (got %v)" $full $a.shards) -}}
{{- end -}}
{{- $_ := set $a "shards" $shards -}}
{{- $mcpPort := int $a.ports.mcp -}}
{{- $adminPort := int $a.ports.admin -}}
{{- $mode := $a.output.mode -}}
{{- if not (has $mode (list "mcp" "both" "kube")) -}}
{{- fail (printf "%s: output.mode must be mcp, both or kube (got %v)" $full $mode) -}}
{{- end -}}
{{- $_ := set $a "mcp" (ne $mode "kube") -}}
{{- $_ := set $a "kube" (ne $mode "mcp") -}}
{{- if and (ne $mode "kube") (ge $adminPort $mcpPort) (lt $adminPort (add $mcpPort $shards)) -}}
{{- fail (printf "%s: ports.admin %d is among the shard ports %d-%d (the adapter refuses to start); put it below ports.mcp" $full $adminPort $mcpPort (sub (add $mcpPort $shards) 1)) -}}
{{- end -}}
{{- if gt (add $mcpPort $shards) 65536 -}}
{{- fail (printf "%s: ports.mcp %d + %d shards passes 65535" $full $mcpPort $shards) -}}
{{- end -}}
{{- $_ := set $a "mcpPort" $mcpPort -}}
{{- $_ := set $a "adminPort" $adminPort -}}
{{- if and (ne $mode "mcp") (empty $a.output.namespaces) -}}
{{- fail (printf "%s: output.mode %s needs adapters.%s.output.namespaces (the namespaces its ServiceEntries go to: a Role in each)" $full $mode $name) -}}
{{- end -}}
{{- $_ := set $a "leaseNamespace" (default $root.Release.Namespace $a.output.leaseNamespace) -}}
{{- if and $a.tls.enabled (not $a.tls.existingSecret) -}}
{{- fail (printf "%s: tls.enabled needs tls.existingSecret" $full) -}}
{{- end -}}
{{- if and (eq $name "kube") (not $a.kubeconfig.existingSecret) -}}
{{- fail "adapter-kube: adapters.kube.kubeconfig.existingSecret is required (a Secret with the watched cluster's kubeconfig)" -}}
{{- end -}}
{{- if and (eq $name "file") (empty $a.files) (not $a.existingConfigMap) -}}
{{- fail "adapter-file: set adapters.file.files (file name: content) or adapters.file.existingConfigMap" -}}
{{- end -}}
{{- $image := $a.image -}}
{{- $repo := default (printf "mcp-adapter-%s" $name) $image.repository -}}
{{- if $image.registry -}}
{{- $repo = printf "%s/%s" $image.registry $repo -}}
{{- end -}}
{{- $_ := set $a "imageRef" (printf "%s:%s" $repo (toString $image.tag)) -}}
{{- toYaml $a -}}
{{- end -}}

{{/*
Labels of every object of adapter .name: the two deploy/kubernetes uses (the first is also the
selector), then Helm's.
*/}}
{{- define "mcp-adapters.labels" -}}
{{- if .name -}}
app.kubernetes.io/name: {{ .name }}
{{ end -}}
app.kubernetes.io/part-of: mcp-adapters
{{ include "mcp-adapters.helmLabels" .root }}
{{- end -}}

{{/*
What Helm adds (and tests/tests/helm_chart.rs leaves out when comparing with deploy/kubernetes).
*/}}
{{- define "mcp-adapters.helmLabels" -}}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{- end -}}
