package main

import (
	"fmt"

	"github.com/spf13/cobra"

	"github.com/outboxkit/outbox/route"
)

// routeFlags are the routing flags the relay and the console share: the
// console's replay filters by the destination the relay routes to.
type routeFlags struct {
	rc route.Config
}

func (f *routeFlags) register(cmd *cobra.Command) {
	fl := cmd.Flags()
	fl.StringVar(&f.rc.RouteBy, "route-by", route.DefaultRouteBy, "column whose value picks the destination")
	fl.StringVar(&f.rc.Regex, "route-regex", route.DefaultRegex, "regex over the routed value; its named groups feed --route-replacement")
	fl.StringVar(&f.rc.Replacement, "route-replacement", route.DefaultReplacement, "destination template")
	fl.StringVar(&f.rc.Destination, "destination", "", "send every event to this one destination (topic, subject, queue) instead of routing")
}

// config returns the routing the flags give, checked.
func (f *routeFlags) config(cmd *cobra.Command) (route.Config, error) {
	rc := f.rc
	if rc.Destination != "" {
		for _, name := range []string{"route-by", "route-regex", "route-replacement"} {
			if cmd.Flags().Changed(name) {
				return rc, fmt.Errorf("--destination sends every event to one destination: leave out --%s", name)
			}
		}
		rc.RouteBy, rc.Regex, rc.Replacement = "", "", ""
	}
	if _, err := route.New(&rc); err != nil {
		return rc, fmt.Errorf("routing: %w", err)
	}
	return rc, nil
}
