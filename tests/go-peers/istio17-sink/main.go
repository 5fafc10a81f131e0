// mcp-sink-1.7: Istio 1.7's own legacy MCP sink client (istio.io/istio/pkg/mcp/sink), wired up
// as Pilot 1.7 wires it (pilot/pkg/bootstrap/configcontroller.go, mcpController): one
// sink.Client over istio.mcp.v1alpha1.ResourceSource/EstablishResourceStream, asking for every
// collection in collections.Pilot, with a monitoring.StatsContext reporter. Instead of Pilot's
// config store it prints what the sink hands to its Updater, one JSON object a line on stdout:
//
//	{"event":"apply","collection":"...","incremental":false,"system_version":"...",
//	 "objects":[{"name":"ns/n","version":"...","type_url":"...","body":{...}}],"removed":[]}
//	{"event":"ack","collection":"..."}            the sink ACKed a response
//	{"event":"nack","collection":"...","code":"..."} the sink NACKed a response
//	{"event":"invalid","name":"ns/n","errors":[...]}  before an "apply": a ServiceEntry in it
//	                                               that Istio 1.7's ValidateServiceEntry refuses
//
// Apply errors are never returned, so every response that decodes is ACKed; one whose body does
// not decode as the type its type URL names (gogo registry, as in Pilot) is NACKed by the sink.
// Usage: mcp-sink-1.7 -address host:port [-incremental] [-collections a,b]
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"strings"
	"sync"
	"syscall"

	"github.com/gogo/protobuf/jsonpb"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"

	mcpapi "istio.io/api/mcp/v1alpha1"
	networking "istio.io/api/networking/v1alpha3"
	"istio.io/istio/pkg/config/schema/collections"
	"istio.io/istio/pkg/config/validation"
	"istio.io/istio/pkg/mcp/monitoring"
	"istio.io/istio/pkg/mcp/sink"
	"istio.io/pkg/log"
)

type printer struct {
	mu  sync.Mutex
	enc *json.Encoder
}

func (p *printer) print(v interface{}) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if err := p.enc.Encode(v); err != nil {
		fmt.Fprintf(os.Stderr, "mcp-sink-1.7: writing stdout: %v\n", err)
		os.Exit(1)
	}
}

type object struct {
	Name    string            `json:"name"`
	Version string            `json:"version"`
	TypeURL string            `json:"type_url"`
	Labels  map[string]string `json:"labels,omitempty"`
	Body    json.RawMessage   `json:"body"`
}

type applied struct {
	Event         string   `json:"event"`
	Collection    string   `json:"collection"`
	Incremental   bool     `json:"incremental"`
	SystemVersion string   `json:"system_version"`
	Objects       []object `json:"objects"`
	Removed       []string `json:"removed"`
}

// updater is the sink.Updater in place of Pilot's MCP controller.
type updater struct{ out *printer }

func (u updater) Apply(c *sink.Change) error {
	a := applied{
		Event:         "apply",
		Collection:    c.Collection,
		Incremental:   c.Incremental,
		SystemVersion: c.SystemVersionInfo,
		Objects:       []object{},
		Removed:       append([]string{}, c.Removed...),
	}
	m := jsonpb.Marshaler{OrigName: true}
	for _, o := range c.Objects {
		body, err := m.MarshalToString(o.Body)
		if err != nil {
			body = fmt.Sprintf("%q", fmt.Sprintf("cannot print %T: %v", o.Body, err))
		}
		obj := object{TypeURL: o.TypeURL, Body: json.RawMessage(body)}
		if o.Metadata != nil {
			obj.Name = o.Metadata.Name
			obj.Version = o.Metadata.Version
			obj.Labels = o.Metadata.Labels
		}
		// What Pilot 1.7's config store would run on it (validation is on for MCP there too).
		if se, ok := o.Body.(*networking.ServiceEntry); ok {
			ns, name := "", obj.Name
			if i := strings.Index(obj.Name, "/"); i >= 0 {
				ns, name = obj.Name[:i], obj.Name[i+1:]
			}
			if err := validation.ValidateServiceEntry(name, ns, se); err != nil {
				u.out.print(struct {
					Event  string   `json:"event"`
					Name   string   `json:"name"`
					Errors []string `json:"errors"`
				}{"invalid", obj.Name, errorList(err)})
			}
		}
		a.Objects = append(a.Objects, obj)
	}
	u.out.print(a)
	return nil
}

// errorList lists the errors inside go-multierror's error, one message each.
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

// reporter is Pilot's reporter (monitoring.StatsContext), and prints the sink's ACKs and NACKs.
type reporter struct {
	*monitoring.StatsContext
	out *printer
}

func (r reporter) RecordRequestAck(collection string, connectionID int64) {
	r.StatsContext.RecordRequestAck(collection, connectionID)
	r.out.print(map[string]string{"event": "ack", "collection": collection})
}

func (r reporter) RecordRequestNack(collection string, connectionID int64, code codes.Code) {
	r.StatsContext.RecordRequestNack(collection, connectionID, code)
	r.out.print(map[string]string{"event": "nack", "collection": collection, "code": code.String()})
}

func main() {
	address := flag.String("address", "127.0.0.1:15051", "the MCP source, host:port (as meshConfig.configSources[].address)")
	incremental := flag.Bool("incremental", false, "ask for incremental updates (Pilot's PILOT_ENABLE_INCREMENTAL_MCP)")
	only := flag.String("collections", "", "comma-separated collections to ask for (default: Pilot 1.7's, collections.Pilot)")
	flag.Parse()

	// Istio's log (the sink's "mcp" scope) to stderr: stdout carries the events.
	logOptions := log.DefaultOptions()
	logOptions.OutputPaths = []string{"stderr"}
	if err := log.Configure(logOptions); err != nil {
		fmt.Fprintf(os.Stderr, "mcp-sink-1.7: configuring the log: %v\n", err)
		os.Exit(1)
	}

	var names []string
	if *only != "" {
		names = strings.Split(*only, ",")
	} else {
		for _, c := range collections.Pilot.All() {
			names = append(names, c.Name().String())
		}
	}
	cols := make([]sink.CollectionOptions, 0, len(names))
	for _, n := range names {
		cols = append(cols, sink.CollectionOptions{Name: n, Incremental: *incremental})
	}

	out := &printer{enc: json.NewEncoder(os.Stdout)}
	stats := monitoring.NewStatsContext("pilot")
	ctx, cancel := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer cancel()

	conn, err := grpc.DialContext(ctx, *address, grpc.WithInsecure())
	if err != nil {
		fmt.Fprintf(os.Stderr, "mcp-sink-1.7: dial %s: %v\n", *address, err)
		os.Exit(1)
	}
	client := sink.NewClient(mcpapi.NewResourceSourceClient(conn), &sink.Options{
		CollectionOptions: cols,
		Updater:           updater{out: out},
		ID:                "",
		Reporter:          reporter{StatsContext: stats, out: out},
	})
	out.print(map[string]interface{}{"event": "start", "collections": names})
	client.Run(ctx)
	_ = conn.Close()
	_ = stats.Close()
}
