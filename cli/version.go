package cli

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"runtime"
	"runtime/debug"

	"github.com/spf13/cobra"

	subv1 "github.com/qvirt/qvirt/api/subresources/v1alpha1"
)

func newVersion(e *env) *cobra.Command {
	var clientOnly bool
	cmd := &cobra.Command{
		Use:   "version",
		Short: "Print the client and server versions",
		Long: "Print \"Client Version: ...\" from the binary's build information, then \"Server Version: ...\"\n" +
			"from GET /apis/subresources.qvirt.io/v1alpha1/version. When the server cannot be asked the\n" +
			"client version is still printed and the command exits 1 with the server's error.",
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			printClientVersion(cmd.OutOrStdout())
			if clientOnly {
				return nil
			}
			c, err := e.connect()
			if err != nil {
				return err
			}
			b, err := c.Do(cmd.Context(), http.MethodGet, subv1.VersionPath(), nil)
			if err != nil {
				return err
			}
			var v subv1.Version
			if err := json.Unmarshal(b, &v); err != nil {
				return fmt.Errorf("server version %q: %w", truncate(b, 200), err)
			}
			fmt.Fprintf(cmd.OutOrStdout(), "Server Version: %s\n", versionLine(v))
			return nil
		},
	}
	cmd.Flags().BoolVar(&clientOnly, "client", false, "print the client version only")
	return cmd
}

// clientVersion reads the build information Go embeds in the binary.
func clientVersion() subv1.Version {
	v := subv1.Version{GitVersion: "devel", GoVersion: runtime.Version(), Platform: runtime.GOOS + "/" + runtime.GOARCH}
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		return v
	}
	if bi.Main.Version != "" && bi.Main.Version != "(devel)" {
		v.GitVersion = bi.Main.Version
	}
	for _, s := range bi.Settings {
		switch s.Key {
		case "vcs.revision":
			v.GitCommit = s.Value
		case "vcs.modified":
			if s.Value == "true" {
				v.GitCommit += "-dirty"
			}
		}
	}
	return v
}

func printClientVersion(w io.Writer) {
	fmt.Fprintf(w, "Client Version: %s\n", versionLine(clientVersion()))
}

func versionLine(v subv1.Version) string {
	s := v.GitVersion
	if v.GitCommit != "" {
		s += ", commit " + v.GitCommit
	}
	return fmt.Sprintf("%s (%s, %s)", s, v.GoVersion, v.Platform)
}
