package metrics

import (
	"time"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// NewCollectorWithTimeouts is NewCollector with other scrape and launcher timeouts.
func NewCollectorWithTimeouts(reader client.Reader, nodeName, podsDir string, log logr.Logger, scrape, launcher time.Duration) prometheus.Collector {
	c := NewCollector(reader, nodeName, podsDir, log).(*Collector)
	c.scrapeTimeout, c.launcherTimeout = scrape, launcher
	return c
}
