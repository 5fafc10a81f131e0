// compose-check validates a Compose file the way `docker compose config` does, without a
// container engine: it loads it with compose-go (the library Docker Compose v2 itself uses),
// which checks it against the Compose Specification JSON schema and then normalizes it
// (interpolation, depends_on targets, extends, ...). Prints the normalized model as YAML.
//
//	go run ./docker/compose-check docker/compose.yaml
//	COMPOSE_PROFILES=client go run ./docker/compose-check docker/compose.yaml
//
// Built by scripts/test.sh into target/compose-check; tests/tests/docker_compose.rs runs it.
package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"

	"github.com/compose-spec/compose-go/v2/cli"
)

func main() {
	if len(os.Args) != 2 {
		fmt.Fprintln(os.Stderr, "usage: compose-check COMPOSE_FILE")
		os.Exit(2)
	}
	file := os.Args[1]
	opts, err := cli.NewProjectOptions([]string{file},
		cli.WithWorkingDirectory(filepath.Dir(file)),
		cli.WithName("mcp-demo"),
		cli.WithOsEnv,
		// COMPOSE_PROFILES, as `docker compose` reads it: services under a profile are
		// checked only when it is active.
		cli.WithDefaultProfiles(),
	)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	project, err := opts.LoadProject(context.Background())
	if err != nil {
		fmt.Fprintln(os.Stderr, "invalid:", err)
		os.Exit(1)
	}
	out, err := project.MarshalYAML()
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	os.Stdout.Write(out)
}
