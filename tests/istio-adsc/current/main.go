// adsc-watch: a test peer that subscribes to an MCP-over-xDS server with
// Istio's own client (istio.io/istio/pkg/adsc), configured the way istiod
// configures it for a `configSources: - address: xds://HOST:PORT` entry
// (pilot/pkg/bootstrap/configcontroller.go), and prints what Istio's
// in-memory config store ends up holding, as JSON lines on stdout.
//
// This file is shared by both builds (v1_22/main.go is a symlink to it).
// Everything that differs between Istio versions lives in istio.go next to
// it in each module.
//
// stdout carries only JSON lines:
//
//	{"event":"synced",...}          once adsc.HasSynced() is true
//	{"event":"serviceentries",...}  right after "synced", then on every change
//	{"event":"invalid",...}         before a "serviceentries" line, for each entry in
//	                                it that Istio's ValidateServiceEntry refuses
//	{"event":"error","message":..}  stream failures, resources adsc rejected, timeout
//
// Exit codes: 0 stdin reached EOF, 2 bad flags, 3 --timeout elapsed, 1 internal failure.
package main

import (
	"bytes"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"net"
	"os"
	"runtime/debug"
	"sort"
	"sync"
	"time"

	"go.uber.org/zap/zapcore"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"

	"istio.io/istio/pilot/pkg/model"
	"istio.io/istio/pkg/adsc"
	"istio.io/istio/pkg/config"
	"istio.io/istio/pkg/config/schema/collections"
	"istio.io/istio/pkg/config/validation"
	"istio.io/istio/pkg/keepalive"
	istiolog "istio.io/istio/pkg/log"
)

// configStore is what both Istio versions' memory.Controller offer and what
// this program needs: the model.ConfigStore adsc writes into, plus Run and
// the HasSynced hook istiod wires up.
type configStore interface {
	model.ConfigStore
	Run(stop <-chan struct{})
	RegisterHasSyncedHandler(cb func() bool)
}

// pollInterval is how often the store is compared with what was last printed.
const pollInterval = 20 * time.Millisecond

func main() {
	os.Exit(run())
}

