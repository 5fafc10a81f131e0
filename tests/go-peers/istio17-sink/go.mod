module bridge.test/mcp-sink-1.7

go 1.22

// Istio 1.7.8 (tag 1.7.8, commit 30e54dcb8a1c; Istio's tags are not semver, so a pseudo-version).
require istio.io/istio v0.0.0-20210223230603-30e54dcb8a1c

require (
	github.com/gogo/protobuf v1.3.1
	google.golang.org/grpc v1.29.1
	istio.io/api v0.0.0-20210128181506-0c4b8e54850f
	istio.io/pkg v0.0.0-20201202160453-b7f8c8c88ca3
)

require (
	github.com/cenkalti/backoff v2.0.0+incompatible // indirect
	github.com/census-instrumentation/opencensus-proto v0.2.1 // indirect
	github.com/cncf/udpa/go v0.0.0-20200629203442-efcf912fb354 // indirect
	github.com/envoyproxy/go-control-plane v0.9.7-0.20200730005029-803dd64f0468 // indirect
	github.com/envoyproxy/protoc-gen-validate v0.1.0 // indirect
	github.com/golang/protobuf v1.4.2 // indirect
	github.com/google/go-cmp v0.5.0 // indirect
	github.com/google/gofuzz v1.1.0 // indirect
	github.com/hashicorp/errwrap v1.0.0 // indirect
	github.com/hashicorp/go-multierror v1.1.0 // indirect
	github.com/inconshreveable/mousetrap v1.0.0 // indirect
	github.com/json-iterator/go v1.1.9 // indirect
	github.com/modern-go/concurrent v0.0.0-20180306012644-bacd9c7ef1dd // indirect
	github.com/modern-go/reflect2 v1.0.1 // indirect
	github.com/natefinch/lumberjack v2.0.0+incompatible // indirect
	github.com/prometheus/client_model v0.2.0 // indirect
	github.com/spf13/cobra v1.0.0 // indirect
	github.com/spf13/pflag v1.0.5 // indirect
	go.opencensus.io v0.22.2 // indirect
	go.uber.org/atomic v1.4.0 // indirect
	go.uber.org/multierr v1.1.0 // indirect
	go.uber.org/zap v1.10.0 // indirect
	golang.org/x/net v0.0.0-20200602114024-627f9648deb9 // indirect
	golang.org/x/sys v0.0.0-20200615200032-f1bc736245b1 // indirect
	golang.org/x/text v0.3.3 // indirect
	golang.org/x/time v0.0.0-20190921001708-c4c64cad1fd0 // indirect
	google.golang.org/genproto v0.0.0-20200619004808-3e7fca5c55db // indirect
	google.golang.org/protobuf v1.25.0 // indirect
	gopkg.in/inf.v0 v0.9.1 // indirect
	gopkg.in/yaml.v2 v2.3.0 // indirect
	istio.io/gogo-genproto v0.0.0-20201202160550-002d724ddaf1 // indirect
	k8s.io/api v0.18.3 // indirect
	k8s.io/apiextensions-apiserver v0.18.3 // indirect
	k8s.io/apimachinery v0.18.3 // indirect
	k8s.io/klog v1.0.0 // indirect
	k8s.io/utils v0.0.0-20200324210504-a9aa75ae1b89 // indirect
	sigs.k8s.io/service-apis v0.0.0-20200708220836-10c7cb28ed93 // indirect
	sigs.k8s.io/structured-merge-diff/v3 v3.0.0 // indirect
)

// Istio 1.7's own replaces (its go.mod; a dependency's replaces do not apply to the main module).
replace github.com/golang/glog => github.com/istio/glog v0.0.0-20190424172949-d7cfb6fa2ccd

replace k8s.io/klog => github.com/istio/klog v0.0.0-20190424230111-fb7481ea8bcf

replace github.com/spf13/viper => github.com/istio/viper v1.3.3-0.20190515210538-2789fed3109c

replace github.com/docker/docker => github.com/docker/engine v1.4.2-0.20191011211953-adfac697dc5b

replace github.com/chzyer/logex => github.com/chzyer/logex v1.1.11-0.20170329064859-445be9e134b2

replace github.com/docker/distribution => github.com/docker/distribution v2.7.1+incompatible

replace github.com/Microsoft/hcsshim => github.com/Microsoft/hcsshim v0.8.8-0.20200421182805-c3e488f0d815

replace github.com/imdario/mergo => github.com/imdario/mergo v0.3.5

replace github.com/evanphx/json-patch => github.com/evanphx/json-patch v0.0.0-20190815234213-e83c0a1c26c8

// vbom.ml is gone (the proxy answers 403); k8s.io/kubectl v0.18 still requires it. The same
// commit from its GitHub home (github.com/fvbommel/util).
replace vbom.ml/util => github.com/fvbommel/util v0.0.0-20160121211510-db5cfe13f5cc
