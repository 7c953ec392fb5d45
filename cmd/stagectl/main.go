// Command stagectl operates stage sidecars: stats, routes, config checks,
// benchmarks, and the demo that runs two sidecars end to end.
package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/stage-kv/stage/client"
	"github.com/stage-kv/stage/config"
	"github.com/stage-kv/stage/wire"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	err := newRoot().ExecuteContext(ctx)
	stop()
	if err != nil {
		fmt.Fprintln(os.Stderr, "stagectl:", err)
		os.Exit(1)
	}
}

func newRoot() *cobra.Command {
	root := &cobra.Command{
		Use:           "stagectl",
		Short:         "operate stage sidecars",
		SilenceUsage:  true,
		SilenceErrors: true,
	}
	root.PersistentFlags().String("socket", "", "sidecar control socket (default: the embedded default's control_socket)")
	root.AddCommand(statsCmd(), routesCmd(), configCmd(), benchCmd(), demoCmd(), sinkCmd())
	return root
}

func socketPath(cmd *cobra.Command) string {
	if p, _ := cmd.Flags().GetString("socket"); p != "" {
		return p
	}
	if p := os.Getenv("STAGE_CONTROL_SOCKET"); p != "" {
		return p
	}
	return config.Default().SocketPath()
}

func dial(cmd *cobra.Command) (*client.Client, error) { return client.Dial(socketPath(cmd)) }

func statsCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "stats",
		Short: "show a sidecar's figures: pools, sessions, bytes and transfers per link",
		Args:  cobra.NoArgs,
	}
	asJSON := cmd.Flags().Bool("json", false, "print JSON")
	watch := cmd.Flags().Duration("watch", 0, "refresh every interval (e.g. 1s) with rates, until interrupted")
	cmd.RunE = func(cmd *cobra.Command, _ []string) error {
		c, err := dial(cmd)
		if err != nil {
			return err
		}
		defer c.Close()
		ctx := cmd.Context()
		var prev *wire.Stats
		var prevAt time.Time
		for {
			st, err := c.Stats(ctx)
			if err != nil {
				return err
			}
			now := time.Now()
			if *asJSON {
				enc := json.NewEncoder(os.Stdout)
				enc.SetIndent("", "  ")
				if err := enc.Encode(st); err != nil {
					return err
				}
			} else {
				if *watch > 0 {
					fmt.Print("\033[H\033[2J")
				}
				printStats(os.Stdout, st, prev, now.Sub(prevAt))
			}
			if *watch <= 0 {
				return nil
			}
			prev, prevAt = st, now
			select {
			case <-ctx.Done():
				return nil
			case <-time.After(*watch):
			}
		}
	}
	return cmd
}

// printStats renders the stats table; with prev, rates since then.
func printStats(w io.Writer, st, prev *wire.Stats, dt time.Duration) {
	fmt.Fprintf(w, "node %s  device %s  listen %s  up %s\n", st.Node, st.Device, st.Listen, (time.Duration(st.UptimeS) * time.Second).String())
	fmt.Fprintf(w, "slots %s: send %d/%d in use, recv %d/%d in use; regions %d (mappings %d); sessions %d; transfers active %d\n",
		config.ByteSize(st.SlotSize), st.SendInUse, st.SendSlots, st.RecvInUse, st.RecvSlots, st.Regions, st.Mappings, st.Sessions, st.Transfers)
	tw := tabwriter.NewWriter(w, 2, 4, 2, ' ', tabwriter.AlignRight)
	hdr := "LINK\tUP\tBYTES OUT\tBYTES IN\tCHUNKS OUT\tCHUNKS IN\tOK\tFAILED\tINLINE\t"
	if prev != nil {
		hdr += "OUT/s\tIN/s\t"
	}
	fmt.Fprintln(tw, hdr)
	for _, l := range st.Links {
		row := fmt.Sprintf("%s\t%d\t%s\t%s\t%d\t%d\t%d\t%d\t%d\t", l.Name, l.Up, config.ByteSize(l.BytesOut), config.ByteSize(l.BytesIn),
			l.ChunksOut, l.ChunksIn, l.XfersOK, l.XfersFailed, l.XfersInline)
		if prev != nil {
			var p wire.LinkStats
			for _, q := range prev.Links {
				if q.Name == l.Name {
					p = q
				}
			}
			sec := dt.Seconds()
			row += fmt.Sprintf("%s\t%s\t", rate(l.BytesOut-p.BytesOut, sec), rate(l.BytesIn-p.BytesIn, sec))
		}
		fmt.Fprintln(tw, row)
	}
	if len(st.Links) == 0 {
		fmt.Fprintln(tw, "(no links yet)\t")
	}
	_ = tw.Flush()
	printSameNode(w, st)
}