func run() int {
	flags := flag.NewFlagSet("adsc-watch", flag.ContinueOnError)
	flags.SetOutput(os.Stderr)
	addr := flags.String("addr", "", "MCP-over-xDS server HOST:PORT (what istiod gets from xds://HOST:PORT)")
	timeout := flags.Duration("timeout", 120*time.Second, "exit with code 3 after this long")
	// The Helm-installed istiod runs with REVISION=default; adsc drops resources
	// whose istio.io/rev label names another revision.
	revision := flags.String("revision", "default", "istiod revision (REVISION env of istiod)")
	if err := flags.Parse(os.Args[1:]); err != nil {
		if err == flag.ErrHelp {
			return 0
		}
		return 2
	}
	if flags.NArg() != 0 || *addr == "" || *timeout <= 0 {
		fmt.Fprintln(os.Stderr, "usage: adsc-watch --addr HOST:PORT [--timeout 120s] [--revision default]")
		return 2
	}
	if _, _, err := net.SplitHostPort(*addr); err != nil {
		fmt.Fprintf(os.Stderr, "adsc-watch: bad --addr %q: %v\n", *addr, err)
		return 2
	}

	out := &emitter{}
	if err := configureLogging(out); err != nil {
		fmt.Fprintf(os.Stderr, "adsc-watch: configuring istio logging: %v\n", err)
		return 1
	}

	// istiod's own initial requests: MeshConfig plus every collections.Pilot type.
	requests := adsc.ConfigInitialRequests()
	typeURLs := make([]string, 0, len(requests))
	for _, r := range requests {
		typeURLs = append(typeURLs, r.TypeUrl)
	}
	seGVK, ok := serviceEntryGVK()
	if !ok {
		fmt.Fprintln(os.Stderr, "adsc-watch: collections.Pilot has no ServiceEntry schema")
		return 1
	}

	store := newConfigStore()
	client, err := adsc.New(*addr, &adsc.ADSConfig{
		InitialDiscoveryRequests: requests,
		Config: adsc.Config{
			Namespace: "istio-system",
			Workload:  "adsc-watch",
			Revision:  *revision,
			Meta: model.NodeMetadata{
				Generator:     "api",
				IstioRevision: *revision,
			}.ToStruct(),
			// Same options istiod passes: keepalive + explicit plaintext
			// credentials (adsc only adds plaintext itself when GrpcOpts is
			// empty). The interceptor is ours: adsc keeps stream errors to
			// itself, so we observe them on the wire instead.
			GrpcOpts: []grpc.DialOption{
				keepalive.DefaultOption().ConvertToClientOption(),
				grpc.WithTransportCredentials(insecure.NewCredentials()),
				grpc.WithStreamInterceptor(reportStreamErrors(out)),
			},
		},
	})
	if err != nil {
		out.errorf("adsc.New(%s): %v", *addr, err)
		return 1
	}
	// As in istiod: the controller's readiness is the client's HasSynced, and
	// the store is attached before Run so the first responses land in it.
	store.RegisterHasSyncedHandler(client.HasSynced)
	client.Store = store
	// istiod runs every config controller. The memory controller must run:
	// it queues an event per store write (1.22: a 100-slot channel that
	// blocks adsc once full if nobody drains it) or marks its collections
	// ready (later versions).
	stop := make(chan struct{})
	go store.Run(stop)

	// istiod gives up if the very first Run fails (it cannot open the stream);
	// a test peer must instead wait for the server. Once a Run has succeeded,
	// adsc reconnects by itself with exponential backoff (0.5s .. 60s).
	go func() {
		delay := 200 * time.Millisecond
		for client.Run() != nil { // the interceptor already printed why
			time.Sleep(delay)
			delay = min(2*delay, 2*time.Second)
		}
	}()

	stdinClosed := make(chan struct{})
	go func() {
		_, _ = io.Copy(io.Discard, os.Stdin)
		close(stdinClosed)
	}()
	deadline := time.NewTimer(*timeout)
	ticker := time.NewTicker(pollInterval)
	defer ticker.Stop()

	synced := false
	last := ""
	for {
		select {
		case <-stdinClosed:
			return 0
		case <-deadline.C:
			out.errorf("timeout after %s (synced=%v)", *timeout, synced)
			return 3
		case <-ticker.C:
			if !synced {
				if !client.HasSynced() {
					continue
				}
				synced = true
				out.emit(syncedEvent{
					Event:               "synced",
					Istio:               istioRelease,
					IstioModule:         istioModuleVersion(),
					ServiceEntryTypeURL: seGVK.String(),
					RequestedTypeURLs:   typeURLs,
				})
			}
			line, invalid, err := serviceEntriesLine(store, seGVK)
			if err != nil {
				// Report each distinct failure once, not every poll.
				if msg := fmt.Sprintf("rendering store: %v", err); msg != last {
					out.errorf("%s", msg)
					last = msg
				}
				continue
			}
			if line != last {
				for _, ev := range invalid {
					out.emit(ev)
				}
				out.writeLine(line)
				last = line
			}
		}
	}
}

// serviceEntryGVK is the GVK adsc requests (and stores) ServiceEntries under:
// networking.istio.io/v1alpha3/ServiceEntry up to 1.23, .../v1/... from 1.24.
func serviceEntryGVK() (config.GroupVersionKind, bool) {
	for _, s := range collections.Pilot.All() {
		if s.Kind() == "ServiceEntry" {
			return s.GroupVersionKind(), true
		}
	}
	return config.GroupVersionKind{}, false
}

type syncedEvent struct {
	Event               string   `json:"event"`
	Istio               string   `json:"istio"`
	IstioModule         string   `json:"istioModule"`
	ServiceEntryTypeURL string   `json:"serviceEntryTypeUrl"`
	RequestedTypeURLs   []string `json:"requestedTypeUrls"`
}

