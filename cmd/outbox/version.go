package main

import (
	"fmt"
	"runtime/debug"
	"strings"

	"github.com/spf13/cobra"
)

// versionText describes this build: the module version, the VCS commit it
// was built from and the Go version, as the binary records them.
func versionText() string {
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		return "outbox: no build information (built without module support)\n"
	}
	version := bi.Main.Version
	if version == "" {
		version = "(devel)"
	}
	settings := map[string]string{}
	for _, s := range bi.Settings {
		settings[s.Key] = s.Value
	}
	commit := settings["vcs.revision"]
	if commit == "" {
		commit = "unknown (built without version control information)"
	} else {
		if t := settings["vcs.time"]; t != "" {
			commit += " (" + t + ")"
		}
		if settings["vcs.modified"] == "true" {
			commit += ", with uncommitted changes"
		}
	}
	var b strings.Builder
	fmt.Fprintf(&b, "outbox %s\n", version)
	fmt.Fprintf(&b, "module %s\n", bi.Main.Path)
	fmt.Fprintf(&b, "commit %s\n", commit)
	fmt.Fprintf(&b, "go     %s\n", bi.GoVersion)
	return b.String()
}

func newVersion() *cobra.Command {
	return &cobra.Command{
		Use:   "version",
		Short: "Print the module version, the commit it was built from and the Go version",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			_, err := fmt.Fprint(cmd.OutOrStdout(), versionText())
			return err
		},
	}
}