func rate(b uint64, sec float64) string {
	if sec <= 0 {
		return "-"
	}
	return fmt.Sprintf("%.2f GB/s", float64(b)/sec/1e9)
}

func routesCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "routes",
		Short: "show routes and each peer: node, address, how found, state, sessions, streams, last error",
		Args:  cobra.NoArgs,
	}
	asJSON := cmd.Flags().Bool("json", false, "print JSON")
	cmd.RunE = func(cmd *cobra.Command, _ []string) error {
		c, err := dial(cmd)
		if err != nil {
			return err
		}
		defer c.Close()
		rs, err := c.Routes(cmd.Context())
		if err != nil {
			return err
		}
		if *asJSON {
			enc := json.NewEncoder(os.Stdout)
			enc.SetIndent("", "  ")
			return enc.Encode(rs)
		}
		tw := tabwriter.NewWriter(os.Stdout, 2, 4, 2, ' ', 0)
		fmt.Fprintln(tw, "ROUTE\tNODE\tPEER\tFOUND\tSTATE\tSESSIONS\tSTREAMS\tIN FLIGHT\tSAME HOST\tCHUNK\tTRANSPORT\tERROR")
		for _, r := range rs {
			for _, p := range r.Peers {
				fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%d\t%d/%d\t%d\t%v\t%s\t%s\t%s\n", r.Name, dash(p.Node), p.Addr, p.Found, p.State,
					p.Sessions, p.StreamsUp, p.Stripes, p.InFlight, p.SameHost, config.ByteSize(p.Chunk), transportCell(r.Transport, p.Transport), p.Error)
			}
			if len(r.Peers) == 0 {
				fmt.Fprintf(tw, "%s\t-\t(no peers%s)\t\t\t\t\t\t\t\t\t%s\n", r.Name, routeSource(r), r.DNSError)
			}
		}
		if len(rs) == 0 {
			fmt.Fprintln(tw, "(no routes configured)")
		}
		return tw.Flush()
	}
	return cmd
}

// dash stands for an empty cell.
func dash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

// routeSource says where a route without peers takes them from.
func routeSource(r wire.RouteInfo) string {
	var from []string
	if r.DNS != "" {
		from = append(from, "dns "+r.DNS)
	}
	if len(r.Allow) > 0 {
		from = append(from, "allow "+strings.Join(r.Allow, ","))
	}
	if len(from) == 0 {
		return ""
	}
	return " yet: " + strings.Join(from, "; ")
}

func configCmd() *cobra.Command {
	cmd := &cobra.Command{Use: "config", Short: "configuration tools"}
	check := &cobra.Command{
		Use:   "check FILE",
		Short: "validate a config file; prints every problem with its key path",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			warnings, err := config.Check(args[0])
			if err != nil {
				return err
			}
			for _, w := range warnings {
				fmt.Fprintf(os.Stderr, "%s: warning: %s\n", args[0], w)
			}
			fmt.Printf("%s: ok\n", args[0])
			return nil
		},
	}
	def := &cobra.Command{
		Use:   "default",
		Short: "print the embedded default configuration",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			_, err := os.Stdout.Write(config.DefaultYAML())
			return err
		},
	}
	cmd.AddCommand(check, def)
	return cmd
}