type serviceEntriesEvent struct {
	Event string             `json:"event"`
	Items []serviceEntryItem `json:"items"`
}

type serviceEntryItem struct {
	Namespace         string            `json:"namespace"`
	Name              string            `json:"name"`
	ResourceVersion   string            `json:"resourceVersion"`
	CreationTimestamp string            `json:"creationTimestamp"`
	Labels            map[string]string `json:"labels"`
	Annotations       map[string]string `json:"annotations"`
	Spec              json.RawMessage   `json:"spec"`
}

type invalidEvent struct {
	Event     string   `json:"event"`
	Namespace string   `json:"namespace"`
	Name      string   `json:"name"`
	Errors    []string `json:"errors"`
}

// serviceEntriesLine renders the store's ServiceEntries, sorted by namespace
// then name, as one JSON line (without newline). Equal store contents give
// an equal line, so comparing lines detects changes. It also runs Istio's
// ValidateServiceEntry (the admission webhook's check) over each entry and
// returns those it refuses: the store validates on write too, but this
// states it for every entry a test sees, whatever the store's settings.
func serviceEntriesLine(store model.ConfigStore, gvk config.GroupVersionKind) (string, []invalidEvent, error) {
	configs := store.List(gvk, "")
	sort.Slice(configs, func(i, j int) bool {
		if configs[i].Namespace != configs[j].Namespace {
			return configs[i].Namespace < configs[j].Namespace
		}
		return configs[i].Name < configs[j].Name
	})
	items := make([]serviceEntryItem, 0, len(configs))
	var invalid []invalidEvent
	for _, c := range configs {
		spec, err := specJSON(c.Spec)
		if err != nil {
			return "", nil, fmt.Errorf("%s/%s: %v", c.Namespace, c.Name, err)
		}
		if _, err := validation.ValidateServiceEntry(c); err != nil {
			invalid = append(invalid, invalidEvent{"invalid", c.Namespace, c.Name, errorList(err)})
		}
		items = append(items, serviceEntryItem{
			Namespace:         c.Namespace,
			Name:              c.Name,
			ResourceVersion:   c.ResourceVersion,
			CreationTimestamp: c.CreationTimestamp.UTC().Format(time.RFC3339Nano),
			Labels:            nonNil(c.Labels),
			Annotations:       nonNil(c.Annotations),
			Spec:              spec,
		})
	}
	b, err := json.Marshal(serviceEntriesEvent{Event: "serviceentries", Items: items})
	return string(b), invalid, err
}

// errorList lists the errors inside Istio's multierror (go-multierror's
// WrappedErrors), one message each.
func errorList(err error) []string {
	if m, ok := err.(interface{ WrappedErrors() []error }); ok {
		var out []string
		for _, e := range m.WrappedErrors() {
			out = append(out, errorList(e)...)
		}
		return out
	}
	return []string{err.Error()}
}

// specJSON renders a spec with protojson: lowerCamelCase field names and enum
// names, as in Istio YAML. protojson deliberately varies its whitespace, so
// the result is compacted to keep the output stable.
func specJSON(spec any) (json.RawMessage, error) {
	var raw []byte
	var err error
	if m, ok := spec.(proto.Message); ok {
		raw, err = protojson.Marshal(m)
	} else {
		raw, err = json.Marshal(spec)
	}
	if err != nil {
		return nil, err
	}
	var compact bytes.Buffer
	if err := json.Compact(&compact, raw); err != nil {
		return nil, err
	}
	return compact.Bytes(), nil
}

func nonNil(m map[string]string) map[string]string {
	if m == nil {
		return map[string]string{}
	}
	return m
}

// istioModuleVersion is the istio.io/istio module version compiled in (a
// pseudo-version, since Istio's tags are not semver).
func istioModuleVersion() string {
	if info, ok := debug.ReadBuildInfo(); ok {
		for _, dep := range info.Deps {
			if dep.Path == "istio.io/istio" {
				return dep.Version
			}
		}
	}
	return "unknown"
}

