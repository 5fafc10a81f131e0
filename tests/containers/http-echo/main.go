// http-echo: the hashicorp/http-echo:1.0.0 stand-in's server (tests/containers/build.sh). It
// takes the two flags docker/compose.yaml passes, -listen and -text, and answers every request
// with the text and a newline, as the upstream server does; /health answers {"status":"ok"}.
// Nothing else of the upstream (its -status-code flag, its version endpoint) is here.
package main

import (
	"flag"
	"fmt"
	"log"
	"net/http"
	"os"
)

func main() {
	listen := flag.String("listen", ":5678", "address and port to listen on")
	text := flag.String("text", "", "text to answer with (required)")
	flag.Parse()
	if *text == "" {
		fmt.Fprintln(os.Stderr, "error: -text is required")
		os.Exit(127)
	}
	body := []byte(*text + "\n")
	mux := http.NewServeMux()
	mux.HandleFunc("/health", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write([]byte(`{"status":"ok"}` + "\n"))
	})
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		_, _ = w.Write(body)
		log.Printf("%s %s %s %q", r.RemoteAddr, r.Method, r.URL.Path, r.Host)
	})
	log.Printf("server is listening on %s", *listen)
	log.Fatal(http.ListenAndServe(*listen, mux))
}
