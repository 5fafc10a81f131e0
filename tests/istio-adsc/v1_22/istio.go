package main

import (
	"istio.io/istio/pilot/pkg/config/memory"
	"istio.io/istio/pkg/config/schema/collections"
)

// istioRelease names the Istio line pinned in go.mod: a master commit of
// 2024-02-18, after the 1.21 branch cut (the VERSION file says 1.22). The
// module proxy this project can reach refuses the 1.22.x releases; of the
// 1.22-era commits it does serve, this is the one whose whole dependency
// graph it serves too. Like every release up to 1.23 it requests
// networking.istio.io/v1alpha3/ServiceEntry (1.24+ request .../v1/...).
const istioRelease = "1.22-dev"

// newConfigStore builds the store the way istiod does for an xds:// config
// source at this commit (pilot/pkg/bootstrap/configcontroller.go):
// memory.Make = validation ON, so invalid ServiceEntries are rejected as in
// istiod; the Controller gives istiod's HasSynced hook and Run.
func newConfigStore() configStore {
	return memory.NewController(memory.Make(collections.Pilot))
}