// emitter writes whole JSON lines to stdout; os.Stdout is unbuffered, so each
// line is flushed as it is written. The mutex keeps lines from interleaving
// (errors come from gRPC and log goroutines).
type emitter struct {
	mu sync.Mutex
}

func (e *emitter) writeLine(line string) {
	e.mu.Lock()
	defer e.mu.Unlock()
	_, _ = os.Stdout.WriteString(line + "\n")
}

func (e *emitter) emit(v any) {
	b, err := json.Marshal(v)
	if err != nil {
		fmt.Fprintf(os.Stderr, "adsc-watch: marshal: %v\n", err)
		return
	}
	e.writeLine(string(b))
}

func (e *emitter) errorf(format string, args ...any) {
	e.emit(struct {
		Event   string `json:"event"`
		Message string `json:"message"`
	}{"error", fmt.Sprintf(format, args...)})
}

// reportStreamErrors turns failures of the ADS stream into error lines:
// failing to open it (server down) and the stream breaking (server stopped or
// restarted). adsc only logs these at info level and retries on its own.
func reportStreamErrors(out *emitter) grpc.StreamClientInterceptor {
	return func(ctx context.Context, desc *grpc.StreamDesc, cc *grpc.ClientConn, method string,
		streamer grpc.Streamer, opts ...grpc.CallOption,
	) (grpc.ClientStream, error) {
		s, err := streamer(ctx, desc, cc, method, opts...)
		if err != nil {
			out.errorf("opening ADS stream to %s: %v", cc.Target(), err)
			return nil, err
		}
		return &watchedStream{ClientStream: s, out: out}, nil
	}
}

type watchedStream struct {
	grpc.ClientStream
	out *emitter
}

func (w *watchedStream) RecvMsg(m any) error {
	err := w.ClientStream.RecvMsg(m)
	if err == io.EOF {
		w.out.errorf("ADS stream closed by the server (EOF)")
	} else if err != nil {
		w.out.errorf("ADS stream broken: %v", err)
	}
	return err
}

// configureLogging sends all Istio (and, through it, klog/zap) logging to
// stderr - Istio's default is stdout, which must stay JSON-only - and tees
// warnings of the "adsc" scope and all errors into error lines. That is how
// resources adsc drops show up: "Invalid data: ...", or "Error adding a new
// resource to the store ..." when validation rejects a ServiceEntry.
func configureLogging(out *emitter) error {
	opts := istiolog.DefaultOptions()
	opts.OutputPaths = []string{"stderr"}
	opts.ErrorOutputPaths = []string{"stderr"}
	opts.WithExtension(func(c zapcore.Core) (zapcore.Core, func() error, error) {
		return zapcore.NewTee(c, errorCore{out}), func() error { return nil }, nil
	})
	return istiolog.Configure(opts)
}

type errorCore struct{ out *emitter }

func (c errorCore) Enabled(l zapcore.Level) bool      { return l >= zapcore.WarnLevel }
func (c errorCore) With([]zapcore.Field) zapcore.Core { return c }
func (c errorCore) Sync() error                       { return nil }

func (c errorCore) Check(e zapcore.Entry, ce *zapcore.CheckedEntry) *zapcore.CheckedEntry {
	if c.Enabled(e.Level) {
		return ce.AddCore(e, c)
	}
	return ce
}

// Write is also called directly (not via Check) by Istio's scopes, so it
// filters by itself.
func (c errorCore) Write(e zapcore.Entry, _ []zapcore.Field) error {
	if e.Level >= zapcore.ErrorLevel || (e.LoggerName == "adsc" && e.Level >= zapcore.WarnLevel) {
		c.out.errorf("istio log [%s] %s: %s", e.LoggerName, e.Level, e.Message)
	}
	return nil
}
