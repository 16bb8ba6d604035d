package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"text/tabwriter"

	"github.com/spf13/cobra"

	"github.com/outboxkit/outbox/contract"
	"github.com/outboxkit/outbox/ops"
)

// exitError ends the command with its own exit status (main prints err
// unless it is nil).
type exitError struct {
	code int
	err  error
}

func (e *exitError) Error() string {
	if e.err == nil {
		return ""
	}
	return e.err.Error()
}

func (e *exitError) Unwrap() error { return e.err }

func newContract() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "contract",
		Short: "Check payload contract registries (docs/contracts.md)",
	}
	cmd.AddCommand(newContractCheck(), newContractList())
	return cmd
}

// contractListing is one contract as `outbox contract list --json` prints it.
type contractListing struct {
	AggregateType string   `json:"aggregatetype"`
	Type          string   `json:"type"`
	Version       int      `json:"version"`
	Schema        string   `json:"schema"`
	DataSchema    string   `json:"dataschema,omitempty"`
	OnePass       bool     `json:"one_pass"`
	Library       string   `json:"library_because,omitempty"`
	Sensitive     []string `json:"sensitive"`
	Forbidden     []string `json:"forbidden"`
}

func newContractList() *cobra.Command {
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "list DIR",
		Short: "List a contract registry's contracts, their masked and forbidden fields, and how their events are checked",
		Long: `Load a contract registry (a folder with a contracts.json index) and list
each contract: aggregate type, type and version, its schema file, the fields
masked wherever a payload is shown (sensitive) and refused at write time
(forbidden), and how a valid event of it is checked: in one pass over its
bytes (a few microseconds a kilobyte), or by the JSON Schema library alone
(tens of microseconds), with the first keyword that keeps it there and
where (docs/contracts.md, "What a check costs").

Exit status: 0, or 2 when the registry cannot be loaded.`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			reg, err := contract.Load(args[0])
			if err != nil {
				return &exitError{2, err}
			}
			list := []contractListing{}
			for _, c := range reg.Contracts() {
				ok, why := c.OnePass()
				sensitive, forbidden := reg.SensitivePaths(c.AggregateType, c.Type), reg.ForbiddenPaths(c)
				if sensitive == nil {
					sensitive = []string{}
				}
				if forbidden == nil {
					forbidden = []string{}
				}
				list = append(list, contractListing{AggregateType: c.AggregateType, Type: c.Type, Version: c.Version,
					Schema: c.File, DataSchema: c.DataSchema, OnePass: ok, Library: why,
					Sensitive: sensitive, Forbidden: forbidden})
			}
			out := cmd.OutOrStdout()
			if asJSON {
				return json.NewEncoder(out).Encode(list)
			}
			w := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
			fmt.Fprintln(w, "CONTRACT\tSCHEMA\tCHECK\tSENSITIVE\tFORBIDDEN")
			for _, l := range list {
				check := "one pass"
				if !l.OnePass {
					check = "library: " + l.Library
				}
				fmt.Fprintf(w, "%s/%s/v%d\t%s\t%s\t%s\t%s\n", l.AggregateType, l.Type, l.Version, l.Schema, check,
					orDash(strings.Join(l.Sensitive, ",")), orDash(strings.Join(l.Forbidden, ",")))
			}
			return w.Flush()
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print the contracts as a JSON array")
	return cmd
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

func newContractCheck() *cobra.Command {
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "check OLD_DIR NEW_DIR",
		Short: "Report breaking changes from one contract registry to the next (exit 0 compatible, 1 breaking, 2 error)",
		Long: `Load two contract registries (folders with a contracts.json index) and list
the changes from OLD_DIR to NEW_DIR that break a consumer or a producer: a
contract version removed, a field removed or retyped, a field newly
required, an enum narrowed, an object closed (additionalProperties false).
New versions, new optional fields and new enum values are compatible.

Exit status: 0 when compatible, 1 when a change breaks, 2 when a registry
cannot be loaded. Meant for a CI step: outbox contract check main/contracts contracts`,
		Args: cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			old, err := contract.Load(args[0])
			if err != nil {
				return &exitError{2, fmt.Errorf("OLD_DIR: %w", err)}
			}
			nw, err := contract.Load(args[1])
			if err != nil {
				return &exitError{2, fmt.Errorf("NEW_DIR: %w", err)}
			}
			changes := contract.Compare(old, nw)
			out := cmd.OutOrStdout()
			if asJSON {
				if changes == nil {
					changes = []contract.Change{}
				}
				if err := json.NewEncoder(out).Encode(map[string]any{"compatible": len(changes) == 0, "breaking": changes}); err != nil {
					return &exitError{2, err}
				}
			} else if len(changes) == 0 {
				fmt.Fprintf(out, "compatible: %d contract(s) checked, no breaking change\n", len(old.Contracts()))
			} else {
				for _, c := range changes {
					fmt.Fprintln(out, c)
				}
			}
			if len(changes) > 0 {
				return &exitError{1, errors.New(fmt.Sprint(len(changes), " breaking change(s)"))}
			}
			return nil
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print {compatible, breaking: [...]} as JSON")
	return cmd
}

// contractFlags are --contracts and --contracts-missing.
type contractFlags struct {
	dir, missing string
}

func (f *contractFlags) register(cmd *cobra.Command, what string) {
	cmd.Flags().StringVar(&f.dir, "contracts", "", "contract registry folder (with contracts.json): "+what)
	cmd.Flags().StringVar(&f.missing, "contracts-missing", "", "with --contracts: an event type without a contract is refused (refuse) or let through and counted (allow); default: the index's \"missing\", else refuse")
}

// load returns the registry --contracts names, or nil without the flag.
func (f *contractFlags) load() (*contract.Registry, error) {
	if f.dir == "" {
		if f.missing != "" {
			return nil, errors.New("--contracts-missing goes with --contracts")
		}
		return nil, nil
	}
	reg, err := contract.Load(f.dir)
	if err != nil {
		return nil, fmt.Errorf("--contracts: %w", err)
	}
	if f.missing != "" {
		if err := reg.SetMissing(contract.Missing(f.missing)); err != nil {
			return nil, fmt.Errorf("--contracts-missing: %w", err)
		}
	}
	return reg, nil
}

// maskFlags are --sensitive-path and --contracts for the commands that
// show payloads: both name fields masked wherever a payload is shown.
type maskFlags struct {
	paths     []string
	contracts string
}

func (f *maskFlags) register(cmd *cobra.Command) {
	cmd.Flags().StringArrayVar(&f.paths, "sensitive-path", nil, "JSON path masked in payloads, e.g. customer.email or cards.*.number (repeatable), besides those stored with the table (outbox mask)")
	cmd.Flags().StringVar(&f.contracts, "contracts", "", "contract registry folder: mask the sensitive and forbidden fields its contracts name, besides those stored with the table (outbox mask import stores them)")
}

// apply sets cfg's sensitive paths and contracts.
func (f *maskFlags) apply(cfg *ops.Config) error {
	cfg.SensitivePaths = f.paths
	if f.contracts == "" {
		return nil
	}
	reg, err := contract.Load(f.contracts)
	if err != nil {
		return fmt.Errorf("--contracts: %w", err)
	}
	cfg.Contracts = reg
	return nil
}
