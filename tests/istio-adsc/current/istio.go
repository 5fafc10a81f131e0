package main

import (
	"istio.io/istio/pilot/pkg/config/memory"
	"istio.io/istio/pkg/config/schema/collections"
)

// istioRelease names the Istio line pinned in go.mod. Istio tags are not
// semver, so Go only knows its commits as pseudo-versions; the module proxy
// this project can reach refuses the release tags (1.28.0 .. 1.30.0) and, of
// the recent commits it serves, only this master commit of 2026-04-23 has a
// dependency graph it serves too. The 1.30 branch had already been cut (the VERSION
// file says 1.31), so this is Istio 1.30 plus early 1.31 development.
const istioRelease = "1.31-dev"

// newConfigStore builds the store the way istiod does for an xds:// config
// source at this commit (pilot/pkg/bootstrap/configcontroller.go):
// memory.Make = validation ON, so invalid ServiceEntries are rejected as in
// istiod; the Controller gives istiod's HasSynced hook and Run.
func newConfigStore() configStore {
	return memory.NewController(memory.Make(collections.Pilot))
}
