package cli

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"

	"github.com/spf13/cobra"

	subv1 "github.com/qvirt/qvirt/api/subresources/v1alpha1"
	"github.com/qvirt/qvirt/internal/buildinfo"
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

func printClientVersion(w io.Writer) {
	fmt.Fprintf(w, "Client Version: %s\n", versionLine(buildinfo.Version()))
}

func versionLine(v subv1.Version) string {
	s := v.GitVersion
	if v.GitCommit != "" {
		s += ", commit " + v.GitCommit
	}
	return fmt.Sprintf("%s (%s, %s)", s, v.GoVersion, v.Platform)
}
