// istio-validate: a test peer that runs Istio's own ServiceEntry validation
// (istio.io/istio/pkg/config/validation.ValidateServiceEntry, the function the
// admission webhook and istiod's config stores call) over ServiceEntries read
// from stdin, so that tests can hold the adapters, and the Rust mirror of these
// rules (mcp-core/src/translate/istio_rules.rs), to Istio's code rather than to
// a reading of it.
//
// stdin: JSON lines, one ServiceEntry each:
//
//	{"name":"a","namespace":"ns","labels":{...},"spec_b64":"<protobuf bytes, base64>"}
//	{"name":"a","namespace":"ns","spec":{...protojson...}}
//
// stdout: one JSON line per input line, in order:
//
//	{"valid":true,"errors":[],"warnings":["..."]}
//
// A line that cannot be decoded is answered with valid=false and the decoding
// error as its only error (prefixed "input:"), so a caller never loses count.
// Output is flushed whenever no further input is already buffered: a batch is
// answered at pipe speed, a single request at once.
//
// Exit codes: 0 stdin reached EOF, 1 stdin or stdout failed.
package main

import (
	"bufio"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"

	"github.com/hashicorp/go-multierror"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"

	networking "istio.io/api/networking/v1alpha3"
	"istio.io/istio/pkg/config"
	"istio.io/istio/pkg/config/schema/gvk"
	"istio.io/istio/pkg/config/validation"
	"istio.io/istio/pkg/config/validation/agent"
)

type request struct {
	Name      string            `json:"name"`
	Namespace string            `json:"namespace"`
	Labels    map[string]string `json:"labels"`
	SpecB64   string            `json:"spec_b64"`
	Spec      json.RawMessage   `json:"spec"`
}

type verdict struct {
	Valid    bool     `json:"valid"`
	Errors   []string `json:"errors"`
	Warnings []string `json:"warnings"`
}

func main() {
	if err := run(os.Stdin, os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "istio-validate:", err)
		os.Exit(1)
	}
}

func run(in io.Reader, out io.Writer) error {
	r := bufio.NewReaderSize(in, 1<<20)
	w := bufio.NewWriterSize(out, 1<<16)
	enc := json.NewEncoder(w)
	for {
		line, err := r.ReadBytes('\n')
		if len(line) > 0 {
			if encErr := enc.Encode(validate(line)); encErr != nil {
				return encErr
			}
			if r.Buffered() == 0 {
				if flushErr := w.Flush(); flushErr != nil {
					return flushErr
				}
			}
		}
		if errors.Is(err, io.EOF) {
			return w.Flush()
		}
		if err != nil {
			return err
		}
	}
}

func validate(line []byte) verdict {
	var req request
	if err := json.Unmarshal(line, &req); err != nil {
		return refused(fmt.Errorf("input: %v", err))
	}
	spec := &networking.ServiceEntry{}
	switch {
	case req.SpecB64 != "":
		raw, err := base64.StdEncoding.DecodeString(req.SpecB64)
		if err != nil {
			return refused(fmt.Errorf("input: spec_b64: %v", err))
		}
		if err := proto.Unmarshal(raw, spec); err != nil {
			return refused(fmt.Errorf("input: spec_b64: %v", err))
		}
	case len(req.Spec) > 0:
		// configz and kubectl output may carry fields of newer Istio versions.
		opts := protojson.UnmarshalOptions{DiscardUnknown: true}
		if err := opts.Unmarshal(req.Spec, spec); err != nil {
			return refused(fmt.Errorf("input: spec: %v", err))
		}
	}
	// What the webhook hands the validator (pkg/webhooks/validation/server):
	// the object's metadata and its spec as the typed message.
	cfg := config.Config{
		Meta: config.Meta{
			GroupVersionKind: gvk.ServiceEntry,
			Name:             req.Name,
			Namespace:        req.Namespace,
			Labels:           req.Labels,
		},
		Spec: spec,
	}
	warnings, err := validation.ValidateServiceEntry(cfg)
	return verdict{
		Valid:    err == nil,
		Errors:   flatten(err),
		Warnings: flatten(warnings),
	}
}

func refused(err error) verdict {
	return verdict{Errors: []string{err.Error()}, Warnings: []string{}}
}

// flatten lists the single errors inside Istio's multierror and Validation
// wrappers, one message each, never nil (so the JSON says [] rather than null).
func flatten(err error) []string {
	out := []string{}
	var walk func(error)
	walk = func(e error) {
		switch t := e.(type) {
		case nil:
		case *multierror.Error:
			for _, inner := range t.Errors {
				walk(inner)
			}
		case agent.Validation:
			walk(t.Err)
			walk(t.Warning)
		default:
			out = append(out, e.Error())
		}
	}
	walk(err)
	return out
}
